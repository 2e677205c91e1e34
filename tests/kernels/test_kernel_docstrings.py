"""Kernel docstrings state the contract and the schedule that ships; the history behind each choice (when it was
measured, at which commit, how many microseconds) lives in ``benchmarks/results/``, which a docstring may cite by
path."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNEL_FILES = sorted(p for p in (ROOT / "kernels").rglob("*.py"))
CITED = re.compile(r"benchmarks/results/[\w./*-]+")  # a stored result's path may carry its date and commit
HISTORY = {
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),
    "a microsecond figure": re.compile(r"\d\s*(?:µs|us)\b"),
    "an issue number": re.compile(r"\bissue \d+"),
}


def _docstrings(path: Path):
    tree = ast.parse(path.read_text())
    for node in [tree, *ast.walk(tree)]:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield getattr(node, "name", "<module>"), doc


def test_there_are_kernel_files_to_read():
    assert len(KERNEL_FILES) >= 15


@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_kernel_docstrings_carry_no_dates_commits_microseconds_or_issue_numbers(path):
    found = []
    for name, doc in _docstrings(path):
        text = CITED.sub("<result>", doc)
        found += [f"{name}: {what} ({m.group(0)!r})" for what, rx in HISTORY.items() for m in rx.finditer(text)]
    assert not found, "\n".join(found)
