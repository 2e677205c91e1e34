"""The built-in decode workload as a target: no server, no weights; random weights, real ops, real timings."""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from search_spaces import ResolvedSpace
from storage.types import MetricRow
from tuner.errors import KnobError
from tuner.figures.verification import VerifyResult
from tuner.measurement import Measurement, Outcome
from tuner.settings import CommonSettings
from tuner.targets.base import Deployment, LaunchSpec, PreflightReport, Reporter, Target
from tuner.targets.workload.model import DEFAULT_KNOBS
from tuner.targets.workload.presets import get_preset

_logger = logging.getLogger(__name__)


class WorkloadSettings(CommonSettings):
    """Settings of the built-in workload."""

    preset: str | None = None
    """Model dimensions (``dsv4-flash``, ``dsv4-flash-tiny``); default: the space's ``preset``."""
    live_context: int = Field(512, ge=1)
    """Tokens each request holds when a step is timed (the context cap bounds what the step may allocate)."""
    warmup: int = Field(2, ge=0)
    """Untimed steps before timing, per level."""
    repeats: int = Field(5, ge=1)
    """Timed steps per level (the median is kept)."""
    numerics: bool = True
    """Compare each trial's step output with the precise reference's (float32 GEMMs, torch operators; the same
    weights and fixed inputs); beyond the tolerance of its dtype family the trial is ``wrong_result``."""
    numerics_tolerance: dict[str, float] = Field(default_factory=dict)
    """Relative norm error allowed per dtype family (fp32, tf32, fp16, bf16, fp8), over the defaults of
    ``tuner.targets.workload.numerics.DEFAULT_TOLERANCE``."""
    persistent_worker: bool = True
    """Run trials one after another in a long-lived worker per GPU set (torch and Triton imported once, the
    weights of a preset built once, compiled kernels kept); false: a fresh process per trial."""
    numerics_batch: int = Field(2, ge=1)
    """Requests in the numerics step. 2 keeps the torch MoE on its exact path (a larger batch sends it to its
    fixed-capacity path, which drops pairs over capacity: an error of the baseline itself)."""

    @field_validator("numerics_tolerance")
    @classmethod
    def _known_families(cls, v: dict[str, float]) -> dict[str, float]:
        from tuner.targets.workload.numerics import FAMILIES

        for fam, tol in v.items():
            if fam not in FAMILIES:
                raise ValueError(f"unknown dtype family {fam!r} (use {', '.join(FAMILIES)})")
            if not tol > 0:
                raise ValueError(f"the tolerance of {fam} must be > 0, but got {tol!r}")
        return v


class WorkloadTarget(Target):
    """A DeepSeek-V4-Flash-shaped decode step (``tuner.targets.workload.model``) measured at each concurrency level."""

    name = "workload"
    baseline_runs = 2
    Settings = WorkloadSettings
    config: WorkloadSettings

    @classmethod
    def verify_export(
        cls,
        path: Path,
        recorded: dict[str, Any],
        *,
        tolerance: float = 0.15,
        timeout_s: float = 3600.0,
        settings: dict[str, Any] | None = None,
    ) -> VerifyResult:
        from tuner.targets.workload.verify import verify_workload

        return verify_workload(path, recorded, tolerance, timeout_s)

    def __init__(self, resolved: ResolvedSpace, settings: dict[str, Any] | None = None) -> None:
        super().__init__(resolved, settings)
        self.preset = get_preset(self.config.preset or self.space.preset)
        self.gpus_per_trial = 1 if resolved.hardware.gpu_count else 0
        self.persistent_worker = self.config.persistent_worker

    def preflight(self) -> PreflightReport:
        report = super().preflight()
        hw = self.resolved.hardware
        report.facts.update(
            {
                "preset": self.preset.name,
                "device": hw.gpu_name if hw.gpu_count else "cpu (no CUDA GPU: Triton kernels and CUDA graphs inactive)",
                "levels": list(self.space.objective.levels),
                "objective": self.space.objective.describe(),
                "live_context": self.config.live_context,
            }
        )
        flags = [f"{p.name} -> {p.server.name}" for p in self.space.params if p.server and p.server.name]
        flagless = [p.name for p in self.space.params if p.server and not p.server.name]
        if flags or flagless:
            report.facts["sglang counterparts"] = ", ".join(flags) + (
                f"; no SGLang flag: {', '.join(flagless)}" if flagless else ""
            )
        for p in self.space.params:
            if not (p.flag or p.kernel or p.env) and p.name not in DEFAULT_KNOBS and p.name != "cuda_graph_buckets":
                report.errors.append(
                    f"parameter `{p.name}` is not a knob of the workload; knobs are "
                    f"{sorted([*DEFAULT_KNOBS, 'cuda_graph_buckets'])}"
                )
        if "context_length" in self.space.names:
            too_big = [v for v in self.space.param("context_length").choices() if v > self.preset.max_context]
            if too_big:
                report.errors.append(
                    f"`context_length` values {too_big} exceed preset {self.preset.name}'s max "
                    f"context {self.preset.max_context}; drop them or use another preset"
                )
        return report

    def check(self, params: dict[str, Any]) -> str | None:
        """Constraints, then the attention kernel's own rules at every shape the levels produce, before any
        subprocess or compile is spent on a configuration that cannot run."""
        reason = super().check(params)
        if not reason and params.get("attention_impl") == "wgmma":
            p = self.preset
            if p.heads > 64 or p.head_dim != 512:
                return (
                    f"attention_impl=wgmma runs 64 heads of 512 columns (V4-Flash); preset {p.name} has "
                    f"{p.heads} heads of {p.head_dim}: use mma"
                )
            return None
        if reason or params.get("attention_impl") not in ("mma", "simt"):
            return reason
        fields = {
            p.kernel.split(".", 1)[1]: params[p.name]
            for p in self.space.params
            if p.kernel and p.kernel.startswith("sparse_decode.") and p.name in params
        }
        if not fields or params["attention_impl"] != "mma":
            return None
        try:
            from kernels.sparse_decode import SparseDecodeKernel
        except ImportError:  # no Triton here: the trial itself will say so
            return None
        kernel, p = SparseDecodeKernel.instance, self.preset
        live = self.config.live_context
        rows = {"window": p.window, "hca": -(-live // p.hca_ratio) + p.window, "csa": p.index_topk + p.window}
        for c in self.space.objective.levels:
            for kind, topk in rows.items():
                shape = {
                    "batch": c,
                    "heads": p.heads,
                    "d_qk": p.head_dim,
                    "d_v": p.head_dim,
                    "topk": topk,
                    "num_rows": 1 << 20,
                }
                why = kernel.check_config({**kernel.default_config(shape), **fields}, shape)
                if why:
                    return f"sparse_decode cannot run at batch {c} ({kind} layers, {topk} rows): {why}"
        return None

    def evaluate(self, params: dict[str, Any], deadline: float, report: Reporter | None = None) -> Measurement:
        import torch

        from tuner.targets.workload.bench import measure
        from tuner.targets.workload.model import DecodeModel

        device = "cuda" if torch.cuda.is_available() else "cpu"
        knobs = self._knobs(params)
        t0 = time.time()
        try:
            model = DecodeModel(self.preset, knobs, device, seed=self.config.seed)
        except KnobError as exc:
            return Measurement.failed(Outcome.INVALID_CONFIG, str(exc))
        times = [
            MetricRow("trial_time_s", "build", time.time() - t0, "s"),
            MetricRow("weights_reused", "", float(model.weights_reused), ""),
        ]
        gate: list[MetricRow] = []
        if self.config.numerics:
            t0 = time.time()
            gate, wrong = self._numerics(model, knobs)
            times.append(MetricRow("trial_time_s", "numerics", time.time() - t0, "s"))
            if wrong:
                return Measurement(outcome=Outcome.WRONG_RESULT, reason=wrong, metrics=gate + times)
        obj = self.space.objective
        try:
            res = measure(
                model,
                list(obj.levels),
                live_context=self.config.live_context,
                warmup=self.config.warmup,
                repeats=self.config.repeats,
                buckets=params.get("cuda_graph_buckets"),
                deadline=deadline,
                report=report,
            )
        except TimeoutError as exc:
            return Measurement.failed(Outcome.TIMEOUT, str(exc))
        by_level = {lv.concurrency: lv.tok_s for lv in res.levels}
        times += [MetricRow("trial_time_s", phase, v, "s") for phase, v in res.phases().items()]
        m = Measurement(outcome=Outcome.OK, metrics=res.metrics() + gate + times, by_level=by_level)
        if len(by_level) == len(obj.levels):
            m.value = obj.combine_values(by_level)
        else:
            m.outcome, m.reason = Outcome.PRUNED, f"stopped after levels {sorted(by_level)}"
        return m

    def worker_reusable(self, measurement: Measurement) -> bool:
        """A numerics failure retires the worker too: a configuration whose output is wrong may have written where
        it should not (the weights kept for the next trial are fingerprinted, but not everything a process holds)."""
        return measurement.outcome is not Outcome.WRONG_RESULT

    def _knobs(self, params: dict[str, Any]) -> dict[str, Any]:
        knobs = dict(params)
        for p in self.space.params:  # kernel params travel as "kernel.field" knobs
            if p.kernel and p.name in params:
                knobs[p.kernel] = params[p.name]
        return knobs

    def _numerics(self, model, knobs: dict[str, Any]) -> tuple[list[MetricRow], str]:
        """The numerics gate: this configuration's step output against the precise reference's on the same weights
        and inputs (:mod:`tuner.targets.workload.numerics`). Returns the metric rows and a reason when beyond the
        tolerance (``""`` when within)."""
        from tuner.targets.workload import numerics as nm

        baseline = nm.normalized(self.preset, self._knobs(self.resolved.defaults()))
        reference = nm.reference_knobs(self.preset, baseline)
        cfg = self.config
        at = dict(seed=cfg.seed, batch=cfg.numerics_batch, live_context=cfg.live_context)
        ref = nm.reference_output(self.preset, reference, model.device, own=model, **at)
        # the baseline's output too (the baseline trial, run first, writes it): a configuration as close to the
        # reference as the deployment's own path is right enough (`tolerance_for`)
        base_out = nm.reference_output(self.preset, baseline, model.device, own=model, **at)
        if model.knobs == reference:
            out = ref
        elif model.knobs == baseline:
            out = base_out
        else:
            out = nm.step_output(model, cfg.numerics_batch, cfg.live_context)
        err = nm.rel_err(out, ref)
        base_err = nm.rel_err(base_out, ref)
        family = nm.dtype_family(model.knobs, model.device)
        tol = nm.tolerance_for(family, cfg.numerics_tolerance, base_err if math.isfinite(base_err) else 0.0)
        rows = [
            MetricRow("numerics_rel_err", "", err if math.isfinite(err) else 1e30, ""),
            MetricRow("numerics_tolerance", "", tol, ""),
            MetricRow("numerics_baseline_err", "", base_err if math.isfinite(base_err) else 1e30, ""),
        ]
        _logger.info("numerics: rel. error %.3g vs the reference (tolerance %.3g, %s family)", err, tol, family)
        if err <= tol:
            return rows, ""
        return rows, (
            f"output differs from the precise reference's (float32 GEMMs, torch operators) by rel. norm error "
            f"{err:.3g} > tolerance {tol:.3g} ({family} family; setting numerics_tolerance)"
        )

    def kernel_shapes(self) -> list[tuple]:
        """The kernel shapes this space's configurations produce: every concurrency level (as the batch, and as
        padded to each bucket size it can take) for the MMA attention and the fused MoE, the indexer at every
        context cap, the Gluon attention where ``attention_impl=wgmma`` can run, both attentions again on an fp8
        cache where ``kv_cache_dtype=fp8_e4m3`` can run (``(kernel, shape, "float8_e4m3fn")``), and, with the
        ``gemm_impl`` knob, the linears' GEMMs (and at batch 1 their GEMVs)."""
        p, live = self.preset, self.config.live_context
        from search_spaces.buckets import level_batches

        order = level_batches(self.space)  # the measured levels' own batches before the bucket paddings
        widths = {-(-live // p.csa_ratio)}
        if "context_length" in self.space.names:
            widths |= {p.indexer_width(int(c)) for c in self.space.param("context_length").choices()}
        # in the order a kernel phase short of budget should tune them: one attention and one MoE case per batch
        # before the indexer at each of its widths
        shapes: list[tuple] = []

        def attention(b: int) -> dict[str, int]:
            return {
                "batch": b,
                "heads": p.heads,
                "d_qk": p.head_dim,
                "d_v": p.head_dim,
                "topk": p.index_topk + p.window,
                "num_rows": 1 << 16,
            }

        for b in order:
            shapes.append(("sparse_decode", attention(b)))
            if "moe_impl" in self.space.names:
                shapes.append(
                    (
                        "moe",
                        {
                            "tokens": b,
                            "hidden": p.hidden,
                            "width": p.expert_width,
                            "experts": p.experts_local,
                            "topk": p.topk_experts,
                        },
                    )
                )
        for b in order:
            shapes += [
                ("indexer", {"batch": b, "heads": p.indexer_heads, "dim": p.indexer_dim, "width": w, "shared_k": 0})
                for w in sorted(widths)
            ]
        impls = self._choices("attention_impl")
        wgmma = "wgmma" in impls and p.heads <= 64 and p.head_dim == 512  # other presets refuse the value (check)
        if wgmma:
            # the Gluon kernel, where this GPU runs it (the space dropped the value elsewhere): after the indexer,
            # since its default configs already name the sweeps' fastest partitions at batch 1, 16 and 64
            shapes += [("sparse_decode_wgmma", attention(b)) for b in order]
        if "fp8_e4m3" in self._choices("kv_cache_dtype"):  # after the bf16 cases: the cache a search keeps less often
            fp8 = "float8_e4m3fn"
            shapes += [("sparse_decode", attention(b), fp8) for b in order if "mma" in impls]
            shapes += [("sparse_decode_wgmma", attention(b), fp8) for b in order if wgmma]
        if "gemm_impl" in self.space.names:  # last: the linears' (N, K) in bf16, whose entries gemm_impl=auto follows
            for b in order:
                shapes += [("gemm", {"M": b, "N": n, "K": k}) for n, k in dict.fromkeys(self.gemm_shapes())]
            if 1 in order:  # at one row auto may run the GEMV instead, where it beat the library by more
                shapes += [("gemv", {"M": 1, "N": n, "K": k}) for n, k in dict.fromkeys(self.gemm_shapes())]
        return shapes

    def _choices(self, name: str) -> tuple:
        """The values parameter ``name`` takes on this machine (its one value where the space fixes it)."""
        par = {q.name: q for q in self.resolved.params}.get(name)
        return tuple(par.choices()) if par else (self.resolved.fixed.get(name),)

    def gemm_shapes(self) -> list[tuple[int, int]]:
        """(N, K) of the twin's bf16-family linears: the attention projections and the shared expert."""
        p = self.preset
        return [
            (p.q_lora, p.hidden),
            (p.heads * p.head_dim, p.q_lora),
            (p.head_dim, p.hidden),
            (p.hidden, p.o_groups * p.o_lora),
            (2 * p.expert_width, p.hidden),
            (p.hidden, p.expert_width),
        ]

    def kernel_config_dirs(self) -> list[str]:
        import os

        d = self.config.kernel_config_dir or os.environ.get("TUNER_KERNEL_CONFIG_DIR")
        return [str(d)] if d else []

    def side_by_side(self, best_params: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The exported command's configuration (``server_map.command_config``: every value the command cannot give
        on this GPU replaced by what SGLang runs), when it differs from the best and runs here."""
        from tuner.targets.workload.server_map import command_config

        cmd = command_config(self.space, best_params, self.resolved.hardware.arch)
        if not cmd.changes:
            return []
        why = (
            self.check(cmd.params)
            or next(
                (
                    f"`{p.name}={cmd.params[p.name]}` cannot run here"
                    for p in self.resolved.params
                    if p.name in cmd.params and cmd.params[p.name] not in p.choices()
                ),
                None,
            )
            or next(
                (
                    f"`{n}={cmd.params[n]}` cannot run here"
                    for n, v in self.resolved.fixed.items()
                    if n in cmd.params and cmd.params[n] != v
                ),
                None,
            )
        )
        if why:
            # launch.sh says it ("this command: not measured"); a value the best does not use is no warning
            _logger.info("the exported command's configuration is not measured beside the best: %s", why)
            return []
        return [("the exported command's configuration", cmd.params)]

    def plugin_measurements(self, params: dict[str, Any]) -> list[list[str]]:
        """V4's decode q path (SGLang's JIT ``fused_q_norm_rope``, which the plug-in's Triton kernel can replace) at
        the objective's batch sizes, where the exported command runs SGLang's glue and this GPU can build SGLang's
        kernel beside ours (a record timed beside a stand-in never ships)."""
        from tuner.targets.workload.ops import NORM_EPS
        from tuner.targets.workload.server_map import command_config

        hw = self.resolved.hardware
        if not {"triton", "sglang_jit"} <= hw.capabilities:  # sglang_jit: a GPU that builds SGLang's kernel
            return []
        if command_config(self.space, params, hw.arch).params.get("glue") != "sglang":
            return []
        p = self.preset
        return [
            [
                "--batches",
                *[str(c) for c in self.space.objective.levels],
                "--heads",
                str(p.heads),
                "--head-dim",
                str(p.head_dim),
                "--rope-dim",
                str(p.rope_dim),
                "--eps",
                repr(NORM_EPS),
            ]
        ]

    def deployment(
        self, params: dict[str, Any], *, environment: dict[str, Any] | None, repo: Any, run_id: int
    ) -> Deployment:
        """SGLang's launch command for ``params`` (:func:`tuner.targets.workload.deploy.deployment`), for the GPU
        architecture the study ran on."""
        from search_spaces.hardware import arch_of_environment
        from tuner.targets.workload.deploy import command_config, command_stage_best, deployment, read_ablation

        arch = arch_of_environment(environment)
        staged = command_stage_best(
            repo,
            run_id,
            self.space.objective.direction != "minimize",
            self.space,
            arch,
            command_config(self.space, params, arch),
        )
        return deployment(self.space, params, arch, read_ablation(repo, run_id), staged=staged)

    def launch_spec(self, params: dict[str, Any]) -> LaunchSpec:
        argv = [
            sys.executable,
            "-m",
            "tuner.targets.workload.run",
            "--preset",
            self.preset.name,
            "--levels",
            ",".join(map(str, self.space.objective.levels)),
            "--live-context",
            str(self.config.live_context),
            "--repeats",
            str(self.config.repeats),
        ]
        for k, v in params.items():
            argv += ["--knob", f"{k}={v}"]
        return LaunchSpec(argv=argv, description="re-measure the best decode configuration of the built-in workload")
