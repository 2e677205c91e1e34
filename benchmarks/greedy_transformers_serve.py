"""The greedy check against real ``transformers serve`` on the CPU: how far each ``--dtype`` moves a tiny random
Llama's greedy completions from the float32 baseline's, and whether the baseline agrees with itself across starts.

Builds the test's tiny model (``tests/real_server/tiny_model.py``: random weights, its own tokenizer, no download),
then runs the ``command`` target's own trial (``CommandTarget.evaluate``: launch, warm-up, the greedy check, one
load level, teardown) for the baseline (``--dtype auto``, the float32 weights) and for each other dtype, each judged
against the baseline's completions. Writes ``benchmarks/results/greedy_transformers_serve/cpu/<date>_<commit>.md`` with the date,
the machine, the commit and every prompt's agreement.

    python benchmarks/greedy_transformers_serve.py [--dtypes auto,float16,bfloat16] [--prompts 8] [--tokens 32]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from search_spaces import Hardware, load_space_text, resolve  # noqa: E402
from tests.real_server.tiny_model import build_tiny_llama  # noqa: E402
from tuner.targets.server import greedy  # noqa: E402
from tuner.targets.server.target import CommandTarget  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="auto,float16,bfloat16", help="the dtypes after the baseline's second start")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument(
        "--out",
        default=None,
        help="the report (default: benchmarks/results/greedy_transformers_serve/cpu/<date>_<commit>.md)",
    )
    args = ap.parse_args()
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    space = (
        "name: transformers-serve-dtype\ntarget: command\nobjective: {metric: tok_s, levels: [1]}\nparams:\n"
        f"  dtype: {{type: categorical, values: [{', '.join(dict.fromkeys(['auto', *dtypes]))}], "
        "default: auto, flag: --dtype}\n"
    )
    resolved = resolve(load_space_text(space, source="dtype.yaml"), Hardware())
    check = {"prompts": args.prompts, "tokens": args.tokens, "min_agreement": 0.9}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_llama(Path(tmp) / "tiny-llama")
        base = {
            "command": ["transformers", "serve", "{model}", "--host", "{host}", "--port", "{port}"],
            "model": str(model),
            "health_paths": ["/health"],
            "env": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
            "port_range": "37500-37999",
            "api": "completions",
            "prompt_len": 16,
            "output_len": 8,
            "min_requests": 2,
            "rounds": 1,
            "level_s": 0.5,
            "warmup_requests": 1,
            "greedy_check": check,
        }

        def run(dtype: str, **extra):
            m = CommandTarget(resolved, {**base, **extra}).evaluate({"dtype": dtype}, time.time() + 300)
            print(f"{dtype}: {m.outcome.value} agreement {m.metric('greedy_agreement')} {m.reason[:200]}", flush=True)
            return m

        first = run("auto", greedy_is_baseline=True)
        if "greedy" not in first.data:
            print(f"the baseline failed: {first.outcome.value}: {first.reason}", file=sys.stderr)
            return 1
        ref = first.data["greedy"]
        rows = [(d, run(d, greedy_reference=ref)) for d in dtypes]
    reference = greedy.completions_of(ref)
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    lines = [
        "# The greedy check against real `transformers serve` on the CPU",
        "",
        f"- date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, no GPU",
        f"- commit: {sha.strip()}",
        "- source: benchmarks/greedy_transformers_serve.py",
        f"- model: tests/real_server/tiny_model.py (random Llama, float32 weights); {args.prompts} built-in prompts x "
        f"{args.tokens} tokens; compared as {'token ids' if ref['token_ids'] else 'text (the server refuses return_token_ids)'}",
        "- each row: a fresh server start judged against the first start of `--dtype auto` (the baseline)",
        "",
        "| --dtype | outcome | agreement | per prompt | greedy check s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for dtype, m in rows:
        outs = greedy.completions_of(m.data["greedy"]) if "greedy" in m.data else []
        per = ", ".join(f"{greedy.prompt_agreement(r, o):.2f}" for r, o in zip(reference, outs)) or "-"
        agree = m.metric("greedy_agreement")
        lines.append(
            f"| {dtype} | {m.outcome.value} | {agree:.3f} | {per} | {m.metric('greedy_s') or 0:.1f} |"
            if agree is not None
            else f"| {dtype} | {m.outcome.value} | - | - | - |"
        )
    from benchmarks.common import result_path

    out = Path(args.out) if args.out else result_path("greedy_transformers_serve", "cpu")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
