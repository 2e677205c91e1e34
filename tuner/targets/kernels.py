"""The ``kernels`` target: one trial = one config of one Triton kernel at one shape, correctness-gated, then timed.

Settings (from the space's ``settings:`` or ``--set``):

``kernel``
    A registry name (``sparse_decode``), a plug-in's short name (``sglang_fused_moe``: SGLang's own fused-MoE
    kernel, see :mod:`kernels.plugins.sglang_moe`) or a plug-in ``module:Class`` (a :class:`kernels.base.TunableKernel`).
``shape``
    The shape dict (``{batch: 16, heads: 64, ...}``); a JSON string is accepted (``--set shape='{...}'``).
``dtype`` (``bfloat16``), ``seed`` (0)
    Input dtype and the seed of the correctness inputs (timing inputs use the following seeds).
``allow_cpu_interpreter`` (false)
    Without CUDA the target can only run Triton's interpreter: correct or not, never a speed. Preflight refuses
    unless this is true (tests), and then the value is the interpreter's wall time, meaningless for speed.
``peak_bytes_per_s``, ``peak_flops``
    Roofline of the GPU for the ``roofline_frac`` metric (default: the H200 figures measured in DESIGN.md).

A trial: ``check_config`` (in the search process, :meth:`KernelsTarget.check`: a config that breaks a named rule
is ``invalid_config`` without a subprocess) -> one launch on fresh random inputs into a NaN-poisoned output,
compared with the reference (over tolerance: ``wrong_result``; it can never win) -> ``kernels.bench.do_bench``
(warm-up outside the timing, L2 flushed by a clean read, CUDA-graph replay for calls under 20 µs, several input
sets rotated) -> value ``time_us`` (median; minimise) with p20/p80, spread, achieved bytes/s and FLOP/s.
Compile errors and ``OutOfResources`` raised at the first launch become their outcomes.

``python -m tuner.targets.kernels --kernel K --shape JSON --config JSON [--dtype D]`` re-measures one config
(the exported launch spec).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import os
import statistics
import sys
import time
from typing import Any

from pydantic import Field

from search_spaces import ResolvedSpace
from storage.types import MetricRow
from tuner.errors import TargetError
from tuner.measurement import Measurement, Outcome
from tuner.settings import CommonSettings
from tuner.targets.base import LaunchSpec, PreflightReport, Reporter, Target

_logger = logging.getLogger(__name__)

H200_BYTES_PER_S = 4.27e12  # copy rate measured on one H200 (DESIGN.md)
H200_BF16_FLOPS = 7.9e14
ROTATE_BYTES = 2 * 1024**3  # at most this many bytes of distinct input sets for rotation during timing
ROTATE_MAX = 4


def load_kernel(name: str):
    """The :class:`~kernels.base.TunableKernel` registered as ``name`` in ``kernels.registry``, or a plug-in given
    as ``module:Class``."""
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise TargetError(
                f"kernel {name!r} cannot be imported ({exc}); give a registry name or "
                "module.path:ClassName on PYTHONPATH"
            ) from None
        return getattr(obj, "instance", None) or (obj() if isinstance(obj, type) else obj)
    from kernels.registry import get_kernel

    try:
        return get_kernel(name)
    except ValueError as exc:
        raise TargetError(f"setting `kernel`: {exc}") from None


def parse_shape(value: Any) -> dict[str, int]:
    """A shape dict from a dict or its JSON text; every value an int."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise TargetError(
                f"setting `shape` must be a mapping or JSON text, but got {value!r} ({exc.msg}); "
                'write e.g. --set shape=\'{"batch": 16, "heads": 64}\''
            ) from None
    if not isinstance(value, dict) or not value:
        raise TargetError(f"setting `shape` must be a non-empty mapping of dim to int, but got {value!r}")
    out = {}
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
            raise TargetError(f"setting `shape`: dim {k!r} must be an int, but got {v!r}")
        out[str(k)] = int(v)
    return out


class KernelsSettings(CommonSettings):
    """Settings of the kernels target, and of a kernels plan (``tuner search --target kernels``)."""

    kernel: str | None = None
    """A registry name (``sparse_decode``, ``sglang_fused_moe``) or a plug-in ``module:Class``."""
    shape: dict[str, int] | str | None = None
    """The shape dict; a JSON string is accepted (``--set shape='{...}'``)."""
    dtype: str = "bfloat16"
    allow_cpu_interpreter: bool = False
    """Let a CPU machine run Triton's interpreter (tests): correct or not, never a speed."""
    persistent_worker: bool = True
    """Run trials one after another in a long-lived worker per GPU set."""
    rep_ms: float = Field(60.0, gt=0)
    """Milliseconds of timing per config."""
    peak_bytes_per_s: float = Field(H200_BYTES_PER_S, gt=0)
    peak_flops: float = Field(H200_BF16_FLOPS, gt=0)
    # a kernels plan
    kernels: dict[str, Any] | None = None
    """The plan: kernel name -> model dims and batch buckets."""
    only: str | list[str] | None = None
    """Tune only these kernels of the plan (``--set only=sparse_decode,indexer``)."""
    max_cases: int | None = Field(None, ge=1)
    retune: bool = False
    """Tune again a case whose tuned-config file already holds it."""
    retimes: int = Field(1, ge=0)
    """Extra timings of the top configs before a case's winner is chosen."""
    min_gain: float = Field(0.01, ge=0)
    """A winner must beat the default by this much beyond the measured spread."""
    compile_ahead: int | bool | str = "auto"
    """Compile helpers: ``auto`` (the spare CPUs of a GPU host), a count, or false."""


class KernelsTarget(Target):
    """Microbenchmark one config of one kernel at one shape (see the module docstring)."""

    name = "kernels"
    Settings = KernelsSettings
    config: KernelsSettings

    def __init__(self, resolved: ResolvedSpace, settings: dict[str, Any] | None = None) -> None:
        super().__init__(resolved, settings)
        kernel_name = self.config.kernel
        if not kernel_name:
            raise TargetError(
                "the kernels target needs setting `kernel` (e.g. sparse_decode) and `shape`; "
                "use `tuner search --target kernels` with a kernels plan, or write them in the space"
            )
        self.kernel_name = str(kernel_name)
        self.shape = parse_shape(self.config.shape)
        self.dtype = self.config.dtype
        self.seed = self.config.seed
        self.allow_cpu = self.config.allow_cpu_interpreter
        self.gpus_per_trial = 1 if resolved.hardware.gpu_count else 0
        self.persistent_worker = self.config.persistent_worker
        self._kernel = None
        self._limits_device: Any = None

    # -- the kernel, its config ----------------------------------------------------------------------------------
    @property
    def kernel(self):
        if self._kernel is None:
            self._kernel = load_kernel(self.kernel_name)
        return self._kernel

    def config_of(self, params: dict[str, Any]) -> dict[str, Any]:
        """The full kernel config of ``params``: the default config with every searched field replaced.

        A parameter goes to the config field named by its ``kernel:`` destination (``sparse_decode.S`` -> ``S``),
        else to the field of its own name.
        """
        config = dict(self.kernel.fit_dtype(self.kernel.default_config(self.shape), self.shape, self.dtype))
        by_name = {p.name: p for p in self.space.params}
        for name, value in params.items():
            p = by_name.get(name)
            field = p.kernel.split(".", 1)[-1] if p is not None and p.kernel else name
            config[field] = value
        return config

    def _device_for_rules(self) -> Any:
        # check_config runs in the search process: ask CUDA for the real limits only where a GPU is present
        return "cuda" if self.resolved.hardware.gpu_count else None

    # -- the contract --------------------------------------------------------------------------------------------
    def preflight(self) -> PreflightReport:
        report = super().preflight()
        try:
            kernel = self.kernel
        except TargetError as exc:
            report.errors.append(str(exc))
            return report
        hw = self.resolved.hardware
        missing = kernel.unavailable()
        if missing:
            report.errors.append(f"kernel {self.kernel_name!r} cannot run here: {missing}")
            return report
        try:
            key = kernel.shape_key(self.shape)
            cost = kernel.cost(self.shape, self.dtype)
        except (KeyError, ValueError, TypeError) as exc:
            report.errors.append(
                f"setting `shape` {self.shape} does not fit kernel {self.kernel_name!r} "
                f"({type(exc).__name__}: {exc}); give every dim of e.g. {kernel.shapes('v4flash')[0]}"
            )
            return report
        import triton

        report.facts.update(
            {
                "kernel": self.kernel_name,
                "shape_key": key,
                "dtype": self.dtype,
                "triton": triton.__version__,
                "cost": f"{cost.bytes / 1e6:.2f} MB, {cost.flops / 1e9:.3f} GFLOP",
                "device": hw.gpu_name if hw.gpu_count else "cpu (no CUDA GPU)",
            }
        )
        space_fields = set(kernel.config_space(self.shape))
        for p in self.space.params:
            field = p.kernel.split(".", 1)[-1] if p.kernel else p.name
            if field not in space_fields:
                report.errors.append(
                    f"parameter `{p.name}` is not a config field of kernel {self.kernel_name!r}; "
                    f"fields are {sorted(space_fields)}"
                )
        why = kernel.check_config(
            kernel.fit_dtype(kernel.default_config(self.shape), self.shape, self.dtype),
            self.shape,
            None,
            dtype=self.dtype,
        )
        if why:
            report.errors.append(f"the default config of {self.kernel_name!r} fails its own rule at {key}: {why}")
        report.rules.append(
            f"{self.kernel_name}.check_config rules prune a config before it is compiled "
            "(outcome invalid_config, no subprocess)"
        )
        report.rules.append(
            "correctness gate: fresh random inputs, NaN-poisoned output, reference within "
            f"tolerance {kernel.tolerance(self.dtype):g}, else wrong_result (never a winner)"
        )
        if not hw.gpu_count:
            if self.allow_cpu:
                report.will_not_run.append(
                    "timing: no CUDA GPU; the Triton interpreter checks correctness and the "
                    "value is its wall time, which says nothing about GPU speed (tests only)"
                )
            else:
                report.errors.append(
                    "no CUDA GPU: the kernels target times Triton kernels on a GPU; on a CPU the "
                    "Triton interpreter can check correctness but cannot time. Run on a GPU host "
                    "(or, for tests only, --set allow_cpu_interpreter=true)"
                )
        return report

    def canonical_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """The kernel's ``canonical_config`` of ``params``' config, read back into the searched parameters (GEMM:
        GROUP_M is 1 wherever there is one row block)."""
        config = self.config_of(params)
        canonical = self.kernel.canonical_config(config, self.shape)
        if canonical == config:
            return params
        by_name = {p.name: p for p in self.space.params}
        out = dict(params)
        for name in params:
            p = by_name.get(name)
            field = p.kernel.split(".", 1)[-1] if p is not None and p.kernel else name
            out[name] = canonical.get(field, params[name])
        return out

    def check(self, params: dict[str, Any]) -> str | None:
        why = super().check(params)
        if why:
            return why
        try:
            return self.kernel.check_config(
                self.config_of(params), self.shape, self._device_for_rules(), dtype=self.dtype
            )
        except Exception as exc:  # noqa: BLE001 - a rule that cannot be evaluated is a reason too
            return f"check_config failed: {type(exc).__name__}: {exc}"

    def evaluate(self, params: dict[str, Any], deadline: float, report: Reporter | None = None) -> Measurement:
        import torch

        if not torch.cuda.is_available():
            if not self.allow_cpu:
                return Measurement.failed(
                    Outcome.CRASH,
                    "no CUDA GPU in the trial process; the kernels target cannot time on a CPU (see preflight)",
                )
            os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module defines its @triton.jit
            return self._evaluate(params, deadline, report, "cpu")
        return self._evaluate(params, deadline, report, "cuda")

    def _evaluate(self, params, deadline, report, device) -> Measurement:
        from kernels.base import check as check_once
        from kernels.base import classify_failure

        kernel = self.kernel
        config = self.config_of(params)
        why = kernel.check_config(config, self.shape, device if device == "cuda" else None, dtype=self.dtype)
        if why:
            return Measurement.failed(Outcome.INVALID_CONFIG, why)
        t0 = time.time()
        try:
            err = check_once(kernel, self.shape, self.dtype, config, device, self.seed)
        except Exception as exc:  # noqa: BLE001 - compile errors, OutOfResources, bad launches: data
            return Measurement.failed(Outcome(classify_failure(exc)), f"{type(exc).__name__}: {exc}"[:2000])
        first_s = time.time() - t0
        tol = kernel.tolerance(self.dtype)
        if not err <= tol:
            return Measurement.failed(
                Outcome.WRONG_RESULT,
                f"rel. error {err:.3g} > tolerance {tol:.3g} on fresh "
                f"inputs (seed {self.seed}) with a NaN-poisoned output",
            )
        if time.time() >= deadline:
            return Measurement.failed(Outcome.TIMEOUT, f"first launch took {first_s:.1f}s; no time left to time it")
        try:
            timing = self._time(config, device)
        except Exception as exc:  # noqa: BLE001
            return Measurement.failed(Outcome(classify_failure(exc)), f"timing: {type(exc).__name__}: {exc}"[:2000])
        return self._measurement(timing, err, first_s, device)

    def compare_library(self, config: dict[str, Any], device: str) -> dict[str, Any]:
        """``config`` and the kernel's library path (``kernel.torch_baseline``, named by ``kernel.library_impl``)
        measured the same way in this process: each checked once on the correctness inputs against the reference,
        then timed by the same bench on the same input sets, Triton first, the library second."""
        from kernels.base import check as check_once
        from kernels.base import rel_error

        kernel = self.kernel
        if kernel.library_impl is None:
            raise TargetError(f"kernel {self.kernel_name!r} names no library implementation to compare with")
        tol = kernel.tolerance(self.dtype)
        err = check_once(kernel, self.shape, self.dtype, config, device, self.seed)
        inputs = kernel.make_inputs(self.shape, self.dtype, device, self.seed)
        lib_err = rel_error(kernel.torch_baseline(inputs), kernel.reference(inputs))
        out: dict[str, Any] = {
            "library_impl": kernel.library_impl,
            "rel_error": err,
            "library_rel_error": lib_err,
            "tolerance": tol,
        }
        out["triton_us"] = self._time(config, device)["median"] if err <= tol else None
        out["library_us"] = self._time(config, device, library=True)["median"] if lib_err <= tol else None
        return out

    def _time(self, config: dict, device: str, library: bool = False) -> dict[str, Any]:
        """Time ``config`` (or, with ``library``, the kernel's library path on the same input sets)."""
        kernel = self.kernel
        recorded = kernel.recorded_time_us(config, self.shape) if device != "cuda" and not library else None
        if recorded is not None:
            # replay: a kernel that carries recorded GPU timings (tests, strategy studies) answers from its table
            us = float(recorded)
            return {
                "median": us,
                "p20": us * 0.995,
                "p80": us * 1.005,
                "n": 1,
                "graph": True,
                "spread": 0.01,
                "sets": 1,
                "replay": True,
            }
        n_sets = max(1, min(ROTATE_MAX, int(ROTATE_BYTES // max(kernel.rotation_bytes(self.shape, self.dtype), 1.0))))
        sets = []
        for i in range(n_sets):
            inputs = kernel.make_inputs(self.shape, self.dtype, device, self.seed + 1 + i)
            sets.append((inputs, kernel.output_like(inputs)))

        def call(item):
            inputs, out = item
            if library:
                return kernel.torch_baseline(inputs)
            return kernel.run(inputs, config) if out is None else kernel.run(inputs, config, out=out)

        if device == "cuda":
            from kernels.bench import do_bench

            t = do_bench(call, sets, rep_ms=self.config.rep_ms)
            return {
                "median": t.median_us,
                "p20": t.p20_us,
                "p80": t.p80_us,
                "n": t.n,
                "graph": t.graph,
                "spread": t.spread,
                "sets": n_sets,
            }
        samples = []  # the interpreter: wall time of whole calls, for tests only
        call(sets[0])  # warm-up outside the timing, as on a GPU (first-call set-up is not the call's time)
        for i in range(3):
            s = time.perf_counter()
            call(sets[i % n_sets])
            samples.append((time.perf_counter() - s) * 1e6)
        samples.sort()
        med = statistics.median(samples)
        return {
            "median": med,
            "p20": samples[0],
            "p80": samples[-1],
            "n": 3,
            "graph": False,
            "spread": (samples[-1] - samples[0]) / med if med > 0 else math.inf,
            "sets": n_sets,
        }

    def _measurement(self, t: dict[str, Any], err: float, first_s: float, device: str) -> Measurement:
        cost = self.kernel.cost(self.shape, self.dtype)
        us = t["median"]
        peak_b = self.config.peak_bytes_per_s
        peak_f = self.config.peak_flops
        floor = cost.floor_us(peak_b, peak_f)
        metrics = [
            MetricRow("time_us", "", us, "us"),
            MetricRow("p20_us", "", t["p20"], "us"),
            MetricRow("p80_us", "", t["p80"], "us"),
            MetricRow("spread", "", t["spread"], "ratio"),
            MetricRow("samples", "", float(t["n"]), "count"),
            MetricRow("cuda_graph", "", float(bool(t["graph"])), "bool"),
            MetricRow("input_sets", "", float(t["sets"]), "count"),
            MetricRow("first_launch_s", "", first_s, "s"),
            MetricRow("rel_error", "", err, "ratio"),
            MetricRow("achieved_GBps", "", cost.bytes / (us * 1e-6) / 1e9, "GB/s"),
            MetricRow("achieved_TFLOPs", "", cost.flops / (us * 1e-6) / 1e12, "TFLOP/s"),
            MetricRow("roofline_floor_us", "", floor, "us"),
            MetricRow("roofline_frac", "", floor / us if us > 0 else 0.0, "ratio"),
        ]
        level = self.space.objective.level or (self.space.objective.levels[0] if self.space.objective.levels else 1)
        reason = (
            ""
            if device == "cuda"
            else (
                "replayed recorded time"
                if t.get("replay")
                else "interpreter wall time on a CPU: correctness only, not a GPU speed"
            )
        )
        return Measurement(outcome=Outcome.OK, value=us, metrics=metrics, by_level={int(level): us}, reason=reason)

    def launch_spec(self, params: dict[str, Any]) -> LaunchSpec:
        argv = [
            sys.executable,
            "-m",
            "tuner.targets.kernels",
            "--kernel",
            self.kernel_name,
            "--shape",
            json.dumps(self.shape, sort_keys=True),
            "--dtype",
            self.dtype,
            "--config",
            json.dumps(self.config_of(params), sort_keys=True),
        ]
        return LaunchSpec(argv=argv, description=f"re-measure {self.kernel_name} at {self.shape} ({self.dtype})")

    def kernel_config_dirs(self) -> list[str]:
        d = self.config.kernel_config_dir
        return [d] if d else []


def main(argv: list[str] | None = None) -> int:
    """Re-measure one config (the launch spec of a kernels study); prints the measurement as JSON."""
    ap = argparse.ArgumentParser(prog="python -m tuner.targets.kernels", description=main.__doc__)
    ap.add_argument("--kernel", required=True)
    ap.add_argument("--shape", required=True, help="JSON mapping of dims")
    ap.add_argument("--config", required=True, help="JSON mapping of config fields")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--allow-cpu-interpreter", action="store_true")
    ap.add_argument(
        "--compare-library",
        action="store_true",
        help="time the config and the kernel's library path (torch) the same way; print both as JSON",
    )
    args = ap.parse_args(argv)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and args.allow_cpu_interpreter:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports Triton (detect_hardware does)
    from search_spaces import detect_hardware, load_space_text, resolve

    config = json.loads(args.config)
    lines = [
        "name: remeasure",
        "target: kernels",
        "objective: {metric: time_us, direction: minimize, combine: level, levels: [1], level: 1, unit: us}",
        "params:",
    ]
    lines += [f"  {k}: {{type: categorical, values: [{v}], default: {v}}}" for k, v in config.items()]
    space = load_space_text("\n".join(lines))
    target = KernelsTarget(
        resolve(space, detect_hardware()),
        {
            "kernel": args.kernel,
            "shape": args.shape,
            "dtype": args.dtype,
            "allow_cpu_interpreter": args.allow_cpu_interpreter,
        },
    )
    if args.compare_library:
        if device == "cpu" and not args.allow_cpu_interpreter:
            print(
                "error: --compare-library on a CPU runs Triton's interpreter; pass --allow-cpu-interpreter "
                "(tests) or run it on a GPU host",
                file=sys.stderr,
            )
            return 2
        print(json.dumps(target.compare_library(config, device)))
        return 0
    m = target.evaluate(config, time.time() + 600)
    print(json.dumps(m.to_json(), indent=1))
    return 0 if m.outcome is Outcome.OK else 1


if __name__ == "__main__":
    sys.exit(main())
