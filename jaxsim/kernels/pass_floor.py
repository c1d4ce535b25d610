"""The shortest pass a table can price: a lower bound on the duration of any engine pass it supports.

Every supported lookup interpolates between measured points and never extrapolates: a decode lookup is a convex
combination (in batch, weight in [0, 1]) of measured batch curves, each linear in past KV between its own measured
points; a prefill lookup combines measured (tokens, KV) points of one measured batch along a token-first or KV-first
path, each step a convex combination. Every measured point lies on the table's grids, so the smallest supported
lookup at the grid vertices (the measured batches x the KV grid; the measured prefill batches x their token x KV
grids) is a lower bound on every supported lookup, and a pass, priced as the sum of its prefill and decode lookups,
lasts at least that long.

The replay's clock adds each lookup rounded to whole nanoseconds: :func:`shortest_pass_ms` is lowered by one
nanosecond so that it stays below a rounded pass. Used where only a bound is needed (how far an engine may run
before another can reach it: :mod:`jaxsim.replay.pd_closed_loop`), never as a timing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float64, Int64

from jaxsim._jax import jit_x64
from jaxsim.kernels import status as st
from jaxsim.kernels.rounds import RoundTable, decode_latency_ms, prefill_latency_ms

__all__ = ["shortest_pass_ms"]

_ROUNDING_MS = 1e-6  # a lookup is rounded to whole nanoseconds on the replay's clock


def _smallest_supported(latency_ms: Float64[Array, " Q"], code) -> Float64[Array, ""]:
    ok = (code < st.FIRST_UNSUPPORTED) & jnp.isfinite(latency_ms)
    return jnp.min(jnp.where(ok, latency_ms, jnp.inf))


def _vertices_ms(t: RoundTable, d_batch: Int64[Array, " D"], d_kv: Int64[Array, " D"], p_batch: Int64[Array, " P"],
                 p_tokens: Int64[Array, " P"], p_kv: Int64[Array, " P"]) -> Float64[Array, ""]:
    """The smallest supported lookup over the given decode and prefill vertices (inf: none supported)."""
    d_ms, d_code = jax.vmap(decode_latency_ms, in_axes=(None, 0, 0))(t, d_batch, d_kv)
    p_ms, p_code = jax.vmap(prefill_latency_ms, in_axes=(None, 0, 0, 0))(t, p_batch, p_tokens, p_kv)
    # no requests is no pass (batch 0 decodes are 'empty', 0 ms): only lookups with work count
    d_code = jnp.where(d_batch > 0, d_code, st.INVALID_QUERY)
    p_code = jnp.where((p_batch > 0) & (p_tokens > 0), p_code, st.INVALID_QUERY)
    return jnp.minimum(_smallest_supported(d_ms, d_code), _smallest_supported(p_ms, p_code))


_vertices_ms_jit = jit_x64(_vertices_ms)


def _decode_vertices(t: RoundTable) -> tuple[np.ndarray, np.ndarray]:
    batches = np.asarray(t.curve_batch)
    batches = batches[batches > 0]
    grid = np.asarray(t.kv_grid)[: int(t.n_kv)]
    b, k = np.meshgrid(batches, grid, indexing="ij")
    return b.reshape(-1).astype(np.int64), k.reshape(-1).astype(np.int64)


def _prefill_vertices(t: RoundTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    index = np.asarray(t.pre_batch_index)
    tok_grid, kv_grid = np.asarray(t.pre_tok_grid), np.asarray(t.pre_kv_grid)
    n_tok, n_kv = np.asarray(t.pre_n_tok), np.asarray(t.pre_n_kv)
    out_b, out_t, out_k = [], [], []
    for batch in np.flatnonzero(index >= 0):
        nb = int(index[batch])
        tt, kk = np.meshgrid(tok_grid[nb, : int(n_tok[nb])], kv_grid[nb, : int(n_kv[nb])], indexing="ij")
        out_b.append(np.full(tt.size, batch, np.int64))
        out_t.append(tt.reshape(-1))
        out_k.append(kk.reshape(-1))
    if not out_b:
        return (np.zeros(0, np.int64),) * 3
    return np.concatenate(out_b), np.concatenate(out_t).astype(np.int64), np.concatenate(out_k).astype(np.int64)


def _bucket(*columns: np.ndarray) -> tuple[np.ndarray, ...]:
    """Columns padded to a power of two with batch-0 rows (no work: not counted), so nearby tables share a compilation."""
    n = max(int(columns[0].size), 1)
    size = 1 << (n - 1).bit_length()
    return tuple(np.concatenate([c, np.zeros(size - c.size, np.int64)]) for c in columns)


def shortest_pass_ms(t: RoundTable) -> float:
    """A lower bound (ms, ≥ 0) on the duration of any pass ``t`` prices: its smallest supported lookup at the grid
    vertices, less the clock's rounding (0.0 when the table supports no lookup with work)."""
    d_batch, d_kv = _bucket(*_decode_vertices(t))
    p_batch, p_tokens, p_kv = _bucket(*_prefill_vertices(t))
    low = float(_vertices_ms_jit(t, d_batch, d_kv, p_batch, p_tokens, p_kv))
    return max(low - _ROUNDING_MS, 0.0) if np.isfinite(low) else 0.0
