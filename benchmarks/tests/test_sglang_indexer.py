"""benchmarks/sglang_indexer.py: its filed H200 report is what the script writes from the stored JSON, and the
report's cap comparison reads the rows it is given."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILED = ROOT / "benchmarks" / "results" / "sglang_indexer" / "h200" / "2026-12-03_1eb065e"


def _module():
    spec = importlib.util.spec_from_file_location("sglang_indexer", ROOT / "benchmarks" / "sglang_indexer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_filed_report_is_rewritten_from_its_stored_json(tmp_path):
    out = tmp_path / "report.md"
    assert _module().main(["--report-from", str(FILED.with_suffix(".json")), "--out", str(out)]) == 0
    assert out.read_text() == FILED.with_suffix(".md").read_text()


def test_the_cap_comparison_is_the_largest_cap_over_the_smallest_per_batch():
    data = json.loads(FILED.with_suffix(".json").read_text())
    rows = [dict(r, dg_indexer_us=10.0 * (r["cap"] == 1048576) + 10.0, dg_logits_us=5.0) for r in data["indexer"]]
    text = _module().report(dict(data, indexer=rows), "x.json")
    assert "- batch 16: 20.0 / 10.0 µs = 2.00x (logits alone 1.00x)" in text
