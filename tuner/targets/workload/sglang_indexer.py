"""DeepSeek-V4's decode indexer as SGLang 0.5.23 runs it on Hopper: DeepGEMM's paged MQA logits over SGLang's paged
fp8 index-key cache, then the top-k of each request's live compressed rows.

What SGLang does (``srt/layers/attention/dsv4/indexer.py``, ``C4IndexerBackendMixin.forward_c4_indexer``; the
metadata in ``srt/layers/attention/dsv4/metadata.py``, ``PagedIndexerMetadata``):

* the index keys live in pages of 64 compressed rows (``compressed_page_size``: 256 tokens a page, one compressed
  row per 4), each page 64 rows of 128 e4m3 values, then the 64 rows' float32 scales (132 bytes a row; viewed as
  ``[pages, 64, 1, 132]`` uint8);
* ``deep_gemm.get_paged_mqa_logits_metadata(context_lens [rows, 1] int32, 64, num_sms)`` schedules the live
  compressed lengths over the SMs;
* ``deep_gemm.fp8_paged_mqa_logits(q [rows, 1, 64, 128] e4m3, cache, weights [rows, 64] float32, context_lens,
  page_table [rows, width] int32, schedule, max_compressed_seq_len, False)`` returns float32 logits
  ``[rows, page_table width x 64]``, written for the live columns only (``clean_logits`` False: the rest is left
  as allocated);
* ``topk_transform_paged_v2`` (a JIT CUDA kernel of the sglang package) picks the top 512 of each row's live
  columns and maps them through the page table; -1 pads a row with fewer live rows.

The top-k is a knob (``indexer_topk``): ``sglang`` runs SGLang's own JIT kernels from the installed sglang package
(``sglang.kernels.ops.attention.dsv4``: ``plan_topk_v2`` and ``topk_transform_paged_v2``, and SGLang's JIT schedule
``get_paged_mqa_logits_metadata``, which 0.5.23 uses in place of DeepGEMM's by default,
``SGLANG_OPT_USE_JIT_INDEXER_METADATA``), compiled by its JIT (apache-tvm-ffi and nvcc); ``torch`` is the stand-in
where those cannot build: ``torch.topk`` over the live columns, with DeepGEMM's own schedule. The page indices SGLang's
top-k writes are mapped back to the twin's pool rows by one add (the twin's attention reads pool rows, SGLang's
FlashMLA reads the page indices as they are): the one step here SGLang does not run.
"""

from __future__ import annotations

import math
from typing import Any

import torch

PAGE_TOKENS = 256
"""SGLang's page size for DeepSeek-V4 (forced: ``model_overrides/deepseek_v4.py``)."""
COMPRESSED_PAGE_ROWS = 64
"""Compressed-4 rows in a page of 256 tokens: DeepGEMM's ``block_kv``."""
INDEX_DIM = 128
ROW_BYTES = INDEX_DIM + 4


def page_table_width(context_length: int, csa_ratio: int = 4) -> int:
    """Pages a request's row of SGLang's index page table holds at a context cap: ``ceil(cap / 256)`` (each page
    64 compressed rows); its logits are ``width x 64`` columns wide (``max_compressed_seq_len``)."""
    return math.ceil(context_length / (COMPRESSED_PAGE_ROWS * csa_ratio))


def quantize_index_pages(keys: torch.Tensor) -> torch.Tensor:
    """Index keys ``[pages * 64, 128]`` (float) as SGLang's paged fp8 index cache: uint8 ``[pages, 64, 1, 132]``,
    each page's 64 rows of e4m3 values (scale ``max|row| / 448``), then their 64 float32 scales."""
    n, d = keys.shape
    if d != INDEX_DIM or n % COMPRESSED_PAGE_ROWS:
        raise ValueError(f"index keys must be [pages * 64, {INDEX_DIM}], got {list(keys.shape)}")
    pages = n // COMPRESSED_PAGE_ROWS
    x = keys.float()
    scale = x.abs().amax(-1).clamp(min=1e-4) / 448.0
    q = (x / scale[:, None]).to(torch.float8_e4m3fn)
    buf = torch.empty(pages, COMPRESSED_PAGE_ROWS * ROW_BYTES, dtype=torch.uint8, device=keys.device)
    buf[:, : COMPRESSED_PAGE_ROWS * INDEX_DIM] = q.view(torch.uint8).reshape(pages, -1)
    buf[:, COMPRESSED_PAGE_ROWS * INDEX_DIM :] = scale.reshape(pages, -1).contiguous().view(torch.uint8)
    return buf.view(pages, COMPRESSED_PAGE_ROWS, 1, ROW_BYTES)


def dequantize_index_pages(cache: torch.Tensor) -> torch.Tensor:
    """The float32 rows ``[pages * 64, 128]`` a paged index cache holds (the references check against these)."""
    pages = cache.shape[0]
    raw = cache.reshape(pages, -1)
    q = raw[:, : COMPRESSED_PAGE_ROWS * INDEX_DIM].contiguous().view(torch.float8_e4m3fn).float()
    scale = raw[:, COMPRESSED_PAGE_ROWS * INDEX_DIM :].contiguous().view(torch.float32)
    return (q.reshape(pages, COMPRESSED_PAGE_ROWS, INDEX_DIM) * scale[..., None]).reshape(-1, INDEX_DIM)


def paged_index_state(keys: torch.Tensor, batch: int, live_rows: int, width_pages: int) -> dict[str, torch.Tensor]:
    """SGLang's indexer inputs for ``batch`` requests of ``live_rows`` compressed rows each, whose keys are
    ``keys[1 + b * live_rows + j]`` (the twin's compressed pool; row 0 its padding row): the paged cache (page 0
    blank, request ``b``'s pages next), its page table ``[batch, width_pages]`` (unused entries 0, as SGLang's
    are), the live lengths ``[batch, 1]`` and each request's first pool row (to map a pick back to the pool)."""
    dev = keys.device
    live_pages = math.ceil(live_rows / COMPRESSED_PAGE_ROWS)
    if width_pages < live_pages:
        raise ValueError(f"a page table of {width_pages} pages cannot hold {live_rows} live compressed rows")
    rows = torch.zeros(1 + batch * live_pages, COMPRESSED_PAGE_ROWS, keys.shape[1], device=dev, dtype=torch.float32)
    per_request = keys[1 : 1 + batch * live_rows].float().reshape(batch, live_rows, -1)
    padded = torch.zeros(batch, live_pages * COMPRESSED_PAGE_ROWS, keys.shape[1], device=dev)
    padded[:, :live_rows] = per_request
    rows[1:] = padded.reshape(batch * live_pages, COMPRESSED_PAGE_ROWS, -1)
    table = torch.zeros(batch, width_pages, dtype=torch.int32, device=dev)
    table[:, :live_pages] = (
        1 + torch.arange(batch, device=dev)[:, None] * live_pages + torch.arange(live_pages, device=dev)[None, :]
    ).to(torch.int32)
    return {
        "idx_cache": quantize_index_pages(rows.reshape(-1, keys.shape[1])),
        "idx_table": table,
        "idx_lens": torch.full((batch, 1), live_rows, dtype=torch.int32, device=dev),
        "idx_base": (1 + torch.arange(batch, device=dev) * live_rows).to(torch.long),
    }


def quantize_query(qi: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``qi`` [B, 64, 128] as e4m3 with one scale per (token, head) folded into the head weights [B, 64] (relu is
    positively homogeneous, so ``relu(s q . k) w = relu(q . k) (s w)``): what DeepGEMM's fp8 logits take."""
    x = qi.float()
    s = x.abs().amax(-1).clamp(min=1e-4) / 448.0
    return (x / s[..., None]).to(torch.float8_e4m3fn), (weights.float() * s).contiguous()


TOPK_IMPLS = ("torch", "sglang")


class SGLangIndexer:
    """``indexer(qi [B, 64, 128], weights [B, 64], st) -> rows [B, topk]`` (pool rows of the picks, -1 padded), as
    SGLang 0.5.23 runs DeepSeek-V4's decode indexer on sm_90: DeepGEMM's paged logits, then the live top-k (SGLang's
    JIT kernel with ``topk_impl="sglang"``, ``torch.topk`` with ``"torch"``)."""

    def __init__(self, topk: int, topk_impl: str = "torch") -> None:
        import deep_gemm  # SGLang's sgl-deep-gemm, or DeepGEMM built from source (see benchmarks/deepgemm_build.sh)

        if topk_impl not in TOPK_IMPLS:
            raise ValueError(f"indexer top-k must be one of {', '.join(TOPK_IMPLS)}, but got {topk_impl!r}")
        self._dg = deep_gemm
        self.topk = topk
        self.topk_impl = topk_impl
        self.num_sms = deep_gemm.get_num_sms()
        self._jit = None
        if topk_impl == "sglang":
            from sglang.kernels.ops.attention import dsv4  # SGLang's JIT kernels: the sglang package, tvm_ffi, nvcc

            self._jit = dsv4

    def prepare(self, st: dict[str, Any]) -> None:
        """What SGLang computes once a forward for every layer (``PagedIndexerMetadata``): the split of the live
        lengths over the SMs, and with SGLang's top-k its plan and the map from its page indices to pool rows."""
        lens = st["idx_lens"]
        if self._jit is None:
            st["idx_schedule"] = self._dg.get_paged_mqa_logits_metadata(lens, COMPRESSED_PAGE_ROWS, self.num_sms)
            return
        flat = lens.view(-1)
        st["idx_schedule"] = self._jit.get_paged_mqa_logits_metadata(flat, COMPRESSED_PAGE_ROWS, self.num_sms)
        st["idx_topk_plan"] = self._jit.plan_topk_v2(flat)
        # request b's pages are consecutive from table[b, 0]: its slot table[b, 0] * 64 + i is its pool row base + i
        st["idx_slot_shift"] = (st["idx_base"] - st["idx_table"][:, 0].long() * COMPRESSED_PAGE_ROWS)[:, None]

    def logits(self, qi: torch.Tensor, weights: torch.Tensor, st: dict[str, Any]) -> torch.Tensor:
        q, w = quantize_query(qi, weights)
        table = st["idx_table"]
        return self._dg.fp8_paged_mqa_logits(
            q.unsqueeze(1).contiguous(),
            st["idx_cache"],
            w,
            st["idx_lens"],
            table,
            st["idx_schedule"],
            table.shape[1] * COMPRESSED_PAGE_ROWS,
            False,
        )

    def __call__(self, qi: torch.Tensor, weights: torch.Tensor, st: dict[str, Any]) -> torch.Tensor:
        logits = self.logits(qi, weights, st)
        if self._jit is not None:
            table = st["idx_table"]
            slots = torch.empty(table.shape[0], self.topk, dtype=torch.int32, device=logits.device)
            self._jit.topk_transform_paged_v2(
                logits, st["idx_lens"].view(-1), table, slots, COMPRESSED_PAGE_ROWS, st["idx_topk_plan"]
            )
            return torch.where(slots >= 0, slots + st["idx_slot_shift"], -1)
        live = int(st["idx_live"])
        k = min(self.topk, live)
        picks = logits[:, :live].topk(k, dim=-1).indices
        rows = st["idx_base"][:, None] + picks
        if k < self.topk:
            rows = torch.nn.functional.pad(rows, (0, self.topk - k), value=-1)
        return rows


def reference_logits(
    qi: torch.Tensor, weights: torch.Tensor, cache: torch.Tensor, table: torch.Tensor, live_rows: int
) -> torch.Tensor:
    """float64 logits [B, live_rows] of the fp8 inputs DeepGEMM reads: ``sum_h relu(q_h . k_j) w_h``."""
    q, w = quantize_query(qi, weights)
    keys = dequantize_index_pages(cache).double().reshape(cache.shape[0], COMPRESSED_PAGE_ROWS, -1)
    live_pages = math.ceil(live_rows / COMPRESSED_PAGE_ROWS)
    k = keys[table[:, :live_pages].long()].reshape(table.shape[0], -1, keys.shape[-1])[:, :live_rows]
    s = torch.einsum("bhd,bjd->bhj", q.double(), k)
    return (torch.relu(s) * w.double()[..., None]).sum(1)
