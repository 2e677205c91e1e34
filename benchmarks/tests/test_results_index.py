"""benchmarks/results/ as a newcomer meets it: the index (README.md) names a current file for every benchmark folder
and every file it links exists; each result is filed as <benchmark>/<gpu>/<date>_<commit>[_<variant>].<ext>; no logs;
the tree stays under 10 MB."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
INDEX = RESULTS / "README.md"
NAME = re.compile(r"\d{4}-\d\d-\d\d_[0-9a-f]{7}(_[a-z0-9_]+)?\.(md|json|json\.gz|db|db\.gz|txt|csv)")
LINK = re.compile(r"\]\(([^)]+)\)")


def test_every_file_the_index_links_exists():
    links = LINK.findall(INDEX.read_text())
    assert len(links) > 30
    missing = [link for link in links if not (RESULTS / link).is_file()]
    assert not missing, missing


def test_the_index_retypes_no_test_count_it_links_the_file_that_holds_it():
    """A figure is a line a script printed from stored data (STYLE.md): the index links each gpu_tests file, whose own
    ``Result:`` line (filed by benchmarks/gpu_tests.py from the pytest log) holds the count; a count typed again
    here goes stale without anyone seeing."""
    retyped = re.findall(r"\b\d+ (?:passed|failed|skipped|deselected)\b", INDEX.read_text())
    assert not retyped, retyped


def test_the_index_links_a_file_of_every_benchmark_folder():
    linked = {link.split("/")[0] for link in LINK.findall(INDEX.read_text())}
    folders = {p.name for p in RESULTS.iterdir() if p.is_dir()}
    assert folders - linked == set(), sorted(folders - linked)


def test_every_result_is_filed_by_benchmark_gpu_date_and_commit():
    misfiled = []
    for path in RESULTS.rglob("*"):
        if (
            not path.is_file()
            or path.parent == RESULTS
            and path.name in ("README.md", "MOVES.md", "sparse_decode_history.md")
        ):
            continue
        rel = path.relative_to(RESULTS).parts
        if len(rel) != 3 or not NAME.fullmatch(rel[2]):
            misfiled.append("/".join(rel))
    assert not misfiled, misfiled


def test_the_results_stay_under_10_mb_with_no_logs():
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    assert not [p.name for p in files if p.suffix == ".log"]
    assert sum(p.stat().st_size for p in files) < 10e6


CITED = re.compile(r"(?<![:\w/])benchmarks/results/[\w./-]+\.(?:md|json\.gz|json|db|txt|csv)")


def _citing_files() -> list[Path]:
    root = RESULTS.parents[1]
    return sorted(
        [
            *(root / "kernels").rglob("*.py"),
            *(root / "benchmarks").glob("*.py"),
            *(root / "benchmarks").glob("*.sh"),
            root / "README.md",
            *(root / "docs").glob("*.md"),
            *RESULTS.glob("*.md"),
        ]
    )


def test_every_stored_result_a_kernel_a_benchmark_or_the_readme_cites_exists():
    """Each ``benchmarks/results/<file>`` that a kernel's notes, a benchmark script, the README, ``docs/`` or the
    results' own notes name lies there (a removed one is named as ``git show <commit>:benchmarks/results/<old path>``)."""
    root = RESULTS.parents[1]
    cited = {(str(path.relative_to(root)), c) for path in _citing_files() for c in CITED.findall(path.read_text())}
    assert len(cited) > 50
    missing = sorted((where, c) for where, c in cited if not (root / c).is_file())
    assert not missing, missing


def test_every_file_the_sparse_decode_history_links_exists():
    """benchmarks/results/sparse_decode_history.md (linked from the index) links each run by its path under
    benchmarks/results/, and every link resolves."""
    history = RESULTS / "sparse_decode_history.md"
    assert "(sparse_decode_history.md)" in INDEX.read_text()
    links = LINK.findall(history.read_text())
    assert len(links) > 20
    missing = [link for link in links if not (RESULTS / link).is_file()]
    assert not missing, missing
