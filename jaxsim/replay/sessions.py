"""Multi-turn sessions replayed with the engines in the loop.

A session's first turn is sent at its arrival; each later turn is sent when the session's previous turn
completes plus its think time (``delay_ms``), as a chat client that waits for an answer, reads it and
replies. Send times therefore depend on the replay itself: every replica's engine runs pass by pass and
stops right after a pass that completes a request (:func:`~jaxsim.replay.engine.advance_until_stack`,
``stop_done``), before the first pass that would start at or after the next send due on it, or at the next
first turn's arrival (where the router decides). A due turn becomes its replica's next engine row, sent at its
send time; engine rows stay in send order, so the passes are those of one uninterrupted replay of the same
requests sent at the same times (``tests/test_replay_sessions.py`` checks exactly that).

Routing: a first turn goes where the pool's router sends it (round-robin over sessions, least-loaded, or the
KV router); the later turns of a session follow it to the same replica (session affinity: the replica that
holds its context). A turn no replica can ever run (too long, larger than the pool) is rejected without
entering an engine, and its session ends there: its later turns are never sent (terminal ``unfinished``,
no send time). A prompt's length is the trace's (a later turn's prompt holds the conversation so far).

With prompt block keys (a trace with ``hash_ids`` and prefix caching on) every replica caches prefixes
(:class:`~jaxsim.replay.inloop.CachedEngineLoop`): a later turn reads what its conversation left on its replica.
"""

from __future__ import annotations

import heapq
from dataclasses import replace

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from jaxsim._jax import ensure_x64
from jaxsim.kernels.capacity import blocks_for
from jaxsim.replay.engine import REJECTED, UNFINISHED, ReplayResult
from jaxsim.replay.inloop import engine_loop
from jaxsim.replay.routing import ReplicaView, RoutingSummary, choose
from jaxsim.replay.traces import Sessions
from jaxsim.router import Router

__all__ = ["SessionRun", "run_sessions"]

class SessionRun(eqx.Module):
    """What the loop decided, per request of the stage (trace order): its replica, its send time (nan: never
    sent), whether it entered its replica's engine, and its engine row there (-1: none); and, after the replay,
    the prompt tokens its replica's prefix cache supplied at its first admission (0: none, or no cache)."""

    replica: np.ndarray
    sent_ms: np.ndarray
    entered: np.ndarray
    engine_row: np.ndarray
    cache_hit_tokens: np.ndarray


def run_sessions(stage, sessions: Sessions, router: Router, keys: list[np.ndarray] | None, timeline_len: int,
                 timings: dict | None = None, report=None):
    """Replay ``stage`` (the aggregated pool of an open loop) whose requests are the turns of ``sessions``:
    (the stage with each request's replica as its assignment, one :class:`ReplayResult` per replica over its
    requests in trace order, a :class:`RoutingSummary` when a state router routed several replicas, else None,
    the :class:`SessionRun`). ``keys``: each prompt's full-block keys, for the KV router (None: none); ``report``:
    :class:`~jaxsim.replay.inloop.EngineLoop`'s."""
    ensure_x64()
    loop = _Loop(stage, sessions, router, keys, timeline_len, timings, report)
    firsts = np.flatnonzero(sessions.previous < 0)  # in arrival order
    i = 0
    while True:
        t_first = float(stage.arrival_ms[firsts[i]]) if i < firsts.size else np.inf
        stops = loop.advance(t_first)
        if loop.completions():  # a replica stopped after a completion, maybe before its stop: run again first
            continue
        if loop.send_due(stops):  # every replica has run each pass that starts before its stop
            continue
        if i >= firsts.size:
            break
        loop.send(int(firsts[i]), loop.first_replica(int(firsts[i]), t_first, i), t_first)
        i += 1
    return loop.results(timings)


class _Loop:
    """The engines of a pool's replicas (:class:`~jaxsim.replay.inloop.EngineLoop`) and what the loop has decided."""

    def __init__(self, stage, sessions: Sessions, router: Router, keys, timeline_len: int, timings: dict | None, report=None):
        pool, n, reps = stage.pool, int(stage.arrival_ms.size), int(stage.pool.replicas)
        self.stage, self.sessions, self.router, self.keys, self.reps = stage, sessions, router, keys, reps
        self.engines = engine_loop(stage, timeline_len, timings, report)
        size = self.engines.size
        self.num_done = np.zeros(reps, np.int64)
        self.snap = None
        self.prompt = np.asarray(stage.input_tokens, np.int64)
        self.output = np.asarray(stage.output_tokens, np.int64)
        self.blocks = blocks_for(self.prompt, pool.block_size)
        self.fits = (self.prompt < pool.max_model_len) & (self.blocks + pool.state_blocks <= pool.num_gpu_blocks)
        self.following = _next_turns(sessions.previous)
        self.watch = bool(np.any(sessions.previous >= 0))  # later turns: stop at completions (they send them)
        self.state_routed = router.routed and reps > 1
        self.views = [ReplicaView() for _ in range(reps)]
        self.decided = SessionRun(replica=np.full(n, -1, np.int64), sent_ms=np.full(n, np.nan), entered=np.zeros(n, bool),
                                  engine_row=np.full(n, -1, np.int64), cache_hit_tokens=np.zeros(n, np.int64))
        self.rows = np.zeros(reps, np.int64)
        self.row_request = np.full((reps, size), -1, np.int64)  # engine row -> request
        self.row_view = np.full((reps, size), -1, np.int64)  # engine row -> its request's place in the replica's view
        self.seen_done = np.zeros((reps, size), bool)
        self.pending: list[list] = [[] for _ in range(reps)]  # per replica: heap of (send ms, order, request) not yet sent
        self.order = 0
        self.overlap_tokens = 0

    def _keys(self, q: int) -> np.ndarray:
        return self.keys[q] if self.keys is not None else np.zeros(0, np.int64)

    def advance(self, t_first: float) -> np.ndarray:
        """Run every replica up to its stop (the next first turn's arrival, or its next due turn if earlier), or until
        it completes a request; the stops."""
        stops = np.array([min(t_first, p[0][0]) if p else t_first for p in self.pending])
        self.snap = self.engines.advance(stops, self.num_done if self.watch else None)
        self.num_done = self.snap.num_done.copy()
        return stops

    def completions(self) -> bool:
        """Turns whose previous turn completed in the last call are due on its replica at completion + think time;
        whether a replica stopped at a completion (before its stop)."""
        if not self.watch:
            return False
        any_new = False
        for w in range(self.reps):
            m = int(self.rows[w])
            new = np.flatnonzero(self.snap.done[w, :m] & ~self.seen_done[w, :m])
            self.seen_done[w, new] = True
            for row in new:
                any_new = True
                nxt = int(self.following[int(self.row_request[w, row])])
                if nxt >= 0:
                    due = float(self.snap.last_token_ms[w, row]) + float(self.sessions.delay_ms[nxt])
                    heapq.heappush(self.pending[w], (due, self.order, nxt))
                    self.order += 1
        return any_new

    def send_due(self, stops: np.ndarray) -> bool:
        """Send the turns due on each replica at its stop; whether any was."""
        sent = False
        for w in range(self.reps):
            while self.pending[w] and self.pending[w][0][0] <= stops[w]:
                t, _, q = heapq.heappop(self.pending[w])
                self.send(q, w, t)
                sent = True
        return sent

    def send(self, q: int, w: int, t: float) -> None:
        """Request ``q`` reaches replica ``w`` at ``t``: its next engine row, or rejected (it holds nothing)."""
        d, r = self.decided, self.router
        d.replica[q], d.sent_ms[q] = w, t
        k = self._keys(q)
        hit = self.views[w].overlap_blocks(k, t, float(r.ttl_s) * 1000.0) if self.state_routed and r.policy == "kv" else 0
        self.views[w].take(q, t, k, int(self.blocks[q]), hit, bool(self.fits[q]))
        self.overlap_tokens += hit * self.stage.pool.block_size
        if self.fits[q]:
            row = int(self.rows[w])
            self.engines.insert(w, row, t, int(self.prompt[q]), int(self.output[q]), request=q)
            d.entered[q], d.engine_row[q], self.row_request[w, row] = True, row, q
            self.row_view[w, row] = len(self.views[w].sent) - 1
            self.rows[w] += 1

    def first_replica(self, q: int, t: float, nth: int) -> int:
        """The replica a session's first turn goes to: the router's choice from the replicas' state at ``t``, or
        round-robin over sessions."""
        if not self.state_routed:
            return nth % self.reps
        for w, v in enumerate(self.views):
            m = int(self.rows[w])
            engine = self.row_view[w, :m]
            first = np.full(len(v.sent), np.nan)
            done_ms = np.full(len(v.sent), np.nan)
            first[engine] = self.snap.first_token_ms[w, :m]
            done_ms[engine] = np.where(self.snap.done[w, :m], self.snap.last_token_ms[w, :m], np.nan)
            v.update(t, first, done_ms)
        w, _ = choose(self.router, self.views, q, t, self._keys(q), int(self.blocks[q]))
        return int(w)

    def results(self, timings: dict | None):
        """(the stage with its replicas, per-replica results, routing summary or None, the decisions)."""
        d, prev = self.decided, self.sessions.previous
        for q in np.flatnonzero(d.replica < 0):  # later turns of sessions that ended early: their session's replica
            d.replica[q] = d.replica[_first_turn(prev, int(q))]
        res = self.engines.finish()
        hits = self.engines.first_hit_tokens
        if hits is not None:
            has = d.engine_row >= 0
            d.cache_hit_tokens[has] = hits[d.replica[has], d.engine_row[has]]
        if timings is not None:
            timings["passes"] = timings.get("passes", 0) + int(np.sum(res.num_passes))
            timings["loop_steps"] = timings.get("loop_steps", 0) + int(np.sum(res.num_steps))
        results = [_replica_result(res, w, d) for w in range(self.reps)]
        summary = None
        if self.state_routed:
            summary = RoutingSummary(self.router.policy, tuple(int(np.sum(d.replica == w)) for w in range(self.reps)),
                                     float(self.overlap_tokens / max(int(np.sum(self.prompt)), 1)))
        return replace(self.stage, assignment=d.replica), results, summary, d


def _next_turns(previous: np.ndarray) -> np.ndarray:
    """Each request's next turn in its session (-1: none)."""
    nxt = np.full(previous.size, -1, np.int64)
    later = np.flatnonzero(previous >= 0)
    nxt[previous[later]] = later
    return nxt


def _first_turn(previous: np.ndarray, q: int) -> int:
    while previous[q] >= 0:
        q = int(previous[q])
    return q


def _replica_result(res: ReplayResult, w: int, d: SessionRun) -> ReplayResult:
    """Replica ``w``'s results over its requests in trace order: the engine's rows; a rejected turn (sent, no
    token) and a turn never sent (its session ended before it) have no row."""
    mine = np.flatnonzero(d.replica == w)
    row = d.engine_row[mine]
    has = row >= 0
    fields = {}
    for name in ("first_token_ms", "second_token_ms", "last_token_ms", "token_gap_sq_ms2", "sent_ms"):
        a = np.full(mine.size, np.nan)
        a[has] = getattr(res, name)[w, row[has]]
        fields[name] = a
    fields["token_gap_sq_ms2"] = np.nan_to_num(fields["token_gap_sq_ms2"])
    fields["sent_ms"] = np.where(has, fields["sent_ms"], d.sent_ms[mine])
    for name in ("output_tokens", "decode_rounds", "preemptions", "admissions", "terminal"):
        src = getattr(res, name)[w]
        a = np.zeros(mine.size, src.dtype)
        a[has] = src[row[has]]
        fields[name] = a
    never_sent = np.isnan(d.sent_ms[mine])
    fields["terminal"] = np.where(has, fields["terminal"], np.where(never_sent, UNFINISHED, REJECTED)).astype(np.int32)
    scalars = {name: getattr(res, name)[w] for name in ("status", "num_passes", "num_steps", "end_ms", "failed_query", "timeline")}
    return ReplayResult(**{k: jnp.asarray(v) for k, v in {**fields, **scalars}.items()})
