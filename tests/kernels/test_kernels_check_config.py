"""check_config rules, default configs, and the recorded H200 sweep as ground truth."""

import json
from pathlib import Path

import pytest

from kernels import get_kernel, kernel_names

DATA = Path(__file__).parent / "data" / "sparse_decode_sweep_h200_b16.json"
V4 = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}


@pytest.mark.parametrize("name", kernel_names())
def test_default_configs_pass_their_own_rules(name):
    kernel = get_kernel(name)
    for preset in ("v4flash", "test"):
        for shape in kernel.shapes(preset):
            for dtype in ("bf16", "fp8", "fp32", "tf32") if name == "gemm" else ("bfloat16", "float32"):
                cfg = kernel.default_config(shape)
                assert kernel.check_config(cfg, shape, dtype=dtype) is None, (shape, cfg, dtype)


@pytest.mark.parametrize("name", kernel_names())
def test_space_is_not_empty_and_key_is_stable(name):
    kernel = get_kernel(name)
    shape = kernel.shapes("v4flash")[0]
    assert next(iter(kernel.configs(shape)), None) is not None
    assert kernel.shape_key(shape) == kernel.shape_key(dict(shape))
    assert f"{kernel.batch_dim}=" in kernel.shape_key(shape)


def test_recorded_out_of_resources_configs_are_rejected():
    """Every config that hit OutOfResources on the H200 is rejected; every config rejected although
    it ran was at least 1.5x slower than the best (the accumulator spills registers)."""
    sweep = json.loads(DATA.read_text())
    kernel = get_kernel("sparse_decode")
    cols = sweep["columns"]
    ok_times = [r[cols.index("time_us")] for r in sweep["rows"] if r[cols.index("status")] == "ok"]
    best = min(ok_times)
    for row in sweep["rows"]:
        cfg = {k: row[cols.index(k)] for k in ("S", "BLOCK_H", "BLOCK_T", "num_warps", "num_stages")}
        why = kernel.check_config(cfg, V4, dtype="bfloat16")
        if row[cols.index("status")] != "ok":
            assert why is not None and why.startswith("shared_memory"), (cfg, why)
        elif why is not None:
            assert row[cols.index("time_us")] > 1.5 * best, (cfg, why)


@pytest.mark.parametrize(
    "name, cfg, rule",
    [
        ("sparse_decode", {"S": 1, "BLOCK_H": 64, "BLOCK_T": 128, "num_warps": 8, "num_stages": 3}, "shared_memory"),
        ("sparse_decode", {"S": 1, "BLOCK_H": 64, "BLOCK_T": 32, "num_warps": 4, "num_stages": 1}, "register_pressure"),
        ("sparse_decode", {"S": 1, "BLOCK_H": 24, "BLOCK_T": 32, "num_warps": 4, "num_stages": 1}, "tile_size"),
        ("sparse_decode", {"S": 1024, "BLOCK_H": 16, "BLOCK_T": 32, "num_warps": 4, "num_stages": 1}, "split_rows"),
        ("sparse_decode", {"S": 1, "BLOCK_H": 16, "BLOCK_T": 32, "num_warps": 4}, "missing_param"),
        (
            "sparse_decode",
            {"S": 1, "BLOCK_H": 16, "BLOCK_T": 32, "num_warps": 4, "num_stages": 1, "X": 1},
            "unknown_param",
        ),
        (
            "gemm",
            {
                "BLOCK_M": 16,
                "BLOCK_N": 256,
                "BLOCK_K": 256,
                "SPLIT_K": 1,
                "GROUP_M": 8,
                "num_warps": 4,
                "num_stages": 5,
            },
            "shared_memory",
        ),
        (
            "gemm",
            {
                "BLOCK_M": 16,
                "BLOCK_N": 64,
                "BLOCK_K": 128,
                "SPLIT_K": 64,
                "GROUP_M": 8,
                "num_warps": 4,
                "num_stages": 2,
            },
            "split_k",
        ),
        ("indexer", {"BLOCK_N": 256, "TILES": 1, "num_warps": 2, "num_stages": 1}, "register_pressure"),
        ("indexer", {"BLOCK_N": 48, "TILES": 1, "num_warps": 4, "num_stages": 1}, "tile_size"),
    ],
)
def test_impossible_configs_are_rejected_with_the_rule_name(name, cfg, rule):
    kernel = get_kernel(name)
    shape = V4 if name == "sparse_decode" else kernel.shapes("v4flash")[0]
    why = kernel.check_config(cfg, shape, dtype="bfloat16" if name != "gemm" else "bf16")
    assert why is not None and why.startswith(rule), why
