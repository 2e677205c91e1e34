"""Model dimensions of the decode workload. ``dsv4-flash`` follows DeepSeek-V4-Flash's published config;
``dsv4-flash-tiny`` keeps its structure (layer kinds, indexer, MoE, window) at sizes a CPU steps in milliseconds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    name: str
    layers: int
    hidden: int
    heads: int
    head_dim: int
    """The one shared K=V latent head (d_qk = d_v)."""
    rope_dim: int
    q_lora: int
    o_lora: int
    o_groups: int
    window: int
    csa_ratio: int
    hca_ratio: int
    indexer_heads: int
    indexer_dim: int
    index_topk: int
    experts_total: int
    experts_local: int
    """Experts on the one expert-parallel rank that is modelled (of an 8-GPU deployment)."""
    topk_experts: int
    expert_width: int
    max_context: int
    mhc_mult: int = 4
    mhc_out: int = 24
    capacity_factor: float = 2.0

    def layer_kind(self, i: int) -> str:
        """``window`` for layers 0-1, then ``csa`` (compress-4 + indexer) and ``hca`` (compress-128) alternate."""
        if i < 2:
            return "window"
        return "csa" if (i - 2) % 2 == 0 else "hca"

    def kinds(self) -> list[str]:
        return [self.layer_kind(i) for i in range(self.layers)]

    def indexer_width(self, context_length: int) -> int:
        """Rows the indexer scores when sized by the configured context (SGLang under CUDA graphs).

        ``context / csa_ratio + 64``: with a 1M context this is 262,208, the width seen in the seed's profile.
        """
        return context_length // self.csa_ratio + 64


PRESETS: dict[str, Preset] = {
    "dsv4-flash": Preset(
        name="dsv4-flash",
        layers=43,
        hidden=4096,
        heads=64,
        head_dim=512,
        rope_dim=64,
        q_lora=1024,
        o_lora=1024,
        o_groups=8,
        window=128,
        csa_ratio=4,
        hca_ratio=128,
        indexer_heads=64,
        indexer_dim=128,
        index_topk=512,
        experts_total=256,
        experts_local=32,
        topk_experts=6,
        expert_width=2048,
        max_context=1_048_576,
    ),
    "dsv4-flash-tiny": Preset(
        name="dsv4-flash-tiny",
        layers=8,
        hidden=256,
        heads=8,
        head_dim=64,
        rope_dim=16,
        q_lora=128,
        o_lora=128,
        o_groups=4,
        window=16,
        csa_ratio=4,
        hca_ratio=32,
        indexer_heads=8,
        indexer_dim=32,
        index_topk=64,
        experts_total=32,
        experts_local=8,
        topk_experts=2,
        expert_width=128,
        max_context=131_072,
    ),
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown workload preset {name!r}; use one of {sorted(PRESETS)}") from None
