#!/usr/bin/env bash
# the twin's re-measure of the exported command's configuration (study 'dsv4-flash-workload')
# params: context_length=1048576, indexer_impl=deepgemm, indexer_topk=sglang, attention_impl=flashmla_kv, kv_cache_dtype=fp8_e4m3, gemm_proj=fp8, gemm_indexer=fp8, gemm_moe=fp8, moe_impl=triton, gemm_mhc=fp32, gemm_impl=deepgemm, cuda_graph_buckets=pow2:256, glue=sglang
# tuner-recorded: {"by_level": {"1": 54.39597890076625, "16": 477.77667917103895, "64": 1743.4784592200992}, "combine": "geomean", "direction": "maximize", "level": null, "levels": [1, 16, 64], "load": {"live_context": 512}, "metric": "tok_s", "objective": "geomean of tok_s at c=1,16,64", "runs": [13], "study": "dsv4-flash-workload", "target": "workload", "unit": "tok/s", "value": 356.50813427813495}
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec /opt/torch/.venv/bin/python3 \
    -m \
    tuner.targets.workload.run \
    --preset \
    dsv4-flash \
    --levels \
    1,16,64 \
    --live-context \
    512 \
    --repeats \
    6 \
    --knob \
    context_length=1048576 \
    --knob \
    indexer_impl=deepgemm \
    --knob \
    indexer_topk=sglang \
    --knob \
    attention_impl=flashmla_kv \
    --knob \
    kv_cache_dtype=fp8_e4m3 \
    --knob \
    gemm_proj=fp8 \
    --knob \
    gemm_indexer=fp8 \
    --knob \
    gemm_moe=fp8 \
    --knob \
    moe_impl=triton \
    --knob \
    gemm_mhc=fp32 \
    --knob \
    gemm_impl=deepgemm \
    --knob \
    cuda_graph_buckets=pow2:256 \
    --knob \
    glue=sglang \
    "$@"
