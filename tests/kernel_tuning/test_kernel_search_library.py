"""The GEMM's implementation choice in the kernel search (CPU: the Triton kernel in the interpreter, the library path
as torch on the CPU): the tuned config and the library are measured side by side, and the entry ships the faster."""

from __future__ import annotations

import pytest

from kernels.configs import clear_cache, config_path, read_config_file
from kernels.linear import resolve_impl
from search_spaces import Hardware
from tuner.search.context import SearchOptions
from tuner.search.kernel_search import KernelCase, KernelCaseResult, _write, choose_impl, tune_cases

SHAPE = {"M": 3, "N": 40, "K": 96}


def test_gemm_entry_ships_the_implementation_measured_faster(tmp_path, sqlite_url, monkeypatch):
    opts = SearchOptions(
        budget_s=240,
        storage_url=sqlite_url,
        out_dir=str(tmp_path / "out"),
        seed=1,
        hardware=Hardware(),
        settings={"allow_cpu_interpreter": True},
        confirm_top=0,
        n_trials=2,
    )
    res = tune_cases([KernelCase("gemm", dict(SHAPE), "float32")], opts, study="lib")
    case = res.cases[0]
    assert case.status in ("tuned", "default_kept"), case
    assert case.library_time_us is not None and case.impl_triton_time_us is not None, case.reason
    faster = "triton" if case.impl_triton_time_us < case.library_time_us else "torch"
    assert case.impl == faster
    entry = read_config_file(config_path("gemm", "cpu", "float32", directory=res.config_dir))["K=96,M=3,N=40"]
    assert entry["impl"] == faster
    assert entry["library_time_us"] == pytest.approx(case.library_time_us)
    assert entry["impl_triton_time_us"] == pytest.approx(case.impl_triton_time_us)
    # what a model's linear(impl="auto") reads from that file
    monkeypatch.setenv("TUNER_KERNEL_CONFIG_DIR", res.config_dir)
    clear_cache()
    try:
        assert resolve_impl("auto", 3, 40, 96, "fp32", "cpu") == faster
    finally:
        clear_cache()


@pytest.mark.parametrize(
    "triton_us, library_us, ships",
    [
        (5.0, 7.0, "triton"),  # the Triton config measured faster
        (7.0, 5.0, "torch"),  # the library measured faster
        (5.0, 5.0, "torch"),  # a tie ships the library
        (None, 5.0, "torch"),  # the Triton config did not run correctly
        (5.0, None, "triton"),  # the library path did not run correctly
    ],
)
def test_choose_impl_ships_triton_only_where_it_measured_faster(triton_us, library_us, ships):
    assert choose_impl(triton_us, library_us, "torch") == ships


def test_an_entry_shipping_triton_makes_linear_auto_run_triton(tmp_path, monkeypatch):
    res = KernelCaseResult(
        "gemm",
        dict(SHAPE),
        "float32",
        "K=96,M=3,N=40",
        "tuned",
        config={
            "BLOCK_M": 16,
            "BLOCK_N": 32,
            "BLOCK_K": 32,
            "SPLIT_K": 1,
            "GROUP_M": 8,
            "num_warps": 4,
            "num_stages": 2,
        },
        time_us=4.0,
        impl=choose_impl(4.0, 6.0, "torch"),
        library_time_us=6.0,
        impl_triton_time_us=4.0,
    )
    _write([res], "cpu", tmp_path, None)
    monkeypatch.setenv("TUNER_KERNEL_CONFIG_DIR", str(tmp_path))
    clear_cache()
    try:
        assert resolve_impl("auto", 3, 40, 96, "fp32", "cpu") == "triton"
        assert resolve_impl("auto", 3, 40, 96, "fp16", "cpu") == "torch"  # no fp16 entry: the library
    finally:
        clear_cache()
