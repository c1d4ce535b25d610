"""Speculative-decoding acceptance: chained conditional Bernoulli trials per round.

Per request per round: tokens = 1; for i = 1..K, with probability p_i the i-th draft is accepted and
tokens += 1, else the chain stops. The emitted burst is min(tokens, remaining output).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float64, Int64

MAX_DRAFT_TOKENS = 5


def rates_from_accepted(accepted_tokens: float, num_draft_tokens: int) -> np.ndarray:
    """Lower a mean accepted-draft count a to rates [1]*floor(a) + [a - floor(a)] + zeros (length K)."""
    k = int(num_draft_tokens)
    a = float(accepted_tokens)
    if not (0.0 <= a <= k) or not math.isfinite(a):
        raise ValueError(f"accepted_tokens={a} must be within [0, nextn={k}]")
    whole = int(math.floor(a))
    rates = [1.0] * whole + ([a - whole] if whole < k else [])
    rates += [0.0] * (k - len(rates))
    return np.asarray(rates[:k], dtype=np.float64)


def normalize_rates(rates, num_draft_tokens: int) -> np.ndarray:
    """Pad with zeros / drop extras to length K; each rate must be finite in [0, 1]."""
    r = [float(x) for x in rates][: int(num_draft_tokens)]
    for i, x in enumerate(r):
        if not (math.isfinite(x) and 0.0 <= x <= 1.0):
            raise ValueError(f"accept_rates[{i}]={x} must be a finite probability in [0, 1]")
    r += [0.0] * (int(num_draft_tokens) - len(r))
    return np.asarray(r, dtype=np.float64)


def pad_rates(rates: np.ndarray) -> np.ndarray:
    """Pad a length-K rate vector to MAX_DRAFT_TOKENS with zeros (so every depth shares one shape)."""
    out = np.zeros(MAX_DRAFT_TOKENS)
    out[: len(rates)] = rates
    return out


def expected_tokens_per_round(
    rates: Float64[Array, " 5"], num_draft_tokens: Int64[Array, ""], remaining_tokens: Float64[Array, ""]
) -> Float64[Array, ""]:
    """Exact E[min(1 + accepted drafts, remaining)] for chained conditional acceptance.

    P(tokens ≥ j+1) = p_1···p_j for j ≤ K, so E[min(T, R)] = Σ_{j=0}^{min(K, R)-1} Π_{i≤j} p_i with the
    empty product 1. ``remaining_tokens`` ≥ 1.
    """
    k = jnp.arange(MAX_DRAFT_TOKENS)
    active = k < num_draft_tokens
    surv = jnp.cumprod(jnp.where(active, rates, 0.0))  # P(T ≥ k+2)
    terms = jnp.concatenate([jnp.ones(1), surv])  # P(T ≥ j+1), j = 0..5
    j = jnp.arange(MAX_DRAFT_TOKENS + 1)
    return jnp.sum(jnp.where(j < jnp.minimum(num_draft_tokens + 1, remaining_tokens), terms, 0.0))


def sample_burst(
    key: jax.Array, rates: Float64[Array, " 5"], num_draft_tokens: Int64[Array, ""], remaining_tokens: Int64[Array, ""]
) -> Int64[Array, ""]:
    """Draw one round's burst: 1 + accepted drafts (chained), capped by the remaining output."""
    u = jax.random.uniform(key, (MAX_DRAFT_TOKENS,), dtype=jnp.float64)
    k = jnp.arange(MAX_DRAFT_TOKENS)
    accepted = (u < rates) & (k < num_draft_tokens)
    run = jnp.sum(jnp.cumprod(accepted.astype(jnp.int64)))
    return jnp.minimum(1 + run, remaining_tokens)
