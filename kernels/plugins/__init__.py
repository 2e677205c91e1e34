"""Kernels that load a serving engine's own Triton source (SGLang's fused MoE), registered in
``kernels.registry`` like any other kernel, and that engine's config-file format (``sglang_moe_files``)."""
