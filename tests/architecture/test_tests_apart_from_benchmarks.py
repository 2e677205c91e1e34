"""The product's tests never import the lab: no test under ``tests/`` imports ``benchmarks`` (at module level or in a
function), loads a benchmark script by path, or runs one. Tests of benchmark scripts live in ``benchmarks/tests/``
and run with their own command. (That the product never imports ``benchmarks`` is import-linter's contract
``product-apart-from-the-lab`` in pyproject.toml.)"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
LOADERS = {"spec_from_file_location", "run_path", "run", "Popen", "check_output", "check_call", "call"}


def _mentions_benchmarks(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and "benchmarks" in n.value for n in ast.walk(node)
    )


def uses_of_benchmarks(source: str) -> list[str]:
    """Each place in ``source`` that imports ``benchmarks`` (or the helper that loads its scripts) or loads or runs a
    benchmark script by a path naming ``benchmarks``: ``"line N: what"``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif isinstance(node, ast.Call):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if func in LOADERS and any(
                _mentions_benchmarks(a) for a in [*node.args, *(k.value for k in node.keywords)]
            ):
                found.append((node.lineno, f"{func}(...benchmarks...)"))
            continue
        else:
            continue
        found += [(node.lineno, f"import {n}") for n in names if n.split(".")[0] in ("benchmarks", "benchmark_scripts")]
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_the_checker_finds_each_way_of_reaching_a_benchmark_script():
    src = """
import benchmarks.report
from benchmarks.kernels import choose_gemm_impls
def f():
    from benchmark_scripts import benchmark_script
    spec = importlib.util.spec_from_file_location("k", ROOT / "benchmarks" / "kernels.py")
    subprocess.run([sys.executable, "benchmarks/gemm_floor.py"])
from kernels import get_kernel
open(ROOT / "benchmarks/results/README.md").read()
"""
    assert [u.split(":")[0] for u in uses_of_benchmarks(src)] == ["line 2", "line 3", "line 5", "line 6", "line 7"]


def test_no_test_imports_or_runs_benchmarks():
    uses = {}
    for path in sorted(TESTS.rglob("*.py")):
        found = uses_of_benchmarks(path.read_text())
        if found:
            uses[str(path.relative_to(ROOT))] = found
    assert not uses, uses
