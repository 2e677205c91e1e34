"""SGLang's Triton block-FP8 GEMM loaded from the installed SGLang's source file and launched as SGLang launches it:
checked against a float64 reference (Triton's interpreter on a CPU, float32 operands standing in for e4m3: the
kernel's arithmetic is the same), on both of SGLang's CUDA kernels, with SGLang's own tuned config files."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

if importlib.util.find_spec("sglang") is None:  # CI installs it (no deps); its kernel source is all this needs
    pytest.skip("sglang is not installed (`pip install sglang --no-deps`)", allow_module_level=True)

from kernels.plugins.sglang_block_fp8 import (  # noqa: E402 - after the skip
    KNOWN_ARGS,
    block_fp8_configs,
    block_fp8_matmul,
    default_config,
    source_path,
)
from kernels.plugins.sglang_moe import SGLangKernelUnavailable, load_sglang_jit  # noqa: E402

BLOCK = [128, 128]


@pytest.fixture
def device():
    import triton

    if torch.cuda.is_available():
        return "cuda"
    if not triton.knobs.runtime.interpret:
        pytest.skip("Triton was imported before TRITON_INTERPRET=1 was set; run this file on its own")
    return "cpu"


def _operands(m: int, n: int, k: int, device: str, seed: int):
    """Fresh random operands: e4m3 on a GPU (what SGLang passes), float32 in the interpreter (no fp8 there)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g)
    b = torch.randn(n, k, generator=g)
    if device == "cuda":
        a, b = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    a_scale = torch.rand(m, -(-k // BLOCK[1]), generator=g) + 0.5
    b_scale = torch.rand(-(-n // BLOCK[0]), -(-k // BLOCK[1]), generator=g) + 0.5
    return [t.to(device) for t in (a, b, a_scale, b_scale)]


def _reference(a, b, a_scale, b_scale) -> torch.Tensor:
    """sum over K blocks of (a_blk @ b_blk.T) * a_scale[m, kb] * b_scale[nb, kb], in float64."""
    a, b, a_scale, b_scale = (t.cpu().double() for t in (a, b, a_scale, b_scale))
    m, k = a.shape
    n = b.shape[0]
    out = torch.zeros(m, n, dtype=torch.float64)
    for kb in range(-(-k // BLOCK[1])):
        ks = slice(kb * BLOCK[1], (kb + 1) * BLOCK[1])
        part = a[:, ks] @ b[:, ks].T
        out += part * a_scale[:, kb : kb + 1] * b_scale[:, kb].repeat_interleave(BLOCK[0])[:n][None, :]
    return out


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double().cpu() - want).norm() / want.norm())


SMALL = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2}


def _config_folder(tmp_path, n: int, k: int, config: dict) -> str:
    """A tuned config file as SGLang names it, for a made-up device, with ``config`` at batch 1 and 64."""
    name = f"N={n},K={k},device_name=TEST_GPU,dtype=fp8_w8a8,block_shape=[{BLOCK[0]}, {BLOCK[1]}].json"
    (tmp_path / name).write_text(json.dumps({"1": config, "64": dict(config, BLOCK_SIZE_M=64)}))
    block_fp8_configs.cache_clear()
    return str(tmp_path)


@pytest.mark.parametrize(
    ("config", "sm90"),
    [
        (None, False),  # no tuned file: SGLang's default config, the plain kernel
        (SMALL, False),  # a tuned file's config, the plain kernel (K=320: the last K tile masked)
        (dict(SMALL, SPLIT_K=2), True),  # the Hopper kernel's split-K and SGLang's reduction
        (dict(SMALL, SWAP_AB=True), True),  # the Hopper kernel's swapped MMA
        (dict(SMALL, SPLIT_K=2, SWAP_AB=True), False),  # Hopper-only fields on another GPU: the plain kernel
    ],
    ids=["default", "tuned", "hopper-split-k", "hopper-swap-ab", "not-sm90"],
)
def test_sglangs_block_fp8_gemm_matches_the_float64_reference(device, tmp_path, config, sm90):
    m, n, k = 3, 192, 320
    a, b, a_scale, b_scale = _operands(m, n, k, device, seed=7)
    folder = _config_folder(tmp_path, n, k, config) if config else str(tmp_path)
    out = block_fp8_matmul(
        a, b, a_scale, b_scale, BLOCK, torch.float32, config_folder=folder, device="TEST_GPU", sm90=sm90
    )
    assert out.shape == (m, n) and out.dtype == torch.float32
    assert _rel_err(out, _reference(a, b, a_scale, b_scale)) < 1e-5


def _shipped_files(name: str) -> list:
    """SGLang's tuned block-FP8 files for the GPU ``name`` with V4's 128 x 128 blocks. Not a glob: in one, the
    ``[128, 128]`` of the file name is a set of characters, and the H200 run skipped "SGLang ships no block-FP8
    config for NVIDIA_H200" while it ships them."""
    tail = f",device_name={name},dtype=fp8_w8a8,block_shape=[128, 128].json"
    root = source_path().parent / "configs"
    return sorted(p for p in root.iterdir() if p.name.startswith("N=") and p.name.endswith(tail))


def test_the_gpu_test_finds_the_tuned_files_sglang_ships_for_an_h200():
    files = _shipped_files("NVIDIA_H200")
    assert len(files) >= 10, files
    assert all("block_shape=[128, 128]" in p.name and "NVIDIA_H200" in p.name for p in files)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="SGLang's own tuned files name a GPU")
def test_on_this_gpu_every_tuned_file_sglang_ships_for_it_runs_and_matches_the_reference():
    """Each of SGLang's tuned files for this GPU with 128 x 128 blocks (V4's), at batches 1, 16 and 64: e4m3
    operands, the config SGLang picks for the batch (on an H200, the Hopper kernel where the file asks for it), bf16
    out as SGLang's linears ask."""
    from kernels.plugins.sglang_block_fp8 import device_name

    name = device_name()
    files = _shipped_files(name)
    if not files:
        pytest.skip(f"SGLang ships no block-FP8 config for {name}")
    for path in files:
        n, k = (int(part.split("=")[1]) for part in path.name.split(",")[:2])
        for m in (1, 16, 64):
            a, b, a_scale, b_scale = _operands(m, n, k, "cuda", seed=m)
            out = block_fp8_matmul(a, b, a_scale, b_scale, BLOCK, torch.bfloat16)
            err = _rel_err(out.float(), _reference(a, b, a_scale, b_scale))
            assert err < 1e-2, (path.name, m, err)  # bf16 output: ~3e-3


def test_a_wrong_weight_scale_is_caught_by_the_reference(device, tmp_path):
    a, b, a_scale, b_scale = _operands(3, 192, 320, device, seed=8)
    wrong = b_scale.clone()
    wrong[1, 0] *= 2.0
    out = block_fp8_matmul(a, b, a_scale, wrong, BLOCK, torch.float32, config_folder=str(tmp_path), device="X")
    assert _rel_err(out, _reference(a, b, a_scale, b_scale)) > 1e-3


def test_sglangs_own_h200_file_is_read_as_sglang_reads_it():
    """V4's shapes that SGLang ships an H200 file for: the entry for the batch nearest M, as SGLang picks it."""
    configs = block_fp8_configs(2048, 512, 128, 128, "NVIDIA_H200")
    assert configs is not None and 1 in configs
    fields = {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"}
    assert all(fields <= set(c) for c in configs.values())
    assert block_fp8_configs(2048, 512, 128, 128, "NO_SUCH_GPU") is None
    assert default_config(128, 128) == {
        "BLOCK_SIZE_M": 64,
        "BLOCK_SIZE_N": 128,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 32,
        "num_warps": 4,
        "num_stages": 3,
    }


def test_the_launcher_knows_every_parameter_of_the_installed_sglangs_kernels():
    found = load_sglang_jit(*KNOWN_ARGS, path=source_path())
    assert {name: tuple(fn.arg_names) for name, fn in found.items()} == KNOWN_ARGS


def test_a_release_without_a_kernel_or_with_other_parameters_gives_one_line(tmp_path):
    from kernels.plugins.sglang_block_fp8 import _kernels

    def source(**params: str) -> str:
        return "import triton\n" + "".join(
            f"\n@triton.jit\ndef {name}({args}):\n    pass\n" for name, args in params.items()
        )

    known = {name: ", ".join(args) for name, args in KNOWN_ARGS.items()}
    missing = tmp_path / "missing.py"
    missing.write_text(source(**{k: v for k, v in known.items() if k != "_w8a8_block_fp8_matmul_hopper"}))
    with pytest.raises(SGLangKernelUnavailable, match="has no @triton.jit function '_w8a8_block_fp8_matmul_hopper'"):
        _kernels(missing)
    renamed = tmp_path / "renamed.py"
    renamed.write_text(
        source(**dict(known, _w8a8_block_fp8_matmul=known["_w8a8_block_fp8_matmul"].replace("As,", "A_scale,")))
    )
    with pytest.raises(
        SGLangKernelUnavailable, match=r"_w8a8_block_fp8_matmul takes parameters \['A', 'B', 'C', 'A_scale'"
    ):
        _kernels(renamed)


def test_scales_that_do_not_fit_the_blocks_are_refused_with_the_shapes():
    a, b, a_scale, b_scale = _operands(3, 192, 320, "cpu", seed=9)
    with pytest.raises(ValueError, match=r"are not one per \[128, 128\] block of b \(192, 320\)"):
        block_fp8_matmul(a, b, a_scale, b_scale[:1], BLOCK, torch.float32, device="X")
