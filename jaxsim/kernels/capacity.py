"""KV-cache capacity: rank-local pool bytes → tokens → blocks → concurrency.

Two layers, as everywhere in jaxsim:

* plain-Python checks before dispatch (:func:`capacity_problems`, in :mod:`jaxsim.rules.capacity`): the equality checks of the reference
  (requested memory fraction == recorded, scheduler envelope == recorded, no CUDA-graph reservation on a
  runtime pool, context within bounds, GPU budget holds the pool) are exact float/int comparisons;
* pure array functions, one per quantity, written for ONE pool and vmapped at the call site
  (:func:`pool_capacity`, :data:`pool_capacity_batch`); results carry a status code.

Runtime-memory linear pools (the only layout allowed for speculative rounds) use the recorded pool
verbatim: tokens = ⌊kv_cache_bytes / kv_bytes_per_token⌋, blocks = ⌊tokens / block_size⌋. Nothing is
subtracted for weights, draft models, draft KV or CUDA graphs, and the pool is never rescaled.
Integer math is int64 throughout.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float64, Int32, Int64

from jaxsim._jax import ensure_x64, jit_x64  # noqa: F401  (importing it turns x64 on; entry points check it)
from jaxsim.kernels.status import (  # capacity status codes (registered there, 32–47)
    BLOCK_SIZE_INVALID,
    DOES_NOT_FIT,
    FIRST_REFUSED,
    INVALID_REQUEST,
    NO_KV_BUDGET,
)
from jaxsim.kernels.status import CAPACITY_OK as OK
from jaxsim.profile.cache_pages import group_pages
from jaxsim.profile.model import Resources

MAX_GROUPS = 4


# ----------------------------------------------------------------------------------------------------
# pure quantities (one pool / one request)


def declared_kv_bytes(
    gpu_budget_bytes: Float64[ArrayLike, ""],
    non_kv_bytes: Int64[ArrayLike, ""],
    cuda_graph_reserved_bytes: Int64[ArrayLike, ""],
) -> Int64[Array, ""]:
    """Declared-memory pool: ⌊capacity × fraction − declared non-KV bytes − graph reservation⌋ (may be ≤ 0).

    ``gpu_budget_bytes`` = capacity × fraction must be rounded to float64 BEFORE the subtraction, as the
    reference does; compute it outside jit (:func:`gpu_budget_bytes`), because XLA may fuse a traced
    multiply-subtract into one FMA and change the floor by one byte.
    """
    return jnp.floor(gpu_budget_bytes - (non_kv_bytes + cuda_graph_reserved_bytes).astype(jnp.float64)).astype(jnp.int64)


def gpu_budget_bytes(gpu_memory_bytes, memory_fraction) -> np.ndarray | np.float64:
    """capacity × fraction in float64, rounded once (numpy, outside jit)."""
    return np.asarray(gpu_memory_bytes, np.float64) * np.asarray(memory_fraction, np.float64)


def tolerance_kv_bytes(kv_bytes: Int64[ArrayLike, ""], tolerance_fraction: Float64[ArrayLike, ""]) -> Int64[Array, ""]:
    """Pool after a safety tolerance t ∈ [0, 1): ⌊bytes · (1 − t)⌋."""
    return jnp.floor(jnp.asarray(kv_bytes, jnp.float64) * (1.0 - tolerance_fraction)).astype(jnp.int64)


def kv_tokens(kv_bytes: Int64[ArrayLike, ""], kv_bytes_per_token: Int64[ArrayLike, ""]) -> Int64[Array, ""]:
    """Whole tokens a linear pool holds: ⌊bytes / bytes_per_token⌋."""
    return jnp.floor_divide(kv_bytes, jnp.maximum(kv_bytes_per_token, 1))


def blocks_for(tokens: Int64[ArrayLike, "*#N"], block_size: Int64[ArrayLike, "*#N"]) -> Int64[ArrayLike, "*#N"]:
    """Blocks that hold ``tokens`` tokens: ⌈tokens / block_size⌉ (block_size ≥ 1). Plain integer array
    arithmetic: numpy in, numpy out; traced in, traced out."""
    return (tokens + block_size - 1) // block_size


def kv_blocks(tokens: Int64[ArrayLike, ""], block_size: Int64[ArrayLike, ""]) -> Int64[Array, ""]:
    """Whole scheduler blocks: ⌊tokens / block_size⌋ (−1 when block_size ≤ 0)."""
    return jnp.where(block_size > 0, jnp.floor_divide(tokens, jnp.maximum(block_size, 1)), -1)


def request_blocks(
    isl: Int64[ArrayLike, "*W"], osl: Int64[ArrayLike, "*W"], lookahead_tokens: Int64[ArrayLike, ""], block_size: Int64[ArrayLike, ""]
) -> Int64[Array, "*W"]:
    """Blocks one request (or each of the workload classes ``*W``) needs at its peak: ⌈(ISL + OSL + lookahead) / block_size⌉.

    ``lookahead_tokens`` is K+1 when speculating (the slots reserved before a round), else 0.
    """
    return blocks_for(isl + osl + lookahead_tokens, jnp.maximum(block_size, 1))


def grouped_request_bytes(
    block_tokens: Int64[ArrayLike, " G"],
    page_bytes: Int64[ArrayLike, " G"],
    window_tokens: Int64[ArrayLike, " G"],
    length_tokens: Int64[ArrayLike, ""],
    step_tokens: Int64[ArrayLike, ""],
) -> Int64[Array, ""]:
    """Bytes one request holds in a grouped cache at ``length_tokens`` (pages summed over groups).

    Pages per group: :func:`jaxsim.profile.cache_pages.group_pages` (full attention ⌈L/B⌉; a window W
    min(⌈L/B⌉, ⌈(W + T − 1)/B⌉ + 1) with T = ``step_tokens``, the scheduler token budget for the peak, 1 for
    steady occupancy). Padding groups have page_bytes 0. ``window_tokens`` 0 means full attention.
    """
    return jnp.sum(group_pages(length_tokens, block_tokens, window_tokens, step_tokens, xp=jnp) * page_bytes)


def kv_transfer_ms(isl: Int64[Array | np.ndarray, "*N"], kv_bytes_per_token, bytes_per_s) -> Float64[Array | np.ndarray, "*N"]:
    """Prefill → decode KV hand-off of a prompt of ``isl`` tokens (ms): each rank sends its rank-local
    share over its own link. Plain array arithmetic: numpy arrays in, numpy out (the replay's host-side
    arrival times); traced arrays in, traced out (the sweep model)."""
    return isl.astype("float64") * kv_bytes_per_token / bytes_per_s * 1e3


def max_concurrency(
    kv_blocks_: Int64[ArrayLike, ""], request_blocks_: Int64[ArrayLike, ""], max_batch_size: Int64[ArrayLike, ""]
) -> Int64[Array, ""]:
    """Requests that fit at once: min(max_batch_size, ⌊blocks / blocks per request⌋)."""
    return jnp.minimum(max_batch_size, jnp.floor_divide(kv_blocks_, jnp.maximum(request_blocks_, 1)))


class KvPool(eqx.Module):
    """One bound role's rank-local KV pool (arrays only: stack pools on a leading axis and vmap).

    ``kv_bytes`` is the pool after any tolerance; ``kv_bytes_per_token`` is 0 for grouped layouts, whose
    per-request cost comes from the padded ``group_*`` arrays (page_bytes 0 = padding).
    """

    kv_bytes: Int64[Array, ""]
    kv_bytes_per_token: Int64[Array, ""]
    block_size: Int64[Array, ""]
    max_batch_size: Int64[Array, ""]
    lookahead_tokens: Int64[Array, ""]
    grouped: Bool[Array, ""]
    group_block_tokens: Int64[Array, " G"]
    group_page_bytes: Int64[Array, " G"]
    group_window_tokens: Int64[Array, " G"]


class PoolCapacity(eqx.Module):
    """Capacity of one pool for one request shape. Blocks are −1 for grouped layouts (no block count)."""

    kv_tokens: Int64[Array, ""]
    kv_blocks: Int64[Array, ""]
    request_blocks: Int64[Array, ""]
    request_bytes: Int64[Array, ""]
    max_concurrency: Int64[Array, ""]
    status: Int32[Array, ""]


def pool_capacity(pool: KvPool, isl: Int64[ArrayLike, ""], osl: Int64[ArrayLike, ""]) -> PoolCapacity:
    """KV tokens, blocks, per-request blocks and max concurrency of one pool for requests of ISL + OSL."""
    isl = jnp.asarray(isl, jnp.int64)
    osl = jnp.asarray(osl, jnp.int64)
    tokens = jnp.where(pool.grouped, -1, kv_tokens(pool.kv_bytes, pool.kv_bytes_per_token))
    blocks = jnp.where(pool.grouped, -1, kv_blocks(tokens, pool.block_size))
    per_req = jnp.where(pool.grouped, -1, request_blocks(isl, osl, pool.lookahead_tokens, pool.block_size))
    lin_bytes = per_req * jnp.maximum(pool.block_size, 1) * pool.kv_bytes_per_token
    grp_bytes = grouped_request_bytes(pool.group_block_tokens, pool.group_page_bytes, pool.group_window_tokens, isl + osl, jnp.int64(1))
    req_bytes = jnp.where(pool.grouped, grp_bytes, lin_bytes)
    conc = jnp.where(
        pool.grouped,
        jnp.minimum(pool.max_batch_size, jnp.floor_divide(pool.kv_bytes, jnp.maximum(grp_bytes, 1))),
        max_concurrency(blocks, per_req, pool.max_batch_size),
    )
    status = jnp.where(conc >= 1, OK, DOES_NOT_FIT)
    status = jnp.where(pool.kv_bytes <= 0, NO_KV_BUDGET, status)
    status = jnp.where(~pool.grouped & (pool.block_size <= 0), BLOCK_SIZE_INVALID, status)
    status = jnp.where((isl < 0) | (osl < 0) | (isl + osl <= 0), INVALID_REQUEST, status)
    refused = status >= FIRST_REFUSED
    conc = jnp.where(refused, -1, jnp.maximum(conc, 0))
    return PoolCapacity(tokens, blocks, per_req, req_bytes, conc, status.astype(jnp.int32))


pool_capacity_batch = jit_x64(jax.vmap(pool_capacity, in_axes=(0, 0, 0)))
"""Many pools × request shapes at once (leading axis on every pool leaf and on isl/osl)."""

pool_capacity_jit = jit_x64(pool_capacity)


def _i64(x) -> jnp.ndarray:
    return jnp.asarray(x, jnp.int64)


def make_pool(res: Resources, kv_bytes: int, *, block_size: int, num_draft_tokens: int = 0) -> KvPool:
    """A :class:`KvPool` for ``kv_bytes`` usable bytes of this deployment's layout."""
    groups = res.cache_groups[:MAX_GROUPS]
    blk = np.zeros(MAX_GROUPS, np.int64)
    page = np.zeros(MAX_GROUPS, np.int64)
    win = np.zeros(MAX_GROUPS, np.int64)
    for i, g in enumerate(groups):
        blk[i], page[i], win[i] = g.block_size_tokens, g.page_size_bytes, g.sliding_window or 0
    return KvPool(
        kv_bytes=_i64(kv_bytes),
        kv_bytes_per_token=_i64(res.kv_bytes_per_token or 0),
        block_size=_i64(block_size),
        max_batch_size=_i64(res.max_batch_size),
        lookahead_tokens=_i64(num_draft_tokens + 1 if num_draft_tokens > 0 else 0),
        grouped=jnp.asarray(res.cache_layout == "grouped"),
        group_block_tokens=jnp.asarray(blk),
        group_page_bytes=jnp.asarray(page),
        group_window_tokens=jnp.asarray(win),
    )
