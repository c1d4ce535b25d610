"""Speculative-decoding acceptance: chained conditional Bernoulli trials per round.

Per request per round: tokens = 1; for i = 1..K, with probability p_i the i-th draft is accepted and
tokens += 1, else the chain stops. The emitted burst is min(tokens, remaining output). Rates are lowered and
padded in plain Python by :mod:`jaxsim.acceptance`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float64, Int64

from jaxsim._jax import ensure_x64  # noqa: F401  (importing it turns x64 on; entry points call it)
from jaxsim.acceptance import MAX_DRAFT_TOKENS, tail_probabilities


def expected_tokens_per_round(
    rates: Float64[ArrayLike, " 5"], num_draft_tokens: Int64[ArrayLike, ""], remaining_tokens: Float64[ArrayLike, ""]
) -> Float64[Array, ""]:
    """Exact E[min(1 + accepted drafts, remaining)] for chained conditional acceptance.

    P(tokens ≥ j+1) = p_1···p_j for j ≤ K, so E[min(T, R)] = Σ_{j=0}^{min(K, R)-1} Π_{i≤j} p_i with the
    empty product 1. ``remaining_tokens`` ≥ 1.
    """
    terms = tail_probabilities(rates, num_draft_tokens, jnp)  # P(T ≥ j+1), j = 0..5
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
