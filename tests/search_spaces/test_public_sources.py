"""What a user receives cites what a user can open: the shipped spaces (``search_spaces/*.yaml``) and the lines the
export writes into every ``launch.sh`` header from them (each value the command cannot give, with its ``source``)
name public things (an SGLang file and line, a public issue, a file in ``benchmarks/results/``), never a path of the
machine a space was written on nor an issue number of this project's own tracker."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from search_spaces import load_space
from tuner.targets.workload.server_map import command_config

ROOT = Path(__file__).resolve().parents[2]
SPACES = sorted((ROOT / "search_spaces").glob("*.yaml"))
LOCAL_PATH = re.compile(r"(?<![\w.:/])/(?:work|home|root|tmp|mnt|data|scratch|Users|opt)/\S*")
INTERNAL_ISSUE = re.compile(r"\bissues? #?\d+\b", re.IGNORECASE)  # a public one is a URL (.../issues/1234) or "PR #N"


def _private(text: str) -> list[str]:
    return [m.group(0) for rx in (LOCAL_PATH, INTERNAL_ISSUE) for m in rx.finditer(text)]


def test_the_check_catches_a_local_path_and_an_internal_issue_number():
    assert _private("source: the seed (/work/shared/seed/000_44bf5d70ef8d5cbb.txt); issue 42") == [
        "/work/shared/seed/000_44bf5d70ef8d5cbb.txt);",
        "issue 42",
    ]
    assert (
        _private(
            "source: sglang 0.5.23 srt/layers/attention/dsa/utils.py:72; "
            "https://github.com/sgl-project/sglang/issues/1234; benchmarks/results/a/b.md"
        )
        == []
    )


def test_there_are_shipped_spaces_to_check():
    assert len(SPACES) >= 8


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.name)
def test_a_shipped_space_names_no_local_path_or_internal_issue_number(path):
    found = [f"line {n}: {hit}" for n, line in enumerate(path.read_text().splitlines(), 1) for hit in _private(line)]
    assert not found, found


@pytest.mark.parametrize("path", [p for p in SPACES if "not_deployable" in p.read_text()], ids=lambda p: p.name)
def test_each_value_the_export_header_lists_as_not_deployable_cites_a_public_source(path):
    """Every ``not_deployable`` mark of the space, as the header writes it under the best's code changes: the best
    takes each marked value in turn (on an sm_90 GPU, where none of the marks is lifted)."""
    space = load_space(path.stem)
    defaults = {p.name: p.default for p in space.params}
    lines = []
    for p in space.params:
        marks = p.server.not_deployable if p.server else {}
        for value in marks:
            lines += command_config(space, {**defaults, p.name: value}, "sm_90").lines()
    assert lines and any("[source: " in ln for ln in lines)
    found = [f"{ln.strip()!r}: {hit}" for ln in lines for hit in _private(ln)]
    assert not found, found


def test_the_export_code_writes_no_local_path_or_internal_issue_number_into_what_it_writes():
    """The string literals of ``tuner/export/`` (the header's fixed text); its comments may cite the tracker."""
    found = []
    for path in sorted((ROOT / "tuner" / "export").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found += [f"{path.name}:{node.lineno}: {hit}" for hit in _private(node.value)]
    assert not found, found
