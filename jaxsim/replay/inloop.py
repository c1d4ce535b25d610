"""A pool's replica engines driven from the host one event at a time (a router in the loop, multi-turn sessions).

The replicas' engines are one stack of replays that starts empty (:func:`~jaxsim.replay.engine.start_stack`);
the host runs them up to an event (:func:`~jaxsim.replay.engine.advance_until_stack`: before the first pass
that would start at or after a time, or right after a pass that completes a request), reads what it needs,
decides, and adds each request as its replica's next engine row
(:func:`~jaxsim.replay.engine.insert_request_stack`). The state stays on the device between calls; the host
reads only the per-request times and flags it decides from. Every call goes through an executable compiled
once per shape bucket and kept in the on-disk executable cache (:mod:`jaxsim.replay.executables`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float64, Int32, Int64

from jaxsim._jax import ensure_x64
from jaxsim.replay import cache_engine as ce
from jaxsim.replay import executables as X
from jaxsim.replay.cache_runner import executables_for
from jaxsim.replay.engine import RUNNING, SLOTS_FULL, ReplayResult, Requests, is_stochastic, slot_bucket, start_stack, widen_stack
from jaxsim.replay.runner import capacities, stretch_lookahead
from jaxsim.replay.traces import request_bucket

__all__ = ["CachedEngineLoop", "EngineLoop", "Snapshot", "engine_loop"]

NO_LIMIT = np.iinfo(np.int64).max
REPORT_S = 0.25
"""At most this often (seconds) an engine loop tells its ``report`` where it stands."""


class Snapshot(eqx.Module):
    """What the host reads after a call, per replica (axis 0) and engine row (axis 1, rows in use first)."""

    status: Int32[Array, " R"] | np.ndarray
    now_ms: Float64[Array, " R"] | np.ndarray
    num_done: Int64[Array, " R"] | np.ndarray
    done: Bool[Array, "R N"] | np.ndarray
    first_token_ms: Float64[Array, "R N"] | np.ndarray
    last_token_ms: Float64[Array, "R N"] | np.ndarray
    remaining: Int64[Array, "R N"] | np.ndarray  # output tokens not yet emitted


def _snapshot(s) -> Snapshot:
    r = s.requests
    return Snapshot(status=s.status, now_ms=s.now_ms, num_done=s.num_done, done=r.done, first_token_ms=r.first_token_ms,
                    last_token_ms=r.last_token_ms, remaining=r.output_tokens - r.generated)


_SNAPSHOT = jax.jit(_snapshot)
_SNAPSHOT_ONE = jax.jit(lambda s: _snapshot(jax.tree.map(lambda a: a[None], s)))  # one replay's, as a stack of one


class EngineLoop:
    """The engines of a stage's pool (one per replica, each with room for every request of the stage). They start
    at a single replay's first capacity (:func:`~jaxsim.replay.runner.capacities`: the max_num_seqs bucket up to
    128 slots, else 64) and double their running-list slots when a replica fills them
    (``SLOTS_FULL``: that pass is not applied, so going on at the larger capacity is the replay run at it from the
    start), up to the pool's max_num_seqs bucket: a pass costs about 0.1 us per slot."""

    def __init__(self, stage, timeline_len: int, timings: dict | None = None, report: Callable | None = None):
        """``report(now_ms, requests_done)`` (optional): where the engines stand, at most every
        :data:`REPORT_S` seconds (the latest clock of the replicas, the requests they completed)."""
        ensure_x64()
        self.report, self.reported = report, time.monotonic()
        pool, n, reps = stage.pool, int(stage.arrival_ms.size), int(stage.pool.replicas)
        self.reps, self.size, self.max_model_len, self.timings = reps, request_bucket(max(n, 1)), int(pool.max_model_len), timings
        one = pool.params(stage.nextn, stage.accept_rates, stage.max_passes, 0)
        stacked = jax.tree.map(lambda a: np.stack([np.asarray(a)] * reps), one)
        self.params = jax.device_put(eqx.tree_at(lambda q: q.table, stacked, one.table))  # one table for all replicas
        key = jax.random.fold_in(jax.random.PRNGKey(int(stage.seed)), stage.stream)
        self.prng = jax.device_put(np.stack([np.asarray(jax.random.fold_in(key, r)) for r in range(reps)]))
        empty = Requests(arrival_ms=jnp.full(self.size, jnp.inf), input_tokens=jnp.ones(self.size, jnp.int64),
                         output_tokens=jnp.ones(self.size, jnp.int64), valid=jnp.zeros(self.size, bool),
                         materialized=jnp.zeros(self.size, bool))
        self.rq = jax.tree.map(lambda a: jnp.stack([a] * reps), empty)
        self.top = slot_bucket(pool.max_num_seqs)
        self.slots = capacities(self.top, 1)[0]  # a single replay's first rung (runner: SMALL_FIRST_SLOTS above 128)
        self.timeline_len = int(timeline_len)
        self.stochastic = is_stochastic(np.asarray(stage.accept_rates)[: stage.nextn])
        start = X.Call(X.START, (self.params, self.rq), self._start_statics(self.slots))
        s_abs, c_abs = widen_stack(*self._shapes(self.slots), 0)
        finish = X.Call(X.FINISH, (self.rq, s_abs, c_abs))
        self.exe = dict(zip(("start", "finish"), self._compile([start, finish])))
        self.exe.update(self._capacity(self.slots))
        self.s, self.consts = self.exe["start"](self.params, self.rq)
        self.view = None
        self.first_hit_tokens: np.ndarray | None = None  # no prefix cache here (CachedEngineLoop fills it)

    def _start_statics(self, slots: int) -> dict:
        return dict(slots=slots, timeline_len=self.timeline_len, shared_table=True)

    def _shapes(self, slots: int):
        return jax.eval_shape(lambda p, r: start_stack(p, r, **self._start_statics(slots)), self.params, self.rq)

    def _compile(self, calls: list) -> list:
        X.compile_calls(calls, self.timings)
        return [X.executable(c) for c in calls]  # looked up once: a key hashes every argument

    def _capacity(self, slots: int) -> dict:
        """The advance and insert executables at ``slots`` running-list slots."""
        s_abs, c_abs = self._shapes(slots)
        stop = (jax.ShapeDtypeStruct((self.reps,), jnp.float64), jax.ShapeDtypeStruct((self.reps,), jnp.int64))
        scalar = lambda dtype: jax.ShapeDtypeStruct((), dtype)  # noqa: E731
        advance = X.Call(X.ADVANCE_UNTIL, (self.params, c_abs, self.prng, s_abs, *stop),
                         dict(stochastic=self.stochastic, shared_table=True, closed_loop=False))  # routers and sessions: open loops
        insert = X.Call(X.INSERT, (s_abs, c_abs, jax.eval_shape(lambda r: r, self.rq), scalar(jnp.int64), scalar(jnp.int64),
                                   scalar(jnp.float64), scalar(jnp.int64), scalar(jnp.int64), scalar(jnp.int64), scalar(bool)))
        return dict(zip(("advance", "insert"), self._compile([advance, insert])))

    def advance(self, stop_ms: np.ndarray, stop_done: np.ndarray | None = None) -> Snapshot:
        """Run each replica while it is active and its next pass starts before its ``stop_ms`` (and, with ``stop_done``,
        until a pass takes its completed requests above it); what the host reads then."""
        done = np.full(self.reps, NO_LIMIT, np.int64) if stop_done is None else np.asarray(stop_done, np.int64)
        stop = np.asarray(stop_ms, np.float64)
        while True:
            self.s = self.exe["advance"](self.params, self.consts, self.prng, self.s, stop, done)
            self.view = jax.tree.map(np.asarray, _SNAPSHOT(self.s))
            if not np.any(self.view.status == SLOTS_FULL):
                if self.report is not None and time.monotonic() - self.reported >= REPORT_S:
                    self.reported = time.monotonic()
                    self.report(float(np.max(self.view.now_ms)), int(np.sum(self.view.num_done)))
                return self.view
            self._widen(min(2 * self.slots, self.top))

    def _widen(self, slots: int) -> None:
        s, consts = widen_stack(jax.device_get(self.s), jax.device_get(self.consts), slots)
        self.slots = slots
        self.exe.update(self._capacity(slots))
        self.s, self.consts = jax.device_put(s), jax.device_put(consts)

    def insert(self, replica: int, row: int, sent_ms: float, prompt_tokens: int, output_tokens: int, request: int = -1,
               materialized: bool = False) -> None:
        """Request (``prompt_tokens``, ``output_tokens``) sent at ``sent_ms`` becomes replica ``replica``'s engine row ``row``
        (``request``, its position in the stage, matters only to :class:`CachedEngineLoop`: its prompt keys; ``materialized``:
        it arrives with its prompt's KV, a decode pool's request)."""
        self.s, self.consts, self.rq = self.exe["insert"](
            self.s, self.consts, self.rq, np.int64(replica), np.int64(row), np.float64(sent_ms), np.int64(prompt_tokens),
            np.int64(output_tokens), np.int64(self.max_model_len), np.bool_(materialized))

    def finish(self) -> ReplayResult:
        """Per-replica results over their engine rows (host arrays, replica on axis 0)."""
        s, consts = widen_stack(jax.device_get(self.s), jax.device_get(self.consts), 0)
        res = self.exe["finish"](self.rq, s, consts)
        return jax.tree.map(np.asarray, jax.device_get(res))


def engine_loop(stage, timeline_len: int, timings: dict | None = None, report: Callable | None = None):
    """The engines of ``stage``'s pool in the loop: with prefix caching when the stage has prompt block keys
    (:class:`CachedEngineLoop`), else :class:`EngineLoop`."""
    cls = CachedEngineLoop if stage.keys is not None else EngineLoop
    return cls(stage, timeline_len, timings, report)


class CachedEngineLoop:
    """The engines of a stage's pool with prefix caching (:mod:`jaxsim.replay.cache_engine`): each replica its own
    replay with its own block pool, called one replica at a time (under ``vmap`` the pool's in-place writes become
    copies of it). Same interface as :class:`EngineLoop`, plus each engine row's cache-hit tokens after
    :meth:`finish`. Each replica climbs the slot ladder on its own (first rung as :class:`EngineLoop`'s, doubling on
    ``SLOTS_FULL``: :func:`~jaxsim.replay.cache_engine.widen`), and advances by decode stretches that end before the
    stop (:mod:`jaxsim.replay.cache_stretch`)."""

    def __init__(self, stage, timeline_len: int, timings: dict | None = None, report: Callable | None = None):
        ensure_x64()
        self.report, self.reported, self.timings = report, time.monotonic(), timings
        pool, n, reps = stage.pool, int(stage.arrival_ms.size), int(stage.pool.replicas)
        self.reps, self.size, self.max_model_len = reps, request_bucket(max(n, 1)), int(pool.max_model_len)
        self.params = jax.device_put(pool.params(stage.nextn, stage.accept_rates, stage.max_passes, 0))
        flat, capacity = ce.prompt_keys(list(stage.keys), stage.num_keys, n)
        self.key_offset = np.asarray(flat.offset)  # request (stage order) -> where its keys start in flat.keys
        self.shapes = ce.shapes_for(stage.input_tokens, stage.output_tokens, max_num_seqs=pool.max_num_seqs, block_size=pool.block_size,
                                    num_gpu_blocks=pool.num_gpu_blocks, max_model_len=pool.max_model_len, num_keys=capacity)
        self.timeline_len = int(timeline_len)
        put = jax.device_put
        rq = Requests(arrival_ms=put(np.full(self.size, np.inf)), input_tokens=put(np.ones(self.size, np.int64)),
                      output_tokens=put(np.ones(self.size, np.int64)), valid=put(np.zeros(self.size, bool)),
                      materialized=put(np.zeros(self.size, bool)))
        pk = ce.PromptKeys(keys=flat.keys, offset=put(np.zeros(self.size, np.int64)))
        self.exe: dict[int, dict] = {}
        first_slots = capacities(self.shapes.slots, 1)[0]
        first = self._executables(first_slots, rq, pk)
        # each replica its own buffers: the advance and insert calls take (donate) them and write them in place
        started = [first["start"](self.params, rq) for _ in range(reps)]
        self.s, self.consts = [s for s, _ in started], [c for _, c in started]
        self.rq, self.pk = [jax.tree.map(jnp.copy, rq) for _ in range(reps)], [jax.tree.map(jnp.copy, pk) for _ in range(reps)]
        self.slots = [first_slots] * reps
        self.views: list = [jax.tree.map(np.asarray, _SNAPSHOT_ONE(s.engine)) for s in self.s]
        self.fresh = np.zeros(reps, bool)  # a request was inserted since the replica's last advance
        self.first_hit_tokens: np.ndarray | None = None

    def _executables(self, slots: int, rq=None, pk=None) -> dict:
        """The start, advance, insert and finish executables at ``slots`` running-list slots."""
        if slots not in self.exe:
            rq, pk = (self.rq[0], self.pk[0]) if rq is None else (rq, pk)
            self.exe[slots] = executables_for(self.params, rq, pk, self.shapes._replace(slots=slots), self.timeline_len,
                                              stretch_lookahead(1), self.timings, insert=True)
        return self.exe[slots]

    def advance(self, stop_ms: np.ndarray, stop_done: np.ndarray | None = None) -> Snapshot:
        """As :meth:`EngineLoop.advance`; a replica with nothing to run (not running, nothing inserted) is not called."""
        done = np.full(self.reps, NO_LIMIT, np.int64) if stop_done is None else np.asarray(stop_done, np.int64)
        stop = np.asarray(stop_ms, np.float64)
        for w in range(self.reps):
            if int(self.views[w].status[0]) != RUNNING and not self.fresh[w]:
                continue
            while True:
                exe = self._executables(self.slots[w])
                self.s[w] = exe["advance"](self.params, self.consts[w], self.pk[w], self.s[w], np.float64(stop[w]), np.int64(done[w]))
                self.views[w] = jax.tree.map(np.asarray, _SNAPSHOT_ONE(self.s[w].engine))
                if int(self.views[w].status[0]) != SLOTS_FULL:
                    break
                self.slots[w] = min(2 * self.slots[w], self.shapes.slots)
                self.s[w], self.consts[w] = jax.device_put(ce.widen(self.s[w], self.consts[w], self.slots[w]))
            self.fresh[w] = False
        view = jax.tree.map(lambda *a: np.concatenate(a), *self.views)
        if self.report is not None and time.monotonic() - self.reported >= REPORT_S:
            self.reported = time.monotonic()
            self.report(float(np.max(view.now_ms)), int(np.sum(view.num_done)))
        return view

    def insert(self, replica: int, row: int, sent_ms: float, prompt_tokens: int, output_tokens: int, request: int = -1,
               materialized: bool = False) -> None:
        """As :meth:`EngineLoop.insert`; ``request`` (the stage position) gives the row its prompt keys. A prompt computed
        here (the cache serves prompts): never ``materialized``."""
        if materialized:
            raise ValueError("a cached engine loop computes its prompts: no materialized request")
        w = int(replica)
        self.s[w], self.consts[w], self.rq[w], self.pk[w] = self._executables(self.slots[w])["insert"](
            self.s[w], self.consts[w], self.rq[w], self.pk[w], np.int64(row), np.float64(sent_ms), np.int64(prompt_tokens),
            np.int64(output_tokens), np.int64(self.max_model_len), np.int64(self.key_offset[int(request)]))
        self.fresh[w] = True

    def finish(self) -> ReplayResult:
        """As :meth:`EngineLoop.finish`; each engine row's prompt tokens read from the cache at its first admission go
        to ``first_hit_tokens`` (replica on axis 0)."""
        out = [jax.tree.map(np.asarray, self._executables(self.slots[w])["finish"](self.rq[w], self.s[w], self.consts[w]))
               for w in range(self.reps)]
        self.first_hit_tokens = np.stack([o.first_hit_tokens for o in out])
        return jax.tree.map(lambda *a: np.stack(a), *(o.result for o in out))
