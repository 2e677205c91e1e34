"""Export the best configuration: a launch script, the best parameters as YAML, and the tuned kernel configs.

The export is written into a temporary folder beside the destination and renamed into place, so a failure leaves
nothing half-written. Every value in the script is shell-quoted (``shlex.quote``); header text is made single-line.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import statistics
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from storage import Repo
from tuner import __version__
from tuner.errors import ExportError
from tuner.figures.serving import Rules, misses, value_at
from tuner.figures.serving import recorded as goodput_recorded
from tuner.figures.verification import RECORD_MARK, combine_levels
from tuner.processes import json_output
from tuner.targets import Deployment, LaunchSpec, Target
from tuner.targets.base import SGLANG_PLUGIN_ENV as PLUGIN_ENV

_logger = logging.getLogger(__name__)

SCRIPT_NAME = "launch.sh"
REMEASURE_NAME = "remeasure.sh"
"""Where a target's deployment (:meth:`Target.deployment`) takes launch.sh, the target's own re-measure of the best."""
REMEASURE_COMMAND_NAME = "remeasure_command.sh"
"""The target's re-measure of the deployment's configuration (the best with what the command cannot give replaced)."""
PARAMS_NAME = "best_params.yaml"
KERNEL_DIR = "kernel_configs"
MOE_DIR = "sglang_moe_configs"  # SGLang's fused-MoE files, in SGLang's layout (configs/triton_<version>/...)
MOE_ENV = "SGLANG_MOE_CONFIG_DIR"
PLUGIN_MANIFEST = "sglang_plugin/MANIFEST.json"
REMEASURE_PLUGIN_NAME = "remeasure_plugin.sh"
"""The target's re-measure of the exported command's configuration with the export's SGLang plug-in loaded."""
PLUGIN_MEASURE_TIMEOUT_S = 600.0
PLUGIN_TARGETS = ("workload", "sglang")
"""The targets whose launch.sh starts SGLang: their export carries the SGLang plug-in, or says why none."""
LOAD_KEYS = (
    "model",
    "served_model_name",
    "api",
    "prompt_len",
    "output_len",
    "length_jitter",
    "dataset",
    "requests_per_level",
    "rounds",
    "min_requests",
    "level_s",
    "warmup_requests",
    "ignore_eos",
    "seed",
    "extra_body",
    "health_paths",
    "preset",
    "live_context",
    # what a level must serve to count, and how its tokens are counted (tuner.targets.server.loadgen)
    "tokenizer",
    "warmup_s",
    "warmup_max_requests",
    "max_error_rate",
    "min_delivered",
    # the load's shape and the goodput search's load (tuner.targets.server.loadshape, .goodput)
    "load_shape",
    "length_distribution",
    "prompt_len_std",
    "output_len_std",
    "goodput_mode",
    "goodput_arrivals",
    "goodput_window_s",
    "goodput_min_requests",
    "goodput_repeats",
    "goodput_tolerance",
    "goodput_keepup_tolerance",
    "goodput_drain_s",
)


def _one_line(text: Any) -> str:
    return re.sub(r"[\r\n\x00-\x1f]+", " ", str(text))


def config_runs(repo: Repo, run_id: int, params: dict[str, Any] | None) -> list:
    """The stored runs of one configuration: ok, measured (not a repeat's copy); what its median is taken over."""
    if params is None:
        return []
    key = json.dumps(params, sort_keys=True, default=str)
    return [
        t
        for t in repo.list_trials(run_id, outcome="ok", with_measurements=True)
        if t.value is not None and t.repeat_of is None and json.dumps(t.params, sort_keys=True, default=str) == key
    ]


def level_medians(runs: list, metric: str = "tok_s") -> dict[str, float]:
    """Per level, the median of ``metric`` over ``runs`` (the same runs the objective's median is taken over)."""
    by: dict[str, list[float]] = {}
    for t in runs:
        for m in t.measurements:
            if m.metric == metric and m.level:
                by.setdefault(m.level, []).append(m.value)
    return {lvl: statistics.median(vs) for lvl, vs in by.items()}


def render_script(
    spec: LaunchSpec,
    *,
    header: list[str],
    recorded: dict[str, Any] | None,
    kernel_dir: bool = False,
    moe_dir: bool = False,
    plugin_dir: bool = False,
) -> str:
    """A bash script that runs ``spec``: every argv item and env value through ``shlex.quote``; header text made
    single-line; a ``--port N`` becomes ``"$PORT"`` (default N) so a verifier can move it; ``"$@"`` passes extra
    arguments through."""
    argv = [str(a) for a in spec.argv]
    port = argv[argv.index("--port") + 1] if "--port" in argv[:-1] else None
    if port is not None and not port.isdigit():
        raise ExportError(f"the value after --port must be a number, but got {port!r}; fix the target's settings")
    lines = ["#!/usr/bin/env bash"]
    lines += [f"# {_one_line(h)}" if h else "#" for h in header]
    if recorded is not None:
        lines.append(RECORD_MARK + json.dumps(recorded, sort_keys=True))
    lines += ["set -euo pipefail", 'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"']
    if kernel_dir:
        lines.append(f'export TUNER_KERNEL_CONFIG_DIR="$HERE/{KERNEL_DIR}"')
    if moe_dir:
        lines.append(f'export {MOE_ENV}="$HERE/{MOE_DIR}"')
    if plugin_dir:
        lines.append(f'export {PLUGIN_ENV}="$HERE/{PLUGIN_MANIFEST.split("/")[0]}"')
    for k, v in sorted(spec.env.items()):
        if moe_dir and k == MOE_ENV:
            continue
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise ExportError(f"environment variable names must be [A-Za-z_][A-Za-z0-9_]*, but got {k!r}; rename it")
        lines.append(f"export {k}={shlex.quote(str(v))}")
    if port is not None:
        lines.append(f"PORT=${{PORT:-{port}}}")
    parts = [
        '"$PORT"' if port is not None and i > 0 and argv[i - 1] == "--port" else shlex.quote(a)
        for i, a in enumerate(argv)
    ]
    lines.append("exec " + " \\\n    ".join(parts) + ' \\\n    "$@"')
    return "\n".join(lines) + "\n"


def export_run(
    repo: Repo, study: str, out_dir: str | os.PathLike, *, target: Target, note: str = "", parsimony=None, chosen=None
) -> Path:
    """Write ``out_dir/<study>/`` for the run's recorded best (launch script, params YAML, kernel configs); store
    them as artifacts too. The figures per level are medians over the same runs as the recorded value. ``note``:
    what the search said of its choice (e.g. that nothing beat the baseline beyond the noise). ``parsimony`` (a
    ``tuner.search.winner.ParsimonyChoice``, made by the caller) says which trial to prefer and why: its choice
    is exported and its reason written in the header. Where the target deploys another program's command
    (:meth:`Target.deployment`: a workload twin's SGLang command), that is launch.sh, its re-measure script beside it. ``chosen`` (a goodput study's
    :class:`tuner.targets.server.front.Chosen`): export that point of the front instead (its trial; ``tuner verify``
    re-measures its load under its SLO), the header saying which point or SLO it was exported for."""
    run = repo.get_run(study)
    if run is None:
        raise ExportError(f"no study {study!r} in this storage; `tuner status` lists the studies")
    best_trial = repo.get_trial(run.id, run.best_trial_number) if run.best_trial_number is not None else None
    if best_trial is None:
        raise ExportError(f"study {study!r} has no successful trial yet; nothing to export")
    if chosen is not None:
        best_trial = repo.get_trial(run.id, chosen.trial)
        parsimony = None  # the point asked for is exported, not the search's choice
    elif parsimony is not None and parsimony.switched:
        best_trial = repo.get_trial(run.id, parsimony.chosen.key)
    if chosen is None:
        _refuse_infeasible(run, best_trial)
    best_params = best_trial.params
    baseline = repo.baseline_trial(run.id)
    spec = target.launch_spec(best_params)
    best_runs = config_runs(repo, run.id, best_params) or [best_trial]
    base_runs = config_runs(repo, run.id, baseline.params if baseline else None) or ([baseline] if baseline else [])
    best_levels, base_levels = level_medians(best_runs), level_medians(base_runs)
    env = run.environment or {}
    gpus = ", ".join(g["name"] for g in env.get("gpus", [])) or "cpu"
    header = [
        f"Launch script exported by tuner {__version__} on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"study {run.study_name!r}, target {run.target}, space {run.space_name}; best trial "
        f"{best_trial.number if best_trial else '?'}",
        f"objective: {run.objective}",
        spec.description,
        "",
        *([f"exported for: {chosen.line}", ""] if chosen is not None else []),
        *([f"NOTE: {note}", ""] if note else []),
        f"measured (tok/s, x baseline; medians over {len(best_runs)} run(s) of this configuration, trials "
        f"{', '.join(str(r.number) for r in best_runs)}, and {len(base_runs)} of the baseline):",
    ]
    for lvl in sorted(best_levels, key=lambda s: int(s.split("=")[1]) if s.startswith("c=") else 0):
        b = base_levels.get(lvl)
        ratio = (
            f"{best_levels[lvl] / b:.2f}x baseline {b:.1f}"
            if b
            else "the baseline met nothing here"
            if b == 0
            else "no baseline"
        )
        header.append(f"  {lvl:>6}: {best_levels[lvl]:.1f} ({ratio})")
    if chosen is not None:  # the run's objective is its best's, not this point's: say whose it is
        study_best = repo.get_trial(run.id, run.best_trial_number)
        nowhere = nothing_met_the_slo(run, study_best) if study_best is not None else ""
        header.append(
            f"  the study's objective ({run.objective}): trial {run.best_trial_number}, "
            + ("met the study's SLO at no load" if nowhere else f"{(run.best_value or 0.0):.2f}")
            + "; this export is the point above, not it"
        )
    elif run.best_value is not None and run.baseline_value == 0:
        header.append(f"  objective: {run.best_value:.2f}; the baseline met nothing (median 0): no ratio")
    elif run.best_value is not None and run.baseline_value:
        vals = [r.value for r in best_runs]
        spread = f", runs {min(vals):.2f}-{max(vals):.2f}" if len(vals) > 1 else ", one run"
        header.append(
            f"  objective: {run.best_value:.2f} (median{spread}; {run.best_value / run.baseline_value:.2f}x "
            f"the baseline's median {run.baseline_value:.2f})"
        )
    agree = [m.value for r in best_runs for m in r.measurements if m.metric == "greedy_agreement"]
    if agree:
        least = min(agree)
        bound = next((m.value for m in best_trial.measurements if m.metric == "greedy_min_agreement"), None)
        header.append(
            f"  greedy check: completions agree with the baseline's on {least:.3f} of the first tokens "
            f"(mean common prefix share{', lowest of its runs' if len(agree) > 1 else ''}"
            + (f"; min_agreement {bound:g}" if bound is not None else "")
            + ")"
        )
    header += _served_lines(run, best_trial)
    header += [
        "",
        f"environment: {gpus}; torch {env.get('torch')}; triton {env.get('triton')}; sglang {env.get('sglang')}; "
        f"cuda {env.get('cuda')}; driver {env.get('driver')}; tuner commit {env.get('git_sha')}",
        "re-measure: tuner verify <this script>   (or run it: "
        + " ".join(shlex.quote(str(a)) for a in (spec.remeasure_argv or spec.argv))
        + ")",
        "best parameters: " + ", ".join(f"{k}={v}" for k, v in best_params.items()),
    ]
    if parsimony is not None:
        header.append("parsimony: " + parsimony.reason())
    recorded = _recorded(run, best_runs)
    if chosen is not None:
        recorded["point"] = chosen.line
        if recorded.get("goodput"):  # verify re-measures the chosen load, under the SLO it was chosen for
            rows = {(m.metric, m.level): m.value for m in best_trial.measurements}
            recorded["value"] = value_at(str(recorded.get("metric")), rows, chosen.load)  # the point's, not the run's
            recorded["goodput"]["load"] = float(chosen.load.split("=", 1)[1])
            if chosen.slo:
                recorded["goodput"]["slo"] = [list(x) for x in chosen.slo]
    if spec.host:
        recorded["host"] = spec.host  # what the script binds: `tuner verify` dials it
    dest_root = Path(out_dir)
    try:
        dest_root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(
            f"output folder {str(dest_root)!r} cannot be created ({exc.strerror}); pass a writable folder"
        ) from None
    dest = dest_root / re.sub(r"[^A-Za-z0-9._-]+", "_", run.study_name)
    tmp = Path(tempfile.mkdtemp(prefix=".tuner-export-", dir=dest_root))
    try:
        kdirs = [Path(d) for d in target.kernel_config_dirs() if Path(d).is_dir()]
        if kdirs:
            (tmp / KERNEL_DIR).mkdir()
            for d in kdirs:
                for f in sorted(d.glob("*.json")):
                    shutil.copy2(f, tmp / KERNEL_DIR / f.name)
        moe_src = Path(spec.env[MOE_ENV]) / "configs" if spec.env.get(MOE_ENV) else None
        has_moe = bool(moe_src and moe_src.is_dir() and any(moe_src.rglob("*.json")))
        if has_moe:
            shutil.copytree(moe_src, tmp / MOE_DIR / "configs")
        plugin = _plugin(repo, run, tmp)
        script = render_script(
            spec,
            header=header + (["", *plugin.lines] if plugin else []),
            recorded=recorded,
            kernel_dir=bool(kdirs),
            moe_dir=has_moe,
        )
        deployed = target.deployment(best_params, environment=run.environment, repo=repo, run_id=run.id)
        if deployed is not None:  # launch.sh is the deployed command, the target's own re-run sits beside it
            (tmp / REMEASURE_NAME).write_text(script)
            os.chmod(tmp / REMEASURE_NAME, 0o755)
            script = _deployment_script(
                repo,
                run,
                best_trial,
                (best_levels, base_levels),
                recorded,
                parsimony,
                note,
                kdirs,
                tmp,
                target=target,
                deployed=deployed,
                plugin_lines=plugin.lines if plugin else [],
            )
        (tmp / SCRIPT_NAME).write_text(script)
        os.chmod(tmp / SCRIPT_NAME, 0o755)
        params_doc = {
            "study": run.study_name,
            "target": run.target,
            "objective": run.objective,
            "value": recorded["value"],
            "baseline_value": run.baseline_value,
            "params": best_params,
            **({"point": chosen.line} if chosen is not None else {}),
        }
        (tmp / PARAMS_NAME).write_text(yaml.safe_dump(params_doc, sort_keys=False))
        if dest.exists():
            old = dest.with_name(dest.name + f".old-{os.getpid()}")
            dest.rename(old)
            tmp.rename(dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    items = [
        ("launch_script", SCRIPT_NAME, str(dest / SCRIPT_NAME), (dest / SCRIPT_NAME).read_bytes()),
        *[
            ("remeasure_script", name, str(dest / name), (dest / name).read_bytes())
            for name in (REMEASURE_NAME, REMEASURE_COMMAND_NAME)
            if (dest / name).exists()
        ],
        ("best_params", PARAMS_NAME, str(dest / PARAMS_NAME), (dest / PARAMS_NAME).read_bytes()),
    ]
    for f in sorted((dest / KERNEL_DIR).glob("*.json")) if (dest / KERNEL_DIR).is_dir() else []:
        items.append(("kernel_config", f"{KERNEL_DIR}/{f.name}", str(f), f.read_bytes()))
    for f in sorted((dest / MOE_DIR).rglob("*.json")) if (dest / MOE_DIR).is_dir() else []:
        items.append(("kernel_config", f.relative_to(dest).as_posix(), str(f), f.read_bytes()))
    if (dest / PLUGIN_MANIFEST).is_file():
        items.append(
            ("sglang_plugin", PLUGIN_MANIFEST, str(dest / PLUGIN_MANIFEST), (dest / PLUGIN_MANIFEST).read_bytes())
        )
    repo.add_artifacts(run.id, items)
    _logger.info("exported study %s to %s", run.study_name, dest)
    return dest


def _plugin(repo: Repo, run, tmp: Path):
    """The SGLang plug-in of a study whose launch.sh starts SGLang (:mod:`tuner.export.sglang_plugin`), written into
    ``tmp``; None for other targets."""
    if run.target not in PLUGIN_TARGETS:
        return None
    from tuner.export.sglang_plugin import export_plugin, read_records
    from tuner.fingerprint import git_sha

    env = run.environment or {}
    gpus = [g.get("name") for g in env.get("gpus", []) if g.get("name")]
    return export_plugin(
        read_records(repo, run.id),
        tmp,
        study=run.study_name,
        commit=os.environ.get("TUNER_COMMIT") or git_sha(),
        gpu=gpus[0] if gpus else None,
        sglang=env.get("sglang"),
    )


def _prediction(levels: dict[str, float], base: dict[str, float]) -> str:
    if not levels:
        return "not measured"
    return ", ".join(
        f"{lvl} {v / base[lvl]:.2f}x ({v:.1f})" if base.get(lvl) else f"{lvl} {v:.1f}"
        for lvl, v in sorted(levels.items(), key=lambda i: int(i[0].split("=")[1]) if i[0].startswith("c=") else 0)
    )


def _plugin_prediction(
    run, deployed: Deployment, cmd_runs: list, base: dict[str, float], kdirs: list[Path], tmp: Path, *, target: Target
) -> str:
    """The prediction "with this plug-in": the exported command's configuration run by the target with the export's
    SGLang plug-in loaded (remeasure_plugin.sh, written beside launch.sh), measured once here, where that
    configuration ran during the search; its figures go into that script's recorded line for ``tuner verify``."""
    try:
        spec = target.launch_spec(deployed.params)
    except Exception as exc:  # noqa: BLE001 - the command's configuration may not run here; say so
        return f"  with this plug-in: not predicted (the command's configuration cannot run here: {exc})"
    head = [
        f"the twin's re-measure of the exported command's configuration with the SGLang plug-in loaded (study "
        f"{run.study_name!r}): SGLang's functions the plug-in replaces run its kernels where they were measured faster",
        "params: " + ", ".join(f"{k}={v}" for k, v in deployed.params.items()),
    ]
    path = tmp / REMEASURE_PLUGIN_NAME

    def write(recorded: dict[str, Any] | None) -> None:
        path.write_text(render_script(spec, header=head, recorded=recorded, kernel_dir=bool(kdirs), plugin_dir=True))
        os.chmod(path, 0o755)

    prec = _recorded(run, cmd_runs)
    prec.pop("runs", None)
    write({**prec, "by_level": {}, "value": None})
    try:
        done = subprocess.run(
            ["bash", str(path), "--json"], capture_output=True, text=True, timeout=PLUGIN_MEASURE_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        path.unlink()
        return f"  with this plug-in: not predicted ({REMEASURE_PLUGIN_NAME} gave no result in {PLUGIN_MEASURE_TIMEOUT_S:.0f} s)"
    try:
        levels = {k: float(v) for k, v in json_output(done, REMEASURE_PLUGIN_NAME).items()}
    except ValueError as exc:
        path.unlink()
        return f"  with this plug-in: not predicted ({exc})"
    by_level = {int(k.split("=")[1]): v for k, v in levels.items()}
    write({**prec, "by_level": {str(k): v for k, v in by_level.items()}, "value": combine_levels(prec, by_level)})
    return f"  with this plug-in: {_prediction(levels, base)} (one run of {REMEASURE_PLUGIN_NAME} at export)"


def _deployment_script(
    repo: Repo,
    run,
    trial,
    levels: tuple[dict[str, float], dict[str, float]],
    recorded: dict[str, Any],
    parsimony,
    note: str,
    kdirs: list[Path],
    tmp: Path,
    *,
    target: Target,
    deployed: Deployment,
    plugin_lines: list[str] | None = None,
) -> str:
    """launch.sh where the target deploys another program's command (``deployed``, :meth:`Target.deployment`):
    headed by two predictions, "this command" (the runs of the configuration it runs) and "with these code
    changes" (the best), and the deployment's own lines; ``tuner verify``'s record points at remeasure.sh (the best)
    and remeasure_command.sh (the command's configuration)."""
    moe = deployed.copy_configs(kdirs, tmp / MOE_DIR)
    best_levels, base_levels = levels
    cmd_runs = config_runs(repo, run.id, deployed.params)
    cmd_levels = level_medians(cmd_runs)
    err = {m.level: m.value for m in trial.measurements if m.metric == "numerics_rel_err"}
    base_err = next((m.value for m in trial.measurements if m.metric == "numerics_baseline_err"), None)
    same = deployed.same
    header = [
        f"{deployed.title} exported by tuner {__version__} on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"from study {run.study_name!r} ({run.target} target, space {run.space_name}), trial {trial.number}",
        "",
        deployed.predicted,
        *([f"NOTE: {note}"] if note else []),
        deployed.predictions,
        f"  this command: {_prediction(cmd_levels, base_levels)}"
        + (
            ""
            if same
            else f" (its configuration's runs: trials {', '.join(str(r.number) for r in cmd_runs)})"
            if cmd_runs
            else " (`tuner verify launch.sh` measures it)"
        ),
        f"  with these code changes: {_prediction(best_levels, base_levels)} ({deployed.by}'s best"
        + (", the same configuration: nothing below needs a code change)" if same else ")"),
    ]
    if err:
        header.append(  # the workload's numerics gate compares with a precise reference (fp32 GEMMs, torch operators)
            "  the best's output vs the precise reference's (relative norm error): "
            + ", ".join(f"{v:.2g}" for v in err.values())
            + (f"; the baseline's own: {base_err:.2g}" if base_err is not None else "")
        )
    if parsimony is not None:
        header.append("parsimony: " + parsimony.reason())
    plugin_at = len(header) - 1  # "with this plug-in" goes between the two predictions
    header += ["", *deployed.lines, *(plugin_lines or [])]
    rec = dict(recorded, remeasure=REMEASURE_NAME)
    if not same and not cmd_runs:
        # the search measures the command's configuration only where it runs here (Target.side_by_side): with no
        # run there is no second prediction to re-measure
        header.append(f"(no {REMEASURE_COMMAND_NAME}: the command's configuration was not measured here)")
    elif not same:
        try:
            spec = target.launch_spec(deployed.params)
        except Exception as exc:  # noqa: BLE001 - the command's configuration may not run here; say so
            header.append(f"(no {REMEASURE_COMMAND_NAME}: the command's configuration cannot run here: {exc})")
        else:
            crec = _recorded(run, cmd_runs)
            crec["value"] = statistics.median(r.value for r in cmd_runs) if cmd_runs else None
            (tmp / REMEASURE_COMMAND_NAME).write_text(
                render_script(
                    spec,
                    header=[
                        f"{deployed.by}'s re-measure of the exported command's configuration (study {run.study_name!r})",
                        "params: " + ", ".join(f"{k}={v}" for k, v in deployed.params.items()),
                    ],
                    recorded=crec,
                    kernel_dir=bool(kdirs),
                )
            )
            os.chmod(tmp / REMEASURE_COMMAND_NAME, 0o755)
            rec["remeasure_command"] = REMEASURE_COMMAND_NAME
    if (tmp / PLUGIN_MANIFEST).is_file():
        if same or cmd_runs:
            line = _plugin_prediction(run, deployed, cmd_runs, base_levels, kdirs, tmp, target=target)
        else:
            line = "  with this plug-in: not predicted (the command's configuration was not measured here)"
        header.insert(plugin_at, line)
        if (tmp / REMEASURE_PLUGIN_NAME).is_file():
            rec["remeasure_plugin"] = REMEASURE_PLUGIN_NAME
    header += [
        "",
        f"{deployed.by}'s own re-measure: bash {REMEASURE_NAME} (the best) and bash {REMEASURE_COMMAND_NAME} "
        "(this command's configuration); tuner verify launch.sh runs both",
        *deployed.footer,
    ]
    return deployed.render(header, RECORD_MARK + json.dumps(rec, sort_keys=True), MOE_DIR if moe else None)


def _recorded(run, best_runs: list) -> dict[str, Any]:
    """The figures ``tuner verify`` compares against: the objective (the median the run recorded), its metric per
    level (medians over the same runs), and the load that made them."""
    from search_spaces import SpaceError, load_space_text

    try:
        obj = load_space_text(run.space_yaml, source=run.space_name).objective if run.space_yaml else None
    except SpaceError:
        obj = None
    metric = obj.metric if obj else "tok_s"
    by_level = {lvl.split("=", 1)[1]: v for lvl, v in level_medians(best_runs, metric).items() if lvl.startswith("c=")}
    out = {
        "study": run.study_name,
        "target": run.target,
        "objective": run.objective,
        **recorded_figures(obj, run.best_value, by_level, run.settings or {}, direction=run.direction, unit=run.unit),
        "runs": [r.number for r in best_runs],
    }
    best_trial = best_runs[-1] if best_runs else None
    if obj is not None and obj.is_goodput and best_trial is not None:  # verify re-measures the boundary (issue 22)
        out["goodput"] = goodput_recorded(
            obj, {(m.metric, m.level): m.value for m in best_trial.measurements}, run.settings or {}
        )
    return out


def _served_lines(run, trial) -> list[str]:
    """How the trial's tokens were counted, and what a level (a goodput load) had to serve to count: the study's own
    ``max_error_rate`` and ``min_delivered``."""
    counted = sorted({m.metric.split(":", 1)[1] for m in trial.measurements if m.metric.startswith("count:")})
    if not counted:
        return []
    settings = run.settings or {}
    return [
        f"  tokens counted by: {', '.join(counted)} (usage: the server's count; server: its token ids or "
        "logprobs; chunks: one per streamed chunk; tokenizer: the model's tokenizer on the text)",
        f"  served: a request the server said it finished (finish_reason or usage); a level counts with "
        f"{Rules.of(settings).line()}",
    ]


def nothing_met_the_slo(run, trial, consequence: str = "nothing to export") -> str:
    """When ``trial`` (a goodput study's best) met the SLO at no load measured: one line naming the SLO, what
    follows (``consequence``) and how to relax it; empty otherwise (a feasible best, or a study without an SLO)."""
    feasible = next((m.value for m in trial.measurements if m.metric == "goodput_feasible"), None)
    if feasible != 0.0:
        return ""
    served = _served_misses(run, trial)
    advice = (
        f"at its lowest load the latency limits held but it {served}: a server failing or cutting requests "
        "is no latency matter (`tuner status` shows each load; settings max_error_rate and min_delivered set "
        "what a load must serve)"
        if served
        else "loosen the SLO (the space's objective.slo), or measure lower loads (setting goodput_min)"
    )
    return (
        f"study {run.study_name!r}: no configuration met the SLO ({run.objective}); the best, trial "
        f"{trial.number}, missed it at every load measured: {consequence}; {advice}"
    )


def _served_misses(run, trial) -> str:
    """What the trial's lowest load missed of the serving rules (failed requests, tokens delivered) when its latency
    limits held there; empty when a latency limit was missed too (or nothing was stored)."""
    from search_spaces import SpaceError, load_space_text

    rows: dict[str, dict[str, float]] = {}
    for m in trial.measurements:
        if m.level.startswith(("r=", "c=")):
            rows.setdefault(m.level, {})[m.metric] = m.value
    try:
        slo = load_space_text(run.space_yaml, source=run.space_name).objective.slo if run.space_yaml else ()
    except SpaceError:
        return ""
    if not rows or not slo:
        return ""
    figs = rows[min(rows, key=lambda lv: float(lv.split("=", 1)[1]))]
    if any(figs.get(name, float("inf")) > limit for name, limit in slo):
        return ""
    return "; ".join(misses(figs, (), Rules.of(run.settings or {})))


def _refuse_infeasible(run, trial) -> None:
    """A goodput study's best that never met the SLO is no configuration to deploy: ``ExportError`` saying so."""
    line = nothing_met_the_slo(run, trial)
    if line:
        raise ExportError(line)


def recorded_figures(
    objective,
    value: float | None,
    by_level: dict,
    settings: dict[str, Any],
    *,
    direction: str | None = None,
    unit: str | None = None,
) -> dict[str, Any]:
    """The one writer of what a launch script records for ``tuner verify``: the objective (a space's
    ``Objective``, or None for the defaults), its value and its metric per level, and the load that made them."""
    levels = [int(c) for c in (objective.levels if objective else [])] or sorted(int(c) for c in by_level)
    if objective is not None and objective.is_goodput:  # a boundary search measures loads, never these levels
        levels = []
    return {
        "metric": objective.metric if objective else "tok_s",
        "direction": direction or (objective.direction if objective else "maximize"),
        "unit": unit or (objective.unit if objective else ""),
        "combine": objective.combine if objective else "geomean",
        "levels": levels,
        "level": objective.level if objective else None,
        "value": value,
        "by_level": {str(k): v for k, v in by_level.items()},
        "load": {k: settings[k] for k in LOAD_KEYS if k in settings},
    }
