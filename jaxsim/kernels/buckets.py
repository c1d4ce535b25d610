"""Compile-shape buckets (plain Python, no JAX): sizes rounded up to a power of two, so inputs of
similar size share one compilation (tables, query chunks, traces, running lists, sweep chunks)."""

from __future__ import annotations

__all__ = ["pow2_bucket"]


def pow2_bucket(n: int, minimum: int = 1) -> int:
    """The smallest power of two ≥ max(``n``, ``minimum``, 1) (``minimum`` is itself a power of two)."""
    return 1 << (max(int(n), int(minimum), 1) - 1).bit_length()
