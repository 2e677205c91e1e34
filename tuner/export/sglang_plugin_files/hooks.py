"""One hook factory per replaced SGLang function: ``factory(hook_entry, package_dir) -> AROUND hook``.

Each hook runs the plug-in's kernel only for a call it was measured faster on: the GPU architecture, the dtypes,
the shape (heads, head dim, rope dims, norm or not) and the batch bucket of a MANIFEST case; any other call, or a
kernel that fails, goes to SGLang's own function (``original``). Checks run in Python at each call: under a CUDA
graph that is at capture, once per captured batch size.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger("tuner_sglang_plugin")
_ARCH: dict[int, str] = {}


def _arch(device) -> str:
    """``sm_90`` on an H100/H200; ``cpu`` for a CPU tensor (Triton's interpreter: the plug-in's own tests)."""
    import torch

    if device.type != "cuda":
        return device.type
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _ARCH:
        major, minor = torch.cuda.get_device_capability(idx)
        _ARCH[idx] = f"sm_{major}{minor}"
    return _ARCH[idx]


def _bind(names: list[str], args: tuple, kwargs: dict) -> dict | None:
    if len(args) > len(names):
        return None
    out = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in out:
            return None
        out[k] = v
    return out if len(out) == len(names) else None


def case_key(case: dict) -> tuple:
    return (
        case["arch"],
        case["dtype"],
        case["out_dtype"],
        case["heads"],
        case["head_dim"],
        case["rope_dim"],
        bool(case["norm"]),
    )


def fused_q_norm_rope(hook: dict, package_dir: Path):
    """AROUND ``sglang.kernels.ops.attention.dsv4.norm_rope.fused_q_norm_rope(q_input, q_output, eps, freqs_cis,
    positions)``: the plug-in's Triton kernel where measured faster, else SGLang's."""
    import torch

    from .kernels.sglang_q_norm_rope import fused_q_norm_rope as ours

    configs = json.loads((package_dir / hook["config_file"]).read_text())
    cases = {
        case_key(c["case"]): [(b["batch_range"], configs[b["config"]]) for b in c["buckets"]] for c in hook["cases"]
    }
    names = hook["args"]
    broken: list[BaseException] = []

    def around(original, *args, **kwargs):
        a = _bind(names, args, kwargs)
        if a is None or broken:
            return original(*args, **kwargs)
        q, out, freqs = a["q_input"], a["q_output"], a["freqs_cis"]
        if not (
            isinstance(q, torch.Tensor)
            and q.dim() == 3
            and isinstance(out, torch.Tensor)
            and out.shape == q.shape
            and q.stride(2) == 1
            and out.stride(2) == 1
            and freqs.dtype == torch.complex64
            and freqs.dim() == 2
        ):
            return original(*args, **kwargs)
        B, H, D = q.shape
        key = (
            _arch(q.device),
            str(q.dtype).removeprefix("torch."),
            str(out.dtype).removeprefix("torch."),
            H,
            D,
            2 * freqs.shape[1],
            a["eps"] is not None,
        )
        config = next((cfg for (lo, hi), cfg in cases.get(key, ()) if lo <= B <= hi), None)
        if config is None:
            return original(*args, **kwargs)
        try:
            ours(q, out, a["eps"], freqs, a["positions"], config)
        except Exception as exc:  # noqa: BLE001 - SGLang's own kernel is always there
            broken.append(exc)
            logger.warning(
                "tuner plug-in: its fused_q_norm_rope failed (%s: %s); SGLang's own runs from now on",
                type(exc).__name__,
                exc,
            )
            return original(*args, **kwargs)
        return None

    return around
