"""Say why the best configuration won: parameter importances (overall and per level) and, for the workload, an
op-level profile of the baseline and the best configuration side by side."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import optuna

from storage import Repo
from storage.models import Run

_logger = logging.getLogger(__name__)


@dataclass
class Explanation:
    study: str
    importances: dict[str, dict[str, float]] = field(default_factory=dict)
    """``{"objective": {param: importance}, "c=64": {...}}``, each sorted high to low."""
    profiles: dict[str, dict] = field(default_factory=dict)
    """``{"baseline": profile, "best": profile}`` from ``tuner.workload.profile``."""
    notes: list[str] = field(default_factory=list)
    baseline_params: dict[str, Any] = field(default_factory=dict)
    best_params: dict[str, Any] = field(default_factory=dict)

    def markdown(self) -> str:
        out = [f"# Why the best configuration of `{self.study}` won", ""]
        changed = {k: (self.baseline_params.get(k), v) for k, v in self.best_params.items()
                   if self.baseline_params.get(k) != v}
        if changed:
            out += ["Changed from the baseline: " + ", ".join(f"`{k}` {a} → {b}" for k, (a, b) in changed.items()), ""]
        for what, imp in self.importances.items():
            out += [f"## Parameter importances for {what}", "", "| parameter | importance |", "| --- | --- |"]
            out += [f"| {k} | {v:.3f} |" for k, v in imp.items()]
            out.append("")
        for name in ("baseline", "best"):
            prof = self.profiles.get(name)
            if not prof:
                continue
            out += [f"## Profile of the {name} at batch {prof['batch']} ({prof['device']}): step "
                    f"{prof['total_us'] / 1e3:.2f} ms of {'GPU' if prof['device'] == 'cuda' else 'CPU'} time, "
                    f"{prof['launches']} {'kernel launches' if prof['device'] == 'cuda' else 'op calls'}", "",
                    "| op | share | time (µs) | calls | largest input shapes |", "| --- | --- | --- | --- | --- |"]
            out += [f"| {r['op'][:60]} | {100 * r['share']:.1f}% | {r['time_us']:.0f} | {r['count']} | "
                    f"{r['shapes']} |" for r in prof["top"]]
            out.append("")
        out += [f"- {n}" for n in self.notes]
        return "\n".join(out) + "\n"


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
    imp = optuna.importance.get_param_importances(study, params=varying, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0))
    return dict(sorted(imp.items(), key=lambda kv: -kv[1]))


def explain(storage_url: str, study: str, *, profile: bool = True, level: int | None = None,
            timeout_s: float = 300.0) -> Explanation:
    """Importances from the study's successful trials; profiles of baseline and best (workload target only)."""
    from tuner.search import open_optuna_storage

    repo = Repo(storage_url)
    run = repo.get_run(study)
    if run is None:
        raise ValueError(f"no study {study!r} in {storage_url}; `tuner status` lists the studies")
    ostudy = optuna.load_study(study_name=study, storage=open_optuna_storage(storage_url))
    frozen = ostudy.get_trials(deepcopy=False)
    ok = repo.list_trials(run.id, outcome="ok", with_measurements=True)
    ex = Explanation(study=study)
    objective = {t.number: t.value for t in ok if t.value is not None and "not run again" not in t.reason}
    ex.importances["objective"] = _importances(frozen, objective)
    levels = sorted({m.level for t in ok for m in t.measurements if m.metric == "tok_s" and m.level},
                    key=lambda s: int(s.split("=")[1]) if s.startswith("c=") else 0)
    if level is not None:
        levels = [lv for lv in levels if lv == f"c={level}"]
    for lv in levels:
        vals = {t.number: m.value for t in ok for m in t.measurements if m.metric == "tok_s" and m.level == lv
                and "not run again" not in t.reason}
        ex.importances[f"tok/s at {lv}"] = _importances(frozen, vals)
    if not any(ex.importances.values()):
        ex.notes.append("fewer than 3 successful trials with varying parameters: no importances yet")
    base = repo.baseline_trial(run.id)
    best = repo.get_trial(run.id, run.best_trial_number) if run.best_trial_number is not None else None
    ex.baseline_params = base.params if base else {}
    ex.best_params = best.params if best else {}
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


def _profile(run: Run, params: dict[str, Any], level: int, timeout_s: float) -> dict:
    from search_spaces import load_space_text

    space = load_space_text(run.space_yaml, source=run.space_name) if run.space_yaml else None
    preset = run.settings.get("preset") or (space.preset if space else "dsv4-flash")
    argv = [sys.executable, "-m", "tuner.workload.profile", "--preset", preset, "--level", str(level),
            "--live-context", str(run.settings.get("live_context", 512))]
    kernel_of = {p.name: p.kernel for p in space.params if p.kernel} if space else {}
    for k, v in params.items():
        argv += ["--knob", f"{kernel_of.get(k, k)}={v}"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ValueError(f"profiler exited with {out.returncode}: {tail[0][:300]}")
    return json.loads(lines[-1])
