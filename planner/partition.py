"""Pipeline stage partitioning (filled in below)."""
from __future__ import annotations


def even_split(blocks: int, stages: int) -> tuple[int, ...]:
    """Blocks per stage as even as possible, the extra blocks on the first stages (Megatron/torchtitan).

    >>> even_split(96, 10)
    (10, 10, 10, 10, 10, 10, 9, 9, 9, 9)
    """
    base, extra = divmod(blocks, stages)
    return tuple(base + (i < extra) for i in range(stages))
