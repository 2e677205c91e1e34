"""SGLang's own attention kernels in the twin (attention_impl flashmla_kv / flashmla_sparse, the sgl-flash-mla wheel).

On any machine: the V4 fp8 cache the twin builds for FlashMLA has SGLang's layout (584 bytes a token, per page the
data then the scales) and holds the rows within e4m3's error. On an sm_90 GPU with the wheel (marked ``gpu``):
FlashMLA's output agrees with the twin's reference within the fp8 tolerance, as a kernel and in the decode step.
"""

import importlib.util

import pytest
import torch

from tuner.targets.workload.gpu_ops import V4_BYTES, V4_PAGE, dequantize_v4, quantize_v4, store_v4, v4_page_bytes

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_flashmla = pytest.mark.skipif(
    not (HOPPER and importlib.util.find_spec("flash_mla")),
    reason="needs an sm_90 GPU and sgl-flash-mla (pip install 'tuner[flashmla]')",
)
FP8_TOL = 0.30  # the numerics gate's fp8 family tolerance (tuner/targets/workload/numerics.py)


def test_the_v4_cache_has_sglangs_layout_and_holds_the_rows():
    assert V4_BYTES == 584 and v4_page_bytes(64) % 576 == 0  # KVLayout.V4: 576 data + 8 scale bytes, pages of 576s
    rows = torch.randn(130, 512, generator=torch.Generator().manual_seed(0))
    cache = quantize_v4(rows)
    assert cache.dtype == torch.uint8 and tuple(cache.shape) == (3, V4_PAGE, 1, 584)
    assert cache.stride() == (v4_page_bytes(), 584, 584, 1)  # SGLang's view: [pages, page, 1, 584] over padded pages
    back = dequantize_v4(cache, 130)
    assert torch.equal(back[:, 448:], rows[:, 448:].to(torch.bfloat16).float())  # rope values kept in bf16
    assert (back - rows).norm() / rows.norm() < 0.04  # e4m3 with a power-of-two scale per 64 values
    store_v4(cache, 3 * rows[:2], torch.tensor([129, 0]))
    again = dequantize_v4(cache, 130)
    assert torch.allclose(again[129], dequantize_v4(quantize_v4(3 * rows[:1]), 1)[0])
    assert torch.equal(again[1:129], back[1:129])  # only the two slots written changed


@pytest.mark.gpu
@needs_flashmla
@pytest.mark.parametrize("impl", ["flashmla_kv", "flashmla_sparse"])
@pytest.mark.parametrize("batch", [1, 16, 64])
def test_flashmla_agrees_with_the_twins_reference_within_the_fp8_tolerance(impl, batch):
    from tuner.targets.workload.gpu_ops import flashmla_attention
    from tuner.targets.workload.ops import sparse_attention_torch

    g = torch.Generator(device="cuda").manual_seed(batch)
    q = torch.randn(batch, 64, 512, device="cuda", generator=g).to(torch.bfloat16)
    pool = torch.randn(8192, 512, device="cuda", generator=g).to(torch.bfloat16)
    rows = torch.randint(0, 8192, (batch, 640), device="cuda", generator=g)
    rows[:, -40:] = -1  # masked tail, as a short request's selection
    scale = 512**-0.5
    fn = flashmla_attention(impl)
    if impl == "flashmla_kv":
        cache = quantize_v4(pool.float())
        out = fn(q, cache, rows, scale)
        ref = sparse_attention_torch(q, dequantize_v4(cache, pool.shape[0]).to(torch.bfloat16), rows, scale)
        exact = sparse_attention_torch(q, pool, rows, scale)
        assert ((out.float() - exact.float()).norm() / exact.float().norm()).item() < FP8_TOL
    else:
        out = fn(q, pool, rows, scale)
        ref = sparse_attention_torch(q, pool, rows, scale)
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < 2e-2, err  # the same cache contents: only the kernels' bf16 rounding differs


@pytest.mark.gpu
@needs_flashmla
@pytest.mark.parametrize("impl, kv", [("flashmla_kv", "fp8_e4m3"), ("flashmla_sparse", "bf16")])
def test_the_decode_step_on_flashmla_agrees_with_the_torch_reference(impl, kv):
    from tuner.targets.workload.model import DecodeModel
    from tuner.targets.workload.presets import get_preset

    preset = get_preset("dsv4-flash")  # FlashMLA takes d 512 and 64 or 128 heads: V4-Flash's own shape
    outs = {}
    for name, knobs in (
        ("ref", {"attention_impl": "torch", "kv_cache_dtype": "bf16"}),
        (impl, {"attention_impl": impl, "kv_cache_dtype": kv}),
    ):
        m = DecodeModel(preset, {**knobs, "context_length": 8192}, device="cuda", seed=0)
        st = m.state(4, 512)
        outs[name] = m.step(st).float()
    err = ((outs[impl] - outs["ref"]).norm() / outs["ref"].norm()).item()
    assert err < FP8_TOL, err


def test_flashmla_on_a_shape_it_cannot_take_is_a_one_line_knob_error():
    from tuner.targets.workload.model import DecodeModel, KnobError
    from tuner.targets.workload.presets import get_preset

    with pytest.raises(KnobError, match="attention_impl=flashmla_kv.*head dim 512"):
        DecodeModel(
            get_preset("dsv4-flash-tiny"), {"attention_impl": "flashmla_kv", "kv_cache_dtype": "fp8_e4m3"}, device="cpu"
        )
