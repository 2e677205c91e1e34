"""Compiling a config without running it (``kernels.compile_only``), what the kernel search's compile helpers do.

The meta inputs keep what Triton specialises on (shape, strides, dtype, a view's offset); the slow test compiles
real configs of four kernels for sm_90 from meta tensors, then specialises the same configs on real tensors in
another process and checks that Triton's on-disk cache answered them all (no new binary): what a helper compiles
is what the trial worker later loads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.compile_only import meta_inputs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def test_meta_inputs_keep_what_triton_specialises_on():
    x = torch.randn(6, 10, dtype=torch.float16)
    view = x[1:, 2:]
    m = meta_inputs({"x": x, "v": view, "n": 3, "pair": (x, 4)})
    assert m["n"] == 3 and m["pair"][1] == 4
    for real, meta in ((x, m["x"]), (view, m["v"]), (x, m["pair"][0])):
        assert meta.device.type == "meta" and meta.dtype == real.dtype
        assert meta.shape == real.shape and meta.stride() == real.stride()
        assert meta.storage_offset() == real.storage_offset()
    assert m["v"].data_ptr() % 16 == (view.data_ptr() - x.data_ptr()) % 16  # same 16-byte alignment as the view


@pytest.mark.slow
def test_helper_compiles_what_the_trial_then_loads(tmp_path):
    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        pytest.skip("Triton has no NVIDIA backend here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path / "cache"))
    names = "indexer,sparse_decode,moe,gemm"

    def probe(mode):
        p = subprocess.run(
            [sys.executable, str(HERE / "compile_probe.py"), mode, names],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    def binaries():
        return sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "cache").rglob("*.cubin"))

    first = probe("meta")
    compiled = binaries()
    assert len(compiled) >= 2 * len(first)  # two configs per kernel (moe has two kernels, gemm may split)
    probe("real")
    assert binaries() == compiled  # every real-tensor specialisation was a cache hit


@pytest.mark.slow
def test_sparse_decode_compiled_from_meta_tensors_takes_the_gpu_paths_of_a_real_launch(tmp_path):
    """A compile helper launches on meta tensors. The sparse-decode launcher used to ask ``q.is_cuda`` whether to
    prefetch and to launch the merge with programmatic dependent launch, so a helper compiled binaries without them
    and every trial on the H200 compiled again (issue 20's held-out sweep timed 22-101 of 348 configs). From meta
    tensors, under a driver answering sm_90, the launches must take the paths a CUDA launch on an H200 takes."""
    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        pytest.skip("Triton has no NVIDIA backend here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.run(
        [sys.executable, str(HERE / "compile_probe.py"), "launches", "sparse_decode"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    launches = json.loads(p.stdout.strip().splitlines()[-1])
    direct, split = launches["_sparse_decode_kernel"]  # the default config (one split), then one that splits
    assert direct["DIRECT"] is True and direct["PREFETCH"] is True
    assert split["DIRECT"] is False and split["PREFETCH"] is True and split["PDL"] is True
    (merge,) = launches["combine_kernel"]  # the split config's merge, launched with PDL as on an H200
    assert merge["PDL"] is True and merge["launch_pdl"] is True


@pytest.mark.parametrize(
    "kwargs, triggers, merge_pdl",
    [
        ({}, 1, True),
        ({"pdl": False}, 0, False),
    ],
    ids=["early", "plain"],
)
def test_the_tl_dot_split_kernel_lets_its_pdl_merge_start_early_and_without_pdl_neither(
    tmp_path, kwargs, triggers, merge_pdl
):
    """The sm_90 build of a split config: by default the split kernel lets its PDL-launched merge start at once (one
    ``griddepcontrol.launch_dependents``); without PDL, neither."""
    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        pytest.skip("Triton has no NVIDIA backend here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path / "cache"))
    shape = {"batch": 4, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
    config = {"S": 4, "BLOCK_H": 16, "BLOCK_T": 64, "num_warps": 4, "num_stages": 2}
    p = subprocess.run(
        [
            sys.executable,
            str(HERE / "compile_probe.py"),
            "tldot",
            json.dumps(shape),
            json.dumps(config),
            json.dumps(kwargs),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got == {"launch_dependents": triggers, "merge_launch_pdl": merge_pdl}


def _global_loads(tmp_path, kernel, dtype, shape, config=None):
    """How each Triton kernel that ``kernel.run`` launches reads global memory in its sm_90 PTX (compile_probe's
    ``loads``): ``{"ld.b16": n, "cp.async.16B": n, ...}`` per Triton function."""
    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        pytest.skip("Triton has no NVIDIA backend here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path / "cache"))
    args = [sys.executable, str(HERE / "compile_probe.py"), "loads", kernel, dtype, json.dumps(shape)]
    p = subprocess.run(
        args + ([json.dumps(config)] if config else []), env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape, config",
    [
        ({"M": 1, "N": 1024, "K": 4096}, None),  # V4-Flash decode shape, default config (fused split-K)
        ({"M": 64, "N": 4096, "K": 1024}, {"SPLIT_K": 2, "BLOCK_M": 64, "num_warps": 8}),
        ({"M": 3, "N": 40, "K": 96}, None),  # ragged K: masked tiles
    ],
)
def test_gemm_reads_its_tiles_in_16_byte_async_copies_on_sm90(tmp_path, shape, config):
    """The split's first K index (``pid_k * k_per_split``, an unspecialised argument) hid the tiles' 16-byte
    alignment from the compiler: every bf16 element of W was read by its own 2-byte load, with no cp.async pipeline
    (issue 20's GEMMs ran 1.4-3x slower than cuBLAS). The tiles of x and W must be copied 16 bytes at a time."""
    loads = _global_loads(tmp_path, "gemm", "bfloat16", shape, config)["_gemm_kernel"]
    assert not any(kind in loads for kind in ("ld.b16", "ld.v2.b16", "ld.b8")), loads
    assert loads.get("cp.async.16B", 0) > 0, loads
    assert set(k for k in loads if k.startswith("cp.async")) == {"cp.async.16B"}, loads


@pytest.mark.slow
def test_gemv_reads_w_in_16_byte_loads_on_sm90(tmp_path):
    """The GEMV reads W straight into registers: at its V4-Flash default (8 rows x 1024 of K, 8 warps) every thread
    reads 64 bytes of W, which must be four 16-byte loads, never 2-byte ones."""
    loads = _global_loads(tmp_path, "gemv", "bfloat16", {"M": 1, "N": 1024, "K": 4096})["_gemv_kernel"]
    assert loads.get("ld.v4.b32", 0) >= 4 and not any(k in loads for k in ("ld.b16", "ld.v2.b16", "ld.b8")), loads
