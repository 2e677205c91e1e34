"""Kernels that load a serving engine's own Triton source instead of importing its runtime: SGLang's fused MoE
(``sglang_moe``, registered in ``kernels.registry`` like any other kernel, so its configs are tuned; its config-file
format in ``sglang_moe_files``) and SGLang's block-FP8 GEMM (``sglang_block_fp8``, launched as SGLang launches it, at
SGLang's own tuned configs: the decode twin's ``gemm_impl=sglang_triton``)."""
