"""The Triton replacement of SGLang's ``fused_q_norm_rope`` against a float64 torch reference of SGLang's semantics
(norm without weight, rounded to the input dtype, interleaved rope on the last R dims); fresh random inputs,
poisoned outputs, relative norm error. On CPU the kernel runs in Triton's interpreter (fp16/fp32)."""

import os

import pytest
import torch

from kernels.sglang_q_norm_rope import fused_q_norm_rope, q_norm_rope_reference

CUDA = torch.cuda.is_available()
RUNNABLE = CUDA or os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not RUNNABLE, reason="no CUDA and Triton was imported before TRITON_INTERPRET=1")
DEV = "cuda" if CUDA else "cpu"
TOL = {torch.float16: 2e-3, torch.float32: 1e-5}


def _freqs(max_pos, rope_dim, gen):
    ang = torch.rand(max_pos, rope_dim // 2, generator=gen, dtype=torch.float64) * 6.3
    return torch.polar(torch.ones_like(ang), ang).to(torch.complex64).to(DEV)


def _inputs(B, H, D, R, dtype, seed, batch_stride=None):
    gen = torch.Generator().manual_seed(seed)
    bs = batch_stride or H * D
    buf = (torch.randn(B * bs, generator=gen) * 3).to(dtype).to(DEV)
    q = buf.as_strided((B, H, D), (bs, D, 1))
    pos = torch.randint(0, 300, (B,), generator=gen).to(DEV)
    return q, _freqs(300, R, gen), pos


def _rel(out, ref):
    return ((out.to(ref.dtype) - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("B,H,D,R", [(1, 4, 512, 64), (3, 5, 96, 32), (2, 3, 64, 64)], ids=str)
@pytest.mark.parametrize("cfg", [None, {"BLOCK_H": 4, "num_warps": 4}], ids=str)
@pytest.mark.parametrize("eps", [1e-6, None], ids=["norm", "no_norm"])
def test_matches_sglang_semantics_in_float64(dtype, B, H, D, R, cfg, eps):
    q, freqs, pos = _inputs(B, H, D, R, dtype, seed=B * 100 + H)
    out = torch.full_like(q, float("nan"))
    fused_q_norm_rope(q, out, eps, freqs, pos, cfg)
    ref = q_norm_rope_reference(q, eps, freqs, pos)
    assert not out.isnan().any()
    assert _rel(out, ref) <= TOL[dtype]


def test_the_rope_is_interleaved_on_the_last_dims_and_the_rest_only_normed():
    q, freqs, pos = _inputs(2, 3, 96, 32, torch.float32, seed=7)
    out = torch.full_like(q, float("nan"))
    fused_q_norm_rope(q, out, 1e-6, freqs, pos)
    normed = q.double() * torch.rsqrt(q.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(out[..., :64].double(), normed[..., :64], rtol=1e-5, atol=1e-6)
    fr = torch.view_as_real(freqs)[pos.long()].double()  # [B, 16, 2]
    x0, x1 = normed[..., 64::2], normed[..., 65::2]
    c, s = fr[:, None, :, 0], fr[:, None, :, 1]
    assert torch.allclose(out[..., 64::2].double(), x0 * c - x1 * s, rtol=1e-5, atol=1e-5)
    assert torch.allclose(out[..., 65::2].double(), x0 * s + x1 * c, rtol=1e-5, atol=1e-5)


def test_a_padded_batch_stride_and_int32_positions_are_read_as_sglang_passes_them():
    q, freqs, pos = _inputs(3, 4, 128, 64, torch.float16, seed=3, batch_stride=4 * 128 + 64)
    out = torch.full((3, 4, 128), float("nan"), dtype=torch.float16, device=DEV)
    fused_q_norm_rope(q, out, 1e-6, freqs, pos.int())
    assert _rel(out, q_norm_rope_reference(q, 1e-6, freqs, pos)) <= TOL[torch.float16]


def test_in_place_gives_the_same_result():
    q, freqs, pos = _inputs(2, 4, 128, 64, torch.float32, seed=5)
    ref = q_norm_rope_reference(q, 1e-6, freqs, pos)
    fused_q_norm_rope(q, q, 1e-6, freqs, pos)
    assert _rel(q, ref) <= TOL[torch.float32]


def test_a_wrong_layout_is_refused_naming_the_argument():
    q, freqs, pos = _inputs(2, 4, 128, 64, torch.float32, seed=5)
    with pytest.raises(ValueError, match="positions must be"):
        fused_q_norm_rope(q, torch.empty_like(q), 1e-6, freqs, pos[:1])
    with pytest.raises(ValueError, match="q_output must be"):
        fused_q_norm_rope(q, torch.empty_like(q).half(), 1e-6, freqs, pos)


def _plugin_hook(tmp_path, arch):
    """The AROUND hook of an exported plug-in (its own files, imported from where the export wrote them), for
    records measured on ``arch`` at batch 2 (faster) and 4 (slower): it runs ours for batch 1-2 only."""
    import importlib
    import json
    import sys

    from tuner.export.sglang_plugin import SideBySide, choose, write_plugin

    def rec(batch, ours):
        return SideBySide(
            target="sglang.kernels.ops.attention.dsv4.norm_rope.fused_q_norm_rope",
            batch=batch,
            shape={"heads": 4, "head_dim": 128, "rope_dim": 64, "norm": True},
            dtypes={"dtype": "float32", "out_dtype": "float32"},
            ours_us=ours,
            sglang_us=5.0,
            rel_err=1e-7,
            gpu="cpu",
            arch=arch,
            date="2026-12-03",
            commit="c",
            sglang="0.5.23",
            config={"BLOCK_H": 2, "num_warps": 1},
        )

    dest = tmp_path / "sglang_plugin"
    man = write_plugin(dest, choose([rec(2, 4.0), rec(4, 6.0)]), study="s", commit="c", sglang="0.5.23")
    sys.path.insert(0, str(dest))
    try:
        hooks = importlib.import_module("tuner_sglang_plugin.hooks")
        hook = hooks.fused_q_norm_rope(man["hooks"][0], dest / "tuner_sglang_plugin")
    finally:
        sys.path.remove(str(dest))
        for name in [n for n in sys.modules if n.startswith("tuner_sglang_plugin")]:
            del sys.modules[name]
    assert json.loads((dest / "MANIFEST.json").read_text())["hooks"][0]["cases"][0]["buckets"][0]["batch_range"] == [
        1,
        2,
    ]
    return hook


@pytest.mark.skipif(CUDA, reason="the CPU arch key: the interpreter's path")
def test_the_plugins_hook_runs_ours_in_its_measured_bucket_and_sglangs_elsewhere(tmp_path):
    hook = _plugin_hook(tmp_path, "cpu")
    calls = []

    def sglangs(q_input, q_output, eps, freqs_cis, positions):  # SGLang's semantics, counting its calls
        calls.append(q_input.shape[0])
        q_output.copy_(q_norm_rope_reference(q_input, eps, freqs_cis, positions))

    for B, expect_sglang in ((1, False), (2, False), (3, True), (4, True), (9, True)):
        q, freqs, pos = _inputs(B, 4, 128, 64, torch.float32, seed=B)
        out = torch.full_like(q, float("nan"))
        calls.clear()
        hook(sglangs, q, out, 1e-6, freqs, pos)
        assert calls == ([B] if expect_sglang else []), B
        assert _rel(out, q_norm_rope_reference(q, 1e-6, freqs, pos)) <= TOL[torch.float32]
    q, freqs, pos = _inputs(2, 4, 128, 64, torch.float32, seed=1)
    for args in (
        (q, torch.empty_like(q), None, freqs, pos),  # no norm: not measured
        (q[:, :2], torch.empty_like(q[:, :2]), 1e-6, freqs, pos),  # 2 heads: not measured
        (q.half(), torch.empty_like(q.half()), 1e-6, freqs, pos),
    ):  # float16: not measured
        calls.clear()
        hook(sglangs, *args)
        assert calls == [2]
    calls.clear()
    hook(sglangs, q, torch.empty_like(q), 1e-6, freqs, positions=pos)  # keyword arguments bind as SGLang's
    assert calls == []


def test_a_plugin_measured_on_another_arch_leaves_every_call_to_sglang(tmp_path):
    hook = _plugin_hook(tmp_path, "sm_90" if not CUDA else "sm_0")
    calls = []
    q, freqs, pos = _inputs(1, 4, 128, 64, torch.float32, seed=1)
    hook(lambda *a: calls.append(1), q, torch.empty_like(q), 1e-6, freqs, pos)
    assert calls == [1]


COMPILE = r"""
import sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from compile_probe import Sm90
from triton.runtime import driver
driver.set_active(Sm90())
import torch
from kernels.compile_only import jit_compile_only
from kernels.sglang_q_norm_rope import DEFAULT_CONFIG, q_norm_rope
with jit_compile_only():  # V4-Flash's decode q path: 64 heads of 512, rope 64, bf16
    for cfg in (DEFAULT_CONFIG, {"BLOCK_H": 8, "num_warps": 8}):
        for eps in (1e-6, None):
            q = torch.empty(64, 64, 512, dtype=torch.bfloat16, device="meta")
            q_norm_rope(q, torch.empty_like(q), eps, torch.empty(4096, 64, device="meta"),
                        torch.empty(64, dtype=torch.int64, device="meta"), cfg)
print("compiled for sm_90")
"""


@pytest.mark.slow
def test_it_compiles_for_sm90_at_v4_flash_shapes():
    """The file the plug-in ships lowers to PTX and cubin for Hopper with the installed Triton (no GPU needed)."""
    import subprocess
    import sys
    from pathlib import Path

    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        pytest.skip("Triton has no NVIDIA backend here")
    here = Path(__file__).resolve().parent
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", COMPILE, str(here.parents[1]), str(here)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0 and "compiled for sm_90" in done.stdout, done.stderr[-3000:]
