"""The benchmarks' own shape: no import circle between the scripts (function-level imports included), and a script
that writes tuned-config files takes its folder through ``benchmarks.common.tuned_output_dir`` (which refuses
``kernels/tuned/``: only ``tuner search --target kernels`` writes there)."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

BENCHMARKS = Path(__file__).resolve().parents[1]
SCRIPTS = {p.stem: p for p in BENCHMARKS.glob("*.py")}
PRODUCT = {"tuner", "kernels", "search_spaces", "storage", "api"}  # a bare ``kernels`` is the package, not kernels.py


def _imports(path: Path) -> set[str]:
    """The scripts of benchmarks/ that ``path`` imports, as ``benchmarks.X`` or as a sibling module ``X``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level == 0
            else []
        )
        for name in names:
            parts = name.split(".")
            if parts[0] == "benchmarks" and len(parts) > 1 and parts[1] in SCRIPTS:
                out.add(parts[1])
            elif parts[0] in SCRIPTS and len(parts) == 1 and parts[0] not in PRODUCT:
                out.add(parts[0])
    out.discard(path.stem)
    return out


def circles(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Imports that close a circle between scripts (empty: none), by grimp's own cycle finder (the one
    tests/architecture/test_shape.py uses too; import-linter's acyclic contracts are built on it)."""
    g = grimp.ImportGraph()
    g.add_module("s")
    for name in {*graph, *(w for ws in graph.values() for w in ws)}:
        g.add_module(f"s.{name}")
    for name, imported in graph.items():
        for w in imported:
            g.add_import(importer=f"s.{name}", imported=f"s.{w}")
    return {(a[2:], b[2:]) for a, b in g.nominate_cycle_breakers("s")}


def test_the_circle_finder_finds_a_circle_of_three():
    closers = circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert len(closers) == 1 and closers <= {("a", "b"), ("b", "c"), ("c", "a")}
    assert circles({"a": {"b"}, "d": {"a"}}) == set()


def test_no_import_circle_between_benchmark_scripts():
    graph = {name: _imports(path) for name, path in SCRIPTS.items()}
    assert any(graph.values()), "the scripts import each other: the graph cannot be empty"
    assert circles(graph) == set()


def test_every_tuned_config_writer_takes_its_folder_through_tuned_output_dir():
    writers = []
    for name, path in SCRIPTS.items():
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef):
                continue
            called = {
                n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
                for n in ast.walk(fn)
                if isinstance(n, ast.Call)
            }
            if (
                called & {"write_config_file", "config_path"}
                and "write_tuned" in fn.name
                or "write_config_file" in called
            ):
                writers.append((name, fn.name, "tuned_output_dir" in called))
    assert writers and all(ok for *_, ok in writers), writers
