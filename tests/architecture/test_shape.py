"""The shape of the code: no import cycles inside ``tuner`` (function-level and ``TYPE_CHECKING`` imports included),
every package says what lives in it, and the layers and foundations hold (import-linter, the contracts in ``pyproject.toml``)."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tuner", "kernels", "search_spaces", "storage", "api")


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> set[tuple[str, str]]:
    """Imports among ``modules`` that close a circle (empty: none), by grimp's own cycle finder over a graph of
    just those modules (each a child of one root; benchmarks/tests/test_benchmarks_shape.py uses the same finder)."""
    sub = grimp.ImportGraph()
    sub.add_module("m")
    for m in modules:
        sub.add_module("m." + m.replace(".", "/"))
    for m in modules:
        for w in graph.find_modules_directly_imported_by(m) & modules:
            sub.add_import(importer="m." + m.replace(".", "/"), imported="m." + w.replace(".", "/"))
    return {(a[2:].replace("/", "."), b[2:].replace("/", ".")) for a, b in sub.nominate_cycle_breakers("m")}


def _package_modules(graph: grimp.ImportGraph, package: str) -> set[str]:
    """The modules of ``package`` (a package's ``__init__`` counts as the package itself: importing a submodule
    runs it, so the package is left out as a node of its own)."""
    return {m for m in graph.modules if m == package or m.startswith(package + ".")}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_another_in_a_circle(package):
    # imports under `if TYPE_CHECKING:` count: they never run, but two modules that name each other's types are one
    # concept in two files all the same
    graph = grimp.build_graph(package, include_external_packages=False, exclude_type_checking_imports=False)
    modules = {
        m for m in _package_modules(graph, package) if not (ROOT / (m.replace(".", "/") + "/__init__.py")).exists()
    }  # packages re-export downward
    assert _cycles(graph, modules) == set()


def test_a_cycle_is_found_when_there_is_one(tmp_path, monkeypatch):
    """The cycle finder itself: two modules importing each other inside functions are reported."""
    pkg = tmp_path / "circ"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from circ import b\n")
    (pkg / "b.py").write_text("def g():\n    from circ import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("circ", include_external_packages=False, cache_dir=None)
    assert len(_cycles(graph, {"circ.a", "circ.b"})) == 1


def test_a_cycle_closed_by_a_type_checking_import_is_found(tmp_path, monkeypatch):
    """The graph the circle test builds counts an import under ``if TYPE_CHECKING:``: a module that imports another
    and is named back only for its types is a circle (tuner/search/context.py and results.py were one)."""
    pkg = tmp_path / "circt"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circt import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from circt import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph(
        "circt", include_external_packages=False, exclude_type_checking_imports=False, cache_dir=None
    )
    assert len(_cycles(graph, {"circt.a", "circt.b"})) == 1


def test_every_package_says_what_lives_there():
    for init in sorted(ROOT.glob("*/**/__init__.py")):
        rel = init.relative_to(ROOT)
        if rel.parts[0] not in PACKAGES:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 20, f"{rel} has no docstring saying what lives in its folder"


def test_tuner_has_about_a_dozen_entries_at_its_top():
    entries = [
        p.name for p in (ROOT / "tuner").iterdir() if p.name not in ("__init__.py", "__main__.py", "__pycache__")
    ]
    assert len(entries) <= 15, sorted(entries)


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter is not installed")
def test_import_contracts_hold():
    done = subprocess.run(["lint-imports", "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]


def test_the_export_asks_the_target_what_it_deploys_instead_of_naming_a_target():
    """``tuner/export/`` reaches a target's deployment through ``Target`` (its ``deployment`` hook): no module of it
    imports the workload twin's internals (``tuner.targets.workload``) or compares a study's target with a name."""
    found = []
    for path in sorted((ROOT / "tuner" / "export").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tuner.targets.workload"):
                found.append(f"{path.name}:{node.lineno}: imports {node.module}")
            if (
                isinstance(node, ast.Compare)
                and isinstance(node.left, ast.Attribute)
                and node.left.attr == "target"
                and any(isinstance(c, ast.Constant) and isinstance(c.value, str) for c in node.comparators)
            ):
                found.append(f"{path.name}:{node.lineno}: compares .target with a name")
    assert not found, found
