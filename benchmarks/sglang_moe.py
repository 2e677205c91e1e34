"""SGLang's own fused-MoE kernel at the shapes of ``search_spaces/kernels_sglang_moe.yaml``, side by side in one run:
SGLang's default config, the config SGLang's own loader reads from a tuned folder, plain PyTorch, and the memory
floor from the copy bandwidth measured in the same run. Every config is checked against the float32 reference
first (NaN-poisoned output); times are ``kernels.bench.do_bench`` medians (L2 flushed, CUDA graphs where the call
is short or launch-bound, input sets rotated).

    python3 benchmarks/sglang_moe.py --configs OUT/kernel_configs --out sglang_moe.md

``--configs`` is the ``kernel_configs`` folder of ``tuner search --target kernels --space kernels_sglang_moe``
(SGLang's files are under its ``sglang_moe/``). Needs CUDA and SGLang's source (``pip install sglang --no-deps``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)
]

import torch  # noqa: E402
import triton  # noqa: E402

from kernels.base import check  # noqa: E402
from kernels.bench import do_bench, measure_copy_bandwidth  # noqa: E402
from kernels.plugins.sglang_moe import SGLANG_MOE_SUBDIR, SGLangFusedMoEKernel, sglang_version  # noqa: E402
from kernels.plugins.sglang_moe_files import read_moe_config_with_sglang  # noqa: E402
from search_spaces import load_space  # noqa: E402

ROTATE_BYTES = 2 * 1024**3


def plan_shapes() -> list[dict]:
    space = load_space("kernels_sglang_moe")
    dims = space.settings["kernels"]["sglang_fused_moe"]["dims"]
    return [dict(d, tokens=int(b)) for d in dims for b in space.param("batch").choices()]


def time_us(fn, shape, kernel, dtype) -> float:
    sets = []  # several routings (the expert weights are shared between the sets)
    for i in range(max(1, min(4, int(ROTATE_BYTES // kernel.rotation_bytes(shape, dtype))))):
        inputs = kernel.make_inputs(shape, dtype, "cuda", 11 + i)
        sets.append((inputs, kernel.output_like(inputs)))
    return do_bench(lambda item: fn(*item), sets, rep_ms=60).median_us


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", required=True, help="the kernel_configs folder of a kernel search")
    ap.add_argument("--out", default="sglang_moe.md")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: this benchmark times kernels on a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    kernel = SGLangFusedMoEKernel.instance
    gpu = torch.cuda.get_device_name()
    root = Path(args.configs) / SGLANG_MOE_SUBDIR
    bw = measure_copy_bandwidth()
    rows = []
    for shape in plan_shapes():
        tuned_map = read_moe_config_with_sglang(root, E=shape["experts"], N=shape["width"], device_name=gpu)
        if not tuned_map:
            print(
                f"error: SGLang's loader finds no file for E={shape['experts']}, N={shape['width']} on {gpu} in "
                f"{root}; run the kernel search first",
                file=sys.stderr,
            )
            return 2
        tuned = tuned_map[min(tuned_map, key=lambda m: abs(m - shape["tokens"]))]  # SGLang's nearest key
        default = kernel.default_config(shape)
        errs = [check(kernel, shape, args.dtype, c, device="cuda", seed=5) for c in (default, tuned)]
        t_default = time_us(lambda i, o: kernel.run(i, default, out=o), shape, kernel, args.dtype)
        t_tuned = time_us(lambda i, o: kernel.run(i, tuned, out=o), shape, kernel, args.dtype)
        t_torch = time_us(lambda i, o: kernel.torch_baseline(i), shape, kernel, args.dtype)
        floor = kernel.cost(shape, args.dtype).bytes / bw * 1e6
        rows.append((shape, default, tuned, errs, t_default, t_tuned, t_torch, floor))
        print(
            shape,
            f"default {t_default:.1f} us, tuned {t_tuned:.1f} us, torch {t_torch:.1f} us, floor {floor:.1f}",
            flush=True,
        )
    commit = os.environ.get("TUNER_COMMIT") or "unknown"
    lines = [
        f"# SGLang's fused-MoE kernel, default vs tuned, side by side on {gpu}",
        "",
        f"date {dt.date.today()}, torch {torch.__version__}, triton {triton.__version__}, SGLang "
        f"{sglang_version() or '?'} (kernel source), commit {commit}, {args.dtype}; copy bandwidth measured in "
        f"this run {bw / 1e12:.2f} TB/s; floor = expected routed-expert bytes / that bandwidth; tuned = the "
        "config SGLang's own loader reads from the tuned folder (nearest batch key)",
        "",
        "| E | N | tokens | SGLang default us | tuned us | default / tuned | torch us | floor us | tuned / floor "
        "| rel err default, tuned |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for shape, default, tuned, errs, t_d, t_t, t_torch, floor in rows:
        lines.append(
            f"| {shape['experts']} | {shape['width']} | {shape['tokens']} | {t_d:.1f} | {t_t:.1f} | "
            f"**{t_d / t_t:.2f}x** | {t_torch:.1f} | {floor:.1f} | {t_t / floor:.2f} | "
            f"{errs[0]:.1e}, {errs[1]:.1e} |"
        )
    lines += [
        "",
        "Tuned configs: "
        + "; ".join(
            f"E={s['experts']},N={s['width']},tokens={s['tokens']}: " + ",".join(f"{k}={v}" for k, v in t.items())
            for s, _, t, *_ in rows
        ),
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
