"""Pages one request holds in one cache group of a grouped (hybrid) KV layout: the reference's formula, plain
integer array arithmetic usable by the rules (numpy) and the capacity kernels (``jax.numpy``)."""

from __future__ import annotations

import numpy as np

__all__ = ["group_pages"]


def group_pages(length_tokens, block_tokens, window_tokens, step_tokens, xp=np):
    """Pages one request holds in one cache group at ``length_tokens`` (the reference's grouped formula).

    Full attention (``window_tokens`` 0): ⌈L/B⌉ pages; a window W: min(⌈L/B⌉, ⌈(W + T − 1)/B⌉ + 1) pages with
    T = ``step_tokens`` (the scheduler token budget for a request's peak, 1 for its steady occupancy). Plain
    integer array arithmetic on ``xp`` (numpy here; the capacity kernels pass ``jax.numpy``).
    """
    b = xp.maximum(block_tokens, 1)
    full = (length_tokens + b - 1) // b
    windowed = xp.minimum(full, (window_tokens + step_tokens - 1 + b - 1) // b + 1)
    return xp.where(window_tokens > 0, windowed, full)
