"""Kernel tuning: one Optuna sub-study per kernel × shape bucket, winners written as tuned-config files.

Flow (one way): a kernels plan (``search_spaces/kernels_dsv4_flash.yaml``: which kernels, their model dims, the
batch buckets) -> a list of :class:`KernelCase` (kernel, shape, dtype) -> for each case: the persistent cache (the
tuned-config file of this kernel × GPU × dtype × Triton version already holds the shape key: reused, not re-tuned,
unless ``retune``) -> else a generated single-kernel space (every field of ``kernel.config_space(shape)`` a
categorical whose default is the kernel's known-good default, so the baseline trial is the default config) -> a
sub-study ``f"{study}.{kernel}.{shape_key}"`` in the same storage, opened with :func:`tuner.search.open_context`
and run trial by trial with :func:`tuner.search.run_one` on a share of the budget -> the top few configs and the
default re-timed -> the winner (:func:`tuner.search.winner.pick_best`, the median over its runs) kept only if it beats
the default by more than the measured spread -> for a kernel with a library path (``kernel.library_impl``: the
GEMM's cuBLAS through torch) the winner and the library timed side by side, the faster named as the entry's ``impl``
(:func:`compare_library`) -> the entry written with :func:`kernels.configs.write_config_file`
into ``<out>/kernel_configs/`` and, where configured, ``kernel_config_dir`` / ``$TUNER_KERNEL_CONFIG_DIR``.

A system search calls :func:`kernel_phase` with the shapes its parameters produce.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import statistics
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import optuna
import yaml

from search_spaces import Space, load_space
from tuner.errors import SearchError, TargetError
from tuner.execution.compile_ahead import CompileAhead, default_helpers
from tuner.search import refine
from tuner.search.context import (
    CONFIRM_ATTR,
    MAX_REPEATS_IN_A_ROW,
    Progress,
    SearchContext,
    SearchOptions,
    make_sampler,
    open_context,
)
from tuner.search.trial import run_one
from tuner.search.winner import beats_beyond, group_runs, pick_best
from tuner.targets.base import PreflightReport
from tuner.targets.kernels import KernelsSettings, load_kernel, parse_shape

_logger = logging.getLogger(__name__)

DEFAULT_PLAN = "kernels_dsv4_flash"
CONFIG_SUBDIR = "kernel_configs"
SPACE_SUBDIR = "kernel_spaces"
ENV_VAR = "TUNER_KERNEL_CONFIG_DIR"
PASS_THROUGH = (
    "seed",
    "allow_cpu_interpreter",
    "rep_ms",
    "peak_bytes_per_s",
    "peak_flops",
    "trial_timeout_s",
    "kernel_config_dir",
    "persistent_worker",
    "compile_ahead",
)
"""Plan / search settings handed on to every single-kernel sub-study."""
MIN_SHARE_S = 20.0
"""The least time a case is tuned for. Its first trial pays the default's compile, reference check and timing (and,
for the first case, the trial worker's start: ~4 s for Python, torch and CUDA on the H200 host); with 5 s shares a
system search's kernel phase on the H200 measured nothing (every default cut at the share's end)."""
SEED_ATTR = "kernel_seed"
"""User attribute of the trials that try a kernel's ``seed_configs`` (enqueued after the default)."""
FAILURES_TO_GIVE_UP = 20
COMPILE_WAIT_S = 120.0
"""How long a trial waits for its config's compile in a helper before compiling for itself."""


@dataclass(frozen=True)
class KernelCase:
    """One thing to tune: a kernel at one shape and dtype."""

    kernel: str
    shape: dict[str, int]
    dtype: str = "bfloat16"

    @property
    def shape_key(self) -> str:
        return load_kernel(self.kernel).shape_key(self.shape)


@dataclass
class KernelCaseResult:
    kernel: str
    shape: dict[str, int]
    dtype: str
    shape_key: str
    status: str
    """``tuned`` (a config beat the default), ``default_kept`` (nothing beat it beyond the spread), ``cached``
    (reused from an earlier search), ``failed`` (no correct timing, not even the default), ``skipped``."""
    config: dict[str, Any] | None = None
    time_us: float | None = None
    default_time_us: float | None = None
    spread: float | None = None
    study: str = ""
    trials: int = 0
    evaluated: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    reason: str = ""
    elapsed_s: float = 0.0
    impl: str | None = None
    """For a kernel with a library path (``kernel.library_impl``): what the entry ships, the library's name or
    ``triton``, whichever measured faster beside the other (:func:`compare_library`); None: not compared."""
    library_time_us: float | None = None
    impl_triton_time_us: float | None = None
    """The tuned config's time measured beside the library's (same process, bench and inputs)."""

    @property
    def speedup(self) -> float | None:
        if self.time_us and self.default_time_us:
            return self.default_time_us / self.time_us
        return None

    def entry(self) -> dict[str, Any]:
        """The tuned-config file entry of this case; ``source`` names the study it came from (every shipped entry
        has one: ``kernels/tuned/`` is written by this search only)."""
        entry = {
            "config": self.config,
            "time_us": self.time_us,
            "default_time_us": self.default_time_us,
            "spread": self.spread,
            "status": self.status,
            "study": self.study,
            "trials": self.trials,
            "tuned_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "source": f"kernel search study {self.study} (tuner search --target kernels)",
        }
        if self.impl is not None:  # read by kernels.configs.tuned_impl (kernels.linear.linear(impl="auto"))
            entry.update(
                impl=self.impl, library_time_us=self.library_time_us, impl_triton_time_us=self.impl_triton_time_us
            )
        return entry


@dataclass
class KernelSearchResult:
    study: str
    storage_url: str
    state: str
    cases: list[KernelCaseResult]
    config_dir: str | None
    preflight: PreflightReport
    elapsed_s: float
    stop_reason: str = ""
    written: list[str] = field(default_factory=list)
    compile_ahead: str = ""
    """What the compile helpers did (empty when there were none)."""

    @property
    def export_dir(self) -> str | None:
        return self.config_dir

    def summary_lines(self) -> list[str]:
        out = [
            f"kernel search {self.state} after {self.elapsed_s:.0f}s"
            + (f" ({self.stop_reason})" if self.stop_reason else "")
            + f": {len(self.cases)} kernel x shape cases"
        ]
        for c in self.cases:
            t = f"{c.time_us:.2f} us" if c.time_us is not None else "-"
            d = f", default {c.default_time_us:.2f} us" if c.default_time_us is not None else ""
            x = f" = {c.speedup:.2f}x" if c.speedup and c.status == "tuned" else ""
            out.append(
                f"  {c.kernel} [{c.shape_key}] {c.dtype}: {c.status} {t}{d}{x}; "
                f"{c.evaluated} configs run of {c.trials} trials" + (f"; {c.reason}" if c.reason else "")
            )
            if c.status == "tuned" and c.config:
                out.append(f"      config {c.config}")
            if c.impl is not None:
                lib = f"{c.library_time_us:.2f} us" if c.library_time_us is not None else "not correct"
                tri = f"{c.impl_triton_time_us:.2f} us" if c.impl_triton_time_us is not None else "not correct"
                out.append(f"      ships {c.impl}: library {lib}, tuned Triton {tri} (measured side by side)")
        if self.compile_ahead:
            out.append(self.compile_ahead)
        if self.config_dir:
            out.append(f"tuned-config files: {self.config_dir} (export {ENV_VAR}={self.config_dir})")
        return out


# -- the plan ------------------------------------------------------------------------------------------------
def is_kernel_plan(options: SearchOptions) -> bool:
    """True when ``options`` ask for a kernels plan search (not a single-kernel space): the hook in run_search."""
    if options.space_path is None:
        return options.target == "kernels"
    try:
        space = load_space(options.space_path)
    except Exception:  # noqa: BLE001 - the normal path reports a broken space
        return False
    return space.target == "kernels" and "kernels" in space.settings


def _expand_dims(dims: Any, where: str) -> list[dict[str, Any]]:
    items = dims if isinstance(dims, list) else [dims]
    out = []
    for item in items:
        if not isinstance(item, dict):
            raise SearchError(f"{where}: `dims` must be a mapping or a list of mappings, but got {item!r}")
        keys = list(item)
        values = [v if isinstance(v, list) else [v] for v in item.values()]
        out += [dict(zip(keys, combo)) for combo in itertools.product(*values)]
    return out


def plan_cases(space: Space, *, batches: Iterable[int] | None = None) -> list[KernelCase]:
    """Every (kernel, shape, dtype) of a kernels plan: each kernel's dims at every batch bucket (``batch`` param)."""
    plan = KernelsSettings.parse(space.settings, owner=f"the kernels plan {space.source}")
    kernels = plan.kernels
    if not kernels:
        raise SearchError(
            f"{space.source}: a kernels plan needs `settings.kernels`, a mapping of kernel name to "
            "{dims: {...}}; see search_spaces/kernels_dsv4_flash.yaml"
        )
    if batches is None:
        if "batch" not in space.names:
            raise SearchError(f"{space.source}: a kernels plan needs a `batch` parameter listing the batch buckets")
        batches = space.param("batch").choices()
    dtype = plan.dtype
    cases = []
    for name, spec in kernels.items():
        spec = spec or {}
        where = f"{space.source}: kernels.{name}"
        try:
            kernel = load_kernel(str(name))
        except TargetError as exc:
            raise SearchError(f"{where}: {exc}") from None
        for dims in _expand_dims(spec.get("dims", {}), where):
            for b in spec.get("batches") or batches:
                shape = parse_shape({**dims, kernel.batch_dim: int(b)})
                cases.append(KernelCase(str(name), shape, str(spec.get("dtype", dtype))))
    return cases


def kernel_space_yaml(case: KernelCase, settings: dict[str, Any] | None = None) -> str:
    """The single-kernel space of ``case``: one categorical per config field, the default config as defaults."""
    kernel = load_kernel(case.kernel)
    try:
        default = kernel.fit_dtype(kernel.default_config(case.shape), case.shape, case.dtype)
        space, key = kernel.config_space(case.shape), case.shape_key
    except (KeyError, TypeError, ValueError) as exc:
        raise SearchError(
            f"shape {case.shape} does not fit kernel {case.kernel!r} ({type(exc).__name__}: {exc}); "
            f"give every dim, like {kernel.shapes('v4flash')[0]}"
        ) from None
    params = {}
    for name, values in space.items():
        values = list(values)
        if name in default and default[name] not in values:
            values = sorted([*values, default[name]])
        params[name] = {
            "type": "categorical",
            "values": values,
            "default": default.get(name, values[0]),
            "kernel": f"{kernel.name}.{name}",
        }
    level = int(case.shape.get(kernel.batch_dim, 1))
    doc = {
        "name": f"kernel-{kernel.name}",
        "description": f"{kernel.name} at {key} ({case.dtype}); generated by tuner.search.kernel_search",
        "target": "kernels",
        "settings": {**(settings or {}), "kernel": case.kernel, "shape": dict(case.shape), "dtype": case.dtype},
        "objective": {
            "metric": "time_us",
            "direction": "minimize",
            "combine": "level",
            "levels": [level],
            "level": level,
            "unit": "us",
        },
        "params": params,
    }
    return yaml.safe_dump(doc, sort_keys=False)


# -- the cache -----------------------------------------------------------------------------------------------
def configured_dir(settings: dict[str, Any]) -> str | None:
    """The tuned-config folder the deployment reads (setting ``kernel_config_dir`` or ``$TUNER_KERNEL_CONFIG_DIR``)."""
    return settings.get("kernel_config_dir") or os.environ.get(ENV_VAR) or None


def cached_entry(case: KernelCase, gpu: str, dirs: Iterable[str | Path]) -> tuple[dict, Path] | None:
    """The stored entry of exactly this (kernel, GPU, dtype, Triton version, shape key), and its file."""
    from kernels.configs import config_path, read_config_file

    kernel = load_kernel(case.kernel)
    key = kernel.shape_key(case.shape)
    for d in dirs:
        path = config_path(kernel.name, gpu, case.dtype, directory=d)
        entry = read_config_file(path).get(key)
        if isinstance(entry, dict) and isinstance(entry.get("config"), dict):
            if (
                kernel.check_config(
                    {**kernel.default_config(case.shape), **entry["config"]}, case.shape, None, dtype=case.dtype
                )
                is None
            ):
                return entry, path
            _logger.warning(
                "cached config %s for %s [%s] in %s breaks a rule now; re-tuning",
                entry["config"],
                kernel.name,
                key,
                path,
            )
    return None


# -- how a case is searched (benchmarks/tuner_efficiency.py replays exactly this) ------------------------------
def kernel_sampler(resolved, seed: int | None, *, parallel: bool) -> optuna.samplers.BaseSampler:
    """The sampler of every kernel sub-study: the study-wide TPE (:func:`tuner.search.make_sampler`); with trials
    asked ahead (``parallel``, compile helpers) a constant liar keeps the pending ones apart."""
    return make_sampler(resolved, seed, parallel=parallel)


def starting_configs(case: KernelCase, device: str | None) -> list[dict[str, Any]]:
    """The configs tried right after the default (the baseline) in a fresh sub-study: the kernel's
    ``seed_configs``, in order."""
    return list(load_kernel(case.kernel).seed_configs(case.shape, device, case.dtype))


def choose_impl(triton_us: float | None, library_us: float | None, library: str) -> str:
    """What a tuned entry ships: the Triton kernel only where it measured faster than the library beside it (so
    no tuned configuration ships a kernel slower than the library's); the library where it is faster, ties, or the
    Triton config did not run correctly; ``triton`` where the library path did not run correctly."""
    if library_us is None:
        return "triton" if triton_us is not None else library
    return "triton" if triton_us is not None and triton_us < library_us else library


def compare_library(res: KernelCaseResult, options: SearchOptions) -> None:
    """Time ``res.config`` and its kernel's library path the same way (one fresh process: the kernels target's
    bench, inputs and correctness check, ``python -m tuner.targets.kernels --compare-library``), and set
    ``res.impl`` to the faster. A comparison that fails leaves ``impl`` unset (``linear(impl="auto")`` then runs
    the library) and says why in ``res.reason``."""
    import json
    import subprocess
    import sys

    from tuner.execution.isolation import trial_env

    kernel = load_kernel(res.kernel)
    if kernel.library_impl is None or res.config is None:
        return
    config = {**kernel.default_config(res.shape), **res.config}
    argv = [
        sys.executable,
        "-m",
        "tuner.targets.kernels",
        "--kernel",
        res.kernel,
        "--shape",
        json.dumps(res.shape, sort_keys=True),
        "--dtype",
        res.dtype,
        "--config",
        json.dumps(config, sort_keys=True),
        "--compare-library",
    ]
    if options.settings.get("allow_cpu_interpreter"):
        argv.append("--allow-cpu-interpreter")
    gpus = list(options.gpus[:1]) if options.gpus else None
    try:
        p = subprocess.run(argv, env=trial_env(gpus, {}), capture_output=True, text=True, timeout=300)
        found = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 and p.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        p, found = None, None
        why = f"{type(exc).__name__}: {exc}"
    if found is None:
        why = why if p is None else (p.stderr.strip().splitlines() or ["no output"])[-1]
        res.reason = "; ".join(x for x in (res.reason, f"library comparison failed ({why[:200]})") if x)
        _logger.warning("%s [%s]: library comparison failed: %s", res.kernel, res.shape_key, why)
        return
    res.library_time_us, res.impl_triton_time_us = found["library_us"], found["triton_us"]
    res.impl = choose_impl(found["triton_us"], found["library_us"], kernel.library_impl)
    _logger.info(
        "%s [%s]: library %s us, tuned Triton %s us: ships %s",
        res.kernel,
        res.shape_key,
        found["library_us"],
        found["triton_us"],
        res.impl,
    )


# -- one case ------------------------------------------------------------------------------------------------
def _free_study_name(repo, name: str) -> str:
    n = 2
    out = f"{name}.retune{n}" if repo.get_run(name) is not None else name
    while repo.get_run(out) is not None:
        n += 1
        out = f"{name}.retune{n}"
    return out


def _reserve(ctx: SearchContext, k: int) -> float:
    """Time kept back to re-time the top ``k`` configs and the default once each."""
    ok = [t.duration_s for t in ctx.trials if t.outcome == "ok" and t.repeat_of is None]
    if not k or len(ok) < 3:
        return 0.0
    return min(1.2 * (k + 1) * statistics.median(ok), 0.3 * ctx.deadline.budget_s)


def _loop(
    ctx: SearchContext, progress: Progress | None, reserve, case: KernelCase, ahead: CompileAhead | None = None
) -> str:
    """Run trials until the share, the trial count or the space runs out. With ``ahead``, up to ``ahead.helpers``
    trials are asked in advance and their configs compiled by the helpers while earlier trials are timed; trials
    still waiting when the loop ends are failed in Optuna as not run (they never reach the project's tables)."""
    gpus = list(ctx.options.gpus[:1]) if ctx.options.gpus else None
    combos = math.prod(len(p.choices()) for p in ctx.resolved.params) if ctx.resolved.params else 1
    repeats = failures = 0
    reproposed = False  # the last trial's proposals repeated a timed config (recorded, or turned away before it ran)
    started = len(ctx.trials)
    pending: deque[tuple[Any, Future | None]] = deque()
    submitted: set[str] = set()
    try:
        while not ctx.stop.is_set():
            done = len(ctx.trials) - started
            if ctx.options.n_trials is not None and done >= ctx.options.n_trials:
                return f"{ctx.options.n_trials} trials done"
            if ctx.deadline.remaining_for_trials() <= 1.0 + reserve():
                return "budget share used"
            if len(ctx.seen) >= combos:
                return f"every one of the {combos} configs seen"
            want = max(1, ahead.helpers if ahead else 1)
            if ctx.options.n_trials is not None:
                want = min(want, ctx.options.n_trials - done)
            # TPE re-proposed a timed config: a move from the best, enqueued right before the next ask (which takes it)
            move = reproposed
            while len(pending) < want:
                if move:
                    refine.enqueue_next(ctx, progress)
                move = False
                trial = ctx.study.ask()
                pending.append((trial, _compile_early(ctx, trial, case, ahead, submitted) if ahead else None))
            trial, fut = pending.popleft()
            if fut is not None and ahead is not None:
                ahead.wait(fut, min(COMPILE_WAIT_S, ctx.deadline.remaining_for_trials()))
            summary = run_one(ctx, trial, progress, gpus=gpus)
            repeats = repeats + 1 if summary.repeat_of is not None else 0
            reproposed = summary.reproposed
            failures = failures + 1 if summary.outcome not in ("ok", "pruned", "invalid_config") else 0
            if repeats >= MAX_REPEATS_IN_A_ROW:
                return f"space exhausted: {repeats} repeated configs in a row"
            if failures >= FAILURES_TO_GIVE_UP:
                return f"{failures} failed trials in a row (last: {summary.outcome}: {summary.reason[:120]})"
        return ctx.stop_reason or "stopped"
    finally:
        for trial, fut in pending:
            if fut is not None:
                fut.cancel()
            try:
                trial.set_user_attr("outcome", "not_run")
                ctx.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            except Exception:  # noqa: BLE001 - never mask why the loop ended; a resume fails stale trials anyway
                _logger.warning("could not close trial %d, asked ahead and not run", trial.number, exc_info=True)


def _compile_early(
    ctx: SearchContext, trial, case: KernelCase, ahead: CompileAhead, submitted: set[str]
) -> Future | None:
    """Hand an asked trial's config to the compile helpers, unless it was seen, already sent, or breaks a rule."""
    from tuner.search.sampling import suggest

    params = suggest(trial, ctx.resolved)  # run_one's own suggest returns these same values
    key = ctx.key_of(params)
    if key in ctx.seen or key in submitted or ctx.target.check(params):
        return None
    submitted.add(key)
    seed = ctx.target.config.seed
    return ahead.submit(case.kernel, case.shape, case.dtype, ctx.target.config_of(params), seed)


def _retime(ctx: SearchContext, progress: Progress | None, keys: list[dict[str, Any]], times: int) -> None:
    from tuner.search.sampling import suggestable

    gpus = list(ctx.options.gpus[:1]) if ctx.options.gpus else None
    per = [t.duration_s for t in ctx.trials if t.outcome == "ok" and t.repeat_of is None]
    need = 1.2 * (statistics.median(per) if per else 1.0)
    for _ in range(times):
        for params in keys:
            if ctx.stop.is_set() or ctx.deadline.remaining_for_trials() < need:
                return
            ctx.study.enqueue_trial(suggestable(ctx.resolved, params), user_attrs={CONFIRM_ATTR: -1})
            run_one(ctx, ctx.study.ask(), progress, gpus=gpus)


def _within_spread(ctx: SearchContext, numbers: list[int]) -> list[float]:
    """The p20-p80 spread metric of trials ``numbers`` (from the project's tables)."""
    from sqlalchemy import select

    from storage.models import Measurement as MRow
    from storage.models import TrialRecord

    if not numbers:
        return []
    with ctx.repo.session() as s:
        rows = (
            s.execute(
                select(MRow.value)
                .join(TrialRecord, MRow.trial_id == TrialRecord.id)
                .where(TrialRecord.run_id == ctx.run.id, TrialRecord.number.in_(numbers), MRow.metric == "spread")
            )
            .scalars()
            .all()
        )
    return [float(v) for v in rows if v is not None and math.isfinite(v)]


def _decide(ctx: SearchContext, case: KernelCase, defaults: dict[str, Any], min_gain: float) -> KernelCaseResult:
    kernel = load_kernel(case.kernel)
    target = ctx.target
    groups = {g.key: g for g in group_runs(ctx.trials, ctx.key_of)}  # twins of one program are one
    counts = dict(ctx.counts)
    evaluated = len({ctx.key_of(t.params) for t in ctx.trials if t.repeat_of is None and t.outcome != "invalid_config"})
    res = KernelCaseResult(
        case.kernel,
        dict(case.shape),
        case.dtype,
        kernel.shape_key(case.shape),
        "failed",
        study=ctx.run.study_name,
        trials=len(ctx.trials),
        evaluated=evaluated,
        counts=counts,
    )
    best, _ = pick_best(list(groups.values()), maximize=ctx.direction == "maximize")
    d_group = groups.get(ctx.key_of(defaults))
    d_med = d_group.median if d_group else None
    res.default_time_us = d_med
    if best is None:
        cut = [t for t in ctx.trials if t.outcome == "timeout" and t.reason.startswith("stopped at the search's")]
        if cut and len(cut) == len(ctx.trials):  # nothing measured, nothing learnt about the configs either
            res.status, res.config = "skipped", target.config_of(defaults)
            res.reason = "the share ran out before the default config was measured"
            return res
        res.reason = "no config ran correctly, the default included: " + ", ".join(
            f"{k} {v}" for k, v in sorted(counts.items())
        )
        res.config = target.config_of(defaults)
        return res
    within = _within_spread(ctx, list(best.numbers) + list(d_group.numbers if d_group else ()))
    spread = max(
        [best.spread, d_group.spread if d_group else 0.0, min_gain] + ([statistics.median(within)] if within else [])
    )
    res.spread = spread
    if d_med is None:
        res.status, res.config, res.time_us = "tuned", target.config_of(best.params), best.median
        res.reason = "the default config did not run correctly here; the best correct config is kept"
    elif ctx.key_of(best.params) != ctx.key_of(defaults) and beats_beyond(
        best.median, d_med, spread, maximize=ctx.direction == "maximize"
    ):
        res.status, res.config, res.time_us = "tuned", target.config_of(best.params), best.median
    else:
        res.status, res.config, res.time_us = "default_kept", target.config_of(defaults), d_med
        if ctx.key_of(best.params) != ctx.key_of(defaults):
            res.reason = (
                f"best {best.median:.3g} us vs default {d_med:.3g} us is within the measured spread {spread:.1%}"
            )
    return res


def tune_case(
    case: KernelCase,
    options: SearchOptions,
    study: str,
    progress: Progress | None = None,
    ahead: CompileAhead | None = None,
) -> KernelCaseResult:
    """Run the sub-study of one case on ``options.budget_s`` seconds and decide its winner (no file written);
    with ``ahead``, configs are compiled by its helpers while earlier trials are timed."""
    from storage import Repo
    from tuner.search.sampling import suggestable

    t0 = time.time()
    settings = {k: v for k, v in options.settings.items() if k in PASS_THROUGH}
    text = kernel_space_yaml(case, settings)
    space_dir = Path(options.out_dir) / SPACE_SUBDIR
    space_dir.mkdir(parents=True, exist_ok=True)
    repo = Repo(options.storage_url)
    repo.create_schema()
    retune = KernelsSettings.parse(options.settings, owner="the kernels plan").retune
    existing = repo.get_run(study) is not None
    if existing and retune:
        study, existing = _free_study_name(repo, study), False
    path = space_dir / (study.replace("/", "_") + ".yaml")
    path.write_text(text)
    sub = dataclasses.replace(
        options,
        study=study,
        space_path=str(path),
        target="kernels",
        resume=existing,
        settings={},
        export=True,
        dry_run=False,
    )
    ctx = open_context(sub, progress)
    if progress:
        progress.started(ctx)
        progress.message(
            f"tuning {case.kernel} at [{case.shape_key}] {case.dtype}: study {study}, {options.budget_s:.0f}s"
        )
    ctx.study.sampler = kernel_sampler(ctx.resolved, options.seed, parallel=ahead is not None)
    defaults = ctx.resolved.defaults()
    if not ctx.trials:  # a fresh sub-study: after the default (the baseline), the kernel's own starting points
        device = "cuda" if ctx.hardware.gpu_count else None
        for cfg in starting_configs(case, device):
            ctx.study.enqueue_trial(suggestable(ctx.resolved, cfg), user_attrs={SEED_ATTR: True})
    k = max(0, options.confirm_top)
    try:
        reason = _loop(ctx, progress, lambda: _reserve(ctx, k), case, ahead)
        if k and not ctx.stop.is_set():
            ranked: dict[str, dict] = {}
            # one entry per program timed (a repeat's or a twin's value is a copy; Target.canonical_params)
            for t in sorted(
                (t for t in ctx.trials if t.outcome == "ok" and t.value is not None and t.repeat_of is None),
                key=lambda t: t.value,
            ):
                ranked.setdefault(ctx.key_of(t.params), t.params)
            top = list(ranked.values())[:k]
            if ctx.key_of(defaults) in ranked and ctx.key_of(defaults) not in {ctx.key_of(p) for p in top}:
                top.append(ranked[ctx.key_of(defaults)])
            _retime(ctx, progress, top, KernelsSettings.parse(options.settings, owner="the kernels plan").retimes)
    except KeyboardInterrupt:
        ctx.stop.set()
        reason = "interrupted"
    res = _decide(ctx, case, defaults, KernelsSettings.parse(options.settings, owner="the kernels plan").min_gain)
    ctx.repo.end_run(ctx.run.id, "interrupted" if ctx.stop.is_set() else "finished")
    if res.status in ("tuned", "default_kept") and not ctx.stop.is_set():
        compare_library(res, options)
    res.reason = "; ".join(x for x in (res.reason, reason) if x)
    res.elapsed_s = time.time() - t0
    return res


# -- the whole search ----------------------------------------------------------------------------------------
def run_kernel_search(options: SearchOptions, progress: Progress | None = None) -> KernelSearchResult:
    """Tune every kernel × shape of a kernels plan (``options.space_path``, default ``kernels_dsv4_flash``)."""
    space = load_space(options.space_path or DEFAULT_PLAN)
    if space.target != "kernels":
        raise SearchError(
            f"{space.source}: target is {space.target!r}, not a kernels plan; pass --space "
            f"{DEFAULT_PLAN} or a plan written like it"
        )
    settings = {**space.settings, **options.settings}
    plan = KernelsSettings.parse(settings, owner="the kernels plan")  # a misspelt key stops here, named
    settings.pop("kernels", None)
    cases = plan_cases(space)
    if plan.only:  # --set only=sparse_decode,indexer
        wanted = set(plan.only) if isinstance(plan.only, list) else set(plan.only.split(","))
        cases = [c for c in cases if c.kernel in wanted]
    if plan.max_cases:
        cases = cases[: plan.max_cases]
    study = options.study or space.name
    return tune_cases(cases, dataclasses.replace(options, settings=settings), study=study, progress=progress)


def tune_cases(
    cases: list[KernelCase], options: SearchOptions, *, study: str, progress: Progress | None = None
) -> KernelSearchResult:
    """Tune ``cases`` within ``options.budget_s`` (shared out case by case), then write the tuned-config files."""
    from search_spaces import detect_hardware
    from tuner.budget import Deadline

    t0 = time.time()
    deadline = Deadline.start_now(options.budget_s, options.started_at)
    hardware = options.hardware or detect_hardware()
    options = dataclasses.replace(options, hardware=hardware)
    gpu = hardware.gpu_name if hardware.gpu_count else "cpu"
    settings = options.settings
    out_dir = Path(options.out_dir) / CONFIG_SUBDIR
    conf = configured_dir(settings)
    helpers = compile_helpers(settings, hardware.gpu_count)
    report = _preflight(cases, options, settings)
    report.facts["compile_ahead"] = (
        f"{helpers} helper processes compile configs while trials are timed"
        if helpers
        else "off: each trial compiles its own config"
    )
    if options.dry_run or not report.ok:
        if not report.ok and not options.dry_run:
            raise SearchError("preflight failed: " + "; ".join(report.errors))
        return KernelSearchResult(study, options.storage_url, "dry_run", [], None, report, 0.0)
    retune = KernelsSettings.parse(settings, owner="the kernels plan").retune
    results: list[KernelCaseResult] = []
    todo = []
    for case in cases:
        hit = None if retune else cached_entry(case, gpu, [d for d in (conf, out_dir) if d])
        if hit is None:
            todo.append(case)
            continue
        entry, path = hit
        results.append(
            KernelCaseResult(
                case.kernel,
                dict(case.shape),
                case.dtype,
                case.shape_key,
                "cached",
                config=entry["config"],
                time_us=entry.get("time_us"),
                default_time_us=entry.get("default_time_us"),
                spread=entry.get("spread"),
                study=str(entry.get("study", "")),
                reason=f"reused from {path}",
                impl=entry.get("impl"),
                library_time_us=entry.get("library_time_us"),
                impl_triton_time_us=entry.get("impl_triton_time_us"),
            )
        )
        if progress:
            progress.message(f"{case.kernel} [{case.shape_key}]: reusing the tuned config in {path}")
    ahead = CompileAhead(helpers, list(options.gpus[:1]) if options.gpus else None) if helpers and todo else None
    try:
        state, stop_reason = _tune_todo(todo, options, study, deadline, progress, results, ahead)
    finally:
        from tuner.execution.persistent import close_workers

        close_workers()  # the GPU goes back to whatever runs next (a system search's trials)
        if ahead is not None:
            ahead.close()
    written = _write(results, gpu, out_dir if options.export else None, conf)
    return KernelSearchResult(
        study,
        options.storage_url,
        state,
        results,
        str(out_dir.resolve()) if options.export else conf,
        report,
        time.time() - t0,
        stop_reason,
        [str(p) for p in written],
        ahead.summary() if ahead else "",
    )


def compile_helpers(settings: dict[str, Any], gpu_count: int) -> int:
    """The number of compile helpers setting ``compile_ahead`` asks for: ``auto`` (default: the spare CPUs of a
    GPU host, see :func:`tuner.execution.compile_ahead.default_helpers`), a count, or ``false``/``0`` for none."""
    value = KernelsSettings.parse(settings, owner="the kernels plan").compile_ahead
    text = str(value).strip().lower()
    if text == "auto":
        return default_helpers(gpu_count)
    if value is False or text in ("false", "off", "no", "none"):
        return 0
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise SearchError(
            f"setting `compile_ahead` must be auto, a helper count >= 0, or false, but got {value!r}; "
            "e.g. --set compile_ahead=4"
        )
    return n if gpu_count else 0


def _tune_todo(
    todo: list[KernelCase],
    options: SearchOptions,
    study: str,
    deadline,
    progress: Progress | None,
    results: list[KernelCaseResult],
    ahead: CompileAhead | None = None,
) -> tuple[str, str]:
    """Tune the cases not answered from the cache, one sub-study each, appending to ``results``; returns the
    search's ``(state, stop_reason)``."""
    state, stop_reason = "finished", ""
    for i, case in enumerate(todo):
        left = deadline.remaining_for_trials()
        # an even share, but never under MIN_SHARE_S: with more cases than the budget holds, the first ones are
        # tuned properly and the rest keep their defaults (an even 1-2 s each would tune none of them)
        share = min(left, max(left / (len(todo) - i), MIN_SHARE_S))
        if left < MIN_SHARE_S:
            stop_reason = f"budget used: {len(todo) - i} cases not tuned (defaults kept)"
            results += [
                KernelCaseResult(c.kernel, dict(c.shape), c.dtype, c.shape_key, "skipped", reason="no budget left")
                for c in todo[i:]
            ]
            break
        name = f"{study}.{load_kernel(case.kernel).name}.{case.shape_key}"
        try:
            res = tune_case(case, dataclasses.replace(options, budget_s=share), name, progress, ahead)
        except KeyboardInterrupt:
            state, stop_reason = "interrupted", "interrupted (Ctrl-C)"
            break
        results.append(res)
        if res.reason == "interrupted" or "interrupted" in res.reason:
            state, stop_reason = "interrupted", "interrupted"
            break
    return state, stop_reason


def _write(results: list[KernelCaseResult], gpu: str, out_dir: Path | None, conf: str | None) -> list[Path]:
    from kernels.configs import write_config_file

    groups: dict[tuple[str, str], dict[str, dict]] = {}
    server: dict[tuple[str, str], list[tuple[dict, dict]]] = {}  # kernels that also write a server's own files
    for r in results:
        if r.status in ("tuned", "default_kept", "cached") and r.config:
            kernel = load_kernel(r.kernel)
            entry = r.entry()
            if r.status == "cached":
                entry["status"] = "cached"
            groups.setdefault((kernel.name, r.dtype), {})[r.shape_key] = entry
            if hasattr(kernel, "write_server_configs"):
                server.setdefault((r.kernel, r.dtype), []).append((r.shape, entry))
    written = []
    for (name, dtype), entries in groups.items():
        for d in dict.fromkeys(x for x in (out_dir, conf) if x):
            fresh = {k: v for k, v in entries.items() if not (d == conf and v["status"] == "cached")}
            if fresh:
                written.append(write_config_file(name, gpu, dtype, fresh, directory=d))
    for (kernel_name, dtype), pairs in server.items():
        for d in dict.fromkeys(x for x in (out_dir, conf) if x):
            written += load_kernel(kernel_name).write_server_configs(pairs, gpu, dtype, d)
    return written


def _preflight(cases: list[KernelCase], options: SearchOptions, settings: dict[str, Any]) -> PreflightReport:
    """One report for the whole plan: what each case will run, from each case's own target preflight."""
    from search_spaces import load_space_text, resolve
    from tuner.targets.kernels import KernelsTarget

    report = PreflightReport(target="kernels")
    report.facts["cases"] = len(cases)
    report.facts["budget"] = f"{options.budget_s:.0f}s shared out case by case"
    passed = {k: v for k, v in settings.items() if k in PASS_THROUGH}
    seen_errors: set[str] = set()
    for case in cases:
        try:
            space = load_space_text(kernel_space_yaml(case, passed), source=f"<{case.kernel}>")
            sub = KernelsTarget(resolve(space, options.hardware), space.settings).preflight()
        except (TargetError, SearchError, ValueError, KeyError) as exc:
            report.errors.append(f"{case.kernel} {case.shape}: {exc}")
            continue
        report.will_run.append(
            f"{case.kernel} [{sub.facts.get('shape_key', '?')}] {case.dtype}: "
            f"{math.prod(len(v) for v in load_kernel(case.kernel).config_space(case.shape).values())}"
            " configs in the space"
        )
        for e in sub.errors:
            if e not in seen_errors:
                seen_errors.add(e)
                report.errors.append(e)
        for r in sub.rules + sub.will_not_run:
            if r not in report.rules and r not in report.will_not_run:
                (report.will_not_run if r in sub.will_not_run else report.rules).append(r)
    if not cases:
        report.errors.append("the plan yields no kernel x shape case; check `settings.kernels` and `only`")
    return report


# -- a kernel phase inside a system search ------------------------------------------------------------------
def kernel_phase(
    ctx: SearchContext,
    shapes: Iterable[KernelCase | tuple],
    budget_s: float,
    progress: Progress | None = None,
    *,
    apply: bool = True,
) -> KernelSearchResult:
    """Tune exactly ``shapes`` (``KernelCase`` or ``(kernel, shape[, dtype])``) for a running system search.

    Sub-studies are named ``f"{ctx.run.study_name}.kernels.{kernel}.{shape_key}"`` in the same storage; the
    files go to ``<out>/kernel_configs/`` (and the configured folder). With ``apply`` (default) and no
    ``$TUNER_KERNEL_CONFIG_DIR`` set, it is set to that folder, so later trial subprocesses load the tuned configs.
    """
    cases = [
        s if isinstance(s, KernelCase) else KernelCase(s[0], parse_shape(s[1]), *(s[2:3] or ("bfloat16",)))
        for s in shapes
    ]
    seen, unique = set(), []
    for c in cases:
        key = (c.kernel, c.shape_key, c.dtype)
        if key not in seen:
            seen.add(key)
            unique.append(c)
    common = ctx.target.config
    settings = {"seed": common.seed, **common.kernel_phase_settings}
    if common.trial_timeout_s:
        settings.setdefault("trial_timeout_s", common.trial_timeout_s)
    if common.kernel_config_dir:
        settings.setdefault("kernel_config_dir", common.kernel_config_dir)
    KernelsSettings.parse(settings, owner="the kernel phase (setting `kernel_phase_settings`)")
    opts = dataclasses.replace(
        ctx.options,
        budget_s=budget_s,
        settings=settings,
        hardware=ctx.hardware,
        n_trials=None,
        resume=False,
        dry_run=False,
        export=True,
        workers=1,
    )
    result = tune_cases(unique, opts, study=f"{ctx.run.study_name}.kernels", progress=progress)
    if apply and result.config_dir and not os.environ.get(ENV_VAR):
        os.environ[ENV_VAR] = result.config_dir
    return result


__all__ = [
    "KernelCase",
    "KernelCaseResult",
    "KernelSearchResult",
    "cached_entry",
    "is_kernel_plan",
    "choose_impl",
    "compare_library",
    "kernel_phase",
    "kernel_sampler",
    "kernel_space_yaml",
    "plan_cases",
    "run_kernel_search",
    "starting_configs",
    "tune_case",
    "tune_cases",
]
