"""A routed pool replayed with its router in the loop.

Every replica's engine runs up to the next arrival (each replica stops before the first pass that would
start at or after it: :func:`~jaxsim.replay.engine.advance_until_stack`), the router reads the replicas'
first-token and completion times and decides (:func:`~jaxsim.replay.routing.choose`), the request is added
to the chosen replica's rows (the next row after its accepted ones, in arrival order, as the engine's start
lays them out), and the engines go on. The passes are the ones an uninterrupted replay of each replica's
requests runs (a pass never depends on requests that arrive after it starts), decided with no knowledge
of the future. Pass by pass (no decode stretch: a stretch would look past the next arrival). A request
no replica can ever run (too long, or larger than the pool) is rejected by the replica it was sent to
without entering its engine, as the engine's start would.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from jaxsim._jax import ensure_x64, jit_x64
from jaxsim.kernels.capacity import blocks_for
from jaxsim.replay.engine import (
    _OUTPUT,
    _PROMPT,
    COMPLETED,
    REJECTED,
    RUNNING,
    ReplayResult,
    Requests,
    advance_until_stack,
    finish_stack,
    is_stochastic,
    slot_bucket,
    start_stack,
)
from jaxsim.replay.routing import ReplicaView, RoutingSummary, choose
from jaxsim.replay.traces import request_bucket
from jaxsim.router import Router

__all__ = ["run_routed"]

_advance_until = jit_x64(advance_until_stack, static_argnames=("stochastic", "shared_table"))
_start = jit_x64(start_stack, static_argnames=("slots", "timeline_len", "shared_table"))
_finish = jit_x64(finish_stack)


def _stacked(x, r: int):
    return jax.tree.map(lambda a: np.stack([np.asarray(a)] * r), x)


def _host(tree):
    return jax.tree.map(lambda a: np.array(a), jax.device_get(tree))


def run_routed(stage, router: Router, keys: list[np.ndarray] | None, timeline_len: int, timings: dict | None = None):
    """Replay ``stage`` (a :class:`~jaxsim.replay.orchestrate.Stage` of an open loop) with ``router`` in the loop:
    (the stage with each request's replica as its assignment, one :class:`ReplayResult` per replica over its
    requests in arrival order, a :class:`RoutingSummary`). ``keys``: each prompt's full-block keys (None: none)."""
    ensure_x64()
    pool, n, reps = stage.pool, int(stage.arrival_ms.size), int(stage.pool.replicas)
    size = request_bucket(max(n, 1))
    one = stage.pool.params(stage.nextn, stage.accept_rates, stage.max_passes, 0)
    params = jax.device_put(eqx.tree_at(lambda q: q.table, _stacked(one, reps), one.table))  # one table for all replicas, on the device once
    key = jax.random.fold_in(jax.random.PRNGKey(int(stage.seed)), stage.stream)
    prng = np.stack([np.asarray(jax.random.fold_in(key, r)) for r in range(reps)])
    stochastic = is_stochastic(np.asarray(stage.accept_rates)[: stage.nextn])
    empty = Requests(arrival_ms=jnp.full(size, jnp.inf), input_tokens=jnp.ones(size, jnp.int64), output_tokens=jnp.ones(size, jnp.int64),
                     valid=jnp.zeros(size, bool), materialized=jnp.zeros(size, bool))
    rq = _stacked(empty, reps)
    s, consts = _host(_start(params, rq, slots=slot_bucket(pool.max_num_seqs), timeline_len=int(timeline_len), shared_table=True))
    run = partial(_advance_until, stochastic=bool(stochastic), shared_table=True)
    blocks = blocks_for(np.asarray(stage.input_tokens, np.int64), pool.block_size)
    fits = (np.asarray(stage.input_tokens) < pool.max_model_len) & (blocks + pool.state_blocks <= pool.num_gpu_blocks)
    no_keys = np.zeros(0, np.int64)
    views = [ReplicaView() for _ in range(reps)]
    rows = np.zeros(reps, np.int64)  # engine rows filled per replica
    replica = np.zeros(n, np.int64)
    overlap = np.zeros(n, np.int64)
    for q in range(n):
        t = float(stage.arrival_ms[q])
        s = _host(run(params, consts, prng, s, np.full(reps, t)))
        for w, v in enumerate(views):
            local = _engine_positions(v, int(rows[w]))
            first = np.full(len(v.sent), np.nan)
            done_ms = np.full(len(v.sent), np.nan)
            rows_w = local[local >= 0]
            first[local >= 0] = s.requests.first_token_ms[w, rows_w]
            done_ms[local >= 0] = np.where(s.requests.done[w, rows_w], s.requests.last_token_ms[w, rows_w], np.nan)
            v.update(t, first, done_ms)
        k = keys[q] if keys is not None else no_keys
        w, hit = choose(router, views, q, t, k, int(blocks[q]))
        replica[q], overlap[q] = w, hit * pool.block_size
        views[w].take(q, t, k, int(blocks[q]), hit, bool(fits[q]))
        if fits[q]:
            _add_request(s, consts, rq, w, int(rows[w]), t, int(stage.input_tokens[q]), int(stage.output_tokens[q]), pool.max_model_len)
            rows[w] += 1
    s = _host(run(params, consts, prng, s, np.full(reps, np.inf)))
    res = _host(_finish(rq, s, consts))
    if timings is not None:
        timings["passes"] = timings.get("passes", 0) + int(np.sum(res.num_passes))
        timings["loop_steps"] = timings.get("loop_steps", 0) + int(np.sum(res.num_steps))
    routed = replace(stage, assignment=replica)
    results = [_replica_result(res, w, views[w], routed.arrival_ms) for w in range(reps)]
    summary = RoutingSummary(router.policy, tuple(len(v.sent) for v in views),
                             float(overlap.sum() / max(int(np.sum(stage.input_tokens)), 1)))
    return routed, results, summary


def _engine_positions(v: ReplicaView, filled: int) -> np.ndarray:
    """For each request sent to the replica (in order), its engine row (-1: rejected, never in the engine)."""
    entered = np.asarray(v.entered, bool)
    out = np.full(entered.size, -1, np.int64)
    out[entered] = np.arange(int(entered.sum()))
    if int(entered.sum()) != int(filled):
        raise AssertionError(f"router view and engine rows disagree ({int(entered.sum())} != {filled})")
    return out


def _add_request(s, consts, rq, w: int, row: int, t_ms: float, prompt: int, output: int, max_model_len: int) -> None:
    """Request (``prompt``, ``output``) arriving at ``t_ms`` becomes replica ``w``'s engine row ``row`` (host arrays,
    in place): as the engine's start lays out an accepted request, sent at its arrival (an open loop)."""
    consts.arrival_sorted_ms[w, row] = t_ms
    consts.num_accepted[w] = row + 1
    consts.accepted[w, row] = True
    s.sent_ms[w, row] = t_ms
    counts = np.zeros(s.requests.counts.shape[-1], np.int64)
    counts[_PROMPT] = prompt
    counts[_OUTPUT] = min(output, max(max_model_len - prompt, 0))
    s.requests.counts[w, row] = counts
    s.requests.times[w, row] = (np.nan, np.nan, np.nan, 0.0)
    if s.status[w] == COMPLETED:
        s.status[w] = RUNNING
    rq.arrival_ms[w, row] = t_ms
    rq.input_tokens[w, row] = prompt
    rq.output_tokens[w, row] = output
    rq.valid[w, row] = True


def _replica_result(res: ReplayResult, w: int, v: ReplicaView, arrival_ms: np.ndarray) -> ReplayResult:
    """Replica ``w``'s results over the requests sent to it (in order): the engine's rows, and for a request
    the replica rejected, the engine's rejected row (sent at its arrival, no token)."""
    pos = _engine_positions(v, int(np.sum(v.entered)))
    m = len(v.sent)
    fields = {}
    for name in ("first_token_ms", "second_token_ms", "last_token_ms", "token_gap_sq_ms2", "sent_ms"):
        a = np.full(m, np.nan)
        a[pos >= 0] = getattr(res, name)[w, pos[pos >= 0]]
        fields[name] = a
    fields["token_gap_sq_ms2"] = np.nan_to_num(fields["token_gap_sq_ms2"])
    fields["sent_ms"] = np.where(pos >= 0, fields["sent_ms"], arrival_ms[np.asarray(v.sent, np.int64)] if m else fields["sent_ms"])
    for name in ("output_tokens", "decode_rounds", "preemptions", "admissions", "terminal"):
        src = getattr(res, name)[w]
        a = np.zeros(m, src.dtype)
        a[pos >= 0] = src[pos[pos >= 0]]
        fields[name] = a
    fields["terminal"] = np.where(pos >= 0, fields["terminal"], REJECTED).astype(np.int32)
    scalars = {name: getattr(res, name)[w] for name in ("status", "num_passes", "num_steps", "end_ms", "failed_query", "timeline")}
    return ReplayResult(**{k: jnp.asarray(v) for k, v in {**fields, **scalars}.items()})
