"""Say why the best configuration won: parameter importances (overall and per level) and, for the workload, an
op-level profile of the baseline and the best configuration side by side."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import optuna

from storage import Repo
from storage.models import Run, TrialRecord
from tuner.processes import json_output
from tuner.settings import target_settings

if TYPE_CHECKING:
    from search_spaces import Objective
    from tuner.measurement import Measurement

_logger = logging.getLogger(__name__)


@dataclass
class Explanation:
    study: str
    importances: dict[str, dict[str, float]] = field(default_factory=dict)
    """``{"objective": {param: importance}, "c=64": {...}}``, each sorted high to low."""
    importance_trials: int = 0
    """How many successful trials the importances come from."""
    profiles: dict[str, dict] = field(default_factory=dict)
    """``{"baseline": profile, "best": profile}`` from ``tuner.targets.workload.profile``."""
    notes: list[str] = field(default_factory=list)
    baseline_params: dict[str, Any] = field(default_factory=dict)
    best_params: dict[str, Any] = field(default_factory=dict)
    ablation: list[dict] = field(default_factory=list)
    """One row per parameter the best changed: the best re-run with that one parameter back at its baseline value
    (``{"param", "from", "to", "outcome", "by_level", "loss"}``, ``loss`` = best / ablated at each level for a
    maximized objective, ablated / best for a minimized one: > 1 when undoing the change hurts)."""
    alone: list[dict] = field(default_factory=list)
    """One row per parameter the best changed: the baseline re-run with only that parameter at the best's value
    (``{"param", "from", "to", "outcome", "by_level", "gain"}``, ``gain`` = this / baseline at each level for a
    maximized objective, baseline / this for a minimized one: > 1 when the change helps on its own)."""
    best_by_level: dict[int, float] = field(default_factory=dict)
    baseline_by_level: dict[int, float] = field(default_factory=dict)
    neighbours: list[dict] = field(default_factory=list)
    """Trials the search itself ran one value away from the best (its refinement's moves, or TPE's): ``{"param",
    "best", "other", "trial", "ratio"}``, ``ratio`` = the best's objective over that trial's (inverse when minimized):
    > 1 when the best's value wins. No re-run: the search's own timings."""

    numerics: dict[str, Any] = field(default_factory=dict)
    """The numerics gate's errors (workload): ``{"best": err, "tolerance": tol, "rows": [{"param", "value",
    "trials", "max_err"}], "wrong": [{"trial", "params", "err"}]}``, errors relative to the baseline's output."""

    greedy: dict[str, Any] = field(default_factory=dict)
    """The greedy check's agreements (server targets): ``{"best": rate, "min_agreement": m, "rows": [{"param",
    "value", "trials", "min_agreement"}], "wrong": [{"trial", "params", "agreement"}]}``, each the mean common prefix
    share of a trial's greedy completions with the baseline's."""

    predicted: list[dict] = field(default_factory=list)
    """Warm-started trials of a server study: ``{"trial", "twin_study", "twin_trial", "level", "predicted",
    "measured"}``, each a ratio to its own study's baseline (the twin's prediction, the server's measurement)."""

    command: dict[str, Any] = field(default_factory=dict)
    """A workload study: the exported command's configuration against the twin's best (``{"params", "changes"
    (lines), "runs", "by_level", "best_by_level"}``, per-level medians; ``runs`` empty when it was not measured)."""

    def markdown(self) -> str:
        out = [f"# Why the best configuration of `{self.study}` won", ""]
        changed = {
            k: (self.baseline_params.get(k), v) for k, v in self.best_params.items() if self.baseline_params.get(k) != v
        }
        if changed:
            out += ["Changed from the baseline: " + ", ".join(f"`{k}` {a} → {b}" for k, (a, b) in changed.items()), ""]
        short = self._in_short()
        if short:
            out += ["## In short", ""] + [x for line in short for x in (line, "")]
        if any(self.importances.values()):
            out += [
                f"Importances from {self.importance_trials} successful trials (Optuna's PED-ANOVA: how "
                "differently the best of them set each parameter from the rest). With a few dozen trials they "
                "are rough, and the search's last one-change moves crowd its best trials together; `--ablate` "
                "measures what each change is worth.",
                "",
            ]
        for what, imp in self.importances.items():
            out += [f"## Parameter importances for {what}", "", "| parameter | importance |", "| --- | --- |"]
            out += [f"| {k} | {v:.3f} |" for k, v in imp.items()]
            out.append("")
        for name in ("baseline", "best"):
            prof = self.profiles.get(name)
            if not prof:
                continue
            out += [
                f"## Profile of the {name} at batch {prof['batch']} ({prof['device']}): step "
                f"{prof['total_us'] / 1e3:.2f} ms of {'GPU' if prof['device'] == 'cuda' else 'CPU'} time, "
                f"{prof['launches']} {'kernel launches' if prof['device'] == 'cuda' else 'op calls'}",
                "",
                "| op | share | time (µs) | calls | largest input shapes |",
                "| --- | --- | --- | --- | --- |",
            ]
            out += [
                f"| {r['op'][:60]} | {100 * r['share']:.1f}% | {r['time_us']:.0f} | {r['count']} | {r['shapes']} |"
                for r in prof["top"]
            ]
            out.append("")
            if prof.get("stages"):
                covered = sum(r["share"] for r in prof["stages"])
                out += [
                    f"Where the {name}'s step goes, by stage: "
                    + ", ".join(f"{r['stage']} {100 * r['share']:.1f}%" for r in prof["stages"])
                    + f" (the stages hold {100 * covered:.0f}% of the step's time: the profiler links a kernel to its "
                    "stage through the torch op that launched it, and Triton's own launches are not linked)",
                    "",
                ]
            if prof.get("shaped"):
                out += [
                    f"Torch ops of the {name} whose own kernels took the most GPU time, with their input shapes:",
                    "",
                    "| op | time (µs) | calls | input shapes |",
                    "| --- | --- | --- | --- |",
                ]
                out += [
                    f"| {r['op'][:60]} | {r['time_us']:.0f} | {r['count']} | {r['shapes']} |" for r in prof["shaped"]
                ]
                out.append("")
        if self.neighbours:
            out += [
                "## One value away from the best, as the search timed it (no re-run)",
                "",
                "| parameter | best → other value | trial | best / other |",
                "| --- | --- | --- | --- |",
            ]
            out += [
                f"| {r['param']} | {r['best']} → {r['other']} | {r['trial']} | {r['ratio']:.3f} |"
                for r in self.neighbours
            ]
            out.append("")
        if self.alone:
            out += _ratio_table(
                "What each change is worth alone: the baseline with only that parameter set to the best's value",
                "baseline → best value",
                "x faster",
                self.alone,
                "gain",
                sorted(self.baseline_by_level),
                reverse=False,
            )
        if self.ablation:
            out += _ratio_table(
                "What each change is worth: the best with one parameter put back to its baseline value",
                "best → baseline value",
                "x slower",
                self.ablation,
                "loss",
                sorted(self.best_by_level),
                reverse=True,
            )
        out += self._numerics_lines()
        out += self._greedy_lines()
        if self.predicted:
            out += [
                "## Predicted by the twin against measured on the server (x each study's own baseline)",
                "",
                "| trial | twin trial | level | predicted | measured | measured / predicted |",
                "| --- | --- | --- | --- | --- | --- |",
            ]
            out += [
                f"| {r['trial']} | {r['twin_study']}#{r['twin_trial']} | {r['level']} | {r['predicted']:.2f}x | "
                + (
                    f"{r['measured']:.2f}x | {r['measured'] / r['predicted']:.2f} |"
                    if r["measured"] is not None
                    else f"{r['outcome']} | - |"
                )
                for r in self.predicted
            ]
            out.append("")
        out += self._command_lines()
        out += [f"- {n}" for n in self.notes]
        return "\n".join(out) + "\n"

    def _command_lines(self) -> list[str]:
        c = self.command
        if not c:
            return []
        out = ["## The exported command against the twin's best", ""]
        if not c["changes"]:
            return out + ["The best is the command: every value it has, the exported command sets.", ""]
        out += [
            "What the command cannot give (it runs the value after the arrow instead):",
            "",
            *[f"- {ln.strip()}" for ln in c["changes"]],
            "",
        ]
        if not c["runs"]:
            return out + [
                "The command's configuration was not measured in this study (`tuner verify launch.sh` measures it).",
                "",
            ]
        out += [
            f"The command's configuration, trials {', '.join(map(str, c['runs']))} (medians, tok/s):",
            "",
            "| level | the twin's best | this command | best / command |",
            "| --- | --- | --- | --- |",
        ]
        for lv in sorted(c["by_level"], key=lambda x: int(x.split("=")[1]) if x.startswith("c=") else 0):
            b, m = c["best_by_level"].get(lv), c["by_level"][lv]
            out.append(f"| {lv} | {b:.1f} | {m:.1f} | {b / m:.2f}x |" if b and m else f"| {lv} | - | {m:.1f} | - |")
        return out + [""]

    def _numerics_lines(self) -> list[str]:
        return _gate_lines(
            self.numerics,
            "## Numerics: each step's output against the precise reference's (relative norm error)",
            "The best's output differs from the reference's by {:.3g}",
            "tolerance",
            "tolerance {:.3g}",
            "Largest error among the successful trials, per parameter value:",
            "max rel. error",
            "max_err",
            "{:.3g}",
            "error",
            "err",
        )

    def _greedy_lines(self) -> list[str]:
        return _gate_lines(
            self.greedy,
            "## Greedy check: fixed prompts completed at temperature 0 against the baseline's (common prefix share)",
            "The best's completions agree with the baseline's on {:.3f}",
            "min_agreement",
            "min_agreement {:g}",
            "Lowest agreement among the successful trials, per parameter value:",
            "min agreement",
            "min_agreement",
            "{:.3f}",
            "agreement",
            "agreement",
        )

    def _in_short(self) -> list[str]:
        """The report's answer first: per level, the largest change alone and the costliest to undo (measured by
        ``--ablate``), then where each profiled step spends most of its time."""
        lines = [
            line for c in sorted(set(self.baseline_by_level) | set(self.best_by_level)) if (line := self._summary(c))
        ]
        steps = []
        for name in ("baseline", "best"):
            stages = (self.profiles.get(name) or {}).get("stages") or []
            if stages:
                top = stages[0]
                prof = self.profiles[name]
                steps.append(
                    f"the {name}'s step spends {100 * top['share']:.1f}% in the {top['stage']} stage "
                    f"({prof['total_us'] / 1e3:.2f} ms at batch {prof['batch']})"
                )
        if steps:
            lines.append("Profiled: " + "; ".join(steps) + ".")
        if lines and not self.alone and not self.ablation:
            lines.append("`--ablate` measures what each change is worth, alone and undone.")
        return lines

    def _summary(self, c: int) -> str:
        """One sentence for level ``c``: the largest change alone and the costliest to undo ("" without data)."""
        alone = max((r for r in self.alone if c in r["gain"]), key=lambda r: r["gain"][c], default=None)
        # a re-run that failed is the costliest undo of all, as in the table's ranking
        undo = max(
            (r for r in self.ablation if c in r["loss"] or r["outcome"] != "ok"),
            key=lambda r: r["loss"].get(c, float("inf")),
            default=None,
        )
        parts = []
        if alone:
            parts.append(
                f"the largest single change is `{alone['param']}` ({alone['gain'][c]:.2f}x alone on the baseline)"
            )
        if undo:
            cost = f"{undo['loss'][c]:.2f}x" if c in undo["loss"] else f"the best without it fails: {undo['outcome']}"
            parts.append(f"the costliest to undo from the best is `{undo['param']}` ({cost})")
        if not parts:
            return ""
        # a change worth a lot alone that costs little to undo: other changes of the best remove the same cost
        undo_loss = {r["param"]: r["loss"][c] for r in self.ablation if c in r["loss"]}
        overlap = [
            r
            for r in self.alone
            if c in r["gain"]
            and r["gain"][c] >= 1.5
            and r["param"] in undo_loss
            and undo_loss[r["param"]] <= r["gain"][c] ** 0.5
        ]
        text = f"At c={c} " + "; ".join(parts) + "."
        if overlap:
            text += (
                " Overlapping changes (each worth much more alone than undoing it costs, so other changes of the "
                "best remove much of the same cost): "
                + ", ".join(
                    f"`{r['param']}` {r['gain'][c]:.2f}x alone vs {undo_loss[r['param']]:.2f}x to undo" for r in overlap
                )
                + "."
            )
        return text


def _ratio_table(
    title: str, change: str, unit: str, rows: list[dict], key: str, levels: list[int], *, reverse: bool
) -> list[str]:
    """A markdown table of ablation rows: the change (``from → to``, or ``to → from`` when ``reverse``) and the ratio
    ``key`` at each level, or the re-run's outcome where it has none."""
    out = [
        f"## {title}",
        "",
        f"| parameter | {change} | " + " | ".join(f"c={c} {unit}" for c in levels) + " |",
        "| --- | --- | " + " | ".join("---" for _ in levels) + " |",
    ]
    for row in rows:
        a, b = (row["to"], row["from"]) if reverse else (row["from"], row["to"])
        cells = [f"{row[key][c]:.2f}" if c in row[key] else row["outcome"] for c in levels]
        out.append(f"| {row['param']} | {a} → {b} | " + " | ".join(cells) + " |")
    return out + [""]


def _importances(trials: list[optuna.trial.FrozenTrial], values: dict[int, float]) -> dict[str, float]:
    rows = [t for t in trials if t.number in values and t.distributions]
    if len(rows) < 3:
        return {}
    names = set.intersection(*(set(t.distributions) for t in rows)) if rows else set()
    study = optuna.create_study(direction="maximize")
    for t in rows:
        params = {k: t.params[k] for k in names}
        dists = {k: t.distributions[k] for k in names}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=values[t.number]))
    varying = [k for k in names if len({repr(t.params[k]) for t in rows}) > 1]
    if not varying:
        return {}
    # PED-ANOVA needs no scikit-learn (fANOVA does); Optuna 5 makes it the default
    ped = getattr(optuna.importance, "PedAnovaImportanceEvaluator", None)
    imp = optuna.importance.get_param_importances(study, params=varying, evaluator=ped() if ped else None)
    return dict(sorted(imp.items(), key=lambda kv: -kv[1]))


def explain(
    storage_url: str, study: str, *, profile: bool = True, level: int | None = None, timeout_s: float = 300.0
) -> Explanation:
    """Importances from the study's successful trials; profiles of baseline and best (workload target only)."""
    from search_spaces import load_space_text
    from tuner.search.context import open_optuna_storage

    repo = Repo(storage_url)
    run = repo.get_run(study)
    if run is None:
        raise ValueError(f"no study {study!r} in {storage_url}; `tuner status` lists the studies")
    ostudy = optuna.load_study(study_name=study, storage=open_optuna_storage(storage_url))
    frozen = ostudy.get_trials(deepcopy=False)
    ok = repo.list_trials(run.id, outcome="ok", with_measurements=True)
    ex = Explanation(study=study)
    objective = {t.number: t.value for t in ok if t.value is not None and t.repeat_of is None}
    ex.importances["objective"] = _importances(frozen, objective)
    ex.importance_trials = len(objective)
    levels = sorted(
        {m.level for t in ok for m in t.measurements if m.metric == "tok_s" and m.level},
        key=lambda s: int(s.split("=")[1]) if s.startswith("c=") else 0,
    )
    if level is not None:
        levels = [lv for lv in levels if lv == f"c={level}"]
    for lv in levels:
        vals = {
            t.number: m.value
            for t in ok
            for m in t.measurements
            if m.metric == "tok_s" and m.level == lv and t.repeat_of is None
        }
        ex.importances[f"tok/s at {lv}"] = _importances(frozen, vals)
    if not any(ex.importances.values()):
        ex.notes.append("fewer than 3 successful trials with varying parameters: no importances yet")
    base = repo.baseline_trial(run.id)
    best = repo.get_trial(run.id, run.best_trial_number) if run.best_trial_number is not None else None
    ex.baseline_params = base.params if base else {}
    ex.best_params = best.params if best else {}
    if best is not None and best.value:
        space = load_space_text(run.space_yaml, source=run.space_name)
        ex.neighbours = _neighbours(space, best, ok, space.objective.direction)
    ex.numerics = numerics_summary(repo, run.id, best)
    ex.greedy = greedy_summary(repo, run.id, best)
    ex.predicted = predicted_vs_measured(repo, run, base, frozen, ex.notes)
    if run.target == "workload" and best is not None:
        ex.command = command_vs_best(repo, run, best)
    if profile and run.target == "workload" and base and best:
        prof_level = level or max((int(lv.split("=")[1]) for lv in levels), default=64)
        for name, trial in (("baseline", base), ("best", best)):
            try:
                ex.profiles[name] = _profile(run, trial.params, prof_level, timeout_s)
            except (subprocess.SubprocessError, OSError, ValueError) as exc:
                ex.notes.append(f"profile of the {name} failed: {exc}")
    elif profile and run.target != "workload":
        ex.notes.append(f"op-level profiles are made for the workload target only (this study: {run.target})")
    return ex


def predicted_vs_measured(repo: Repo, run: Run, base: TrialRecord | None, frozen, notes: list[str]) -> list[dict]:
    """For each warm-started trial (``--warm-start``), the twin trial's ratio to the twin's baseline (predicted) and
    the server trial's ratio to the server's baseline (measured), per level of the objective's metric."""
    from tuner.search.warm_start import WARM_ATTR

    warm = {t.number: t.user_attrs[WARM_ATTR] for t in frozen if WARM_ATTR in t.user_attrs}
    if not warm:
        return []

    def by_level(t: TrialRecord | None) -> dict[str, float]:
        return {m.level: m.value for m in (t.measurements if t else []) if m.metric == "tok_s" and m.level}

    rows = []
    twins: dict[tuple[str, str], tuple[Repo, Run, TrialRecord | None] | None] = {}
    server_base = by_level(base)
    for number, src in sorted(warm.items()):
        key = (src["url"], src["study"])
        if key not in twins:
            try:
                trepo = Repo(src["url"])
                trun = trepo.get_run(src["study"])
                twins[key] = (trepo, trun, trepo.baseline_trial(trun.id)) if trun else None
            except Exception as exc:  # noqa: BLE001 - the twin's storage may be gone: say so, keep the rest
                notes.append(f"the twin study {src['study']} at {src['url']} cannot be read ({exc}); no predictions")
                twins[key] = None
        if twins[key] is None:
            continue
        trepo, trun, tbase = twins[key]
        twin_levels, twin_base = by_level(trepo.get_trial(trun.id, src["trial"])), by_level(tbase)
        trial = repo.get_trial(run.id, number)
        measured = by_level(trial)
        for lv in sorted(twin_levels, key=lambda s: int(s.split("=")[1]) if s.startswith("c=") else 0):
            if not twin_base.get(lv) or lv not in server_base:  # levels both studies measured
                continue
            got = measured.get(lv) / server_base[lv] if measured.get(lv) and server_base.get(lv) else None
            rows.append(
                {
                    "trial": number,
                    "twin_study": src["study"],
                    "twin_trial": src["trial"],
                    "level": lv,
                    "predicted": twin_levels[lv] / twin_base[lv],
                    "measured": got,
                    "outcome": trial.outcome if trial else "not run",
                }
            )
    return rows


def command_vs_best(repo: Repo, run: Run, best: TrialRecord) -> dict[str, Any]:
    """The exported command's configuration (``server_map.command_config`` on the study's GPU) against the best:
    what it cannot give, and both configurations' per-level medians over their stored runs."""
    from search_spaces import load_space_text
    from search_spaces.hardware import arch_of_environment
    from tuner.export.script import config_runs, level_medians
    from tuner.targets.workload.server_map import command_config

    arch = arch_of_environment(run.environment)
    cmd = command_config(load_space_text(run.space_yaml, source=run.space_name), best.params, arch)
    runs = config_runs(repo, run.id, cmd.params) if cmd.changes else []
    return {
        "params": cmd.params,
        "changes": cmd.lines(),
        "runs": [r.number for r in runs],
        "by_level": level_medians(runs),
        "best_by_level": level_medians(config_runs(repo, run.id, best.params)),
    }


def numerics_summary(repo: Repo, run_id: int, best: TrialRecord | None) -> dict[str, Any]:
    """The numerics gate's stored errors (``numerics_rel_err``): the best's, the largest per parameter value among
    the successful trials, and the trials it refused; ``{}`` when the study stored none."""

    def err(t: TrialRecord) -> float | None:
        return next((m.value for m in t.measurements if m.metric == "numerics_rel_err"), None)

    def tol(t: TrialRecord) -> float | None:
        return next((m.value for m in t.measurements if m.metric == "numerics_tolerance"), None)

    ok = [t for t in repo.list_trials(run_id, outcome="ok", with_measurements=True) if err(t) is not None]
    wrong = [
        t
        for t in repo.list_trials(run_id, outcome="wrong_result", with_measurements=True)
        if err(t) is not None and t.repeat_of is None
    ]
    if not ok and not wrong:
        return {}
    rows: dict[tuple[str, str], dict] = {}
    for t in ok:
        for k, v in t.params.items():
            r = rows.setdefault((k, str(v)), {"param": k, "value": v, "trials": 0, "max_err": 0.0})
            r["trials"] += 1
            r["max_err"] = max(r["max_err"], err(t))
    best_err = err(best) if best is not None else None
    return {
        "best": best_err,
        "tolerance": tol(best) if best is not None else None,
        "rows": sorted(rows.values(), key=lambda r: (r["param"], -r["max_err"])),
        "wrong": [{"trial": t.number, "params": t.params, "err": err(t)} for t in wrong],
    }


def greedy_summary(repo: Repo, run_id: int, best: TrialRecord | None) -> dict[str, Any]:
    """The greedy check's stored agreements (``greedy_agreement``): the best's, the lowest per parameter value among
    the successful trials, and the trials it refused; ``{}`` when the study stored none."""

    def metric(t: TrialRecord, name: str) -> float | None:
        return next((m.value for m in t.measurements if m.metric == name), None)

    ok = [
        t
        for t in repo.list_trials(run_id, outcome="ok", with_measurements=True)
        if metric(t, "greedy_agreement") is not None
    ]
    wrong = [
        t
        for t in repo.list_trials(run_id, outcome="wrong_result", with_measurements=True)
        if metric(t, "greedy_agreement") is not None and t.repeat_of is None
    ]
    if not ok and not wrong:
        return {}
    rows: dict[tuple[str, str], dict] = {}
    for t in ok:
        for k, v in t.params.items():
            r = rows.setdefault((k, str(v)), {"param": k, "value": v, "trials": 0, "min_agreement": 1.0})
            r["trials"] += 1
            r["min_agreement"] = min(r["min_agreement"], metric(t, "greedy_agreement"))
    return {
        "best": metric(best, "greedy_agreement") if best is not None else None,
        "min_agreement": metric(best, "greedy_min_agreement") if best is not None else None,
        "rows": sorted(rows.values(), key=lambda r: (r["param"], r["min_agreement"])),
        "wrong": [{"trial": t.number, "params": t.params, "agreement": metric(t, "greedy_agreement")} for t in wrong],
    }


def _neighbours(space, best: TrialRecord, ok: list[TrialRecord], direction: str) -> list[dict]:
    """The search's ok trials that differ from the best in one parameter (a conditional parameter that comes or goes
    with its parent's change does not count), one row per (parameter, value), the most telling first."""
    children = {p.name: set(p.when.names) for p in space.params if p.when is not None}
    rows: dict[tuple[str, str], dict] = {}
    for t in ok:
        if t.number == best.number or not t.value or t.repeat_of is not None:
            continue
        diff = {k for k in best.params.keys() | t.params.keys() if best.params.get(k) != t.params.get(k)}
        diff = {k for k in diff if not (children.get(k, set()) & diff)}
        if len(diff) != 1 or t.params == best.params:
            continue
        (name,) = diff
        ratio = best.value / t.value if direction == "maximize" else t.value / best.value
        key = (name, repr(t.params.get(name)))
        if key not in rows or ratio < rows[key]["ratio"]:  # of repeated timings, the one closest to the best
            rows[key] = {
                "param": name,
                "best": best.params.get(name),
                "other": t.params.get(name),
                "trial": t.number,
                "ratio": ratio,
            }
    return sorted(rows.values(), key=lambda r: -r["ratio"])


VIEWS = ("alone", "undo")
"""The ablation's views: each change applied alone to the baseline, and each change undone from the best."""


def ablate(
    storage_url: str,
    study: str,
    *,
    timeout_s: float = 300.0,
    level: int | None = None,
    views: tuple[str, ...] = VIEWS,
    on_row: Callable[[Explanation], None] | None = None,
) -> Explanation:
    """Per changed parameter (conditional children follow their parent), re-run the baseline with only that parameter
    at the best's value (``alone``: what the change is worth on its own) and the best with that parameter put back to
    its baseline value (``undo``: what undoing it costs), each in its own trial process, forward then backward so an
    interrupted ablation has both views of the first parameters. ``on_row`` sees the ranked tables so far after every
    re-run (a report that survives an interrupted ablation)."""
    from search_spaces import Hardware, detect_hardware, load_space_text, resolve
    from tuner.execution.isolation import TrialJob, run_trial

    bad = [v for v in views if v not in VIEWS]
    if bad or not views:
        raise ValueError(f"views {tuple(views)!r} must be one or more of {', '.join(VIEWS)}")
    repo = Repo(storage_url)
    run = repo.get_run(study)
    if run is None:
        raise ValueError(f"no study {study!r} in {storage_url}; `tuner status` lists the studies")
    base = repo.baseline_trial(run.id)
    best = repo.get_trial(run.id, run.best_trial_number) if run.best_trial_number is not None else None
    if base is None or best is None:
        raise ValueError(f"study {study!r} needs a baseline and a successful best trial to ablate")
    space = load_space_text(run.space_yaml, source=run.settings.get("space_path", run.space_name))
    hw = Hardware.from_json(run.settings["hardware"]) if run.settings.get("hardware") else detect_hardware()
    resolved = resolve(space, hw)
    ex = Explanation(study=study, baseline_params=base.params, best_params=best.params)
    ex.best_by_level = _by_level(best, space.objective, level)
    ex.baseline_by_level = _by_level(base, space.objective, level)
    if "alone" in views and not ex.baseline_by_level:
        ex.notes.append("the baseline has no stored measurements: the changes alone are run, but no gain is given")
    # the ratio of two values, oriented so that > 1 means the first (the better one if the change helps) is better
    better = (lambda a, b: a / b) if space.objective.direction == "maximize" else (lambda a, b: b / a)
    settings = target_settings(run.settings)

    def rerun(wanted: dict[str, Any]) -> Measurement:
        params = resolved.walk(lambda p: wanted.get(p.name, p.default))
        job = TrialJob(
            target=run.target,
            space_yaml=run.space_yaml,
            space_source=space.source,
            params=params,
            deadline=time.time() + timeout_s,
            settings=settings,
            hardware=hw.to_json(),
        )
        return run_trial(job)

    # both ends re-measured in this run first, so that every ratio is between runs made side by side
    def levels_text(values: dict[int, float]) -> str:
        return ", ".join(f"c={c} {v:.4g}" for c, v in values.items())

    for label, trial, attr, view in (
        ("baseline", base, "baseline_by_level", "alone"),
        ("best", best, "best_by_level", "undo"),
    ):
        stored = getattr(ex, attr)
        if view not in views or not stored:
            continue
        m = rerun(dict(trial.params))
        fresh = {c: m.by_level[c] for c in stored if m.outcome.value == "ok" and m.by_level.get(c)}
        if fresh:
            setattr(ex, attr, fresh)
            ex.notes.append(
                f"the {label} re-run in this ablation: {levels_text(fresh)} (stored by the search: "
                f"{levels_text(stored)}); ratios are against the re-run"
            )
        else:
            ex.notes.append(
                f"the {label} re-run in this ablation failed ({m.outcome.value}); ratios are against "
                "the value the search stored"
            )
        _logger.info("ablation: the %s re-run: %s %s", label, m.outcome.value, fresh)

    def add(rows: list[dict], name: str, m: Measurement, key: str, ratio: dict[int, float], what: str) -> None:
        rows.append(
            {
                "param": name,
                "from": base.params[name],
                "to": best.params[name],
                "outcome": m.outcome.value,
                "by_level": m.by_level,
                key: ratio,
            }
        )
        _logger.info(
            "ablation: %s %s: %s, %s %s", name, what, m.outcome.value, key, {c: round(x, 3) for c, x in ratio.items()}
        )
        _rank(ex)
        store()
        if on_row is not None:
            on_row(ex)

    def store() -> None:  # the tables so far, for the export to name each flagless knob's measured gain
        from tuner.targets.workload.deploy import ABLATION_ARTIFACT

        doc = {"best_trial": best.number, "alone": ex.alone, "undo": ex.ablation}
        repo.add_artifacts(run.id, [("ablation", ABLATION_ARTIFACT, "", json.dumps(doc, default=str).encode())])

    for name, value in best.params.items():
        if base.params.get(name) == value or name not in base.params:
            continue
        if "alone" in views:
            m = rerun({**best.params, **base.params, name: value})
            ok = [c for c in ex.baseline_by_level if m.outcome.value == "ok" and m.by_level.get(c)]
            add(
                ex.alone,
                name,
                m,
                "gain",
                {c: better(m.by_level[c], ex.baseline_by_level[c]) for c in ok},
                f"alone at {value!r}",
            )
        if "undo" in views:
            m = rerun({**best.params, name: base.params[name]})
            ok = [c for c in ex.best_by_level if m.outcome.value == "ok" and m.by_level.get(c)]
            add(
                ex.ablation,
                name,
                m,
                "loss",
                {c: better(ex.best_by_level[c], m.by_level[c]) for c in ok},
                f"back to {base.params[name]!r}",
            )
    return ex


def _by_level(trial: TrialRecord, objective: Objective, level: int | None) -> dict[int, float]:
    """The objective's metric per concurrency level from a trial's stored measurements (only ``level`` if given)."""
    out = {
        int(m.level[2:]): m.value
        for m in trial.measurements
        if m.metric == objective.metric and m.level.startswith("c=")
    }
    return {c: v for c, v in out.items() if level is None or c == level}


def _rank(ex: Explanation) -> None:
    """Costliest change to undo first, by the highest concurrency level (a failed re-run ranks first); the largest
    change alone first, by the baseline's highest level (a change that fails alone is worth nothing: last)."""
    key = max(ex.best_by_level) if ex.best_by_level else None
    ex.ablation.sort(key=lambda r: -(r["loss"].get(key, float("inf")) if key else 0))
    key = max(ex.baseline_by_level) if ex.baseline_by_level else None
    ex.alone.sort(key=lambda r: -(r["gain"].get(key, float("-inf")) if key else 0))


def _profile(run: Run, params: dict[str, Any], level: int, timeout_s: float) -> dict:
    from search_spaces import load_space_text

    space = load_space_text(run.space_yaml, source=run.space_name) if run.space_yaml else None
    preset = run.settings.get("preset") or (space.preset if space else "dsv4-flash")
    argv = [
        sys.executable,
        "-m",
        "tuner.targets.workload.profile",
        "--preset",
        preset,
        "--level",
        str(level),
        "--live-context",
        str(run.settings.get("live_context", 512)),
    ]
    kernel_of = {p.name: p.kernel for p in space.params if p.kernel} if space else {}
    for k, v in params.items():
        argv += ["--knob", f"{kernel_of.get(k, k)}={v}"]
    return json_output(subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s), "profiler")


def _gate_lines(
    g: dict | None,
    title: str,
    best_text: str,
    limit_key: str,
    limit_text: str,
    table_intro: str,
    column: str,
    row_key: str,
    row_fmt: str,
    wrong_word: str,
    wrong_key: str,
) -> list[str]:
    """A gate's section (the numerics gate, the greedy check): the best's figure against its limit, the worst figure
    per parameter value among the successful trials, and the trials the gate made wrong_result."""
    if not g:
        return []
    out = [title, ""]
    if g.get("best") is not None:
        limit = g.get(limit_key)
        out += [best_text.format(g["best"]) + (f" ({limit_text.format(limit)})." if limit is not None else "."), ""]
    if g.get("rows"):
        out += [table_intro, "", f"| parameter | value | trials | {column} |", "| --- | --- | --- | --- |"]
        out += [f"| {r['param']} | {r['value']} | {r['trials']} | {row_fmt.format(r[row_key])} |" for r in g["rows"]]
        out.append("")
    for w in g.get("wrong", []):
        out.append(
            f"- trial {w['trial']} was wrong_result ({wrong_word} {row_fmt.format(w[wrong_key])}): "
            + ", ".join(f"{k}={v}" for k, v in w["params"].items())
        )
    if g.get("wrong"):
        out.append("")
    return out
