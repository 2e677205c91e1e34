#!/usr/bin/env bash
# SGLang launch command exported by tuner 0.1.0 on 2026-12-03 23:19 UTC
# from study 'dsv4-flash-workload' (workload target, space dsv4-flash), trial 143
#
# predicted by the twin: confirm with `tuner verify` or a `--target sglang` search
# two predictions by the twin (its decode step on random weights; x the baseline, SGLang's default path on sm_90 as the twin ran it, tok/s):
#   this command: c=1 1.00x (54.4), c=16 1.00x (477.8), c=64 1.00x (1743.5) (its configuration's runs: trials 13)
#   with these code changes: c=1 1.24x (67.3), c=16 1.13x (538.7), c=64 1.11x (1940.0) (the twin's best)
#   the best's output vs the precise reference's (relative norm error): 0.03; the baseline's own: 0.24
# parsimony: preferred trial 143 (7 change(s) from the defaults) over the best trial 142 (8 changes): 0.1% apart, within the measured noise 0.1%
#
# flags checked by the installed SGLang 0.5.23's own parser
# this command is the command stage's best (trial 13, only values the command can set), measured better than the twin's best with its code changes taken out; the fewest changes from the baseline among the commands within the measured noise (0.2%) of the best command measured
# what this command's configuration ran for each component sglang==0.5.23 runs on sm_90 (sources: files of that release):
#   sparse_attention: SGLang's own kernel, FlashMLA sparse decode on the fp8 V4 cache (flash_mla.flash_mla_with_kvcache, use_legacy, 584-byte rows) [srt/layers/attention/deepseek_v4_backend.py:1269]
#   kv_cache: SGLang's own kernel, --kv-cache-dtype auto resolves to fp8_e4m3 for DeepSeek-V4 (bf16 fails its assertion) [srt/arg_groups/overrides.py:892]
#   indexer_logits: SGLang's own kernel, DeepGEMM fp8_paged_mqa_logits over the paged fp8 index cache, scheduled on the live compressed lengths [srt/layers/attention/dsv4/indexer.py:880]
#   indexer_topk: SGLang's own kernel, SGLang's JIT CUDA topk_transform_paged_v2, planned on the live lengths (plan_topk_v2), after SGLang's JIT schedule of the logits (get_paged_mqa_logits_metadata, SGLANG_OPT_USE_JIT_INDEXER_METADATA on by default) [srt/layers/attention/dsv4/indexer.py:981]
#   routed_moe: a stand-in for FlashInfer cutlass_fused_moe, MXFP4 weights x bf16 activations (--moe-runner-backend auto -> flashinfer_mxfp4): the twin's fused Triton MoE on fp8 experts read in place (twice MXFP4's weight bytes); FlashInfer 0.7.2's CUTLASS MoE is compiled by its JIT at start and was not built on the GPU this twin was measured on, so the gap is not measured [srt/arg_groups/model_overrides/deepseek_v4.py:87]
#   fp8_linears: SGLang's own kernel, DeepGEMM fp8_gemm_nt with 128x128 weight and 1x128 activation scales (Triton w8a8_block_fp8_matmul for shapes it cannot serve; wo_a's grouped projection is DeepGEMM's fp8_einsum, which the twin runs as a torch bmm) [srt/layers/quantization/fp8_utils.py:720]
#   norm_rope_glue: SGLang's own kernel, SGLang's JIT CUDA fused_q_norm_rope and fused_k_norm_rope_flashmla (RMSNorm, RoPE and the fp8 cache write fused) [srt/models/deepseek_v4.py:1823]
#   mhc: a stand-in for SGLang's Triton hc_mix_stats_sinkhorn, hc_combine_norm and mhc_post_split_h: the twin's fp32 MHC-pre linear through torch; gap not measured [srt/models/deepseek_v4_mhc.py:402]
#   context_cap: SGLang's own kernel, --context-length defaults to the checkpoint's max_position_embeddings (1M for V4-Flash) [srt/arg_groups/fields/model.py:110]
# this command (twin knob=value -> SGLang):
#   context_length=1048576 -> --context-length 1048576
#   indexer_impl=deepgemm -> the server default (no flag)
#   attention_impl=flashmla_kv -> the server default (no flag)
#   kv_cache_dtype=fp8_e4m3 -> --kv-cache-dtype fp8_e4m3
#   moe_impl=triton -> the server default (no flag)
#   gemm_impl=deepgemm -> the server default (no flag)
#   cuda_graph_buckets=pow2:256 -> --cuda-graph-bs-decode 1 2 4 8 16 32 64 128 256
#   glue=sglang -> the server default (no flag)
#   indexer_topk=sglang: what SGLang's own code runs (the top-k of SGLang's Hopper indexer is SGLang's own JIT kernel (topk_transform_paged_v2, value sglang); torch.topk over the live columns is the twin's stand-in where SGLang's JIT cannot build)
#   gemm_proj=fp8: what SGLang's own code runs (SGLang takes the attention projections' dtype from the checkpoint's quantization (V4-Flash ships FP8 block-quantized linears); its flags pick the GEMM kernel, not the dtype)
#   gemm_indexer=fp8: what SGLang's own code runs (SGLang 0.5.23 fixes the DeepSeek-V4 indexer's dtype in code (an fp8 e4m3 index cache and fp8 logits); its one flag switches to an FP4 path the twin does not model)
#   gemm_moe=fp8: what SGLang's own code runs (the routed experts' dtype is the checkpoint's (FP4 experts in V4-Flash); flags pick the MoE kernel only)
#   gemm_mhc=fp32: what SGLang's own code runs (SGLang computes the MHC-pre mixing in fp32 in code (DeepGEMM/TileLang hc-prenorm kernels))
# with these code changes (the twin's best; this command cannot give them):
#   attention_impl=flashmla_sparse (the command runs attention_impl=flashmla_kv): code change: SGLang's own FlashMLA kernel, but DeepSeek-V4 calls it for sparse prefill only; --dsa-decode-backend flashmla_sparse sets the DSA (V3.2) backend, not V4's decode [source: sglang 0.5.23 srt/arg_groups/deepseek_v4_hook.py, srt/layers/attention/deepseek_v4_backend.py]
#   kv_cache_dtype=bf16 (the command runs kv_cache_dtype=fp8_e4m3): fails: SGLang asserts DeepSeek-V4's cache dtype is fp8_e4m3 or bfloat16 (bf16 fails it at start), and its Hopper decode, FlashMLA's sparse decode, reads an fp8 cache only (as flashmla_kv here) [source: sglang 0.5.23 srt/arg_groups/overrides.py (_deepseek_v4_kv_cache_dtype); sgl-flash-mla 1.0.0 flash_mla_interface.py (sparse decode asserts is_fp8_kvcache)]
#   gemm_proj=bf16 (the command runs gemm_proj=fp8): code change: SGLang takes the attention projections' dtype from the checkpoint's quantization (V4-Flash ships FP8 block-quantized linears); its flags pick the GEMM kernel, not the dtype [source: this space's `server: none`]
#   gemm_indexer=bf16 (the command runs gemm_indexer=fp8): code change: SGLang 0.5.23 fixes the DeepSeek-V4 indexer's dtype in code (an fp8 e4m3 index cache and fp8 logits); its one flag switches to an FP4 path the twin does not model [source: this space's `server: none`]
#   gemm_moe=bf16 (the command runs gemm_moe=fp8): code change: the routed experts' dtype is the checkpoint's (FP4 experts in V4-Flash); flags pick the MoE kernel only [source: this space's `server: none`]
#   gemm_mhc=bf16 (the command runs gemm_mhc=fp32): code change: SGLang computes the MHC-pre mixing in fp32 in code (DeepGEMM/TileLang hc-prenorm kernels) [source: this space's `server: none`]
#   glue=fused (the command runs glue=sglang): code change (on sm_90, sm_100, sm_120): the twin's fused glue kernels (kernels/sglang_q_norm_rope.py, kernels/glue.py), which SGLang cannot load without the plug-in; SGLang runs its own JIT glue on this GPU [source: sglang 0.5.23 srt/models/deepseek_v4.py:1823]
# SGLang plug-in: none; no kernel of this study was measured beside SGLang's own at the deployment's shapes (benchmarks/sglang_plugin_kernels.py --store measures and stores them)
#
# the twin's own re-measure: bash remeasure.sh (the best) and bash remeasure_command.sh (this command's configuration); tuner verify launch.sh runs both
# random weights as the twin: add --load-format dummy; MODEL=path-or-id PORT=n bash launch.sh [flags]
# tuner-recorded: {"by_level": {"1": 67.2887611323543, "16": 538.7469872554291, "64": 1940.039637864783}, "combine": "geomean", "direction": "maximize", "level": null, "levels": [1, 16, 64], "load": {"live_context": 512}, "metric": "tok_s", "objective": "geomean of tok_s at c=1,16,64", "remeasure": "remeasure.sh", "remeasure_command": "remeasure_command.sh", "runs": [131, 143], "study": "dsv4-flash-workload", "target": "workload", "unit": "tok/s", "value": 412.7742855073868}
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODEL="${MODEL:?set MODEL to the model path or Hugging Face id, e.g. deepseek-ai/DeepSeek-V4-Flash}"
PORT=${PORT:-30000}
exec python -m sglang.launch_server \
    --model-path "$MODEL" \
    --trust-remote-code \
    --tp-size 8 \
    --port "$PORT" \
    --context-length 1048576 \
    --kv-cache-dtype fp8_e4m3 \
    --cuda-graph-bs-decode 1 2 4 8 16 32 64 128 256 \
    "$@"
