"""The benchmarks' own shape: no import circle between the scripts (function-level imports included), and a script
that writes tuned-config files takes its folder through ``benchmarks.common.tuned_output_dir`` (which refuses
``kernels/tuned/``: only ``tuner search --target kernels`` writes there)."""

from __future__ import annotations

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
SCRIPTS = {p.stem: p for p in BENCHMARKS.glob("*.py")}
PRODUCT = {"tuner", "kernels", "search_spaces", "storage", "api"}  # a bare ``kernels`` is the package, not kernels.py


def _imports(path: Path) -> set[str]:
    """The scripts of benchmarks/ that ``path`` imports, as ``benchmarks.X`` or as a sibling module ``X``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        for name in names:
            parts = name.split(".")
            if parts[0] == "benchmarks" and len(parts) > 1 and parts[1] in SCRIPTS:
                out.add(parts[1])
            elif parts[0] in SCRIPTS and len(parts) == 1 and parts[0] not in PRODUCT:
                out.add(parts[0])
    out.discard(path.stem)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected set of more than one script (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle_of_three():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_between_benchmark_scripts():
    graph = {name: _imports(path) for name, path in SCRIPTS.items()}
    assert any(graph.values()), "the scripts import each other: the graph cannot be empty"
    assert circles(graph) == []


def test_every_tuned_config_writer_takes_its_folder_through_tuned_output_dir():
    writers = []
    for name, path in SCRIPTS.items():
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef):
                continue
            called = {n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
                      for n in ast.walk(fn) if isinstance(n, ast.Call)}
            if called & {"write_config_file", "config_path"} and "write_tuned" in fn.name or "write_config_file" in called:
                writers.append((name, fn.name, "tuned_output_dir" in called))
    assert writers and all(ok for *_, ok in writers), writers
