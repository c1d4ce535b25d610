"""A deployment's KV pool on the host, assembled from the capacity rules and kernels: bytes, tokens and blocks of
an accepted capacity request (:func:`estimate_kv_cache`) and the pool as a block-allocating scheduler sees it
(:func:`block_view`, used by the sweep and the replay). Call :func:`jaxsim.rules.capacity.capacity_problems` first.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp

from jaxsim._jax import jit_x64
from jaxsim.kernels.capacity import (
    _i64,
    declared_kv_bytes,
    gpu_budget_bytes,
    grouped_request_bytes,
    kv_blocks,
    kv_tokens,
    make_pool,
    tolerance_kv_bytes,
)
from jaxsim.profile.cache_pages import group_pages
from jaxsim.profile.model import Resources
from jaxsim.rules.capacity import CapacityRequest, KvCacheEstimate, block_size_problem, non_kv_bytes

__all__ = ["BlockView", "block_view", "estimate_kv_cache"]


@jit_x64
def _estimate_numbers(kv_bytes, kvbpt, tol, block_size, has_tol):
    adj = jnp.where(has_tol, tolerance_kv_bytes(kv_bytes, tol), kv_bytes)
    tokens = kv_tokens(kv_bytes, kvbpt)
    adj_tokens = kv_tokens(adj, kvbpt)
    return tokens, adj, adj_tokens, kv_blocks(adj_tokens, block_size)


_declared_bytes = jit_x64(declared_kv_bytes)


def estimate_kv_cache(res: Resources, profile_context_length: int, req: CapacityRequest) -> KvCacheEstimate:
    """KV pool bytes/tokens/blocks of an accepted request (call :func:`capacity_problems` first).

    Linear layouts only give tokens and blocks; grouped layouts give bytes only.
    """
    rm = res.runtime_memory
    if rm is not None:
        kv_bytes = rm.kv_cache_bytes
        source = "runtime"
        default_ctx = min(profile_context_length, rm.max_model_len)
    else:
        budget = gpu_budget_bytes(req.total_gpu_bytes, req.memory_fraction_value)
        kv_bytes = int(_declared_bytes(budget, _i64(non_kv_bytes(res)), _i64(req.cuda_graph_reserved_bytes)))
        source = "declared"
        default_ctx = profile_context_length
    ctx = default_ctx if req.context_length is None else req.context_length
    has_tol = req.tolerance_fraction is not None
    blocks_problem = block_size_problem(req.block_size)
    if res.cache_layout == "linear":
        kvbpt = int(res.kv_bytes_per_token)
        tokens, adj, adj_tokens, blocks = (
            int(x) for x in _estimate_numbers(_i64(kv_bytes), _i64(kvbpt), jnp.float64(req.tolerance_fraction or 0.0),
                                              _i64(req.block_size if isinstance(req.block_size, int) else 0), jnp.asarray(has_tol))
        )
        peak = ctx * kvbpt
    else:
        kvbpt = tokens = adj_tokens = blocks = None
        adj = int(tolerance_kv_bytes(_i64(kv_bytes), jnp.float64(req.tolerance_fraction))) if has_tol else kv_bytes
        g = make_pool(res, kv_bytes, block_size=1)
        peak = int(grouped_request_bytes(g.group_block_tokens, g.group_page_bytes, g.group_window_tokens,
                                         _i64(ctx), _i64(res.max_num_tokens)))
        blocks_problem = "grouped-cache: grouped caches have no scalar token capacity or block count"
    return KvCacheEstimate(
        total_gpu_capacity_bytes=int(req.total_gpu_bytes),
        total_kv_size_bytes=int(kv_bytes),
        kv_size_per_token_bytes=kvbpt,
        total_kv_size_tokens=tokens,
        tolerance_fraction=req.tolerance_fraction,
        tolerance_kv_size_bytes=adj if has_tol else None,
        tolerance_kv_size_tokens=adj_tokens if has_tol else None,
        request_peak_cache_bytes=int(peak),
        num_gpu_blocks=None if blocks_problem else blocks,
        blocks_problem=blocks_problem,
        source=source,
        context_length=int(ctx),
    )


# ----------------------------------------------------------------------------------------------------
# a pool as a block-allocating scheduler sees it (sweep, replay)


@dataclass(frozen=True)
class BlockView:
    """A pool in the scheduler's blocks of ``block_size`` tokens, as the sweep and the replay allocate it.

    Linear caches: the pool's whole blocks (:func:`estimate_kv_cache`), no fixed part. Grouped caches (hybrid
    models): one block = ``block_size`` tokens of every full-attention group (the part that grows with the
    context); the sliding-window groups (at their full window) and the per-sequence state groups are a fixed
    ``state_blocks`` every request holds besides ⌈length / block_size⌉ blocks, rounded up to whole blocks.
    ``num_gpu_blocks`` is None (with ``problem``) when there is no block count.
    """

    num_gpu_blocks: int | None
    state_blocks: int
    problem: str | None = None


def block_view(res: Resources, kv: KvCacheEstimate, block_size: int) -> BlockView:
    """The :class:`BlockView` of an accepted request's pool (``kv`` from :func:`estimate_kv_cache`)."""
    if res.cache_layout == "linear":
        return BlockView(kv.num_gpu_blocks, 0, kv.blocks_problem)
    bp = block_size_problem(block_size)
    if bp:
        return BlockView(None, 0, bp)
    full = [g for g in res.cache_groups if g.kind == "attention" and g.sliding_window is None]
    if not full:
        return BlockView(None, 0, "grouped-cache: no full-attention group to count scheduler blocks in")
    # bytes per token of the full-attention groups, per scheduler block (exact when pages divide evenly)
    block_bytes = -(-sum(g.page_size_bytes * block_size for g in full) // min(g.block_size_tokens for g in full))
    fixed = [g for g in res.cache_groups if g not in full]
    ctx = kv.context_length
    fixed_bytes = sum(int(group_pages(ctx, g.block_size_tokens, g.sliding_window or 0, 1)) * g.page_size_bytes for g in fixed)
    return BlockView(int(kv.usable_kv_bytes) // block_bytes, -(-fixed_bytes // block_bytes))
