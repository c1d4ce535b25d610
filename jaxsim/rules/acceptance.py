"""Speculative-decoding acceptance rates in plain Python/NumPy (no JAX): lowering a mean accepted count to
per-position rates, checking and padding rate vectors. The compiled acceptance kernels (expected tokens
per round, sampled bursts) are in :mod:`jaxsim.kernels.acceptance`.
"""

from __future__ import annotations

import math

import numpy as np

from jaxsim.errors import InputError

__all__ = ["MAX_DRAFT_TOKENS", "normalize_rates", "pad_rates", "rates_from_accepted", "tail_probabilities"]

MAX_DRAFT_TOKENS = 5


def rates_from_accepted(accepted_tokens: float, num_draft_tokens: int) -> np.ndarray:
    """Lower a mean accepted-draft count a to rates [1]*floor(a) + [a - floor(a)] + zeros (length K)."""
    k = int(num_draft_tokens)
    a = float(accepted_tokens)
    if not (0.0 <= a <= k) or not math.isfinite(a):
        raise InputError(f"accepted_tokens={a} must be within [0, nextn={k}]")
    whole = int(math.floor(a))
    rates = [1.0] * whole + ([a - whole] if whole < k else [])
    rates += [0.0] * (k - len(rates))
    return np.asarray(rates[:k], dtype=np.float64)


def normalize_rates(rates, num_draft_tokens: int) -> np.ndarray:
    """Pad with zeros / drop extras to length K; each rate must be finite in [0, 1]."""
    r = [float(x) for x in rates][: int(num_draft_tokens)]
    for i, x in enumerate(r):
        if not (math.isfinite(x) and 0.0 <= x <= 1.0):
            raise InputError(f"accept_rates[{i}]={x} must be a finite probability in [0, 1]")
    r += [0.0] * (int(num_draft_tokens) - len(r))
    return np.asarray(r, dtype=np.float64)


def pad_rates(rates: np.ndarray) -> np.ndarray:
    """Pad a length-K rate vector to MAX_DRAFT_TOKENS with zeros (so every depth shares one shape)."""
    out = np.zeros(MAX_DRAFT_TOKENS)
    out[: len(rates)] = rates
    return out


def tail_probabilities(rates, num_draft_tokens, xp=np):
    """P(T ≥ t), t = 1..MAX_DRAFT_TOKENS + 1, of a round's tokens T = 1 + accepted drafts under chained
    conditional acceptance: 1, p_1, p_1·p_2, ... (rates beyond ``num_draft_tokens`` count as 0).

    ``rates`` [..., MAX_DRAFT_TOKENS] with ``num_draft_tokens`` broadcast over the leading axes; ``xp`` is
    the array namespace (numpy, or jax.numpy inside compiled code)."""
    k = xp.arange(MAX_DRAFT_TOKENS)
    surv = xp.cumprod(xp.where(k < xp.asarray(num_draft_tokens)[..., None], rates, 0.0), axis=-1)
    return xp.concatenate([xp.ones(surv.shape[:-1] + (1,)), surv], axis=-1)
