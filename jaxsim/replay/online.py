"""A routed pool replayed with its router in the loop.

Every replica's engine runs up to the next arrival (each replica stops before the first pass that would
start at or after it: :func:`~jaxsim.replay.engine.advance_until_stack`), the router reads the replicas'
first-token and completion times and decides (:func:`~jaxsim.replay.routing.choose`), the request is added
to the chosen replica's rows (the next row after its accepted ones, in arrival order, as the engine's start
lays them out: :func:`~jaxsim.replay.engine.insert_request_stack`), and the engines go on
(:class:`~jaxsim.replay.inloop.EngineLoop`: the state stays on the device between calls). The passes are
the ones an uninterrupted replay of each replica's requests runs (a pass never depends on requests that
arrive after it starts), decided with no knowledge of the future. Pass by pass (no decode stretch: a
stretch would look past the next arrival). A request no replica can ever run (too long, or larger than the
pool) is rejected by the replica it was sent to without entering its engine, as the engine's start would.
"""

from __future__ import annotations

from dataclasses import replace

import jax.numpy as jnp
import numpy as np

from jaxsim.kernels.capacity import blocks_for
from jaxsim.replay.engine import REJECTED, ReplayResult
from jaxsim.replay.inloop import EngineLoop
from jaxsim.replay.routing import ReplicaView, RoutingSummary, choose
from jaxsim.router import Router

__all__ = ["run_routed"]

def run_routed(stage, router: Router, keys: list[np.ndarray] | None, timeline_len: int, timings: dict | None = None, report=None):
    """Replay ``stage`` (a :class:`~jaxsim.replay.orchestrate.Stage` of an open loop) with ``router`` in the loop:
    (the stage with each request's replica as its assignment, one :class:`ReplayResult` per replica over its
    requests in arrival order, a :class:`RoutingSummary`). ``keys``: each prompt's full-block keys (None: none);
    ``report``: :class:`~jaxsim.replay.inloop.EngineLoop`'s."""
    pool, n, reps = stage.pool, int(stage.arrival_ms.size), int(stage.pool.replicas)
    engines = EngineLoop(stage, timeline_len, timings, report)
    blocks = blocks_for(np.asarray(stage.input_tokens, np.int64), pool.block_size)
    fits = (np.asarray(stage.input_tokens) < pool.max_model_len) & (blocks + pool.state_blocks <= pool.num_gpu_blocks)
    no_keys = np.zeros(0, np.int64)
    views = [ReplicaView() for _ in range(reps)]
    rows = np.zeros(reps, np.int64)  # engine rows filled per replica
    replica = np.zeros(n, np.int64)
    overlap = np.zeros(n, np.int64)
    for q in range(n):
        t = float(stage.arrival_ms[q])
        snap = engines.advance(np.full(reps, t))
        for w, v in enumerate(views):
            local = _engine_positions(v, int(rows[w]))
            first = np.full(len(v.sent), np.nan)
            done_ms = np.full(len(v.sent), np.nan)
            rows_w = local[local >= 0]
            first[local >= 0] = snap.first_token_ms[w, rows_w]
            done_ms[local >= 0] = np.where(snap.done[w, rows_w], snap.last_token_ms[w, rows_w], np.nan)
            v.update(t, first, done_ms)
        k = keys[q] if keys is not None else no_keys
        w, hit = choose(router, views, q, t, k, int(blocks[q]))
        replica[q], overlap[q] = w, hit * pool.block_size
        views[w].take(q, t, k, int(blocks[q]), hit, bool(fits[q]))
        if fits[q]:
            engines.insert(w, int(rows[w]), t, int(stage.input_tokens[q]), int(stage.output_tokens[q]))
            rows[w] += 1
    engines.advance(np.full(reps, np.inf))
    res = engines.finish()
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
