"""CUDA-graph batch-size bucket sets as one parameter: a density and a max batch size.

A bucket set is written ``"<density>:<max_bs>"`` (e.g. ``"pow2:64"``). Densities:

- ``pow2``: 1, 2, 4, ... up to max_bs;
- ``step8``: 1, 2, 4, then every multiple of 8 up to max_bs;
- ``server_default``: SGLang's default list (1, 2, 4, 8, 12, then steps of 8 to 256, then steps of 16), cut at
  max_bs.
- ``none``: no graphs at all (every batch runs eagerly).
"""

from __future__ import annotations

DENSITIES = ("pow2", "step8", "server_default", "none")


def expand_buckets(spec: str) -> list[int]:
    """Return the sorted batch sizes a bucket set captures; ``[]`` for ``none``."""
    density, max_bs = parse_bucket_spec(spec)
    if density == "none":
        return []
    if density == "pow2":
        sizes, b = [], 1
        while b < max_bs:
            sizes.append(b)
            b *= 2
        sizes.append(max_bs)
    elif density == "step8":
        sizes = [b for b in (1, 2, 4) if b < max_bs] + list(range(8, max_bs + 1, 8))
    else:  # server_default
        base = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 1025, 16))
        sizes = [b for b in base if b <= max_bs]
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sorted(set(sizes))


def parse_bucket_spec(spec: str) -> tuple[str, int]:
    """Split ``"pow2:64"`` into ``("pow2", 64)``; raise ``ValueError`` naming the fix when malformed."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"bucket set must look like 'pow2:64' (density:max_bs), but got {spec!r}.")
    density, _, raw = spec.partition(":")
    if density not in DENSITIES:
        raise ValueError(f"bucket density must be one of {DENSITIES}, but got {density!r} in {spec!r}.")
    try:
        max_bs = int(raw)
    except ValueError:
        raise ValueError(f"bucket max_bs must be an integer, but got {raw!r} in {spec!r}.") from None
    if max_bs < 1:
        raise ValueError(f"bucket max_bs must be >= 1, but got {max_bs} in {spec!r}.")
    return density, max_bs


def bucket_for(batch: int, buckets: list[int]) -> int | None:
    """The captured size a batch is padded to, or ``None`` when it runs eagerly (above the largest)."""
    for b in buckets:
        if b >= batch:
            return b
    return None


def level_batches(space, param: str = "cuda_graph_buckets") -> list[int]:
    """The decode batch sizes ``space``'s configurations produce: every concurrency level of its objective, and each
    level padded to every bucket size a choice of its bucket parameter ``param`` captures. The levels' own batches
    come first (what a kernel phase short of budget should tune first), then the paddings, each part ascending."""
    levels = set(space.objective.levels)
    batches = set(levels)
    if param in space.names:
        for spec in space.param(param).choices():
            sizes = expand_buckets(spec)
            batches |= {b for c in levels if (b := bucket_for(c, sizes))}
    return sorted(batches, key=lambda b: (b not in levels, b))
