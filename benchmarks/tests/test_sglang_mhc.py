"""benchmarks/sglang_mhc.py on a CPU: its report sums SGLang's timed mHC pieces and the twin's stand-in per batch,
names the statistics kernel of each batch and lists a failed call instead of a figure."""

from __future__ import annotations

from benchmarks.sglang_mhc import report

META = {"date": "2026-12-03 18:00 UTC", "gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "commit": "abc"}


def test_the_report_sums_each_side_and_lists_failed_calls():
    rows = [
        {"batch": 1, "stats_kernel": "hc_mix_stats_sinkhorn", "sglang_stats_us": 6.0, "sglang_combine_us": 3.0}
        | {"norm_standin_us": 3.0, "twin_mhc_us": 20.0, "twin_add_norm_us": 4.0},
        {"batch": 64, "stats_kernel": "hc_mix_stats_sinkhorn_bf16x3", "sglang_stats_us": None}
        | {"sglang_combine_us": 3.0, "norm_standin_us": 3.0, "twin_mhc_us": 20.0, "twin_add_norm_us": 4.0}
        | {"errors": {"sglang_stats_us": "AssertionError: parts"}},
    ]
    text = report({"meta": META, "rows": rows}, "benchmarks/results/sglang_mhc/h200/x.json")
    assert "| 1 | 6.0 (hc_mix_stats_sinkhorn) | 3.0 | 3.0 | 12.0 | 20.0 | 4.0 | 24.0 | 2.00x |" in text
    assert "| 64 | failed (hc_mix_stats_sinkhorn_bf16x3) | 3.0 | 3.0 | failed | 20.0 | 4.0 | 24.0 | - |" in text
    assert "- batch 64, sglang_stats_us: AssertionError: parts" in text and "commit abc" in text
