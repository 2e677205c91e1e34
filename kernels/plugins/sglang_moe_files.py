"""SGLang's fused-MoE Triton config files: written in SGLang's layout, read back with SGLang's own loader.

SGLang looks for ``$SGLANG_MOE_CONFIG_DIR/configs/triton_<version>/E=..,N=..,device_name=..[,dtype=..].json``, a
map from batch size to the six tile fields. :func:`write_moe_config` writes one atomically;
:func:`read_moe_config_with_sglang` reads it through SGLang's unmodified loader, so a name or layout SGLang would
not find fails here first.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

_logger = logging.getLogger(__name__)

MOE_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def moe_config_file_name(
    E: int, N: int, device_name: str, dtype: str | None = None, block_shape: list[int] | None = None
) -> str:
    """SGLang's file name: ``E=256,N=2048,device_name=NVIDIA_H200[,dtype=fp8_w8a8][,block_shape=[128, 128]].json``."""
    name = f"E={E},N={N},device_name={device_name.replace(' ', '_')}"
    if dtype:
        name += f",dtype={dtype}"
    if block_shape and all(block_shape):
        name += f",block_shape={list(block_shape)}"
    return name + ".json"


def write_moe_config(
    root: str | Path,
    *,
    E: int,
    N: int,
    device_name: str,
    configs: dict[int, dict[str, int]],
    dtype: str | None = None,
    block_shape: list[int] | None = None,
    triton_version: str | None = None,
    merge: bool = False,
) -> Path:
    """Write tuned fused-MoE configs where SGLang looks with ``SGLANG_MOE_CONFIG_DIR=root``:
    ``root/configs/triton_<version>/<name>.json``, mapping batch size to the six tile fields. With ``merge`` the
    batch sizes already in the file and not in ``configs`` are kept. The file is replaced atomically."""
    if not configs:
        raise ValueError("`configs` must map at least one batch size to a config, but got an empty mapping.")
    for bs, cfg in configs.items():
        missing = [k for k in MOE_KEYS if k not in cfg]
        if missing or int(bs) < 1:
            raise ValueError(f"MoE config for batch size {bs!r} needs {MOE_KEYS} and bs >= 1, missing {missing}.")
    if triton_version is None:
        try:
            import triton

            triton_version = triton.__version__
        except ImportError:
            raise ValueError("`triton_version` is needed when triton is not installed (e.g. '3.6.0').") from None
    out = (
        Path(root)
        / "configs"
        / f"triton_{triton_version.replace('.', '_')}"
        / moe_config_file_name(E, N, device_name, dtype, block_shape)
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {int(bs): {k: int(cfg[k]) for k in MOE_KEYS} for bs, cfg in configs.items()}
    if merge and out.is_file():
        try:
            old = {int(bs): cfg for bs, cfg in json.loads(out.read_text()).items()}
        except (ValueError, AttributeError) as exc:
            raise ValueError(f"{out} is not a fused-MoE config file ({exc}); move it away and tune again") from None
        data = {**old, **data}
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({str(bs): data[bs] for bs in sorted(data)}, indent=4) + "\n")
    os.replace(tmp, out)
    _logger.info("wrote %d fused-MoE configs to %s", len(data), out)
    return out


def _sglang_moe_loader(device_name: str):
    """SGLang's own ``get_moe_configs`` from its installed source file, unmodified, or None without SGLang. Its
    module imports two helpers from modules that need SGLang's full dependency set (transformers, ...); they are
    given here: the GPU name (``device_name``) and the deterministic-inference flag (off, SGLang's default)."""
    import importlib.util
    import sys
    import types

    spec = importlib.util.find_spec("sglang")
    paths = [
        Path(p) / "srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py"
        for p in (spec.submodule_search_locations or [] if spec else [])
    ]
    path = next((p for p in paths if p.is_file()), None)
    if path is None:
        return None
    ctx = types.ModuleType("sglang.srt.runtime_context")
    ctx.get_exec = lambda: types.SimpleNamespace(
        deterministic=types.SimpleNamespace(enable_deterministic_inference=False)
    )
    utils = types.ModuleType("sglang.srt.utils")
    utils.get_device_name = lambda *a, **k: device_name
    utils.is_hip = lambda: False
    saved = {k: sys.modules.get(k) for k in (ctx.__name__, utils.__name__)}
    sys.modules.update({ctx.__name__: ctx, utils.__name__: utils})
    try:
        mod_spec = importlib.util.spec_from_file_location("_sglang_moe_config_loader", path)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return module.get_moe_configs


def read_moe_config_with_sglang(
    root: str | Path,
    *,
    E: int,
    N: int,
    device_name: str,
    dtype: str | None = None,
    block_shape: list[int] | None = None,
) -> dict[int, dict] | None:
    """What SGLang's own loader reads for ``(E, N, dtype)`` with ``SGLANG_MOE_CONFIG_DIR=root`` on ``device_name``
    (None when SGLang, or its loader's file, is not installed here)."""
    get_moe_configs = _sglang_moe_loader(device_name)
    if get_moe_configs is None:
        _logger.info("SGLang's MoE config loader is not installed here; %s is not read back", root)
        return None
    old = os.environ.get("SGLANG_MOE_CONFIG_DIR")
    os.environ["SGLANG_MOE_CONFIG_DIR"] = str(root)
    try:
        bn, bk = block_shape or (0, 0)
        return get_moe_configs(E, N, dtype, bn, bk)
    finally:
        if old is None:
            os.environ.pop("SGLANG_MOE_CONFIG_DIR", None)
        else:
            os.environ["SGLANG_MOE_CONFIG_DIR"] = old
