"""Many replays in one compiled call: the engine vmapped over configurations (tables, scheduler
settings, acceptance rates) and seeds. A batched replay equals the same replays run one by one.

Tables of different sizes are padded to one common bucket shape (padding never changes a lookup), so
a whole sweep compiles once. Items are grouped by trace size and sampling mode; a large group runs
through growing running-list capacities (:data:`FIRST_SLOTS`, doubling), capacity by capacity.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import equinox as eqx
import jax
import numpy as np

from jaxsim._jax import ensure_x64
from jaxsim.devices import batch_sharding, num_devices, replicated
from jaxsim.kernels.buckets import pow2_bucket
from jaxsim.kernels.rounds import common_tables
from jaxsim.replay import executables
from jaxsim.replay.engine import (
    DONE,
    PASS_LIMIT,
    RUNNING,
    SLOTS_FULL,
    EngineParams,
    EngineState,
    ReplayConstants,
    ReplayResult,
    Requests,
    start_stack,
    widen_stack,
)
from jaxsim.replay.executables import ADVANCE, ADVANCE_SPLIT, FINISH, START, Call
from jaxsim.replay.stretch import DEFAULT_LOOKAHEAD

FIRST_SLOTS = 16
"""Batched replays start with this many running-list slots and double them when a replay fills them
(``SLOTS_FULL``), up to their max_num_seqs bucket: a pass costs about 0.1 µs per slot per replay on
XLA:CPU, and most passes run far fewer requests than max_num_seqs allows."""
ADAPTIVE_MIN_ITEMS = 8
"""Groups of fewer replays run at their full capacity at once (each capacity step is one more executable), unless
that capacity is above :data:`SMALL_FULL_SLOTS`."""
SMALL_FULL_SLOTS = 128
SMALL_FIRST_SLOTS = 64
"""A small open-loop group whose max_num_seqs bucket is above SMALL_FULL_SLOTS starts at SMALL_FIRST_SLOTS and
doubles, each capacity compiled when a replay first reaches it (a closed loop's slots are its clients: it fills
them at once) (a pass costs about 0.1 us per slot: the calibrated Qwen3-32B
replay of azure_conv_1k at max_num_seqs 1,024 ran in 0.67 s at its 1,024 slots, 0.10 s through the ladder)."""


CPU_LOOKAHEAD = 8
"""The decode-stretch lookahead on XLA:CPU. The calibrated single replay (19,473 passes) ran in the same CPU
time at lookahead 4, 8 and 16 (0.83-0.87 s; 1.71 s pass by pass), while its advance loop compiled in
3.9 s of CPU at 4 or 8 against 4.7 s at 16 (2.7 s pass by pass). On a GPU, where each loop iteration
costs host time whatever its work, the longer :data:`~jaxsim.replay.stretch.DEFAULT_LOOKAHEAD` applies."""


def stretch_lookahead(n_items: int) -> int:
    """The decode-stretch lookahead of a group of ``n_items`` replays (0: pass by pass): every group advances by
    decode stretches (jaxsim.replay.stretch). A vmapped stretch prices every candidate pass of every replay whenever
    one replay can stretch, so groups of 8 or more used to run pass by pass: on the replay benchmark's 256
    configurations stretches made the batch several times slower (2026-12-05, before a stretch stopped copying the
    state through its ``lax.cond``). Measured again (2026-12-07, 2 cores, scripts/bench_replay.py's 256 configurations,
    groups of 16 to 224 replays, fresh process per setting, twice): replay 2.83-3.96 s pass by pass, 1.81-2.03 s by
    stretches (202,894 loop steps instead of 896,255), identical results; the cold compilation of its 12 executables
    14.4-15.9 s -> 22.3-24.3 s. ``n_items`` is kept for callers that size a group."""
    del n_items
    return CPU_LOOKAHEAD if jax.default_backend() == "cpu" else DEFAULT_LOOKAHEAD


@dataclass(frozen=True, eq=False)
class ReplayItem:
    """One replay to run: a worker configuration, its requests, its PRNG key, its running-list capacity
    (the max_num_seqs bucket, :func:`~jaxsim.replay.engine.slot_bucket`) and its sampling mode."""

    params: EngineParams
    requests: Requests
    key: jax.Array
    slots: int
    stochastic: bool


def stack_params(params: Sequence[EngineParams]) -> EngineParams:
    """Stack per-configuration parameters along a leading axis (tables padded to a common shape)."""
    tables = common_tables([p.table for p in params])
    params = [dataclasses.replace(p, table=t) for p, t in zip(params, tables)]
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *params)


def unstack(tree, i: int):
    """Element ``i`` of a stacked pytree (results or parameters)."""
    return jax.tree.map(lambda x: x[i], tree)


def replay_batch(
    params: Sequence[EngineParams],
    requests: Requests,
    seeds: Sequence[int] | int = 0,
    *,
    slots: int,
    stochastic: bool,
    timeline_len: int = 0,
    chunk: int | None = None,
) -> ReplayResult:
    """Replay ``requests`` for every configuration (each with its seed; an int seed is shared), as one
    stacked result (numpy). Runs through the same grouped, bucketed runner as
    :func:`~jaxsim.replay.orchestrate.run_replays`.

    ``chunk`` splits very large sweeps into several calls of at most ``chunk`` configurations (the
    last call is padded with copies so every call reuses one compilation).
    """
    ensure_x64()
    n = len(params)
    if n == 0:
        raise ValueError("replay_batch needs at least one configuration")
    seeds = [int(seeds)] * n if isinstance(seeds, (int, np.integer)) else [int(s) for s in seeds]
    if len(seeds) != n:
        raise ValueError(f"{len(seeds)} seeds for {n} configurations")
    items = [ReplayItem(p, requests, jax.random.PRNGKey(s), int(slots), bool(stochastic)) for p, s in zip(params, seeds)]
    return jax.tree.map(lambda *xs: np.stack(xs), *run_items(items, timeline_len=timeline_len, chunk=chunk))


def capacities(slots: int, n_items: int) -> list[int]:
    """Slot capacities a group of ``n_items`` replays runs through: FIRST_SLOTS, doubling, up to ``slots``; a small
    group runs at ``slots`` at once, or from SMALL_FIRST_SLOTS when ``slots`` is above SMALL_FULL_SLOTS."""
    first = FIRST_SLOTS
    if n_items < ADAPTIVE_MIN_ITEMS:
        if slots <= SMALL_FULL_SLOTS:
            return [slots]
        first = SMALL_FIRST_SLOTS
    if slots <= first:
        return [slots]
    out = [first]
    while out[-1] < slots:
        out.append(min(2 * out[-1], slots))
    return out


CPU_CALL_ITEMS = 16
"""On XLA:CPU a call advances at most this many replays (and at most ``chunk``): a pass's cost there is
its per-slot work, which does not get cheaper per replay in wider calls, while every distinct call width is one
more executable to compile. Measured (2026-12-07, 2 cores, scripts/bench_replay.py's 256 configurations, decode
stretches): calls of up to 224 replays needed 12 executables (cold compilation 26.4 s, loading them warm 1.9 s), calls
of at most 16 needed 7 (18.1 s, 1.1 s), and the replay took 1.84-1.86 s against 1.83-2.15 s. On a GPU, where each
loop iteration costs host time whatever its width, calls stay as wide as the group."""


def _call_size(n: int, chunk: int | None) -> int:
    """Items per call for ``n`` pending items: powers of two up to 16, then multiples of 16 (padding
    stays small), at most ``chunk`` and, on XLA:CPU, at most :data:`CPU_CALL_ITEMS`."""
    size = pow2_bucket(n) if n <= 16 else -(-n // 16) * 16
    limits = [int(chunk)] if chunk else []
    if jax.default_backend() == "cpu":
        limits.append(CPU_CALL_ITEMS)
    return max(1, min([size, *limits]))


def _np_stack(trees):
    """Stack pytrees of equal structure along a new leading axis on the host (numpy: no device op, so
    nothing to compile per leaf shape)."""
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *trees)


def _host(tree):
    return jax.tree.map(np.asarray, tree)


def run_items(
    items: Sequence[ReplayItem], *, timeline_len: int, chunk: int | None, progress=None, timings: dict | None = None
) -> list[ReplayResult]:
    """Run ``items`` grouped by trace size and sampling mode; their results, in order.

    Tables are padded to common shapes, so a group shares its compilations; a group whose items all
    use one table passes it once (not a copy per item). Large groups run through growing slot
    capacities (:func:`capacities`), capacity by capacity: the replays that fill their slots
    (``SLOTS_FULL``) continue together at the next capacity from where they stopped, the others are
    done. One executable per capacity, one to start, one to finish. ``progress(snapshot)`` (optional)
    gets a :class:`ReplayProgress` after every call of a bounded number of loop steps (by simulated
    time, so a long trace shows where it is); ``timings`` (optional) accumulates ``compile_s``,
    ``run_s``, ``compilations``, ``executables_loaded`` and ``replays_shared``.

    Replays that differ only in max_num_seqs (a sweep's axis) run once where the seats never mattered
    (:func:`seat_classes`): the one with the most seats runs first, and every other whose max_num_seqs is at least
    the most requests that replay ever ran (and whose pass limit it stayed within) gets its result, the same
    object: no admission of it was stopped by a seat, so with any max_num_seqs down to that peak every pass is the
    same. The others run after, together."""
    tracker = None if progress is None else _Progress(items, progress)
    out: list = [None] * len(items)
    classes = seat_classes(items, lambda it: (it.stochastic, it.requests.size, seat_key(it.params, it.requests, it.key)))
    peaks = _run_indices(items, [c[0] for c in classes], out, timeline_len, chunk, tracker, timings)
    rest, shared = [], 0
    for first, *others in classes:
        for i in others:
            if same_replay(out[first], peaks[first], items[i].params):
                out[i] = out[first]
                shared += 1
                if tracker is not None:
                    tracker.update(i, 0.0, int(np.sum(np.asarray(out[i].terminal) == DONE)), finished=True)
            else:
                rest.append(i)
    _run_indices(items, rest, out, timeline_len, chunk, tracker, timings)
    if timings is not None:
        timings["replays_shared"] = timings.get("replays_shared", 0) + shared
    return out


def seat_classes(items: Sequence, key: Callable) -> list[list[int]]:
    """Indices of ``items`` (each with ``params``) grouped by ``key(item)`` (:func:`seat_key` of everything the replay
    reads but max_num_seqs and the pass limit), each class by max_num_seqs, most first (ties in order)."""
    classes: dict = {}
    for i, it in enumerate(items):
        classes.setdefault(key(it), []).append(i)
    return [sorted(c, key=lambda i: -int(items[i].params.max_num_seqs)) for c in classes.values()]


def seat_key(params: EngineParams, *arrays) -> tuple:
    """What a replay with ``params`` and ``arrays`` (its requests, key, ...) reads besides max_num_seqs and the pass
    limit: the table object and a digest of every other setting and of the arrays."""
    fields = [np.asarray(getattr(params, f.name)).tobytes() for f in dataclasses.fields(params)
              if f.name not in ("table", "max_num_seqs", "max_passes")]
    data = fields + [np.asarray(a).tobytes() for a in jax.tree.leaves(arrays)]
    return id(params.table), hashlib.blake2b(b"\0".join(data), digest_size=16).digest()


def same_replay(result: ReplayResult, peak_running: int, params: EngineParams) -> bool:
    """Whether a replay with ``params`` (of ``result``'s class, :func:`seat_classes`) is ``result``'s pass for pass:
    its max_num_seqs is at least the most requests ``result``'s replay ran at once, and that replay ended before its
    pass limit, within this one's."""
    return (int(result.status) != PASS_LIMIT and int(params.max_num_seqs) >= peak_running
            and int(result.num_passes) <= int(params.max_passes))


def _run_indices(items: Sequence[ReplayItem], indices: list[int], out: list, timeline_len: int, chunk: int | None,
                 tracker: _Progress | None, timings: dict | None) -> dict[int, int]:
    """Run ``items[indices]`` (grouped by trace size and sampling mode) into ``out``; each one's peak of running
    requests."""
    peaks: dict[int, int] = {}
    if not indices:
        return peaks
    chosen = [items[i] for i in indices]
    tables = {id(it.params.table): it.params.table for it in chosen}
    padded = dict(zip(tables, common_tables(list(tables.values()))))
    by_shape: dict = {}
    for i in indices:
        it = items[i]
        by_shape.setdefault((it.stochastic, it.requests.size), []).append(i)
    groups = [_CapacityGroup(items, group, padded, stochastic, timeline_len, chunk, timings)
              for (stochastic, _), group in by_shape.items()]
    executables.compile_calls([c for g in groups for c in g.calls()], timings)
    for g in groups:
        t0, compile0 = time.perf_counter(), (timings or {}).get("compile_s", 0.0)
        for i, res in g.run(tracker):
            out[i] = res
        peaks.update({r.index: int(np.asarray(r.state.peak_running)) for r in g.replays})
        if timings is not None:  # a capacity compiled on the way (a small group's ladder) is compile time
            timings["run_s"] = timings.get("run_s", 0.0) + time.perf_counter() - t0 - (timings.get("compile_s", 0.0) - compile0)
    return peaks


# ----------------------------------------------------------------------------------------------------
# a group of items sharing compilations, run capacity by capacity


@dataclass(eq=False)
class _GroupReplay:
    """One item of a group on its way through its capacities. Not started: no state; pending: its
    state at ``capacity``; finished: its final state, slot arrays emptied (host arrays)."""

    index: int  # in the caller's items
    position: int  # in the group's stacked arrays
    capacities: list[int]
    capacity: int
    state: EngineState | None = None
    constants: ReplayConstants | None = None
    finished: bool = False

    @property
    def started(self) -> bool:
        return self.state is not None

    @property
    def pending(self) -> bool:
        return self.started and not self.finished

    @property
    def at_last_capacity(self) -> bool:
        return self.capacity == self.capacities[-1]


@dataclass(frozen=True)
class _CallSizes:
    """Items per call: per (capacity, last) an upper bound on the items that run at that capacity
    (``last``: it is their max_num_seqs bucket, so they run to the end there; the others may fill
    their slots and stop early, so the two never share a call); per starting capacity; finishing."""

    advance: dict[tuple[int, bool], int]
    start: dict[int, int]
    finish: int


@dataclass(frozen=True, eq=False)
class _Placed:
    """Arguments of a call for some items of a group, padded with copies and placed on the devices
    (or their shapes and placements only); ``put`` places per-item arrays the same way."""

    params: EngineParams
    requests: Requests
    keys: object  # array or ShapeDtypeStruct
    put: Callable
    split: bool  # items split over the devices
    put_shared: Callable  # places an array every device reads whole (a scalar argument)

    @property
    def advance(self) -> executables.Executable:
        return ADVANCE_SPLIT if self.split else ADVANCE


class _CapacityGroup:
    """Items of one group on the host: stacked parameters, requests and keys, and each item's progress
    through its slot capacities (start, then doubling up to its max_num_seqs bucket)."""

    def __init__(self, items: Sequence[ReplayItem], indices: list[int], padded: dict, stochastic: bool,
                 timeline_len: int, chunk: int | None, timings: dict | None = None):
        self.chunk, self.timeline_len, self.timings = chunk, int(timeline_len), timings
        members = [items[i] for i in indices]
        self.replays = []
        # a large closed-loop group (a replay-evaluated sweep's benchmarks) climbs one ladder of capacities (up to its
        # largest bucket): a replay that needs fewer slots finishes low on it, and the group needs one executable per
        # rung, not per bucket. A large open-loop group (trace replays of a sweep) climbs each replay's own ladder
        # (scripts/bench_replay.py, 256 configurations of max_num_seqs 16..256: replay 19.2 s on the shared ladder,
        # 9.3 s on their own; 7 against 11 executables)
        top = max(items[i].slots for i in indices)
        # an open-loop group never writes send times (engine.commit): a faster loop on long traces
        closed = any(int(np.max(np.asarray(items[i].params.max_concurrency))) > 0 for i in indices)
        for position, index in enumerate(indices):
            if len(indices) >= ADAPTIVE_MIN_ITEMS:
                caps = capacities(top if closed else items[index].slots, len(indices))
            elif closed:  # a small closed-loop group's clients fill their slots at once: no ladder to climb
                caps = [items[index].slots]
            else:
                caps = capacities(items[index].slots, len(indices))
            self.replays.append(_GroupReplay(index=index, position=position, capacities=caps, capacity=caps[0]))
        table_ids = {id(it.params.table) for it in members}
        self.shared_table = len(table_ids) == 1
        self.shared = {id(x) for x in jax.tree.leaves(padded[next(iter(table_ids))])} if self.shared_table else set()
        params = [eqx.tree_at(lambda q: q.table, it.params, padded[id(it.params.table)]) for it in members]
        self.params = jax.tree.map(lambda *xs: xs[0] if id(xs[0]) in self.shared else np.stack([np.asarray(x) for x in xs]), *params)
        self.requests = _np_stack([it.requests for it in members])
        self.keys = np.stack([np.asarray(it.key) for it in members])
        self.run_statics = dict(stochastic=bool(stochastic), shared_table=self.shared_table, lookahead=stretch_lookahead(len(indices)),
                                closed_loop=closed)
        self.sizes = self._sizes()

    def _sizes(self) -> _CallSizes:
        advance: dict = {}
        start: dict = {}
        for r in self.replays:
            for c in r.capacities:
                advance[(c, c == r.capacities[-1])] = advance.get((c, c == r.capacities[-1]), 0) + 1
            start[r.capacities[0]] = start.get(r.capacities[0], 0) + 1
        size = lambda n: _call_size(n, self.chunk)  # noqa: E731
        return _CallSizes({k: size(n) for k, n in sorted(advance.items())}, {c: size(n) for c, n in start.items()},
                          size(len(self.replays)))

    def _start_statics(self, capacity: int) -> dict:
        return dict(slots=capacity, timeline_len=self.timeline_len, shared_table=self.shared_table)

    def _placed(self, positions, size: int, abstract: bool = False) -> _Placed:
        """Parameters, requests and keys of the items at ``positions``, padded to ``size`` with copies,
        placed on the devices (``abstract``: their shapes and placements only)."""
        sel = np.resize(np.asarray(positions), size)
        split = num_devices() > 1 and size % num_devices() == 0  # items split over the devices, a shared table copied to each
        items, rep = (batch_sharding(), replicated()) if split else (None, None)
        if abstract:
            place = lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh or getattr(x, "sharding", None))  # noqa: E731
        else:
            place = (lambda x, sh: jax.device_put(x, sh)) if split else (lambda x, sh: x)
        put = lambda x: place(x, items)  # noqa: E731
        pick = lambda x: x[sel]  # noqa: E731
        params = jax.tree.map(lambda x: place(x, rep) if id(x) in self.shared else put(pick(x)), self.params)
        return _Placed(params, jax.tree.map(lambda x: put(pick(x)), self.requests), put(self.keys[sel]), put, split,
                       lambda x: place(x, rep))

    @property
    def lazy(self) -> bool:
        """A small group climbing a ladder compiles each capacity when a replay first reaches it."""
        return len(self.replays) < ADAPTIVE_MIN_ITEMS and any(len(r.capacities) > 1 for r in self.replays)

    def _advance_call(self, capacity: int, size: int) -> Call:
        """The advance call of ``size`` items at ``capacity`` slots, with its arguments' shapes (to compile)."""
        a = self._placed([0], size, abstract=True)
        s_abs, consts_abs = jax.eval_shape(
            lambda p, r: start_stack(p, r, slots=capacity, timeline_len=self.timeline_len, shared_table=self.shared_table),
            a.params, a.requests,
        )
        sds = _abstract(a.split)
        return Call(a.advance, (a.params, jax.tree.map(sds, consts_abs), a.keys, jax.tree.map(sds, s_abs), a.put_shared(_STEPS)),
                    self.run_statics)

    def calls(self) -> list[Call]:
        """Every call the group will make, with arguments as the devices will see them (to compile); a lazy group's
        advance calls at its first capacities only."""
        out = []
        for capacity, size in self.sizes.start.items():
            a = self._placed([0], size, abstract=True)
            out.append(Call(START, (a.params, a.requests), self._start_statics(capacity)))
        firsts = {r.capacities[0] for r in self.replays}
        for (capacity, _), size in self.sizes.advance.items():
            if not self.lazy or capacity in firsts:
                out.append(self._advance_call(capacity, size))
        call = out[-1]
        s_abs, consts_abs = widen_stack(call.args[3], call.args[1], 0)
        fin = self.sizes.finish
        a = self._placed([0], fin, abstract=True)
        s_abs, consts_abs = jax.tree.map(lambda x: jax.ShapeDtypeStruct((fin,) + x.shape[1:], x.dtype), (s_abs, consts_abs))
        sds = _abstract(a.split)
        out.append(Call(FINISH, (a.requests, jax.tree.map(sds, s_abs), jax.tree.map(sds, consts_abs))))
        return out

    def run(self, progress: _Progress | None = None) -> Iterator[tuple[int, ReplayResult]]:
        """Yield (item index, result) for every item of the group."""
        for (capacity, last), size in self.sizes.advance.items():
            self._start([r for r in self.replays if not r.started and r.capacity == capacity], capacity)
            pending = [r for r in self.replays if r.pending and r.capacity == capacity and r.at_last_capacity == last]
            for batch in _batches(pending, size):
                self._advance(batch, size, progress)
        for batch in _batches(self.replays, self.sizes.finish):
            yield from self._finish(batch)

    def _start(self, replays: list[_GroupReplay], capacity: int) -> None:
        size = self.sizes.start.get(capacity, 1)
        for batch in _batches(replays, size):
            a = self._placed([r.position for r in batch], size)
            s, consts = _host(executables.execute(Call(START, (a.params, a.requests), self._start_statics(capacity))))
            for k, r in enumerate(batch):
                r.state, r.constants = unstack((s, consts), k)

    def _advance(self, replays: list[_GroupReplay], size: int, progress: _Progress | None = None) -> int:
        """Run ``replays`` until each finishes or fills its slots (then it moves to its next capacity),
        in calls of a bounded number of loop steps (``progress`` is told where each replay stands after
        each call); how many finished."""
        a = self._placed([r.position for r in replays], size)
        s, consts = _np_stack([(r.state, r.constants) for r in _cycled(replays, size)])
        put = lambda t: jax.tree.map(a.put, t)  # noqa: E731
        consts, s = put(consts), put(s)
        max_passes = np.asarray(a.params.max_passes)
        if self.lazy:
            executables.compile_calls([self._advance_call(replays[0].capacity, size)], self.timings)
        budget = FIRST_CALL_STEPS
        run = None
        while True:
            t0 = time.perf_counter()
            call = Call(a.advance, (a.params, consts, a.keys, s, a.put_shared(np.int64(budget))), self.run_statics)
            if run is None:
                s = executables.execute(call)
                run = executables.executable(call)  # later calls pass the state it returned, on the devices
            else:  # placed again: XLA may hand back an empty leaf (a zero-length timeline) replicated
                s = run(*call.args[:3], put(s), *call.args[4:])
            now_ms, status, passes, done = (np.asarray(x) for x in (s.now_ms, s.status, s.passes, s.num_done))
            active = (status == RUNNING) & (passes < max_passes)
            if progress is not None:
                for k, r in enumerate(replays):
                    progress.update(r.index, float(now_ms[k]), int(done[k]), finished=bool(not active[k] and status[k] != SLOTS_FULL))
            if not active.any():
                break
            budget = _next_budget(budget, time.perf_counter() - t0)
        s, consts = _host(s), _host(consts)
        finished = 0
        for k, r in enumerate(replays):
            sk, ck = unstack((s, consts), k)
            if int(sk.status) == SLOTS_FULL:
                r.capacity = r.capacities[r.capacities.index(r.capacity) + 1]
                r.state, r.constants = widen_stack(sk, ck, r.capacity)
            else:
                r.state, r.constants = widen_stack(sk, ck, 0)
                r.finished = True
                finished += 1
        return finished

    def _finish(self, replays: list[_GroupReplay]) -> Iterator[tuple[int, ReplayResult]]:
        size = self.sizes.finish
        a = self._placed([r.position for r in replays], size)
        s, consts = _np_stack([(r.state, r.constants) for r in _cycled(replays, size)])
        res = _host(executables.execute(Call(FINISH, (a.requests, jax.tree.map(a.put, s), jax.tree.map(a.put, consts)))))
        for k, r in enumerate(replays):
            yield r.index, unstack(res, k)


FIRST_CALL_STEPS = 4096
"""Loop steps of the first call of an advance; later calls aim at :data:`CALL_S` each (the same results
whatever the split: a call goes on from the state the previous one returned)."""
CALL_S = 1.0
_STEPS = np.int64(0)  # the step budget argument (a dynamic int64 scalar)


def _next_budget(budget: int, seconds: float) -> int:
    """The next call's loop steps: about :data:`CALL_S` of work at the rate of the last call."""
    if seconds <= 0:
        return budget * 4
    return int(min(max(budget * CALL_S / seconds, 256), 4 * budget, 1 << 24))


class _Progress:
    """Where the replays of a :func:`run_items` call stand, by simulated time: each replay's clock up to
    its last arrival (its span), the whole span once it has finished; ``report(snapshot)`` gets a
    :class:`ReplayProgress` after every update."""

    def __init__(self, items: Sequence[ReplayItem], report: Callable):
        self.report = report
        self.span = np.zeros(len(items))
        self.requests = np.zeros(len(items), np.int64)
        for i, it in enumerate(items):
            valid = np.asarray(it.requests.valid)
            arrivals = np.asarray(it.requests.arrival_ms)[valid]
            self.span[i] = float(arrivals.max()) if arrivals.size and np.isfinite(arrivals.max()) else 0.0
            self.requests[i] = int(valid.sum())
        self.now = np.zeros(len(items))
        self.done = np.zeros(len(items), np.int64)
        self.finished = np.zeros(len(items), bool)

    def update(self, index: int, now_ms: float, num_done: int, *, finished: bool) -> None:
        self.now[index] = self.span[index] if finished else min(max(now_ms, 0.0), self.span[index])
        self.done[index], self.finished[index] = num_done, finished
        self.report(ReplayProgress(float(self.now.sum()), float(self.span.sum()), int(self.done.sum()), int(self.requests.sum()),
                                   int(self.finished.sum()), len(self.span)))


@dataclass(frozen=True)
class ReplayProgress:
    """A snapshot of a replay run: simulated time covered and spanned (ms, summed over the replays: each
    replay's clock, up to its last arrival), requests completed of all, replays finished of all."""

    simulated_ms: float
    span_ms: float
    requests_done: int
    requests: int
    replays_done: int
    replays: int

    @property
    def fraction(self) -> float:
        """Simulated time covered over the span (1 when everything finished)."""
        if self.replays_done == self.replays:
            return 1.0
        return min(self.simulated_ms / self.span_ms, 0.999) if self.span_ms > 0 else 0.0


def _cycled(xs: list, size: int) -> list:
    """``xs`` repeated to ``size`` entries (a call's padding: copies of its first items)."""
    return [xs[i % len(xs)] for i in range(size)]


def _batches(xs: list, size: int) -> Iterator[list]:
    for lo in range(0, len(xs), size):
        yield xs[lo: lo + size]


def _abstract(split: bool):
    sh = batch_sharding() if split else None
    return lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh)
