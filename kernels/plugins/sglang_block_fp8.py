"""SGLang's Triton block-FP8 GEMM (``--fp8-gemm-backend triton``) compiled from the installed SGLang's source file,
launched as SGLang's ``w8a8_block_fp8_matmul_triton`` launches it on an NVIDIA GPU.

SGLang 0.5.23 keeps the kernels and their launcher in ``sglang/kernels/ops/gemm/fp8_kernel.py``. Importing that
module runs ``sglang.srt.layers.deep_gemm_wrapper``, which imports SGLang's model executor and its multimodal configs
(torchvision, transformers' processors, ``sgl_kernel``): the module does not import on a GPU host that has the
kernels' own needs (torch, Triton) but not SGLang's whole runtime. So, as :mod:`kernels.plugins.sglang_moe` does for
the fused MoE, :func:`kernels.plugins.sglang_moe.load_sglang_jit` compiles just the ``@triton.jit`` functions from that
file, under its own name and line numbers, and :func:`block_fp8_matmul` repeats the launcher's steps for CUDA:

* the config: SGLang's tuned file for ``(N, K, block)`` on this GPU (``kernels/ops/gemm/configs/N=..,K=..,
  device_name=..,dtype=fp8_w8a8,block_shape=[bn, bk].json`` inside the installed package, the entry for the batch
  nearest ``M``, ``BLOCK_SIZE_K`` raised to the block where it does not divide it), else SGLang's default
  (``64 x block_n x block_k``, group 32, 4 warps, 3 stages);
* the kernel: ``_w8a8_block_fp8_matmul_hopper`` on sm_90 when the config asks for ``SWAP_AB`` or ``SPLIT_K > 1``
  (then ``SPLIT_K`` fp32 partials summed by ``_reduce_block_fp8_split_k``), else ``_w8a8_block_fp8_matmul``;
* the arguments: SGLang's, by name, with the weight ``B [N, K]`` read transposed through its strides.

SGLang's AMD paths (the unrolled and gfx1250 kernels) are not repeated. The launcher refuses a kernel whose parameters
it does not know (another SGLang release) with one line. Nothing of SGLang is copied here.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch
import triton

from kernels.plugins.sglang_moe import (
    SGLangKernelUnavailable,
    load_sglang_jit,
    sglang_file,
    sglang_package_dirs,
    sglang_version,
)

__all__ = ["SOURCE", "CONFIGS", "block_fp8_matmul", "block_fp8_configs", "default_config", "source_path"]

SOURCE = "kernels/ops/gemm/fp8_kernel.py"
"""Where SGLang (0.5.23) keeps its Triton block-FP8 GEMM and its launcher, relative to the ``sglang`` package."""
CONFIGS = "kernels/ops/gemm/configs"
"""Where SGLang keeps the GEMM's tuned configs (no variable or flag points SGLang elsewhere)."""
KERNELS = ("_w8a8_block_fp8_matmul", "_w8a8_block_fp8_matmul_hopper", "_reduce_block_fp8_split_k")

_ARGS = (
    "A",
    "B",
    "C",
    "As",
    "Bs",
    "M",
    "N",
    "K",
    "group_n",
    "group_k",
    "stride_am",
    "stride_ak",
    "stride_bk",
    "stride_bn",
    "stride_cm",
    "stride_cn",
    "stride_As_m",
    "stride_As_k",
    "stride_Bs_k",
    "stride_Bs_n",
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "needs_masking",
)
KNOWN_ARGS = {
    "_w8a8_block_fp8_matmul": _ARGS,
    "_w8a8_block_fp8_matmul_hopper": (*_ARGS, "SWAP_AB", "SPLIT_K"),
    "_reduce_block_fp8_split_k": ("Parts", "Out", "ELEMENTS", "SPLITS", "BLOCK"),
}
"""Every parameter of each kernel the launcher gives (SGLang 0.5.23); a kernel with others is refused."""


def source_path() -> Path:
    """The installed SGLang's ``fp8_kernel.py``."""
    return sglang_file(SOURCE)


def _kernels(path: Path | None = None) -> dict[str, Any]:
    found = load_sglang_jit(*KERNELS, path=path or source_path())
    for name, known in KNOWN_ARGS.items():
        args = tuple(found[name].arg_names)
        if args != known:
            raise SGLangKernelUnavailable(
                f"SGLang {sglang_version() or '?'}'s {name} takes parameters {list(args)}, not the {list(known)} this "
                "launcher gives; it mirrors SGLang 0.5.23"
            )
    return found


def default_config(block_n: int, block_k: int) -> dict[str, int]:
    """SGLang's config where no tuned file matches (``w8a8_block_fp8_matmul_triton``)."""
    return {
        "BLOCK_SIZE_M": 64,
        "BLOCK_SIZE_N": block_n,
        "BLOCK_SIZE_K": block_k,
        "GROUP_SIZE_M": 32,
        "num_warps": 4,
        "num_stages": 3,
    }


def device_name() -> str | None:
    """The GPU's name as SGLang spells it in config file names (``NVIDIA_H200``); None without a GPU."""
    return torch.cuda.get_device_name().replace(" ", "_") if torch.cuda.is_available() else None


@functools.lru_cache(maxsize=256)
def block_fp8_configs(
    n: int, k: int, block_n: int, block_k: int, device: str | None, folder: str | None = None
) -> dict[int, dict[str, Any]] | None:
    """SGLang's tuned configs for this GEMM on GPU ``device`` (batch -> config), read from the installed package's
    folder (or ``folder``) as ``get_w8a8_block_fp8_configs`` reads them; None where SGLang has no file for it."""
    if device is None:
        return None
    name = f"N={n},K={k},device_name={device},dtype=fp8_w8a8,block_shape=[{block_n}, {block_k}].json"
    dirs = [Path(folder)] if folder else [root / CONFIGS for root in sglang_package_dirs()]
    for d in dirs:
        path = d / name
        if path.is_file():
            raw = {int(m): cfg for m, cfg in json.loads(path.read_text()).items()}
            # SGLang on CUDA raises BLOCK_SIZE_K to the block where it is smaller and does not divide it
            return {
                m: (
                    {**cfg, "BLOCK_SIZE_K": block_k}
                    if cfg["BLOCK_SIZE_K"] < block_k and block_k % cfg["BLOCK_SIZE_K"]
                    else cfg
                )
                for m, cfg in raw.items()
            }
    return None


def block_fp8_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    block_size: list[int],
    output_dtype: torch.dtype = torch.bfloat16,
    *,
    config_folder: str | None = None,
    device: str | None = None,
    sm90: bool | None = None,
) -> torch.Tensor:
    """``a [..., K] @ b.T`` for ``b [N, K]`` with ``a``'s per-token-group scales ``a_scale [..., ceil(K/bk)]`` and
    ``b``'s block scales ``b_scale [ceil(N/bn), ceil(K/bk)]`` (float32), as SGLang's ``w8a8_block_fp8_matmul_triton``
    computes it on CUDA. ``config_folder``, ``device`` and ``sm90`` default to the installed SGLang's configs, this
    GPU's name and its architecture (tests set them)."""
    block_n, block_k = block_size
    if a.shape[-1] != b.shape[-1] or b.ndim != 2 or b_scale.ndim != 2 or a.shape[:-1] != a_scale.shape[:-1]:
        raise ValueError(
            f"block_fp8_matmul: shapes a {tuple(a.shape)}, b {tuple(b.shape)}, a_scale {tuple(a_scale.shape)}, "
            f"b_scale {tuple(b_scale.shape)} do not fit (a [..., K], b [N, K], a_scale [..., K/{block_k}])"
        )
    if (
        not (a.is_contiguous() and b.is_contiguous())
        or a_scale.dtype != torch.float32
        or b_scale.dtype != torch.float32
    ):
        raise ValueError("block_fp8_matmul: a and b must be contiguous and both scales float32, as SGLang asserts")
    n, k = b.shape
    if triton.cdiv(k, block_k) != a_scale.shape[-1] or (triton.cdiv(n, block_n), triton.cdiv(k, block_k)) != tuple(
        b_scale.shape
    ):
        raise ValueError(
            f"block_fp8_matmul: scales a_scale {tuple(a_scale.shape)}, b_scale {tuple(b_scale.shape)} are not one per "
            f"[{block_n}, {block_k}] block of b {tuple(b.shape)}"
        )
    m = a.numel() // k
    c = a.new_empty((*a.shape[:-1], n), dtype=output_dtype)
    kernels = _kernels()
    configs = block_fp8_configs(n, k, block_n, block_k, device_name() if device is None else device, config_folder)
    config = dict(configs[min(configs, key=lambda x: abs(x - m))]) if configs else default_config(block_n, block_k)
    if sm90 is None:
        sm90 = torch.cuda.is_available() and torch.cuda.get_device_capability(a.device) == (9, 0)
    hopper = bool(sm90) and (bool(config.get("SWAP_AB", False)) or config.get("SPLIT_K", 1) > 1)
    split_k = int(config.get("SPLIT_K", 1)) if hopper else 1
    if not hopper:  # the plain kernel takes neither
        config.pop("SWAP_AB", None)
        config.pop("SPLIT_K", None)
    if split_k > 1 and split_k & (split_k - 1):
        raise ValueError(f"block_fp8_matmul: SPLIT_K {split_k} of config {config} is not a power of two")
    out = torch.empty((split_k, m, n), device=a.device, dtype=torch.float32) if split_k > 1 else c
    blocks = triton.cdiv(m, config["BLOCK_SIZE_M"]) * triton.cdiv(n, config["BLOCK_SIZE_N"])
    kernel = kernels["_w8a8_block_fp8_matmul_hopper" if hopper else "_w8a8_block_fp8_matmul"]
    kernel[(blocks, split_k) if hopper else (blocks,)](
        a,
        b,
        out,
        a_scale,
        b_scale,
        m,
        n,
        k,
        block_n,
        block_k,
        a.stride(-2) if a.ndim > 1 else k,
        a.stride(-1),
        b.stride(1),
        b.stride(0),
        c.stride(-2) if c.ndim > 1 else n,
        c.stride(-1),
        a_scale.stride(-2) if a_scale.ndim > 1 else a_scale.shape[-1],
        a_scale.stride(-1),
        b_scale.stride(1),
        b_scale.stride(0),
        **config,
        needs_masking=bool(k % config["BLOCK_SIZE_K"] != 0),
    )
    if split_k > 1:
        kernels["_reduce_block_fp8_split_k"][(triton.cdiv(m * n, 256),)](out, c, m * n, split_k, 256)
    return c
