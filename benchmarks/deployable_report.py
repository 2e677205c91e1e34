"""The markdown of issue 42's GPU runs: per workload search (with and without ``deployable_only``), its export's two
predictions as the search recorded them and measured them, the command, ``tuner verify``'s re-measure where it was
run, and ``tuner explain``'s command-against-best table; then, where given, the side-by-side run of the searches'
bests and the exported command (``benchmarks/workload_gpu.py --study-best ... --study-command ...``'s JSON).

Each search is given as a folder ``benchmarks/deployable_search.sh`` filled (``export/<study>/launch.sh``, and
``verify.txt`` / ``explain.md`` where run), or as a stored study ``NAME=STORAGE_URL#STUDY`` (a database filed under
``benchmarks/results/``): the export and explain are then made here from the stored trials (the header's figures are
the study's own measurements; the flags are checked by the SGLang installed here, if any).

    python benchmarks/deployable_report.py out/off out/on > benchmarks/results/deployable/h200/<date>_<commit>.md
    python benchmarks/deployable_report.py --side-by-side S.json off=sqlite:///off.db#study on=sqlite:///on.db#study
"""

from __future__ import annotations

import argparse
import gzip
import math
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _tuner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, cwd=ROOT)


def from_study(name: str, spec: str, work: Path) -> Path:
    """A folder laid out as deployable_search.sh's, made here from a stored study: ``tuner export`` and ``tuner
    explain --no-profile`` over its database (a ``.db.gz`` is unpacked into ``work`` first)."""
    url, _, study = spec.rpartition("#")
    if not url.startswith("sqlite:///") or not study:
        raise SystemExit(f"error: {name}={spec}: give NAME=sqlite:///PATH#STUDY (a stored study's database)")
    db = Path(url.removeprefix("sqlite:///"))
    if not db.is_file():
        raise SystemExit(f"error: {name}={spec}: no database at {db}")
    d = work / name
    d.mkdir(parents=True)
    if db.suffix == ".gz":
        with gzip.open(db, "rb") as src, open(d / "tuner.db", "wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        shutil.copy(db, d / "tuner.db")
    local = f"sqlite:///{d / 'tuner.db'}"
    out = _tuner("export", "--study", study, "--storage", local, "-o", str(d / "export"))
    if out.returncode != 0:
        raise SystemExit(f"error: tuner export of {name}={spec} exited {out.returncode}: {out.stderr.strip()[-300:]}")
    _tuner("explain", "--study", study, "--storage", local, "--no-profile", "-o", str(d / "explain.md"))
    (d / "source.txt").write_text(f"{db.as_posix()}#{study}")
    (d / "searched.txt").write_text(searched_on(local, study))
    return d


def searched_on(url: str, study: str) -> str:
    """Where and when a stored study searched, from its own record: GPU, date, torch and the commit it ran."""
    from storage import Repo

    run = Repo(url, create=False).get_run(study)
    env = run.environment or {}
    gpu = ", ".join(g.get("name", "?") for g in env.get("gpus") or []) or "cpu"
    return f"searched on {gpu} on {run.started_at:%Y-%m-%d}, torch {env.get('torch')}, commit {env.get('git_sha')}"


def section(name: str, d: Path) -> list[str]:
    launch = next((d / "export").glob("*/launch.sh"))
    text = launch.read_text()
    head = [ln[2:] for ln in text.splitlines() if ln.startswith("# ")]
    env = next((ln for ln in head if ln.startswith("environment:")), None)
    exported = head[0]
    keep = [ln for ln in head if re.match(r"\s*(this command|with these code changes):", ln)]
    code = head[head.index(next(ln for ln in head if ln.startswith("with these code changes (the twin's best"))) :]
    code = code[
        : next((i for i, ln in enumerate(code) if not ln.strip() or not ln.startswith(("with these", "  "))), len(code))
    ]
    checked = [ln for ln in head if ln.startswith("flags checked")]
    cmd = [ln.strip() for ln in text.split("exec ", 1)[1].splitlines()]
    verify = (d / "verify.txt").read_text().splitlines() if (d / "verify.txt").exists() else None
    explain = (d / "explain.md").read_text() if (d / "explain.md").exists() else ""
    table = (
        explain.split("## The exported command against the twin's best", 1)[1].split("\n## ", 1)[0]
        if "## The exported command against" in explain
        else "\n(not in explain's report)\n"
    )
    source = (d / "source.txt").read_text() if (d / "source.txt").exists() else launch.as_posix()
    made = (
        "exported here by `tuner export` from the stored study"
        if (d / "source.txt").exists()
        else "exported by the search"
    )
    searched = (d / "searched.txt").read_text() if (d / "searched.txt").exists() else None
    return [
        f"## {name}: `{launch.parent.name}`",
        "",
        *([f"- {searched}"] if searched else []),
        f"- {exported}",
        *([f"- {env}"] if env else []),
        f"- source: `{source}` ({made})",
        *[f"- {c}" for c in checked],
        "",
        "Predictions recorded by the search:",
        "",
        "```",
        *keep,
        *code,
        "```",
        "",
        "The command:",
        "",
        "```",
        *cmd,
        "```",
        "",
        *(
            ["Re-measured by `tuner verify launch.sh` (both):", "", "```", *verify, "```", ""]
            if verify is not None
            else [
                "`tuner verify` was not run for this search (the side-by-side run below measures the same "
                "configurations).",
                "",
            ]
        ),
        "`tuner explain`:",
        table.strip(),
        "",
    ]


def side_by_side(path: Path) -> list[str]:
    """workload_gpu.py's report of a stored side-by-side JSON (its own ``--report-from`` text)."""
    from benchmarks import workload_gpu
    from benchmarks.common import read_json, stored_path

    data = {**read_json(path), "source": stored_path(path.resolve())}  # workload_gpu.py stored its "compared"
    body = workload_gpu.report(data).splitlines()
    # each deployable-only best (its best is its command) against each other search's exported command
    ok = {c["name"]: c for c in data["cases"] if "tok_s" in c}
    commands = [c for n, c in ok.items() if n.startswith("the exported command of")]
    bests = [c for n, c in ok.items() if n.startswith("best found by") and "deployable" in n]
    extra = []
    for b in bests:
        for c in commands:
            ratios = [b["tok_s"][lv] / c["tok_s"][lv] for lv in data["levels"]]
            extra.append(
                f"{b['name']} / {c['name']}, measured side by side: "
                + ", ".join(f"{lv} {x:.3f}" for lv, x in zip(data["levels"], ratios))
                + f"; geomean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}"
            )
    return [
        f"## Side by side on {data['gpu']}: the searches' bests and the exported command in one run",
        "",
        *body[1:],
        "",
        *extra,
        "",
    ]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("searches", nargs="+", help="a folder deployable_search.sh filled, or NAME=sqlite:///DB#STUDY")
    ap.add_argument(
        "--side-by-side",
        type=Path,
        default=None,
        help="a stored workload_gpu.py JSON measuring the bests and the command in one run",
    )
    args = ap.parse_args(argv)
    out = [
        "# Issue 42: the twin's best against the exported command, with and without deployable_only",
        "",
        f"Written by `benchmarks/deployable_report.py {' '.join(argv)}` from the stored searches named below.",
        "",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for a in args.searches:
            name, eq, spec = a.partition("=")
            d = from_study(name, spec, Path(tmp)) if eq and "#" in spec else Path(a)
            out += section(name if eq else d.name, d)
    if args.side_by_side is not None:
        out += side_by_side(args.side_by_side)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
