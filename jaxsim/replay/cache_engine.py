"""The replay engine with automatic prefix caching: one vLLM-style worker whose KV pool is vLLM's block pool
(:mod:`jaxsim.replay.block_pool`), so requests that share a prompt prefix read its cached blocks.

The specification is ``oracle_replay(..., block_keys=...)`` in ``tests/replay_support.py`` (checked against
the reference's replay with ``kv_cache.prefix_caching: true``); the rules are in ``docs/prefix_caching.md``.
The scheduler is :mod:`jaxsim.replay.engine`'s (same state, same phases, same pricing), with three changes:

* Blocks have identities. A request admitted with nothing computed (fresh, or a recompute after preemption)
  reads its leading cached blocks (at most ``(length - 1) // block_size``), and computes from there; the
  hit tokens are the prefill lookup's cached past KV. Admission needs the whole known sequence's other
  blocks to fit beside the hit blocks nobody else holds.
* A block is cached as soon as a pass allocates it full of known tokens; released blocks stay cached until
  the pool hands them out again (blocks holding nothing cached first, then the least recently released).
* The decode lookup's total past KV is capped at the pool's tokens (a shared block counts once per reader).

The running list and the waiting queue are walked one request at a time (``lax.while_loop``), as in the
oracle: an admission's hits can be blocks an earlier request of the same pass just allocated. Autoregressive
replays only (speculative decoding with prefix caching is refused upstream: the reference prices it
differently, see ``docs/prefix_caching.md``), open or closed loop, linear caches, no materialized requests.
One replay per call: under ``jax.vmap`` (:func:`cached_replay_stack`, equal item by item) the in-place writes
become scatters that copy the pool, so :mod:`jaxsim.replay.cache_runner` runs each replay alone.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float64, Int64

from jaxsim._jax import ensure_x64, jit_x64
from jaxsim.kernels.buckets import pow2_bucket
from jaxsim.kernels.capacity import blocks_for
from jaxsim.replay import block_pool as bp
from jaxsim.replay import cache_stretch as cs
from jaxsim.replay import engine as eng
from jaxsim.replay.stretch import eligible as stretch_eligible

NONE, DECODE, PREFILL = 0, 1, 2  # what a slot does in a pass


class PromptKeys(eqx.Module):
    """Every trace request's prompt block keys (:func:`jaxsim.replay.prefix_cache.block_keys`), concatenated in
    trace order; request ``i``'s ``input_tokens // block_size`` keys start at ``offset[i]``."""

    keys: Int64[Array, " F"]
    offset: Int64[Array, " N"]


class CacheState(eqx.Module):
    """The loop state: the engine's (clock, lists, request rows, timeline), the block pool, each row's block
    table while it holds blocks, and its cache-hit tokens at its first admission and the most at any admission (the
    reference's ``first_admission_reused_input_tokens`` and ``reused_input_tokens``)."""

    engine: eng.EngineState
    pool: bp.BlockPool
    table: Int64[Array, " R"]
    first_hit_tokens: Int64[Array, " R"]  # -1: never admitted
    hit_tokens: Int64[Array, " R"]


class Schedule(eqx.Module):
    """What each slot of the running list does in the pass (:data:`DECODE`, :data:`PREFILL` or :data:`NONE`), its
    budget tokens and the tokens it had computed before."""

    kind: Int64[Array, " S"]
    tokens: Int64[Array, " S"]
    computed_before: Int64[Array, " S"]


class CachedReplay(eqx.Module):
    """The engine's per-request results plus, per request, the prompt tokens read from the cache at its first
    and the most at any of its admissions (0 for a request never admitted)."""

    result: eng.ReplayResult
    first_hit_tokens: Int64[Array, " N"]
    hit_tokens: Int64[Array, " N"]


class Shapes(NamedTuple):
    """Static capacities of a cached replay (host-side, from the trace and the configurations: :func:`shapes_for`)."""

    slots: int  # running-list slots (≥ max_num_seqs)
    table_blocks: int  # blocks of the longest request
    pool_blocks: int  # ≥ num_gpu_blocks
    num_keys: int  # ≥ distinct prompt keys


# ----------------------------------------------------------------------------------------------------
# one request: its row, its keys, its blocks


def _row(s: CacheState, r) -> eng.RequestState:
    """Row ``r`` (a one-row RequestState: read its fields with ``[0]``), each field computed once into its own buffer:
    XLA would otherwise re-read the request arrays inside every consumer, possibly after :func:`_put` wrote them in
    place, and so copy them (every request of every pass; see :mod:`jaxsim.replay.block_pool`)."""
    row = s.engine.requests.rows(jnp.reshape(jnp.clip(r, 0, s.engine.requests.num_rows - 1), (1,)))
    return jax.tree.map(eng._materialize, row)


def _set(row: eng.RequestState, **fields) -> eng.RequestState:
    """A one-row RequestState with fields replaced by scalars."""
    return row.replace(**{k: jnp.reshape(jnp.asarray(v), (1,)) for k, v in fields.items()})


def _put(s: CacheState, r, row: eng.RequestState) -> CacheState:
    """``row`` written at row ``r`` in place (nothing when ``r`` is past the last row)."""
    n = s.engine.requests.num_rows
    safe = jnp.clip(r, 0, n - 1)

    def one(a, v):
        old = jax.lax.dynamic_slice_in_dim(a, safe, 1)
        return jax.lax.dynamic_update_slice_in_dim(a, jnp.where(r < n, v.astype(a.dtype), old), safe, 0)

    return eqx.tree_at(lambda t: t.engine.requests, s, jax.tree.map(one, s.engine.requests, row))


def _key_at(p: eng.EngineParams, consts: eng.ReplayConstants, pk: PromptKeys, shapes: Shapes, r, prompt):
    """The key of row ``r``'s block at a position (scalar in, scalar out): its prompt's full blocks have the trace's
    shared keys (``pk``); blocks holding generated tokens have keys of their own, by row and position (only the
    request's own recompute reads them back)."""
    offset = pk.offset[consts.order[jnp.clip(r, 0, consts.order.shape[0] - 1)]]

    def key_at(j):
        shared = pk.keys[jnp.clip(offset + j, 0, pk.keys.shape[0] - 1)]
        return jnp.where(j < prompt // p.block_size, shared, shapes.num_keys + r * shapes.table_blocks + j)

    return key_at


def _keys(p: eng.EngineParams, consts: eng.ReplayConstants, pk: PromptKeys, shapes: Shapes, r, prompt) -> Int64[Array, " B"]:
    """The keys of row ``r``'s blocks ``[0, B)`` (:func:`_key_at` at every position)."""
    return jax.vmap(_key_at(p, consts, pk, shapes, r, prompt))(jnp.arange(shapes.table_blocks, dtype=jnp.int64))


def _grow(p, consts, pk, shapes, s: CacheState, r, row: eng.RequestState, target, enabled, *, chunked: bool = False
          ) -> tuple[CacheState, eng.RequestState]:
    """When ``enabled``: blocks for ``target`` tokens of row ``r``; its full blocks of known tokens are cached (only
    blocks from the last one it held can be newly full). ``chunked`` (static): the pool works in chunks of blocks
    (:func:`~jaxsim.replay.block_pool.take`: the sites that take a prompt chunk's blocks, the running-list walk and
    admission), else one block at a time (decode stretches, whose requests cross one block boundary: less code to
    compile)."""
    t = s.table[r]
    allocated = row.allocated_blocks[0]
    need = jnp.where(enabled, jnp.maximum(blocks_for(target, p.block_size) - allocated, 0), 0)
    start = jnp.maximum(allocated - 1, 0)
    full = jnp.where(enabled, jnp.minimum(target, row.length[0]) // p.block_size, start)
    take, register = (bp.take, bp.register) if chunked else (bp.take_each, bp.register_each)
    pool = take(s.pool, t, need)
    pool = register(pool, t, start, full, _key_at(p, consts, pk, shapes, r, row.prompt_tokens[0]))
    return eqx.tree_at(lambda x: x.pool, s, pool), _set(row, allocated_blocks=allocated + need)


def _preempt_tail(s: CacheState) -> CacheState:
    """The running list's last request preempted for recompute: its blocks released tail first, onto the
    preempted stack (it resumes first)."""
    e = s.engine
    v = e.running[e.num_running - 1]
    pool = bp.release_each(s.pool, s.table[v], jnp.ones((), bool))
    row = _row(s, v)
    row = _set(row, computed=0, allocated_blocks=0, preemptions=row.preemptions[0] + 1, materialized=False, recomputing=True)
    s = _put(eqx.tree_at(lambda x: x.pool, s, pool), v, row)
    pad = e.requests.num_rows - 1
    return eqx.tree_at(
        lambda x: (x.engine.running, x.engine.num_running, x.engine.preempted, x.engine.num_preempted), s,
        (bp.set_entry(e.running, e.num_running - 1, pad), e.num_running - 1, bp.set_entry(e.preempted, e.num_preempted, v), e.num_preempted + 1),
    )


# ----------------------------------------------------------------------------------------------------
# phase 1: the running list, in order


class _ListWalk(eqx.Module):
    s: CacheState
    sched: Schedule
    idx: Int64[Array, ""]
    budget: Int64[Array, ""]
    preempted: Int64[Array, ""]  # requests preempted in the pass
    lost: Bool[Array, ""]  # the head of the list preempted itself: it can never fit


class _WalkPlan(eqx.Module):
    """The running-list walk computed for every slot at once, valid when no request of the list has to be preempted
    (``fits``: the blocks the reached requests need are all free; then the walk takes blocks only, in list order)."""

    sched: Schedule
    target: Int64[Array, " S"]  # tokens each reached request's blocks must hold after the pass
    work: Bool[Array, " S"]  # reached requests whose blocks change (new blocks, or a block newly full to cache)
    reached: Int64[Array, ""]  # requests the walk reaches (a prefix of the list: those before the budget runs out)
    budget: Int64[Array, ""]  # budget tokens left after them
    fits: Bool[Array, ""]


def _walk_plan(p, s: CacheState) -> _WalkPlan:
    """The walk's schedule for every slot at once (the step of :func:`walk_running`): in list order each request gets
    what it wants of the budget left before it (none once it is spent: the walk stops there), and the blocks its tokens
    need; it ``fits`` when those blocks are all free (then no request is preempted and the step is exactly this)."""
    e = s.engine
    listed = jnp.arange(e.running.shape[0]) < e.num_running
    rows = e.requests.rows(jnp.where(listed, e.running, e.requests.num_rows - 1))
    length, computed = rows.length, rows.computed
    decode = (rows.generated > 0) & (computed == length - 1) & ~rows.recomputing
    want = jnp.where(listed, jnp.where(decode, jnp.minimum(1, p.max_model_len - length), length - computed), 0)
    budget = p.max_num_batched_tokens
    left = budget - (jnp.cumsum(want) - want)  # budget left when the walk reaches each slot
    reached = listed & (left > 0)
    tokens = jnp.where(reached, jnp.minimum(want, left), 0)
    target = computed + jnp.where(decode, 1, tokens)
    need = jnp.where(reached, jnp.maximum(blocks_for(target, p.block_size) - rows.allocated_blocks, 0), 0)
    full = jnp.minimum(target, length) // p.block_size
    work = reached & ((need > 0) | (full > jnp.maximum(rows.allocated_blocks - 1, 0)))
    sched = Schedule(kind=jnp.where(reached, jnp.where(decode, DECODE, PREFILL), NONE), tokens=tokens,
                     computed_before=jnp.where(reached, computed, 0))
    return _WalkPlan(sched=sched, target=target, work=work, reached=jnp.sum(reached).astype(jnp.int64),
                     budget=budget - jnp.sum(tokens), fits=jnp.sum(need) <= s.pool.free_blocks)


def _each_in_order(mask: Bool[Array, " S"], count, body, state):
    """``body(slot, state)`` for the first ``count`` slots where ``mask`` holds, in slot order (each found by one
    masked argmin: the passes touch a few slots, no prefix sum or sort of all of them)."""
    slot = jnp.arange(mask.shape[0], dtype=jnp.int64)

    def one(k, carry):
        last, state = carry
        i = jnp.argmin(jnp.where(mask & (slot > last), slot, mask.shape[0]))
        return i, body(i, state)

    return jax.lax.fori_loop(0, count, one, (jnp.asarray(-1, jnp.int64), state))[1]


def _grow_planned(p, consts, pk, shapes, s: CacheState, plan: _WalkPlan) -> CacheState:
    """When the plan fits: the blocks of the requests whose blocks change, in list order (the others' rows and blocks
    stay as they are), so a pass walks only the requests that cross a block boundary; all at once
    (:func:`~jaxsim.replay.block_pool.take_one_each`) when each takes at most one block and caches at most one block
    of its own generated tokens (a pass of decodes), else one at a time."""
    e = s.engine
    listed = jnp.arange(e.running.shape[0]) < e.num_running
    running = jnp.where(listed, e.running, e.requests.num_rows - 1)
    rows = e.requests.rows(running)
    before = rows.allocated_blocks
    need = jnp.where(plan.work, jnp.maximum(blocks_for(plan.target, p.block_size) - before, 0), 0)
    c = _crossings(p, shapes, plan.work, before, need, jnp.minimum(plan.target, rows.length), rows.prompt_tokens, running,
                   s.table[running])
    simple = c.simple

    def crossings(_, s: CacheState) -> CacheState:
        pool = bp.take_one_each(s.pool, c.tables, c.new_block)
        pool = bp.register_own_each(pool, c.tables, c.position, c.key, c.newly_full)
        requests = s.engine.requests
        grown = requests.rows(running).replace(allocated_blocks=before + need)
        requests = requests.write(jnp.where(plan.work, running, requests.num_rows), grown)
        return eqx.tree_at(lambda x: (x.pool, x.engine.requests), s, (pool, requests))

    s = jax.lax.fori_loop(0, jnp.where(plan.fits & simple & jnp.any(plan.work), 1, 0), crossings, s)

    def one(i, s: CacheState) -> CacheState:
        r = s.engine.running[i]
        s, grown = _grow(p, consts, pk, shapes, s, r, _row(s, r), plan.target[i], jnp.ones((), bool), chunked=True)
        return _put(s, r, grown)

    return _each_in_order(plan.work, jnp.where(plan.fits & ~simple, jnp.sum(plan.work), 0), one, s)


def walk_running(p, consts, pk, shapes, s: CacheState) -> _ListWalk:
    """Budget tokens and blocks for every running request, in list order; when the pool cannot supply a request's
    blocks, the tail of the list is preempted until it fits (the running-list loop of ``oracle_replay``). When no
    request needs preempting (the blocks they need are free) the walk is :func:`_walk_plan` plus the block changes of
    the few requests that cross a block boundary; otherwise request by request."""
    slots = shapes.slots
    plan = _walk_plan(p, s)
    s = _grow_planned(p, consts, pk, shapes, s, plan)
    zeros = jnp.zeros((slots,), jnp.int64)
    start = _ListWalk(s=s, sched=Schedule(kind=zeros, tokens=zeros, computed_before=zeros), idx=jnp.zeros((), jnp.int64),
                      budget=p.max_num_batched_tokens, preempted=jnp.zeros((), jnp.int64), lost=jnp.zeros((), bool))

    def going(w: _ListWalk):
        return (w.idx < w.s.engine.num_running) & (w.budget > 0) & ~w.lost & ~plan.fits

    def step(w: _ListWalk):
        r = w.s.engine.running[w.idx]
        row = _row(w.s, r)
        length, computed = row.length[0], row.computed[0]
        decode = (row.generated[0] > 0) & (computed == length - 1) & ~row.recomputing[0]
        tokens = jnp.where(decode, jnp.minimum(jnp.minimum(1, p.max_model_len - length), w.budget),
                           jnp.minimum(length - computed, w.budget))
        target = computed + jnp.where(decode, 1, tokens)
        need = jnp.maximum(blocks_for(target, p.block_size) - row.allocated_blocks[0], 0)

        def short(x):
            state, n = x
            return (need > state.pool.free_blocks) & (w.idx < state.engine.num_running)

        s, n = jax.lax.while_loop(short, lambda x: (_preempt_tail(x[0]), x[1] + 1), (w.s, jnp.zeros((), jnp.int64)))
        kept = w.idx < s.engine.num_running
        s, grown = _grow(p, consts, pk, shapes, s, r, row, target, kept, chunked=True)
        s = _put(s, jnp.where(kept, r, s.engine.requests.num_rows), grown)
        sched = Schedule(
            kind=bp.set_entry(w.sched.kind, w.idx, jnp.where(kept, jnp.where(decode, DECODE, PREFILL), NONE)),
            tokens=bp.set_entry(w.sched.tokens, w.idx, jnp.where(kept, tokens, 0)),
            computed_before=bp.set_entry(w.sched.computed_before, w.idx, computed),
        )
        return _ListWalk(s=s, sched=sched, idx=w.idx + kept, budget=w.budget - jnp.where(kept, tokens, 0),
                         preempted=w.preempted + n, lost=(~kept & (w.idx == 0)) | w.lost)

    # a request preempting itself ends the walk (the requests after it were preempted before it)
    w = jax.lax.while_loop(going, step, start)
    pick = lambda a, b: jnp.where(plan.fits, a, b)  # noqa: E731
    return _ListWalk(s=w.s, sched=jax.tree.map(pick, plan.sched, w.sched), idx=pick(plan.reached, w.idx),
                     budget=pick(plan.budget, w.budget), preempted=w.preempted, lost=w.lost)


# ----------------------------------------------------------------------------------------------------
# phase 2: admit waiting requests


class _Admit(eqx.Module):
    s: CacheState
    sched: Schedule
    budget: Int64[Array, ""]
    admitted: Int64[Array, ""]
    blocked: Bool[Array, ""]


def _candidate(consts, e: eng.EngineState, now_ms):
    """The waiting queue's head (the preempted stack's top, then the next sent request), and whether one waits."""
    from_stack = e.num_preempted > 0
    fresh = e.next_arrival
    arrived = (fresh < consts.num_accepted) & (e.sent_ms[jnp.clip(fresh, 0, e.sent_ms.shape[0] - 1)] <= now_ms)
    r = jnp.where(from_stack, e.preempted[jnp.clip(e.num_preempted - 1, 0, e.preempted.shape[0] - 1)], fresh)
    return r, from_stack, from_stack | arrived


def admit_waiting(p, consts, pk, shapes, w: _ListWalk, visible_ms) -> _Admit:
    """Without a preemption in the pass, waiting requests (those sent by ``visible_ms``:
    :func:`jaxsim.replay.engine._visible_ms`) are admitted FCFS while ``max_num_seqs``, the budget and
    the free blocks allow: each first reads its leading cached blocks, then the whole known sequence's other
    blocks must fit beside the hit blocks nobody else holds (the waiting-queue loop of ``oracle_replay``)."""
    start = _Admit(s=w.s, sched=w.sched, budget=w.budget, admitted=jnp.zeros((), jnp.int64), blocked=w.preempted > 0)

    def going(a: _Admit):
        e = a.s.engine
        _, _, waits = _candidate(consts, e, visible_ms)
        # with the budget spent an attempt admits nothing and changes nothing (its prompt chunk would be 0 tokens)
        return waits & (e.num_running < p.max_num_seqs) & ~a.blocked & (a.budget > 0)

    def step(a: _Admit):
        s, e = a.s, a.s.engine
        r, from_stack, _ = _candidate(consts, e, visible_ms)
        row = _row(s, r)
        length = row.length[0]
        keys = _keys(p, consts, pk, shapes, r, row.prompt_tokens[0])
        num_hits, hits = bp.leading_hits(s.pool, keys, (length - 1) // p.block_size)
        cached = num_hits * p.block_size
        tokens = jnp.minimum(length - cached, a.budget)
        idle_hits = jnp.sum(jnp.where(hits >= 0, s.pool.refs(hits) == 0, False))
        fits = (blocks_for(length, p.block_size) - num_hits <= s.pool.free_blocks - idle_hits) & (tokens > 0)

        slot = e.num_running
        pool, t = bp.open_table(s.pool, hits, num_hits, fits)
        nowhere = s.table.shape[0]
        at = jnp.where(fits, r, nowhere)
        s = eqx.tree_at(
            lambda x: (x.pool, x.table, x.first_hit_tokens, x.hit_tokens, x.engine.running, x.engine.num_running,
                       x.engine.peak_running, x.engine.num_preempted, x.engine.next_arrival), s,
            (pool, bp.set_entry(s.table, r, t, fits), bp.set_entry(s.first_hit_tokens, r, cached, fits & (row.admissions[0] == 0)),
             bp.set_entry(s.hit_tokens, r, jnp.maximum(s.hit_tokens[r], cached), fits), bp.set_entry(e.running, slot, r, fits),
             e.num_running + fits, jnp.maximum(e.peak_running, e.num_running + fits), e.num_preempted - (fits & from_stack),
             e.next_arrival + (fits & ~from_stack)),
        )
        admitted = _set(row, admissions=row.admissions[0] + 1, computed=cached, allocated_blocks=num_hits)
        s, grown = _grow(p, consts, pk, shapes, s, r, admitted, cached + tokens, fits, chunked=True)
        s = _put(s, at, grown)
        slot = e.num_running
        sched = Schedule(
            kind=bp.set_entry(a.sched.kind, slot, PREFILL, fits),
            tokens=bp.set_entry(a.sched.tokens, slot, tokens, fits),
            computed_before=bp.set_entry(a.sched.computed_before, slot, cached, fits),
        )
        return _Admit(s=s, sched=sched, budget=a.budget - jnp.where(fits, tokens, 0), admitted=a.admitted + fits, blocked=~fits)

    return jax.lax.while_loop(going, step, start)


# ----------------------------------------------------------------------------------------------------
# phases 3-4: price the pass, emit, complete


def _price(p: eng.EngineParams, s: CacheState, sched: Schedule, now_ms) -> tuple[eng.PassPrice, eng.RequestState, Bool[Array, " S"]]:
    """The pass's lookups (prefill: Σ new prompt tokens and Σ cached prompt tokens of the requests computing prompt
    tokens; decode: Σ past KV of the ready requests that emitted before, capped at the pool's tokens), the slots'
    rows with their prefill chunks computed, and which slots emit."""
    e = s.engine
    slot = jnp.arange(e.running.shape[0])
    listed = slot < e.num_running
    rows = e.requests.rows(jnp.where(listed, e.running, e.requests.num_rows - 1))
    prefill = listed & (sched.kind == PREFILL)
    c, n = sched.computed_before, sched.tokens
    new_prompt = jnp.where(prefill, jnp.minimum(c + n, rows.prompt_tokens) - jnp.minimum(c, rows.prompt_tokens), 0)
    computing = new_prompt > 0
    rows = rows.replace(computed=jnp.where(prefill, rows.computed + n, rows.computed))
    ready = listed & (sched.kind != NONE) & ((sched.kind == DECODE) | (rows.computed == rows.length))
    decoding = ready & (rows.generated > 0)
    pool_tokens = p.num_gpu_blocks * p.block_size
    cost = eng.price_lookups(
        p, now_ms, e.passes, jnp.sum(computing).astype(jnp.int64), jnp.sum(new_prompt),
        jnp.sum(jnp.where(computing, jnp.minimum(c, rows.prompt_tokens), 0)), jnp.sum(decoding).astype(jnp.int64),
        jnp.minimum(jnp.sum(jnp.where(decoding, rows.length - 1, 0)), pool_tokens),
    )
    return cost, rows, ready


def _emit(e: eng.EngineState, rows: eng.RequestState, ready, cost: eng.PassPrice) -> tuple[eng.RequestState, Bool[Array, " S"]]:
    """A fresh prefill emits its first token, a decode or a completed recompute one token, all at the pass end."""
    ready = ready & ~cost.unsupported
    zero = eng._runtime_zero(e.passes)
    end_ms = cost.end_ms
    seen = rows.emitted_any
    gap_ms = eng._opaque(jnp.where(ready & seen, end_ms - rows.last_token_ms, 0.0), zero)
    generated = rows.generated + ready
    done = ready & (generated >= rows.output_tokens)
    rows = rows.replace(
        generated=generated, computed=jnp.where(ready, rows.prompt_tokens + generated - 1, rows.computed),
        decode_rounds=rows.decode_rounds + (ready & (rows.generated > 0)), done=rows.done | done,
        recomputing=rows.recomputing & ~ready, first_token_ms=jnp.where(ready & ~seen, end_ms, rows.first_token_ms),
        second_token_ms=jnp.where(ready & seen & jnp.isnan(rows.second_token_ms), end_ms, rows.second_token_ms),
        last_token_ms=jnp.where(ready, end_ms, rows.last_token_ms),
        token_gap_sq_ms2=rows.token_gap_sq_ms2 + eng._opaque(gap_ms * gap_ms, zero),
        allocated_blocks=jnp.where(done, 0, rows.allocated_blocks),
    )
    return rows, done


def _complete(s: CacheState, done: Bool[Array, " S"]) -> CacheState:
    """Completed requests release their blocks (in list order) and leave the running list."""
    e = s.engine
    slots = e.running.shape[0]
    done = done & (jnp.arange(slots) < e.num_running)

    def one(i, pool):
        return bp.release(pool, s.table[e.running[i]], jnp.ones((), bool))

    pool = _each_in_order(done, jnp.sum(done), one, s.pool)
    keep = (jnp.arange(slots) < e.num_running) & ~done
    pos = jnp.where(keep, jnp.cumsum(keep) - 1, slots)
    running = jnp.full((slots,), e.requests.num_rows - 1, jnp.int64).at[pos].set(e.running, mode="drop")
    return eqx.tree_at(lambda x: (x.pool, x.engine.running, x.engine.num_running), s,
                       (pool, running, jnp.sum(keep).astype(jnp.int64)))


# ----------------------------------------------------------------------------------------------------
# one pass


def cache_pass(p: eng.EngineParams, consts: eng.ReplayConstants, pk: PromptKeys, shapes: Shapes, s: CacheState) -> CacheState:
    """One scheduler pass with prefix caching (the specification: ``oracle_replay(..., block_keys=...)``)."""
    e0 = s.engine
    now_ms = eng._clock(consts, e0)
    s = eqx.tree_at(lambda x: x.engine.now_ms, s, now_ms)
    walk = walk_running(p, consts, pk, shapes, s)
    visible_ms = eng._visible_ms(p, e0, now_ms)
    adm = admit_waiting(p, consts, pk, shapes, walk, visible_ms)
    s, sched = adm.s, adm.sched
    cost, rows, ready = _price(p, s, sched, now_ms)
    rows, done = _emit(s.engine, rows, ready, cost)
    e = s.engine
    listed = jnp.arange(shapes.slots) < e.num_running
    requests = e.requests.write(jnp.where(listed, e.running, e.requests.num_rows), rows)
    s = eqx.tree_at(lambda x: x.engine.requests, s, requests)
    completions = jnp.sum(done)
    emitted = jnp.any(ready & ~cost.unsupported)
    s = _complete(s, done & ~cost.unsupported)
    return _end_pass(p, consts, s, e0, now_ms, visible_ms, walk, adm, cost, completions, emitted)


def _end_pass(p, consts, s: CacheState, e0: eng.EngineState, now_ms, visible_ms, walk: _ListWalk, adm: _Admit, cost: eng.PassPrice,
              completions, emitted) -> CacheState:
    """The clock, status, counts, closed-loop send times and timeline after the pass."""
    e = s.engine
    num_done = e0.num_done + completions
    progress = (walk.preempted > 0) | (adm.admitted > 0) | jnp.any(adm.sched.kind != NONE) | emitted
    status = jnp.where(cost.unsupported, cost.status, jnp.where(walk.lost | ~progress, eng.STALLED, eng.RUNNING))
    status = jnp.where((status == eng.RUNNING) & (num_done >= consts.num_accepted), eng.COMPLETED, status).astype(jnp.int32)
    applied = jnp.ones((), bool)
    sent_ms = eng._release_slots(p, consts, e0, completions, cost.end_ms, applied)
    timeline = e.timeline
    if timeline.shape[0]:
        arrived = jnp.sum(e.sent_ms <= now_ms)
        fields = dict(
            start_ms=now_ms, end_ms=cost.end_ms, running=e.num_running, waiting=e.num_preempted + arrived - e.next_arrival,
            prefill_requests=cost.prefill_requests, prefill_tokens=cost.prefill_tokens, prefill_kv_tokens=cost.prefill_kv_tokens,
            decode_requests=cost.decode_requests, decode_kv_tokens=cost.decode_kv_tokens,
            kv_blocks_used=p.num_gpu_blocks - s.pool.free_blocks, preemptions=walk.preempted,
        )
        row = jnp.stack([jnp.asarray(fields[name]).astype(jnp.float64) for name in eng.TIMELINE_FIELDS])
        timeline = timeline.at[e.passes].set(row, mode="drop")
    return eqx.tree_at(
        lambda x: (x.engine.now_ms, x.engine.last_start_ms, x.engine.seen_ms, x.engine.passes, x.engine.steps, x.engine.status,
                   x.engine.num_done, x.engine.sent_ms,
                   x.engine.failed_query, x.engine.timeline), s,
        (jnp.where(cost.unsupported, now_ms, cost.end_ms), now_ms, visible_ms, e.passes + 1, e.steps + 1, status,
         num_done, sent_ms,
         jnp.where(cost.unsupported, cost.query, e.failed_query), timeline),
    )


# ----------------------------------------------------------------------------------------------------
# a whole replay


def _start(p: eng.EngineParams, rq: eng.Requests, shapes: Shapes, timeline_len: int) -> tuple[CacheState, eng.ReplayConstants]:
    e, consts = eng._start(p, rq, shapes.slots, timeline_len)
    rows = e.requests.num_rows
    pool = bp.empty_pool(p.num_gpu_blocks, shapes.pool_blocks, shapes.num_keys, shapes.slots, shapes.table_blocks)
    return CacheState(engine=e, pool=pool, table=jnp.zeros((rows,), jnp.int64), first_hit_tokens=jnp.full((rows,), -1, jnp.int64),
                      hit_tokens=jnp.zeros((rows,), jnp.int64)), consts


def _room(p: eng.EngineParams, consts: eng.ReplayConstants, s: CacheState) -> Bool[Array, ""]:
    """Whether the next pass surely fits the running list's slots: the running requests plus every request that could
    be admitted (the preempted ones and those sent by the pass start, at most max_num_seqs in all) fit. A replay
    without room stops before that pass with ``SLOTS_FULL`` (nothing of the pass applied), and goes on from there
    at twice the slots (:func:`widen`): the replay is the one run at the larger capacity from the start."""
    e = s.engine
    slots = e.running.shape[0]
    rows = e.next_arrival + jnp.arange(slots)
    sent = jax.lax.dynamic_slice_in_dim(e.sent_ms, e.next_arrival, slots)  # S trailing +inf pads: always inside
    arrived = jnp.sum((sent <= eng._clock(consts, e)) & (rows < consts.num_accepted))
    return e.num_running + jnp.minimum(e.num_preempted + arrived, p.max_num_seqs - e.num_running) <= slots


def decode_stretch(p, consts, pk, shapes, s: CacheState, lookahead: int, stop_ms=jnp.inf) -> CacheState:
    """Up to ``lookahead`` decode-only passes at once (:mod:`jaxsim.replay.cache_stretch`): priced together, then the
    pool work of the requests that crossed a block boundary, pass by pass and in list order (each pass's crossings at
    once, :func:`~jaxsim.replay.block_pool.take_one_each`, when every crossing is a new block and a block of generated
    tokens newly full; else one request at a time), then their rows."""
    if lookahead == 0:
        return s
    e = s.engine
    listed = jnp.arange(e.running.shape[0]) < e.num_running
    can = stretch_eligible(p, e, listed, e.requests.rows(jnp.where(listed, e.running, eng._padding_row(e))))
    # only the plan goes through the cond (a branch returning the state would copy it)
    planned = lambda: cs.plan(p, consts, s, lookahead, stop_ms)  # noqa: E731
    nothing = lambda: jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), jax.eval_shape(planned))  # noqa: E731
    x = jax.lax.cond(can, planned, nothing)
    slots = shapes.slots
    work = cs.pool_work(x, p.block_size)  # (pass, slot)
    before = x.allocated_blocks[:-1]
    crossing = _crossings(p, shapes, work, before, x.allocated_blocks[1:] - before, x.prompt_tokens + x.generated[:-1],
                          x.prompt_tokens, x.requests, s.table[x.requests])

    def each_pass(j, pool: bp.BlockPool) -> bp.BlockPool:
        pool = bp.take_one_each(pool, crossing.tables, crossing.new_block[j])
        return bp.register_own_each(pool, crossing.tables, crossing.position[j], crossing.key[j], crossing.newly_full[j])

    # every crossing a block or one block newly full of generated tokens: the passes with crossings, every slot at once
    busy = jnp.any(crossing.new_block | crossing.newly_full, axis=1)
    s = eqx.tree_at(lambda t: t.pool, s, _each_in_order(busy, jnp.where(crossing.simple, jnp.sum(busy), 0), each_pass, s.pool))

    def one(f, s: CacheState) -> CacheState:
        j, i = f // slots, f % slots
        r = x.requests[i]
        row = _set(_row(s, r), generated=x.generated[j, i])  # the row entering pass j (its blocks: as left so far)
        s, grown = _grow(p, consts, pk, shapes, s, r, row, x.prompt_tokens[i] + x.generated[j, i], jnp.ones((), bool))
        return _put(s, r, grown)

    # otherwise (pass, slot) in pass order, then list order, one at a time
    s = _each_in_order(work.reshape(-1), jnp.where(crossing.simple, 0, jnp.sum(work)), one, s)
    return eqx.tree_at(lambda t: t.engine, s, cs.commit_rows(s.engine, x))


class _Crossings(eqx.Module):
    """Pool work per slot (of one pass, or per pass ``J`` of a stretch), as :func:`_grow` would do it: a new block
    (``new_block``), the block at ``position`` newly full, cached under the request's own ``key`` (``newly_full``);
    ``simple`` when every crossing is at most one of each and every block cached holds generated tokens (no prompt key
    chain): then :func:`~jaxsim.replay.block_pool.take_one_each` and ``register_own_each`` do it for every slot at once."""

    tables: Int64[Array, " S"]
    new_block: Bool[Array, "*J S"]
    newly_full: Bool[Array, "*J S"]
    position: Int64[Array, "*J S"]
    key: Int64[Array, "*J S"]
    simple: Bool[Array, ""]


def _crossings(p, shapes: Shapes, work, before, need, length, prompt, requests, tables) -> _Crossings:
    """The crossings of the slots where ``work`` holds: ``before`` blocks held, ``need`` new ones, ``length`` known tokens
    after the pass (``prompt`` of them prompt tokens), rows ``requests``, block ``tables``."""
    start = jnp.maximum(before - 1, 0)
    end = jnp.minimum(length // p.block_size, before + need)
    newly_full = work & (end > start)
    own = start >= prompt // p.block_size  # generated tokens: the request's own key, no key chain
    simple = ~jnp.any(work & ((need > 1) | (end - start > 1) | (newly_full & ~own)))
    return _Crossings(tables=tables, new_block=work & (need == 1), newly_full=newly_full, position=start,
                      key=shapes.num_keys + requests * shapes.table_blocks + start, simple=simple)


def _passes(p, consts, pk, shapes, s: CacheState, going, lookahead: int = 0, stop_ms=jnp.inf) -> CacheState:
    """Loop steps (a decode stretch of up to ``lookahead`` passes, then one pass) while ``going(s)`` and the next pass
    has room in the running list; a replay stopped for want of room is ``SLOTS_FULL``. ``stop_ms``: the stretch leaves
    the pass after it starting before it (``going`` stops there)."""

    def step(s: CacheState) -> CacheState:
        return cache_pass(p, consts, pk, shapes, decode_stretch(p, consts, pk, shapes, s, lookahead, stop_ms))

    s = jax.lax.while_loop(lambda s: going(s) & _room(p, consts, s), step, s)
    full = going(s) & ~_room(p, consts, s)
    return eqx.tree_at(lambda x: x.engine.status, s, jnp.where(full, eng.SLOTS_FULL, s.engine.status).astype(s.engine.status.dtype))


def cached_replay(
    p: eng.EngineParams, rq: eng.Requests, pk: PromptKeys, shapes: Shapes, *, timeline_len: int = 0, lookahead: int = 0,
) -> CachedReplay:
    """Replay one trace on one worker configuration with prefix caching (pure; ``shapes``, ``timeline_len`` and
    ``lookahead`` (decode stretches; 0: pass by pass) static; ``shapes.slots`` at least the max_num_seqs bucket, or the
    replay may end ``SLOTS_FULL``)."""
    ensure_x64()
    s, consts = _start(p, rq, shapes, timeline_len)
    s = _passes(p, consts, pk, shapes, s, lambda s: eng._active(p, s.engine), lookahead)
    return cached_finish(rq, s, consts)


def cached_finish(rq: eng.Requests, s: CacheState, consts: eng.ReplayConstants) -> CachedReplay:
    """Per-request results in trace order, with each request's cache-hit tokens."""
    n = rq.arrival_ms.shape[0]
    inverse = jnp.zeros((n,), jnp.int64).at[consts.order].set(jnp.arange(n))
    first = s.first_hit_tokens[:n][inverse]
    return CachedReplay(result=eng._finish(rq, s.engine, consts), first_hit_tokens=jnp.maximum(first, 0),
                        hit_tokens=s.hit_tokens[:n][inverse])


cached_replay_jit = jit_x64(cached_replay, static_argnames=("shapes", "timeline_len", "lookahead"))


# ----------------------------------------------------------------------------------------------------
# one replay driven from the host one event at a time (a router in the loop, multi-turn sessions)


def cached_start(p: eng.EngineParams, rq: eng.Requests, *, shapes: Shapes, timeline_len: int = 0) -> tuple[CacheState, eng.ReplayConstants]:
    """The state of a replay of ``rq`` before its first pass (an engine in the loop: ``rq`` holds no valid request
    yet, its rows come one by one through :func:`insert_request`)."""
    ensure_x64()
    return _start(p, rq, shapes, timeline_len)


def advance_until(p: eng.EngineParams, consts: eng.ReplayConstants, pk: PromptKeys, s: CacheState, stop_ms: Float64[Array, ""],
                  stop_done: Int64[Array, ""], *, shapes: Shapes, lookahead: int = 0) -> CacheState:
    """Passes while the replay is active and its next pass would start before ``stop_ms`` (a pass starting at or
    after an arrival would see it), and until a pass takes its completed requests above ``stop_done``: the cached
    counterpart of :func:`~jaxsim.replay.engine.advance_until_stack`, for one replay (under ``vmap`` the pool's
    in-place writes become copies). ``lookahead`` (static): decode stretches, which end before ``stop_ms`` (a stretch
    never completes a request, so ``stop_done`` is only checked between loop steps, as pass by pass)."""
    ensure_x64()

    def going(s: CacheState):
        e = s.engine
        return eng._active(p, e) & (eng._clock(consts, e) < stop_ms) & (e.num_done <= stop_done)

    return _passes(p, consts, pk, shapes, s, going, lookahead, stop_ms)


def widen(s: CacheState, consts: eng.ReplayConstants, slots: int) -> tuple[CacheState, eng.ReplayConstants]:
    """Host-side (numpy): a replay's state at ``slots`` (more) running-list slots and block tables; a replay that
    stopped ``SLOTS_FULL`` runs again (:func:`~jaxsim.replay.engine.widen_stack`, one replay)."""
    e, consts = eng.widen_stack(jax.device_get(s.engine), jax.device_get(consts), slots)
    return eqx.tree_at(lambda x: (x.engine, x.pool), s, (e, bp.widen_tables(jax.device_get(s.pool), slots))), consts


def insert_request(s: CacheState, consts: eng.ReplayConstants, rq: eng.Requests, pk: PromptKeys, row: Int64[Array, ""],
                   sent_ms: Float64[Array, ""], prompt_tokens: Int64[Array, ""], output_tokens: Int64[Array, ""],
                   max_model_len: Int64[Array, ""], key_offset: Int64[Array, ""]) -> tuple[CacheState, eng.ReplayConstants, eng.Requests, PromptKeys]:
    """Request (``prompt_tokens``, ``output_tokens``) sent at ``sent_ms`` as engine row ``row`` (the next after the
    accepted ones, rows in send order), its prompt keys at ``key_offset`` of ``pk.keys``: the cached counterpart of
    :func:`~jaxsim.replay.engine.insert_request_stack`, for one replay. A replay that had completed runs again."""
    e = s.engine
    status = jnp.where(e.status == eng.COMPLETED, eng.RUNNING, e.status).astype(e.status.dtype)
    s = _put(s, row, eng.fresh_row(prompt_tokens, output_tokens, max_model_len))
    s = eqx.tree_at(lambda x: (x.engine.sent_ms, x.engine.status), s, (bp.set_entry(s.engine.sent_ms, row, sent_ms), status))
    consts = eqx.tree_at(
        lambda c: (c.arrival_sorted_ms, c.num_accepted, c.accepted), consts,
        (bp.set_entry(consts.arrival_sorted_ms, row, sent_ms), jnp.asarray(row + 1, consts.num_accepted.dtype),
         bp.set_entry(consts.accepted, row, True)),
    )
    rq = eqx.tree_at(
        lambda q: (q.arrival_ms, q.input_tokens, q.output_tokens, q.valid), rq,
        (bp.set_entry(rq.arrival_ms, row, sent_ms), bp.set_entry(rq.input_tokens, row, prompt_tokens),
         bp.set_entry(rq.output_tokens, row, output_tokens), bp.set_entry(rq.valid, row, True)),
    )
    return s, consts, rq, eqx.tree_at(lambda k: k.offset, pk, bp.set_entry(pk.offset, row, key_offset))


cached_start_jit = jit_x64(cached_start, static_argnames=("shapes", "timeline_len"))
# the loop state is donated: a call writes the pool in place instead of copying it (about 4 MB at 26k blocks) first
advance_until_jit = jit_x64(advance_until, static_argnames=("shapes", "lookahead"), donate_argnames=("s",))
# (shapes.slots must equal the state's running-list slots: :func:`widen` changes both)
insert_request_jit = jit_x64(insert_request, donate_argnames=("s", "consts", "rq", "pk"))
cached_finish_jit = jit_x64(cached_finish)


def cached_replay_stack(p: eng.EngineParams, rq: eng.Requests, pk: PromptKeys, shapes: Shapes, *, timeline_len: int = 0,
                        shared_table: bool = False) -> CachedReplay:
    """Cached replays of a stack of (configuration, trace, keys) items (leading axis of every argument; ``p.table``
    unmapped when ``shared_table``), equal item by item to :func:`cached_replay`."""
    ax = eng.param_axes(p, shared_table)
    return jax.vmap(lambda pp, r, k: cached_replay(pp, r, k, shapes, timeline_len=timeline_len), in_axes=(ax, 0, 0))(p, rq, pk)


cached_replay_stack_jit = jit_x64(cached_replay_stack, static_argnames=("shapes", "timeline_len", "shared_table"))


# ----------------------------------------------------------------------------------------------------
# host side: keys and shapes


def prompt_keys(keys: list[np.ndarray], num_keys: int, pad_to: int) -> tuple[PromptKeys, int]:
    """:class:`PromptKeys` of per-request key rows (:func:`jaxsim.replay.prefix_cache.block_keys`, trace order; padded
    to ``pad_to`` requests, as :meth:`Trace.requests <jaxsim.replay.traces.Trace.requests>`, and the keys to a power
    of two) and the static key capacity (a power of two ≥ ``num_keys``)."""
    lengths = np.array([len(k) for k in keys] + [0] * (int(pad_to) - len(keys)), np.int64)
    offset = (np.cumsum(lengths) - lengths).astype(np.int64)
    flat = np.concatenate([np.asarray(k, np.int64) for k in keys] + [np.zeros(1, np.int64)])
    flat = np.concatenate([flat, np.zeros(int(pow2_bucket(flat.size, 64)) - flat.size, np.int64)])
    return PromptKeys(keys=jax.device_put(flat), offset=jax.device_put(offset)), int(pow2_bucket(max(int(num_keys), 1), 64))


def shapes_for(input_tokens: np.ndarray, output_tokens: np.ndarray, *, max_num_seqs: int, block_size: int, num_gpu_blocks: int,
               max_model_len: int, num_keys: int) -> Shapes:
    """Static capacities that serve a trace on configurations up to these settings (host-side), in powers of two so
    that nearby traces and settings share one compilation (:func:`widest` combines several)."""
    prompt = np.asarray(input_tokens, np.int64)
    # a request holds at most max_model_len tokens (a prompt at or over it is rejected and holds nothing)
    longest = int(np.max(np.minimum(prompt + np.asarray(output_tokens, np.int64), max_model_len))) if prompt.size else 1
    table = int(pow2_bucket(int(blocks_for(max(longest, 1), block_size)), 16))
    pool = int(pow2_bucket(int(num_gpu_blocks), 64))
    return Shapes(slots=int(pow2_bucket(int(max_num_seqs), 8)), table_blocks=table, pool_blocks=pool, num_keys=int(num_keys))


def widest(*shapes: Shapes) -> Shapes:
    """Capacities that serve every one of ``shapes``."""
    return Shapes(*(max(values) for values in zip(*shapes)))
