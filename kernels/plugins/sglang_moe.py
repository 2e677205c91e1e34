"""SGLang's own fused-MoE Triton kernel as a tunable kernel, so the configs written in SGLang's file format are
tuned on the kernel SGLang runs (``sglang_fused_moe`` in ``--target kernels`` plans and SGLang kernel phases).

What runs is SGLang's ``fused_moe_kernel`` from the installed SGLang's source file
(``sglang/kernels/ops/moe/fused_moe_triton_kernels.py``, SGLang 0.5.23's layout), unchanged. Importing that module
drags in most of SGLang's runtime (transformers, torchvision, sgl_kernel), so :func:`load_sglang_jit` instead
compiles just the ``@triton.jit`` functions it needs from that file, under the file's own name and line numbers:
``inspect.getsource`` and Triton's cache key see SGLang's source as it is. Nothing of SGLang is copied here.

The launch mirrors SGLang's ``invoke_fused_moe_kernel`` on its unquantized path (bf16/fp16 weights: no scales,
no TMA, no bias, ``swap_ab`` off, programmatic dependent launch on sm_90+, ``even_Ks`` from the K tile), and one
call is SGLang's ``fused_experts`` for decode: gate-up GEMM, ``silu(gate) * up``, down GEMM with the routing
weights, sum over the top-k. One config serves both GEMMs, as in SGLang's own tuning script. The launcher binds
every kernel argument by name and refuses a kernel whose parameters it does not know (another SGLang release).

Left out of the timing, or done differently from SGLang (the same for every config, so rankings hold):

* the routing alignment (SGLang's ``moe_align_block_size`` CUDA kernel): :func:`align_block_size` builds the
  same three tensors in torch (same buffer sizes, ``-1`` marks no expert) once per input set and block size;
* ``silu_and_mul`` and the top-k sum run as torch ops, where SGLang uses its ``sgl_kernel`` ops.

Configs are ``{BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages}``, SGLang's six
fields; the default is SGLang's own ``get_default_config`` for unquantized weights. Shapes use the names of
``kernels/moe.py``: ``tokens, hidden, width, experts, topk`` (SGLang's file key: ``E=experts, N=width``).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import logging
import threading
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.base import TunableKernel, cdiv, device_limits, dtype_of, tf32_matmul
from kernels.moe import MoEKernel, routed_inputs, routed_rotation_bytes
from kernels.plugins.sglang_moe_files import MOE_KEYS, read_moe_config_with_sglang, write_moe_config

__all__ = [
    "SGLangFusedMoEKernel",
    "SGLangKernelUnavailable",
    "align_block_size",
    "load_sglang_jit",
    "sglang_version",
    "SOURCE",
]

_logger = logging.getLogger(__name__)

SOURCE = "kernels/ops/moe/fused_moe_triton_kernels.py"
"""Where SGLang (0.5.23) keeps ``fused_moe_kernel``, relative to the ``sglang`` package."""

# every parameter of fused_moe_kernel the launcher gives (SGLang 0.5.23); a kernel with others is refused
_KNOWN_ARGS = (
    "a_ptr",
    "a_desc",
    "b_ptr",
    "b_desc",
    "bias_ptr",
    "c_ptr",
    "a_scale_ptr",
    "b_scale_ptr",
    "topk_weights_ptr",
    "sorted_token_ids_ptr",
    "expert_ids_ptr",
    "num_tokens_post_padded_ptr",
    "add_mask_ptr",
    "N",
    "K",
    "EM",
    "num_valid_tokens",
    "stride_am",
    "stride_ak",
    "stride_be",
    "stride_bk",
    "stride_bn",
    "stride_bias_e",
    "stride_bias_n",
    "stride_cm",
    "stride_cn",
    "stride_asm",
    "stride_ask",
    "stride_bse",
    "stride_bsk",
    "stride_bsn",
    "group_n",
    "group_k",
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "MUL_ROUTED_WEIGHT",
    "top_k",
    "compute_type",
    "use_fp8_w8a8",
    "use_int8_w8a8",
    "use_int8_w8a16",
    "per_channel_quant",
    "even_Ks",
    "c_sorted",
    "swap_ab",
    "FUSE_ADD_TO_OUTPUT",
    "MASK_OUTPUT",
    "FUSE_SUM_ALL_REDUCE",
    "ROUTER_TOPK",
    "FUSE_SWIGLU",
    "USE_GDC",
    "GDC_EARLY",
    "A_OUTPUT_SLICES",
    "A_OUTPUT_SLICE_WIDTH",
    "A_OUTPUT_SLICE_K",
)
_COMPUTE_TYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


class SGLangKernelUnavailable(RuntimeError):
    """SGLang (or the file holding its fused-MoE kernel) is not installed here."""


def sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def sglang_package_dirs() -> list[Path]:
    """The installed ``sglang`` package's folders (found, not imported: SGLang's ``__init__`` is not run)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SGLangKernelUnavailable(
            "sglang is not installed; `pip install sglang --no-deps` gives its kernel "
            "source (nothing else of SGLang is imported)"
        )
    return [Path(root) for root in spec.submodule_search_locations]


def sglang_file(relative: str) -> Path:
    """``relative`` inside the installed SGLang; one line naming the file and the layout known where it is missing."""
    for root in sglang_package_dirs():
        if (root / relative).is_file():
            return root / relative
    raise SGLangKernelUnavailable(
        f"the installed SGLang ({sglang_version() or 'unknown version'}) has no {relative}; "
        "this plug-in knows SGLang 0.5.23's layout"
    )


def _source_path() -> Path:
    return sglang_file(SOURCE)


def _is_triton_jit(node: ast.FunctionDef) -> bool:
    return any(ast.unparse(d).split("(")[0] in ("triton.jit", "jit") for d in node.decorator_list)


_LOADED: dict[tuple[str, str], dict[str, Any]] = {}
_LOAD_LOCK = threading.Lock()


def load_sglang_jit(*names: str, path: str | Path | None = None) -> dict[str, Any]:
    """The ``@triton.jit`` functions ``names`` (and the module-level ones they call) of SGLang's kernel file,
    compiled from that file under its own name and line numbers. Only ``triton`` and ``tl`` are in scope."""
    src_path = Path(path) if path else _source_path()
    key = (str(src_path), ",".join(sorted(names)))
    with _LOAD_LOCK:
        if key in _LOADED:
            return _LOADED[key]
        tree = ast.parse(src_path.read_text(), filename=str(src_path))
        jit = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and _is_triton_jit(n)}
        wanted, todo = set(), list(names)
        while todo:
            name = todo.pop()
            if name in wanted:
                continue
            if name not in jit:
                raise SGLangKernelUnavailable(
                    f"{src_path} has no @triton.jit function {name!r} "
                    f"(SGLang {sglang_version() or '?'}); this plug-in knows SGLang 0.5.23"
                )
            wanted.add(name)
            todo += [n.id for n in ast.walk(jit[name]) if isinstance(n, ast.Name) and n.id in jit]
        future = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
        body = future + [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
        namespace: dict[str, Any] = {
            "__name__": "sglang_fused_moe_source",
            "__file__": str(src_path),
            "triton": triton,
            "tl": tl,
        }
        exec(compile(ast.Module(body=body, type_ignores=[]), str(src_path), "exec"), namespace)  # noqa: S102
        found = {n: namespace[n] for n in names}
        if "fused_moe_kernel" in found:
            args = set(found["fused_moe_kernel"].arg_names)
            unknown, missing = sorted(args - set(_KNOWN_ARGS)), sorted(set(_KNOWN_ARGS) - args)
            if unknown or missing:
                raise SGLangKernelUnavailable(
                    f"SGLang {sglang_version() or '?'}'s fused_moe_kernel takes parameters {unknown} this launcher does "
                    f"not know and lacks {missing[:5]}{'...' if len(missing) > 5 else ''}; it mirrors SGLang 0.5.23"
                )
        _LOADED[key] = found
        _logger.info("loaded SGLang's %s from %s", ", ".join(sorted(wanted)), src_path)
        return found


def align_block_size(
    topk_ids: torch.Tensor, block_m: int, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang's routing alignment, built in torch without a host sync: ``(sorted_token_ids, expert_ids,
    num_tokens_post_padded)``. The ``T*k`` (token, slot) pairs grouped by expert, each expert's run padded to a
    multiple of ``block_m`` with ``T*k``; the expert of each block (``-1`` past the last run). Buffer sizes are
    SGLang's, so the kernel's grid is the one SGLang launches."""
    numel, dev = topk_ids.numel(), topk_ids.device
    if numel < num_experts + 1:
        size = numel * block_m
    else:
        size = numel + (num_experts + 1) * (block_m - 1)
    size = (size + 3) // 4 * 4
    n_blocks = cdiv(size, block_m)
    sorted_ids = torch.full((size,), numel, dtype=torch.int32, device=dev)
    if dev.type == "meta":  # compile-only: shapes are all a compile needs
        return (
            sorted_ids,
            torch.empty(n_blocks, dtype=torch.int32, device=dev),
            torch.empty(1, dtype=torch.int32, device=dev),
        )
    flat = topk_ids.reshape(-1).to(torch.int64)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)
    rank = torch.arange(numel, device=dev) - (counts.cumsum(0) - counts)[flat[order]]
    sorted_ids.scatter_(0, (ends - padded)[flat[order]] + rank, order.to(torch.int32))
    starts = torch.arange(n_blocks, device=dev, dtype=torch.int64) * block_m
    expert = torch.searchsorted(ends, starts, right=True)
    expert_ids = torch.where(expert < num_experts, expert, -1).to(torch.int32)
    return sorted_ids, expert_ids, ends[-1:].to(torch.int32)


def _invoke(
    kernel,
    A,
    B,
    C,
    topk_weights,
    topk_ids,
    aligned,
    mul_routed_weight: bool,
    top_k: int,
    config: dict,
    router_topk: int = 1,
) -> None:
    """One launch as SGLang's ``invoke_fused_moe_kernel`` makes it for unquantized weights."""
    sorted_ids, expert_ids, ntp = aligned
    bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    K = B.shape[2]
    grid = (cdiv(sorted_ids.shape[0], bm) * cdiv(B.shape[1], bn),)
    extra = {}
    # SGLang's is_arch_support_pdl(); meta tensors (a compile-ahead helper) compile for this process's GPU
    on_gpu = A.is_cuda or (A.device.type == "meta" and torch.cuda.is_available())
    if on_gpu and torch.cuda.get_device_capability(A.device if A.is_cuda else None)[0] >= 9:
        extra = {"USE_GDC": True, "launch_pdl": True, "GDC_EARLY": A.shape[0] <= 512}
    kernel[grid](
        a_ptr=A,
        a_desc=None,
        b_ptr=B,
        b_desc=None,
        bias_ptr=None,
        c_ptr=C,
        a_scale_ptr=None,
        b_scale_ptr=None,
        topk_weights_ptr=topk_weights,
        sorted_token_ids_ptr=sorted_ids,
        expert_ids_ptr=expert_ids,
        num_tokens_post_padded_ptr=ntp,
        add_mask_ptr=None,
        N=B.shape[1],
        K=K,
        EM=sorted_ids.shape[0],
        num_valid_tokens=topk_ids.numel(),
        stride_am=A.stride(0),
        stride_ak=A.stride(1),
        stride_be=B.stride(0),
        stride_bk=B.stride(2),
        stride_bn=B.stride(1),
        stride_bias_e=0,
        stride_bias_n=0,
        stride_cm=C.stride(-2),
        stride_cn=C.stride(-1),
        stride_asm=0,
        stride_ask=0,
        stride_bse=0,
        stride_bsk=0,
        stride_bsn=0,
        group_n=0,
        group_k=0,
        MUL_ROUTED_WEIGHT=mul_routed_weight,
        top_k=top_k,
        compute_type=_COMPUTE_TYPES[A.dtype],
        use_fp8_w8a8=False,
        use_int8_w8a8=False,
        use_int8_w8a16=False,
        per_channel_quant=False,
        even_Ks=K % bk == 0,
        c_sorted=False,
        swap_ab=False,
        FUSE_ADD_TO_OUTPUT=False,
        A_OUTPUT_SLICES=1,
        A_OUTPUT_SLICE_WIDTH=0,
        A_OUTPUT_SLICE_K=0,
        MASK_OUTPUT=False,
        FUSE_SUM_ALL_REDUCE=False,
        ROUTER_TOPK=router_topk,
        FUSE_SWIGLU=False,
        BLOCK_SIZE_M=bm,
        BLOCK_SIZE_N=bn,
        BLOCK_SIZE_K=bk,
        GROUP_SIZE_M=config["GROUP_SIZE_M"],
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
        **extra,
    )


def fused_experts(
    x, w1, w2, topk_ids, topk_weights, config: dict, out: torch.Tensor | None = None, aligned: tuple | None = None
) -> torch.Tensor:
    """SGLang's decode MoE for unquantized weights: ``x [T, H]``, ``w1 [E, 2W, H]`` (gate rows first), ``w2 [E, H,
    W]``, ``topk_ids``/``topk_weights [T, k]``; returns ``[T, H]`` in x's dtype."""
    kernel = load_sglang_jit("fused_moe_kernel")["fused_moe_kernel"]
    if x.dtype not in _COMPUTE_TYPES:
        raise ValueError(
            f"SGLang's fused MoE runs bfloat16 or float16 here, not {x.dtype}; pass --set dtype=bfloat16"
            " (float16 on the CPU interpreter)"
        )
    T, H = x.shape
    E, two_w, _ = w1.shape
    k = topk_ids.shape[1]
    aligned = aligned or align_block_size(topk_ids, config["BLOCK_SIZE_M"], E)
    cache1 = torch.empty(T * k, two_w, device=x.device, dtype=x.dtype)
    _invoke(kernel, x, w1, cache1, topk_weights, topk_ids, aligned, False, k, config)
    gate, up = cache1[:, : two_w // 2], cache1[:, two_w // 2 :]
    cache2 = torch.nn.functional.silu(gate) * up
    cache3 = torch.empty(T, k, H, device=x.device, dtype=x.dtype)
    _invoke(kernel, cache2, w2, cache3, topk_weights, topk_ids, aligned, True, 1, config, router_topk=k)
    if out is None:
        return cache3.sum(1)
    return torch.sum(cache3, dim=1, out=out)


def _reference(x, w1, w2, ids, weights) -> torch.Tensor:
    """Float64 (CPU) / float32 (CUDA), one expert at a time."""
    dt = torch.float64 if x.device.type == "cpu" else torch.float32
    T, W = x.shape[0], w2.shape[2]
    xr, out = x.to(dt), torch.zeros(T, x.shape[1], device=x.device, dtype=dt)
    flat = ids.reshape(-1).long()
    tok = torch.arange(T, device=x.device).repeat_interleave(ids.shape[1])
    gw = weights.reshape(-1).to(dt)
    with tf32_matmul(False):
        for e in torch.unique(flat).tolist():
            sel = (flat == e).nonzero().squeeze(1)
            gu = xr[tok[sel]] @ w1[e].to(dt).T
            act = torch.nn.functional.silu(gu[:, :W]) * gu[:, W:]
            out.index_add_(0, tok[sel], (act @ w2[e].to(dt).T) * gw[sel, None])
    return out


class SGLangFusedMoEKernel(TunableKernel):
    """SGLang's ``fused_moe_kernel`` (see the module docstring)."""

    name = "sglang_fused_moe"
    batch_dim = "tokens"
    dtypes = ("bfloat16", "float16")
    instance: "SGLangFusedMoEKernel"

    def unavailable(self) -> str | None:
        """Why SGLang's kernel cannot be loaded here (preflight names it before any trial), or None."""
        try:
            load_sglang_jit("fused_moe_kernel")
        except (SGLangKernelUnavailable, SyntaxError, OSError) as exc:
            return str(exc)
        return None

    def default_config(self, shape):
        # SGLang's get_default_config for unquantized weights; no num_warps/num_stages there means Triton's 4 and 3
        if shape["tokens"] <= shape["experts"]:
            return {
                "BLOCK_SIZE_M": 16,
                "BLOCK_SIZE_N": 32,
                "BLOCK_SIZE_K": 64,
                "GROUP_SIZE_M": 1,
                "num_warps": 4,
                "num_stages": 3,
            }
        return {
            "BLOCK_SIZE_M": 64,
            "BLOCK_SIZE_N": 64,
            "BLOCK_SIZE_K": 32,
            "GROUP_SIZE_M": 8,
            "num_warps": 4,
            "num_stages": 3,
        }

    def config_space(self, shape):
        # SGLang's tuning script's space (block M to 128 for decode), plus the default's K tile and group 8
        return {
            "BLOCK_SIZE_M": [16, 32, 64, 128],
            "BLOCK_SIZE_N": [32, 64, 128, 256],
            "BLOCK_SIZE_K": [32, 64, 128, 256],
            "GROUP_SIZE_M": [1, 8, 16, 32, 64],
            "num_warps": [4, 8],
            "num_stages": [2, 3, 4, 5],
        }

    def check_config(self, config, shape, device=None, dtype=None):
        why = super().check_config(config, shape, device)
        if why:
            return why
        pairs = shape["tokens"] * shape["topk"]
        bm = config["BLOCK_SIZE_M"]
        if bm > max(64, triton.next_power_of_2(pairs)):  # 64: SGLang's own default block for more tokens than experts
            return f"block_m: BLOCK_SIZE_M={bm} > tokens*topk={pairs} rounded up to a power of two (all padding)"
        numel, E = pairs, shape["experts"]
        rows = numel * bm if numel < E + 1 else numel + (E + 1) * (bm - 1)
        m_blocks = cdiv((rows + 3) // 4 * 4, bm)
        groups = self.config_space(shape)["GROUP_SIZE_M"]
        g = config["GROUP_SIZE_M"]
        if g in groups and g != groups[0] and groups[groups.index(g) - 1] >= m_blocks:
            return (
                f"group_m_moot: GROUP_SIZE_M={g} acts as {groups[groups.index(g) - 1]} with {m_blocks} blocks of "
                "BLOCK_SIZE_M rows (the same launch)"
            )
        elt = 2 if dtype is None else dtype_of(dtype).itemsize
        smem = config["num_stages"] * (bm + config["BLOCK_SIZE_N"]) * config["BLOCK_SIZE_K"] * elt
        limit = device_limits(device)["shared_memory"]
        if smem > limit:
            return f"shared_memory: {smem // 1024} KiB > {limit // 1024} KiB"
        regs = bm * config["BLOCK_SIZE_N"] // (32 * config["num_warps"])
        if regs > 128:
            return f"register_pressure: BLOCK_SIZE_M*BLOCK_SIZE_N/threads = {regs} fp32 registers/thread > 128"
        return None

    def make_inputs(self, shape, dtype, device, seed=0):
        """Fresh tokens and routing per seed over expert weights shared by every seed's set, so timing rotates
        several routings (a config tuned on one routing can lose on the next)."""
        H, W, E = shape["hidden"], shape["width"], shape["experts"]
        inputs, w1, w2 = routed_inputs(self.name, shape, dtype_of(dtype), device, seed, (E, 2 * W, H), (E, H, W))
        return {**inputs, "w1": w1, "w2": w2}

    def rotation_bytes(self, shape, dtype="bfloat16"):
        return routed_rotation_bytes(shape, dtype_of(dtype))

    def output_like(self, inputs):
        return torch.empty_like(inputs["x"])

    def run(self, inputs, config=None, out=None):
        x = inputs["x"]
        shape = {
            "tokens": x.shape[0],
            "hidden": x.shape[1],
            "width": inputs["w2"].shape[2],
            "experts": inputs["w1"].shape[0],
            "topk": inputs["ids"].shape[1],
        }
        config = self.default_config(shape) if config is None else config
        self.require_config(config, shape, x.device, x.dtype)
        # the alignment is built once per input set and block size (SGLang runs its own CUDA kernel for it)
        cache = inputs.setdefault("aligned", {})
        bm = config["BLOCK_SIZE_M"]
        if bm not in cache or cache[bm][0] is not inputs["ids"]:
            cache[bm] = (inputs["ids"], align_block_size(inputs["ids"], bm, shape["experts"]))
        return fused_experts(
            x, inputs["w1"], inputs["w2"], inputs["ids"], inputs["weights"], config, out=out, aligned=cache[bm][1]
        )

    def reference(self, inputs):
        return _reference(inputs["x"], inputs["w1"], inputs["w2"], inputs["ids"], inputs["weights"])

    def torch_baseline(self, inputs):
        """Plain PyTorch at decode batch sizes: gather each pair's expert weights, then batched GEMMs."""
        x, w1, w2, ids, weights = (inputs[k] for k in ("x", "w1", "w2", "ids", "weights"))
        T, k, W = x.shape[0], ids.shape[1], w2.shape[2]
        e = ids.reshape(-1).long()
        gu = torch.bmm(x.repeat_interleave(k, dim=0).unsqueeze(1), w1.index_select(0, e).transpose(1, 2))
        act = torch.nn.functional.silu(gu[..., :W]) * gu[..., W:]
        ye = torch.bmm(act, w2.index_select(0, e).transpose(1, 2)).squeeze(1).float() * weights.reshape(-1, 1)
        return ye.view(T, k, -1).sum(1).to(x.dtype)

    def cost(self, shape, dtype="bfloat16"):
        """The same routed-expert problem as ``kernels/moe.py``: its bytes and FLOPs."""
        return MoEKernel.instance.cost(shape, dtype)

    def shapes(self, preset="v4flash"):
        return MoEKernel.instance.shapes(preset)

    def write_server_configs(
        self, results: list[tuple[dict, dict]], gpu: str, dtype: str, directory: str | Path
    ) -> list[Path]:
        """The tuned ``(shape, entry)`` pairs also as SGLang's own fused-MoE files under ``directory/sglang_moe``
        (``SGLANG_MOE_CONFIG_DIR``), one file per (experts, width), read back with SGLang's own loader."""
        if dtype_of(dtype) not in _COMPUTE_TYPES:
            return []
        groups: dict[tuple[int, int], dict[int, dict]] = {}
        for shape, entry in results:
            groups.setdefault((shape["experts"], shape["width"]), {})[shape["tokens"]] = entry["config"]
        root = Path(directory) / SGLANG_MOE_SUBDIR
        written = []
        for (E, N), configs in sorted(groups.items()):
            path = write_moe_config(root, E=E, N=N, device_name=gpu, configs=configs, merge=True)
            read = read_moe_config_with_sglang(root, E=E, N=N, device_name=gpu)
            want = {int(b): {k: int(c[k]) for k in MOE_KEYS} for b, c in configs.items()}
            if read is not None and any(read.get(b) != c for b, c in want.items()):
                # the tuned configs are in tuner's own file already; this one would mislead SGLang: say so, keep going
                _logger.error(
                    "SGLang's own loader reads %s for E=%d, N=%d on %s, not the %s written to %s; SGLang "
                    "will not use these configs",
                    read,
                    E,
                    N,
                    gpu,
                    want,
                    path,
                )
                continue
            written.append(path)
        return written


SGLANG_MOE_SUBDIR = "sglang_moe"
"""Folder under a kernel-config folder holding SGLang's MoE files (the value for ``SGLANG_MOE_CONFIG_DIR``)."""

SGLangFusedMoEKernel.instance = SGLangFusedMoEKernel()
