"""benchmarks/sglang_twin_kernels.py on a CPU: its report puts each GEMM backend, each glue and each step case beside
the others from a stored JSON, ratios over DeepGEMM and over the baseline."""

from __future__ import annotations

from benchmarks.sglang_twin_kernels import report

DATA = {
    "meta": {"date": "2026-12-03 18:00 UTC", "gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "commit": "abc"},
    "gemm": [
        {
            "linear": "q_a",
            "M": 1,
            "N": 1024,
            "K": 4096,
            **{f"{i}_us": us for i, us in (("deepgemm", 10.0), ("sglang_triton", 15.0), ("torch", 20.0))},
            **{f"{i}_err": 0.02 for i in ("deepgemm", "sglang_triton", "torch")},
        }
    ],
    "glue": [
        {"batch": 1, "q_sglang_us": 5.0, "q_fused_us": 4.5, "q_eager_us": 30.0}
        | {"kv_sglang_us": 4.0, "kv_fused_us": 40.0, "kv_eager_us": 70.0}
    ],
    "step": [
        {"case": "baseline", "c1_tok_s": 50.0, "c16_tok_s": 400.0, "c64_tok_s": 1600.0},
        {"case": "glue=fused", "c1_tok_s": 45.0, "c16_tok_s": 400.0, "c64_tok_s": 1760.0},
    ],
}


def test_the_report_puts_the_backends_glues_and_steps_side_by_side_with_their_ratios():
    text = report(DATA, "benchmarks/results/sglang_twin_kernels/h200/x.json")
    assert "2026-12-03 18:00 UTC, NVIDIA H200" in text and "commit abc" in text
    assert "| q_a | 1 | 1024 x 4096 | 10.0 (0.020) | 15.0 (0.020) | 20.0 (0.020) | 1.50x |" in text
    assert "| 1 | 5.0 | 4.5 | 30.0 | 4.0 | 40.0 | 70.0 |" in text
    assert "| glue=fused | 45.0 (0.90x) | 400.0 (1.00x) | 1760.0 (1.10x) |" in text
