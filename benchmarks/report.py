"""Results tables of recorded studies, read from their databases (issue 21, item 13): the published figures come
from here, never typed.

    python benchmarks/report.py benchmarks/results/studies/*/*.db --out-dir OUT

For each database and each study in it, ``<out-dir>/study_<file stem>.md`` holds: where it ran (GPU, host,
dates) and the commit the run recorded; trials and outcomes; the baseline and the recorded best at every level
with the ratio (× baseline); every configuration timed more than once (re-runs) with its runs and median; and
Optuna's best single trial beside the recorded best (the median of re-runs, which the search reports).
``<out-dir>/studies.md`` is the one-line-per-study summary. Every file names the database it was read from. The
stored ones are filed as ``benchmarks/results/studies/<gpu>/<date>_<commit>_<study>.md`` beside their databases.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from storage import Repo, Run, TrialRecord  # noqa: E402 - after the sys.path line above
from storage.segments import elapsed_s, first_started_at, segments, total_budget_s  # noqa: E402


@dataclass
class StudyReport:
    source: Path
    run: Run
    trials: list[TrialRecord]

    # -- what the database says ------------------------------------------------------------------------------
    @property
    def metric(self) -> str:
        """The per-level metric the objective combines (``geomean of tok_s at c=1,16,64`` -> ``tok_s``)."""
        words = (self.run.objective or "").split()
        return words[words.index("of") + 1] if "of" in words[:-1] else (words[0] if words else "value")

    def levels(self, t: TrialRecord) -> dict[str, float]:
        return {m.level: m.value for m in t.measurements if m.metric == self.metric and m.level}

    @property
    def baseline(self) -> TrialRecord | None:
        return next((t for t in self.trials if t.is_baseline and t.outcome == "ok"), None)

    def runs(self) -> list[TrialRecord]:
        """Trials that measured (ok, not answered from an earlier timing: ``repeat_of`` unset)."""
        return [t for t in self.trials if t.outcome == "ok" and t.value is not None and t.repeat_of is None]

    def by_config(self) -> list[list[TrialRecord]]:
        groups: dict[str, list[TrialRecord]] = {}
        for t in self.runs():
            groups.setdefault(json.dumps(t.params, sort_keys=True), []).append(t)
        return list(groups.values())

    def best_runs(self) -> list[TrialRecord]:
        """Every run of the recorded best's configuration."""
        best = next((t for t in self.trials if t.number == self.run.best_trial_number), None)
        if best is None:
            return []
        return [t for t in self.runs() if t.params == best.params]

    def best_levels(self) -> dict[str, float]:
        """The recorded best at each level: the median over its configuration's runs."""
        per: dict[str, list[float]] = {}
        for t in self.best_runs():
            for level, v in self.levels(t).items():
                per.setdefault(level, []).append(v)
        return {level: statistics.median(vs) for level, vs in per.items()}

    def single_best(self) -> TrialRecord | None:
        """Optuna's best trial: the single best timing."""
        runs = self.runs()
        if not runs:
            return None
        return (max if self.run.direction == "maximize" else min)(runs, key=lambda t: t.value)

    def ratio(self, value: float | None, base: float | None) -> float | None:
        if value is None or base is None or not value or not base:
            return None
        return value / base if self.run.direction == "maximize" else base / value

    def outcomes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.trials:
            out[t.outcome or "running"] = out.get(t.outcome or "running", 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    # -- as text ---------------------------------------------------------------------------------------------
    def env(self) -> dict:
        return self.run.environment or {}

    def gpu(self) -> str:
        gpus = self.env().get("gpus") or []
        names = sorted({g.get("name", "?") for g in gpus})
        return f"{len(gpus)}x {', '.join(names)}" if gpus else "no GPU recorded"

    def commit(self) -> str:
        return self.env().get("git_sha") or "none recorded"

    def markdown(self, header: str) -> str:
        r, base = self.run, self.baseline
        base_lv = self.levels(base) if base else {}
        best_lv = self.best_levels()
        levels = sorted(set(base_lv) | set(best_lv), key=_level_key)
        segs = segments(r)
        lines = [f"# Study `{r.study_name}`", "", header, "",
                 (f"- ran on {self.gpu()} (host {self.env().get('hostname', '?')}), torch {self.env().get('torch')}, "
                 f"triton {self.env().get('triton')}; started {first_started_at(r):%Y-%m-%d %H:%M} UTC, "
                 f"{len(segs)} segment(s), {elapsed_s(r):.0f} s searched of a {total_budget_s(r):.0f} s budget"),
                 f"- commit recorded by the run: `{self.commit()}`",
                 f"- target `{r.target}`, space `{r.space_name}`, objective {r.objective} ({r.unit}, {r.direction})",
                 f"- trials: {len(self.trials)} ("
                 + ", ".join(f"{k} {v}" for k, v in self.outcomes().items()) + ")", ""]  # fmt: skip
        earlier = [t for t in self.trials if t.started_at < first_started_at(r)]
        if earlier:
            lines[-1:-1] = [(f"- {len(earlier)} trial(s) started before the recorded start: the study was resumed by a "
                            "version that kept only the last segment's start and budget, so the start, budget and "
                            "searched time above are the last segment's; the first trial started "
                            f"{min(t.started_at for t in earlier):%Y-%m-%d %H:%M} UTC")]  # fmt: skip
        lines += ["## Baseline and recorded best", "",
                  f"The recorded best is trial {r.best_trial_number}: {_f(r.best_value)} {r.unit}, the median of "
                  f"{len(self.best_runs())} run(s) of its configuration (trials "
                  + ", ".join(str(t.number) for t in self.best_runs()) + "); the baseline is trial "
                  f"{base.number if base else '-'}: {_f(r.baseline_value)}.", "",
                  "| | " + " | ".join(f"{self.metric} {lv}" for lv in levels) + f" | {r.objective} |",
                  "| --- |" + " ---: |" * (len(levels) + 1),
                  "| baseline | " + " | ".join(_f(base_lv.get(lv)) for lv in levels) + f" | {_f(r.baseline_value)} |",
                  "| recorded best (median of its runs) | " + " | ".join(_f(best_lv.get(lv)) for lv in levels)
                  + f" | {_f(r.best_value)} |",
                  "| best × baseline | " + " | ".join(_x(self.ratio(best_lv.get(lv), base_lv.get(lv))) for lv in levels)
                  + f" | {_x(self.ratio(r.best_value, r.baseline_value))} |", ""]  # fmt: skip
        single = self.single_best()
        if single is not None:
            same = single.params == next((t.params for t in self.best_runs()), None)
            lines += [f"Optuna's best trial (the single best timing) is trial {single.number}: {_f(single.value)}"
                      + (" — a run of the recorded best's configuration." if same else
                         " — another configuration; the search reports the best median over re-runs instead, "
                         "since a configuration timed once may be a lucky draw."), ""]  # fmt: skip
        reruns = [g for g in self.by_config() if len(g) > 1]
        lines += ["## Re-runs (configurations timed more than once)", ""]
        if not reruns:
            lines += ["None: every configuration of this study was timed once.", ""]
        else:
            lines += ["| trials | values | median | × baseline |", "| --- | --- | ---: | ---: |"]
            for g in sorted(reruns, key=lambda g: statistics.median(t.value for t in g),
                            reverse=r.direction == "maximize"):  # fmt: skip
                med = statistics.median(t.value for t in g)
                lines.append(f"| {', '.join(str(t.number) for t in g)} | {', '.join(_f(t.value) for t in g)} | "
                             f"{_f(med)} | {_x(self.ratio(med, r.baseline_value))} |")  # fmt: skip
            lines.append("")
        return "\n".join(lines)

    def summary_row(self) -> str:
        base_lv = self.levels(self.baseline) if self.baseline else {}
        best_lv = self.best_levels()
        per = ", ".join(f"{lv}: {_x(self.ratio(best_lv.get(lv), base_lv.get(lv)))}"
                        for lv in sorted(set(base_lv) & set(best_lv), key=_level_key))  # fmt: skip
        reruns = sum(len(g) - 1 for g in self.by_config() if len(g) > 1)
        return (f"| `{self.run.study_name}` | `{self.source.name}` | {self.gpu()} | {len(self.trials)} | "
                + ", ".join(f"{k} {v}" for k, v in self.outcomes().items())
                + f" | {per or '-'} | {_x(self.ratio(self.run.best_value, self.run.baseline_value))} | {reruns} | "
                f"`{self.commit()}` |")  # fmt: skip


def _level_key(level: str):
    num = level.split("=", 1)[-1]
    return (0, int(num)) if num.isdigit() else (1, level)


def _f(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.2f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def load(path: Path) -> list[StudyReport]:
    if not path.is_file():
        raise SystemExit(f"error: no database file {str(path)!r}; give the path of a study database (.db)")
    repo = Repo(f"sqlite:///{path}", create=False)
    if not repo.has_schema():
        raise SystemExit(f"error: {str(path)!r} holds no tuner studies; give a database a search wrote")
    out = [StudyReport(path, run, repo.list_trials(run.id, with_measurements=True))
           for run in sorted(repo.list_runs(), key=lambda r: r.study_name)]  # fmt: skip
    repo.engine.dispose()
    return out


def script_commit() -> str:
    """The commit this script ran at (``+modified`` when it differs from that commit)."""
    import subprocess

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], check=False, cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""

    sha = git("rev-parse", "--short", "HEAD") or "unknown"
    return sha + (" +modified" if git("status", "--porcelain", "--", "benchmarks/report.py", "storage") else "")


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("databases", nargs="+", type=Path)
    ap.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    made = f"{datetime.now(timezone.utc):%Y-%m-%d}"
    reports = [rep for db in args.databases for rep in load(db)]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/report.py " + " ".join(_rel(db) for db in args.databases)
    made = f"{made} at commit {script_commit()}"
    for rep in reports:
        header = (
            f"Made by `{command}` on {made} from `{_rel(rep.source)}` (sha256 {sha256(rep.source)}...): every "
            "figure below is read from that database."
        )
        stem = (
            rep.source.stem
            if len([r for r in reports if r.source == rep.source]) == 1
            else f"{rep.source.stem}_{rep.run.study_name}"
        )
        (args.out_dir / f"study_{stem}.md").write_text(rep.markdown(header) + "\n")
    lines = [
        "# Recorded studies",
        "",
        (
            f"Made by `{command}` on {made}; one row per study, read from its database (the per-study files "
            "`study_<database>.md` have the tables). Best × baseline per level is the recorded best (the median of "
            "its configuration's runs) over the baseline trial, at each level of the objective's metric."
        ),
        "",
        (
            "| study | database | GPU | trials | outcomes | best × baseline per level | objective × baseline | "
            "re-runs | commit recorded by the run |"
        ),
        "| --- | --- | --- | ---: | --- | --- | ---: | ---: | --- |",
    ]
    lines += [rep.summary_row() for rep in reports]
    (args.out_dir / "studies.md").write_text("\n".join(lines) + "\n")
    for rep in reports:
        print(rep.summary_row())
    return 0


if __name__ == "__main__":
    sys.exit(main())
