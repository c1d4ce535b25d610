"""Decode stretches of the prefix-caching engine: up to ``lookahead`` decode-only passes in one loop step.

The ordinary engine's stretches (:mod:`jaxsim.replay.stretch`) with the cached engine's rules
(:mod:`jaxsim.replay.cache_engine`): every running request decodes one token per pass (autoregressive only), the
decode lookup's past KV is capped at the pool's tokens, and KV blocks come from the block pool. A stretch runs the
candidate passes up to the first one where a request would finish, a waiting request could be admitted (one is
waiting, or arrives, while a seat is free), the blocks the list needs are not all free (the pool only shrinks along
a stretch: nothing finishes), a lookup leaves measured support, or the pass limit is reached; that pass is left to
the ordinary pass. Its passes are priced together (one vectorised decode lookup per candidate pass, the clock
chained addition by addition as the reference does); then the pool work of the requests that crossed a block
boundary (a new block, or a block newly full to cache) is done in pass order and list order, exactly as the passes
would have done it one by one (the pool's choices never change a time). ``tests/test_replay_prefix_caching.py``
checks stretch == pass by pass (``lookahead=0``) field by field.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float64, Int64

from jaxsim.replay import engine as eng
from jaxsim.replay import stretch as plain


class CachedStretch(eqx.Module):
    """The candidate passes of a stretch (``J = lookahead`` rows) over the running slots (``S``)."""

    requests: Int64[Array, " S"]  # rows of the running slots (the padding row past the list)
    listed: Bool[Array, " S"]
    rows: eng.RequestState  # the running slots' rows at the stretch's start
    prompt_tokens: Int64[Array, " S"]
    generated: Int64[Array, "K S"]  # K = J + 1: generated tokens entering candidate pass j (row J: after the last)
    allocated_blocks: Int64[Array, "K S"]  # blocks held entering pass j (row J: after the last)
    decode_kv_tokens: Int64[Array, " J"]
    start_ms: Float64[Array, " J"]
    end_ms: Float64[Array, " J"]
    used_blocks: Int64[Array, " J"]  # pool blocks in use after candidate pass j's blocks are taken
    length: Int64[Array, ""]  # passes [0, length) of the stretch are run


def plan(p: eng.EngineParams, consts: eng.ReplayConstants, s, lookahead: int, stop_ms=jnp.inf) -> CachedStretch:
    """The candidate passes from ``s`` (a :class:`~jaxsim.replay.cache_engine.CacheState`) and how many of them run.
    With ``stop_ms`` (an engine in the loop stops before the first pass starting at or after it) a candidate runs only
    if the pass after it still starts before ``stop_ms``."""
    e = s.engine
    slot = jnp.arange(e.running.shape[0])
    listed = slot < e.num_running
    requests = jnp.where(listed, e.running, eng._padding_row(e))
    rows = e.requests.rows(requests)
    ok_start = plain.eligible(p, e, listed, rows)

    step = jnp.arange(lookahead + 1, dtype=jnp.int64)[:, None]
    generated = rows.generated + jnp.where(listed, step, 0)  # [J+1, S]: one token per decode pass
    length = rows.prompt_tokens + generated  # entering each candidate pass
    finishes = jnp.any(listed & (rows.output_tokens - generated[:-1] <= 1), axis=1)

    # a decode pass's target is its known length: blocks for it, from the pool's free blocks (nothing is released)
    held0 = jnp.where(listed, rows.allocated_blocks, 0)
    after = jnp.maximum(held0, jnp.where(listed, plain._blocks(length[:-1], p.block_size), 0))  # [J, S]
    taken = jnp.sum(after - held0, axis=1)
    short = taken > s.pool.free_blocks

    # admission: nobody may be waiting for a free seat at any pass of the stretch
    next_sent_ms = e.sent_ms[e.next_arrival]
    seats_full = e.num_running >= p.max_num_seqs

    decode_kv_tokens = jnp.minimum(jnp.sum(jnp.where(listed, length[:-1] - 1, 0), axis=1), p.num_gpu_blocks * p.block_size)
    start_ms, end_ms, unsupported = plain.price_candidates(p, e.passes, e.now_ms, e.num_running, decode_kv_tokens)

    arrives = ~seats_full & (next_sent_ms <= start_ms)
    # the ordinary pass after the stretch must still be a pass: within the pass limit, and with room in the running
    # list for all it could admit at its start (cache_engine._room, at the end of each candidate pass)
    within = e.passes + jnp.arange(lookahead) + 1 < p.max_passes
    window = jax.lax.dynamic_slice_in_dim(e.sent_ms, e.next_arrival, slot.shape[0])
    real = e.next_arrival + slot < consts.num_accepted
    arrived = jnp.sum(real & (window[None, :] <= end_ms[:, None]), axis=1)
    room = e.num_running + jnp.minimum(e.num_preempted + arrived, p.max_num_seqs - e.num_running) <= slot.shape[0]
    ok = ok_start & within & room & (end_ms < stop_ms) & ~finishes & ~short & ~arrives & ~unsupported
    n = jnp.sum(jnp.cumprod(ok.astype(jnp.int64)))
    return CachedStretch(
        requests=requests, listed=listed, rows=rows, prompt_tokens=rows.prompt_tokens, generated=generated,
        allocated_blocks=jnp.concatenate([held0[None], after]),
        decode_kv_tokens=decode_kv_tokens, start_ms=start_ms, end_ms=end_ms,
        used_blocks=p.num_gpu_blocks - s.pool.free_blocks + taken, length=n,
    )


def pool_work(x: CachedStretch, block_size) -> Bool[Array, "J S"]:
    """Which (pass, slot) of the passes run changes the pool: a new block, or a block newly full of known tokens (to
    cache), as :func:`~jaxsim.replay.cache_engine._grow` decides at that pass (its target is the known length)."""
    before, after = x.allocated_blocks[:-1], x.allocated_blocks[1:]
    full = (x.prompt_tokens + x.generated[:-1]) // block_size
    ran = jnp.arange(before.shape[0])[:, None] < x.length
    return ran & x.listed & ((after > before) | (full > jnp.maximum(before - 1, 0)))


def commit_rows(s: eng.EngineState, x: CachedStretch) -> eng.EngineState:
    """The engine state after the stretch's passes [0, n): each running request's row (its blocks as the pool work
    left them), the clock, the pass count and the timeline rows (``kv_blocks_used``: the pool's blocks in use)."""
    n = x.length
    advanced = plain.advanced_rows(x.rows, x.listed, x.generated[n], x.allocated_blocks[n], x.end_ms, n, eng._runtime_zero(s.passes))
    timeline = plain.stretch_timeline(s, x.start_ms, x.end_ms, n, x.decode_kv_tokens, x.used_blocks)
    return plain.write_stretch(s, x.requests, x.listed, advanced, x.start_ms, x.end_ms, n, timeline)
