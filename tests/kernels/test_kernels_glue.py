"""Fused add+RMSNorm and interleaved RoPE."""

import os

import pytest
import torch

from kernels import check, get_kernel
from kernels.glue import fused_add_rmsnorm, rope, rope_cos_sin, rope_reference

CUDA = torch.cuda.is_available()
RUNNABLE = CUDA or os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not RUNNABLE, reason="no CUDA and Triton was imported before TRITON_INTERPRET=1")
DEV = "cuda" if CUDA else "cpu"
NORM, ROPE = get_kernel("rmsnorm"), get_kernel("rope")


@pytest.mark.parametrize("shape", NORM.shapes("test"), ids=str)
@pytest.mark.parametrize("cfg", [None, {"BLOCK": 256, "num_warps": 2}, {"BLOCK": 2048, "num_warps": 8}], ids=str)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_rmsnorm(shape, cfg, dtype):
    assert check(NORM, shape, dtype, cfg, DEV, seed=2) <= NORM.tolerance(dtype)


def test_rmsnorm_out_dtype_cast_in_the_same_pass():
    x, r = torch.randn(2, 64, device=DEV).half(), torch.randn(2, 64, device=DEV).half()
    w = torch.rand(64, device=DEV).half()
    y, res = fused_add_rmsnorm(x, r, w, out_dtype=torch.float32)
    assert y.dtype == torch.float32 and res.dtype == torch.float16
    assert torch.equal(res, (x.float() + r.float()).half())


@pytest.mark.parametrize("shape", ROPE.shapes("test"), ids=str)
@pytest.mark.parametrize("cfg", [None, {"BLOCK_H": 1, "num_warps": 1}, {"BLOCK_H": 4, "num_warps": 2}], ids=str)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_rope(shape, cfg, dtype):
    assert check(ROPE, shape, dtype, cfg, DEV, seed=4) <= ROPE.tolerance(dtype)


def test_rope_is_interleaved_on_the_last_dims():
    x = torch.zeros(1, 1, 8, device=DEV)
    x[0, 0, 4] = 1.0  # first element of the first rope pair (rope_dim 4 = dims 4..7)
    cs = rope_cos_sin(4, 4, device=DEV)
    y = rope(x, torch.tensor([1], device=DEV), cs, rope_dim=4)
    angle = 1.0  # position 1, pair 0: inv freq 1
    assert torch.allclose(
        y[0, 0, 4:6].cpu(), torch.tensor([torch.cos(torch.tensor(angle)), torch.sin(torch.tensor(angle))])
    )
    assert torch.equal(y[0, 0, :4], x[0, 0, :4])
    assert torch.allclose(y.double().cpu(), rope_reference(x, torch.tensor([1], device=DEV), cs, 4).double().cpu())


def test_errors():
    with pytest.raises(ValueError, match="weight"):
        fused_add_rmsnorm(torch.randn(2, 8), torch.randn(2, 8), torch.randn(4))
    with pytest.raises(ValueError, match="rope_dim"):
        rope(torch.randn(2, 2, 8), torch.zeros(2, dtype=torch.int64), rope_cos_sin(4, 6), rope_dim=6)


def test_the_twins_fused_glue_computes_what_its_eager_glue_computes():
    """The decode twin's `glue=fused` (these kernels) and `glue=eager`/`compile` (tuner.targets.workload.ops) must be
    one function: an H200 seed study found the fused glue's step 0.4-0.6 away (rel. norm) from the eager one's, the
    eager RoPE rotating halves (NeoX) where the kernel, as DeepSeek's models, rotates interleaved pairs. Both
    prepare V4's query (each head RMS-normed, then roped) and KV row (normed with its weight, ones in the twin)."""
    from tuner.targets.workload import gpu_ops, ops

    torch.manual_seed(0)
    torch.set_default_device(DEV)  # the kernels' device: a GPU, or the CPU under the interpreter
    try:
        B, H, D, rope_dim, L = 3, 4, 64, 16, 37
        st = ops.rope_tables(B, L, rope_dim, DEV)
        fused_norm, fused_prep = gpu_ops.fused_glue(), gpu_ops.fused_norm_rope(1e-6)
        x, kv = torch.randn(B, H, D) * 3, torch.randn(B, D)
        eager = ops.norm_rope(x, st["cos"], st["sin"], rope_dim)
        fused = fused_prep(x, st)
        eager_kv = ops.norm_rope(kv, st["cos"], st["sin"], rope_dim, torch.ones(D))
        fused_kv = fused_prep(kv.unsqueeze(1), st).squeeze(1)
        h, res, w = torch.randn(B, 256), torch.randn(B, 256), torch.randn(256)
    finally:
        torch.set_default_device(None)
    assert (eager - fused).norm() / eager.norm() < 1e-5
    assert (eager_kv - fused_kv).norm() / eager_kv.norm() < 1e-5
    (n_e, s_e), (n_f, s_f) = ops.add_rms_norm(h, res, w), fused_norm(h, res, w)
    assert (n_e - n_f).norm() / n_e.norm() < 1e-5 and torch.equal(s_e, s_f)


@pytest.mark.parametrize("d", [64, 512, 576])
@pytest.mark.parametrize("src", ["float16", "float32"])
def test_store_kv_rows_writes_each_row_over_its_scale_at_its_slot_and_nothing_else(d, src):
    """The values before e4m3's rounding (a float32 cache: the interpreter's e4m3 rounding is wrong; the GPU test
    below checks the e4m3 bytes), the scales ``max|row| / 448``, every other row of the cache and its scales left
    as it was (NaN-poisoned), a zero row with the scales' floor."""
    from kernels.glue import store_kv_rows

    g = torch.Generator(device=DEV).manual_seed(d)
    rows = (torch.randn(5, d, generator=g, device=DEV) * torch.logspace(-3, 2, 5, device=DEV)[:, None]).to(
        getattr(torch, src)
    )
    rows[3] = 0
    pool = torch.full((40, d), float("nan"), device=DEV)
    scale = torch.full((40,), float("nan"), device=DEV)
    # a column of a per-request table, as the twin's window slots are (strided)
    slots = torch.tensor([[7, 1], [0, 2], [39, 3], [21, 4], [8, 5]], device=DEV)[:, 0]
    store_kv_rows(rows, pool, scale, slots)
    ref_scale = (rows.float().abs().amax(1) / 448).clamp(min=1e-12)
    torch.testing.assert_close(scale[slots], ref_scale, rtol=1e-6, atol=0)
    torch.testing.assert_close(pool[slots], rows.float() / ref_scale[:, None], rtol=1e-5, atol=1e-5)
    assert float(pool[slots].abs().amax()) == pytest.approx(448, rel=1e-5)
    others = torch.ones(40, dtype=torch.bool, device=DEV)
    others[slots] = False
    assert bool(pool[others].isnan().all()) and bool(scale[others].isnan().all())


def test_store_kv_rows_names_each_bad_argument():
    from kernels.glue import store_kv_rows

    rows = torch.randn(2, 64, device=DEV)
    with pytest.raises(
        ValueError,
        match=r"store_kv_rows: pool \(8, 32\) \(contiguous rows of 64\); pool_scale \(8,\) "
        r"torch.float16 \(float32 \[8\]\); slots \(3,\) \(\[2\]\)",
    ):
        store_kv_rows(
            rows,
            torch.empty(8, 32, device=DEV),
            torch.empty(8, device=DEV).half(),
            torch.zeros(3, dtype=torch.long, device=DEV),
        )


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="e4m3 rounding needs a GPU (the interpreter's is wrong)")
def test_store_kv_rows_writes_the_bytes_torch_quantisation_writes_on_a_gpu():
    from kernels.glue import store_kv_rows
    from kernels.sparse_decode import quantize_kv_fp8

    g = torch.Generator(device="cuda").manual_seed(1)
    rows = torch.randn(64, 512, generator=g, device="cuda").to(torch.bfloat16)
    pool = torch.zeros(100, 512, device="cuda", dtype=torch.float8_e4m3fn)
    scale = torch.zeros(100, device="cuda")
    slots = torch.randperm(100, generator=g, device="cuda")[:64]
    store_kv_rows(rows, pool, scale, slots)
    ref, ref_scale = quantize_kv_fp8(rows)
    torch.testing.assert_close(scale[slots], ref_scale, rtol=1e-6, atol=0)
    got, want = pool[slots].float(), ref.float()
    differ = got != want  # a division rounded the other way may land one e4m3 step off, rarely
    assert float(differ.float().mean()) < 1e-3
    assert bool(((got - want).abs() <= want.abs() / 8 + 2.0**-9)[differ].all())
