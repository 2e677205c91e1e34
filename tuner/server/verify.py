"""Exported launch scripts (render, read back, re-measure) and SGLang fused-MoE config files.

A launch script is plain bash: every argv item and environment value passes through ``shlex.quote``, the port
is ``${PORT:-<port>}`` so a verifier can move it, and ``"$@"`` passes extra flags through. Its header carries the
recorded figures as one JSON line (``# tuner-recorded: {...}``) that :func:`verify_script` compares against.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner import loadgen
from tuner.export import ExportError, read_recorded, render_script
from tuner.measurement import Measurement, Outcome
from tuner.server.launch import ServerProcess, parse_port_range, pick_free_port
from tuner.targets.base import LaunchSpec

_logger = logging.getLogger(__name__)

LOAD_KEYS = ("model", "served_model_name", "api", "prompt_len", "output_len", "length_jitter", "dataset",
             "requests_per_level", "rounds", "min_requests", "warmup_requests", "ignore_eos", "seed", "extra_body",
             "health_paths")


def recorded_header(m: Measurement, objective: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """What a launch script records: the objective, its value per level, and the load that produced it."""
    return {
        "metric": objective.metric, "direction": objective.direction, "combine": objective.combine,
        "levels": list(objective.levels), "level": objective.level, "unit": objective.unit,
        "value": m.value, "by_level": {str(k): v for k, v in m.by_level.items()},
        "load": {k: settings[k] for k in LOAD_KEYS if k in settings},
    }


def render_launch_script(spec: LaunchSpec, recorded: dict[str, Any] | None = None, *,
                         title: str = "exported by tuner") -> str:
    """A bash script that runs ``spec`` (see :func:`tuner.export.render_script`); never a value unquoted."""
    try:
        return render_script(spec, header=[title.splitlines()[0] if title else "", spec.description],
                             recorded=recorded)
    except ExportError as exc:
        raise ValueError(str(exc)) from None


def read_script_header(path: str | Path) -> dict[str, Any]:
    """The recorded figures of a launch script; ``ValueError`` naming the fix when there are none."""
    try:
        return read_recorded(path)
    except ExportError as exc:
        raise ValueError(str(exc)) from None


@dataclass
class VerifyResult:
    ok: bool
    outcome: Outcome
    metric: str
    value: float | None
    recorded_value: float | None
    by_level: dict[int, float] = field(default_factory=dict)
    recorded_by_level: dict[int, float] = field(default_factory=dict)
    ratios: dict[int, float] = field(default_factory=dict)
    tolerance: float = 0.15
    reason: str = ""
    log: str = ""
    duration_s: float = 0.0

    def lines(self) -> list[str]:
        head = "verified" if self.ok else "NOT verified"
        out = [f"{head}: {self.metric} {self.value if self.value is None else round(self.value, 3)} "
               f"(recorded {self.recorded_value if self.recorded_value is None else round(self.recorded_value, 3)}, "
               f"tolerance {self.tolerance:.0%}, outcome {self.outcome.value}, {self.duration_s:.1f}s)"]
        for c in sorted(self.recorded_by_level):
            got = self.by_level.get(c)
            ratio = self.ratios.get(c)
            out.append(f"  c={c}: {got if got is None else round(got, 3)} vs {round(self.recorded_by_level[c], 3)}"
                       + (f" ({ratio:.2f}x)" if ratio is not None else ""))
        if self.reason:
            out.append(f"  {self.reason}")
        return out


def verify_script(path: str | Path, *, tolerance: float = 0.15, timeout_s: float = 3600.0,
                  port_range: str = "30000-30999", host: str = "127.0.0.1",
                  settings: dict[str, Any] | None = None) -> VerifyResult:
    """Run the launch script once (``bash path`` with ``PORT`` set), load it at the recorded levels with the
    recorded load, and compare the objective per level with the header's figures. Never raises for a failed run."""
    t0 = time.time()
    rec = read_script_header(path)
    load = {**rec.get("load", {}), **(settings or {})}
    levels = [int(c) for c in rec.get("levels") or [int(k) for k in rec.get("by_level", {})]]
    metric = str(rec.get("metric", "tok_s"))
    maximize = rec.get("direction", "maximize") == "maximize"
    recorded_by_level = {int(k): float(v) for k, v in (rec.get("by_level") or {}).items()}
    result = VerifyResult(False, Outcome.CRASH, metric, None, rec.get("value"),
                          recorded_by_level=recorded_by_level, tolerance=tolerance)
    port = pick_free_port(*parse_port_range(port_range), host)
    cfg = loadgen.LoadConfig.from_settings(load)
    deadline = t0 + timeout_s
    server = ServerProcess(["bash", str(Path(path).resolve())], env={"PORT": str(port)}, port=port, host=host,
                           health_paths=tuple(load.get("health_paths") or ("/health", "/v1/models")))
    try:
        failure = server.wait_ready(deadline)
        if failure is not None:
            result.outcome, result.reason = failure.outcome, failure.reason
            return result
        loadgen.warmup(server.base_url, cfg, deadline)
        for i, c in enumerate(levels):
            res = loadgen.run_level(server.base_url, cfg, c, level_index=i, deadline=deadline,
                                    should_abort=lambda: (f.reason if (f := server.failure()) else None))
            if res.aborted or not res.ok_requests:
                f = server.failure()
                result.outcome = f.outcome if f else (Outcome.TIMEOUT if res.aborted else Outcome.CRASH)
                result.reason = f"at c={c}: " + (f.reason if f else res.aborted or res.first_error())
                return result
            result.by_level[c] = loadgen.level_summary(res)[metric]
        result.outcome = Outcome.OK
        result.value = _combine(rec, result.by_level)
        compare(result, maximize=maximize)
        return result
    finally:
        server.stop()
        result.log = server.log_text()
        result.duration_s = time.time() - t0
        _logger.info("verify %s: %s", path, result.lines()[0])


def compare(result: VerifyResult, *, maximize: bool) -> None:
    """Fill ``result.ratios``, ``ok`` and ``reason`` from its new and recorded figures per level."""
    worst = []
    for c, want in result.recorded_by_level.items():
        got = result.by_level.get(c)
        if got is None or want == 0 or math.isnan(got):
            continue
        result.ratios[c] = got / want
        tol = result.tolerance
        if (got < want * (1 - tol)) if maximize else (got > want * (1 + tol)):
            worst.append(f"c={c}: {got:.3g} vs recorded {want:.3g}")
    result.ok = not worst
    if worst:
        result.reason = f"outside {result.tolerance:.0%} of the recorded figures: " + "; ".join(worst)


def _combine(rec: dict[str, Any], by_level: dict[int, float]) -> float:
    vals = [v for v in by_level.values()]
    combine = rec.get("combine", "geomean")
    if combine == "level" and rec.get("level") in by_level:
        return by_level[rec["level"]]
    if combine == "geomean":
        return 0.0 if any(v <= 0 for v in vals) else math.exp(sum(math.log(v) for v in vals) / len(vals))
    if combine == "min":
        return min(vals)
    return sum(vals) / len(vals)


# -- SGLang fused-MoE Triton configs --------------------------------------------------------------------------

MOE_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def moe_config_file_name(E: int, N: int, device_name: str, dtype: str | None = None,
                         block_shape: list[int] | None = None) -> str:
    """SGLang's file name: ``E=256,N=2048,device_name=NVIDIA_H200[,dtype=fp8_w8a8][,block_shape=[128, 128]].json``."""
    name = f"E={E},N={N},device_name={device_name.replace(' ', '_')}"
    if dtype:
        name += f",dtype={dtype}"
    if block_shape and all(block_shape):
        name += f",block_shape={list(block_shape)}"
    return name + ".json"


def write_moe_config(root: str | Path, *, E: int, N: int, device_name: str, configs: dict[int, dict[str, int]],
                     dtype: str | None = None, block_shape: list[int] | None = None,
                     triton_version: str | None = None, merge: bool = False) -> Path:
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
    out = Path(root) / "configs" / f"triton_{triton_version.replace('.', '_')}" / moe_config_file_name(
        E, N, device_name, dtype, block_shape)
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
    paths = [Path(p) / "srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py"
             for p in (spec.submodule_search_locations or [] if spec else [])]
    path = next((p for p in paths if p.is_file()), None)
    if path is None:
        return None
    ctx = types.ModuleType("sglang.srt.runtime_context")
    ctx.get_exec = lambda: types.SimpleNamespace(deterministic=types.SimpleNamespace(enable_deterministic_inference=False))
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


def read_moe_config_with_sglang(root: str | Path, *, E: int, N: int, device_name: str, dtype: str | None = None,
                                block_shape: list[int] | None = None) -> dict[int, dict] | None:
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
