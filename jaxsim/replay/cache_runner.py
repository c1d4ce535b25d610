"""Many prefix-caching replays (:mod:`jaxsim.replay.cache_engine`): items grouped by their static shapes (request bucket,
key capacity, pool and table sizes in powers of two) so that nearby configurations and traces share one set of
executables, each item run alone up a ladder of running-list slots (see :func:`run_cached_items`)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from jaxsim._jax import ensure_x64
from jaxsim.kernels.rounds import common_tables
from jaxsim.replay import cache_engine as ce
from jaxsim.replay import executables as X
from jaxsim.replay.engine import SLOTS_FULL, EngineParams, Requests
from jaxsim.replay.runner import capacities, same_replay, seat_classes, seat_key, stretch_lookahead


@dataclass(frozen=True, eq=False)
class CachedItem:
    """One replay with prefix caching: a worker configuration, its requests, their prompt block keys and the
    static capacities that serve them (:func:`~jaxsim.replay.cache_engine.shapes_for`)."""

    params: EngineParams
    requests: Requests
    keys: ce.PromptKeys
    shapes: ce.Shapes


def _group_key(it: CachedItem) -> tuple:
    return it.requests.size, int(it.keys.keys.shape[0]), it.shapes.slots, it.shapes.table_blocks, it.shapes.pool_blocks


def run_cached_items(items: Sequence[CachedItem], *, timeline_len: int, timings: dict | None = None) -> list[ce.CachedReplay]:
    """Run ``items`` grouped by static shapes, one set of executables per group and slot capacity; their results (numpy),
    in order.

    Each item runs alone (not vmapped): the pool is written cell by cell, which XLA does in place for one replay, while
    under ``vmap`` the writes become scatters that copy the pool and the block tables every request (a 200-request
    Mooncake replay: 0.5 s alone, 190 s as a stack of one). A replay climbs a ladder of running-list slots as the
    ordinary engine's single replays do (:func:`~jaxsim.replay.runner.capacities`: 64 slots first when the
    max_num_seqs bucket is above 128, doubling on ``SLOTS_FULL``): a pass's fixed cost grows with the slots (one
    decoding request at 1,024 slots: 85 us a pass; at 64: 11 us). A loop step is a decode stretch
    (:mod:`jaxsim.replay.cache_stretch`, the ordinary engine's lookahead) and one pass. ``timings`` (optional) accumulates ``compile_s``,
    ``run_s``, ``compilations``, ``executables_loaded`` and ``replays_shared`` (executables come through the on-disk
    executable cache). Replays that differ only in max_num_seqs share a result where no seat was reached, as in
    :func:`~jaxsim.replay.runner.run_items` (an admission stops at the first request that does not fit, changing
    nothing, so a seat that stops it first changes nothing either)."""
    ensure_x64()
    out: list = [None] * len(items)
    classes = seat_classes(items, lambda it: (it.requests.size, it.shapes._replace(slots=0), seat_key(it.params, it.requests, it.keys)))
    peaks = _run_indices(items, [c[0] for c in classes], out, timeline_len, timings)
    rest, shared = [], 0
    for first, *others in classes:
        for i in others:
            if same_replay(out[first].result, peaks[first], items[i].params):
                out[i] = out[first]
                shared += 1
            else:
                rest.append(i)
    _run_indices(items, rest, out, timeline_len, timings)
    _add(timings, "replays_shared", shared)
    return out


def _run_indices(items: Sequence[CachedItem], indices: list[int], out: list, timeline_len: int, timings: dict | None) -> dict[int, int]:
    """Run ``items[indices]`` into ``out``, by groups of static shapes; each one's peak of running requests."""
    groups: dict = {}
    for i in indices:
        groups.setdefault(_group_key(items[i]), []).append(i)
    peaks: dict[int, int] = {}
    for group in groups.values():
        shapes = ce.widest(*(items[i].shapes for i in group))
        tables = common_tables([items[i].params.table for i in group])  # one table shape for the group
        jobs = [(i, dataclasses.replace(items[i].params, table=table)) for i, table in zip(group, tables)]
        workers = _workers(len(jobs))
        if workers == 1:
            for i, params in jobs:
                out[i], peaks[i] = _run_one(params, items[i].requests, items[i].keys, shapes, int(timeline_len), timings)
            continue
        # several replays at once, one per core: each is one sequential XLA loop, and XLA runs it without the GIL
        i0, p0 = jobs[0]
        out[i0], peaks[i0] = _run_one(p0, items[i0].requests, items[i0].keys, shapes, int(timeline_len), timings)  # compiles the first rung
        local = [{} for _ in jobs[1:]]
        t0 = time.perf_counter()
        def run(job: tuple, spent: dict) -> tuple[ce.CachedReplay, int]:
            i, params = job
            return _run_one(params, items[i].requests, items[i].keys, shapes, int(timeline_len), spent)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            for (i, _), (res, peak) in zip(jobs[1:], pool.map(run, jobs[1:], local)):
                out[i], peaks[i] = res, peak
        compile_s = sum(t.get("compile_s", 0.0) for t in local)
        for key in ("compile_s", "compilations", "executables_loaded"):
            _add(timings, key, sum(t.get(key, 0) for t in local))
        _add(timings, "run_s", max(time.perf_counter() - t0 - compile_s, 0.0))
    return peaks


def _workers(n_items: int) -> int:
    """Threads for ``n_items`` cached replays: one per CPU core (``JAXSIM_CACHED_THREADS`` overrides); one on other
    backends (a device runs one loop at a time)."""
    if n_items < 2 or jax.default_backend() != "cpu":
        return 1
    want = os.environ.get("JAXSIM_CACHED_THREADS")
    cores = int(want) if want and want.isdigit() and int(want) > 0 else (os.cpu_count() or 1)
    return max(1, min(cores, n_items - 1))


def _run_one(params: EngineParams, rq: Requests, pk: ce.PromptKeys, shapes: ce.Shapes, timeline_len: int,
             timings: dict | None) -> tuple[ce.CachedReplay, int]:
    """One cached replay up the slot ladder (start, advance until done or ``SLOTS_FULL``, widen, ..., finish), and the
    most requests it ran at once."""
    ladder = capacities(shapes.slots, 1)
    lookahead = stretch_lookahead(1)
    exe = executables_for(params, rq, pk, shapes._replace(slots=ladder[0]), timeline_len, lookahead, timings)
    t0 = time.perf_counter()
    s, consts = exe["start"](params, rq)
    never, unlimited = np.float64(np.inf), np.int64(np.iinfo(np.int64).max)
    for k, slots in enumerate(ladder):
        if k:
            s, consts = ce.widen(s, consts, slots)
            exe = executables_for(params, rq, pk, shapes._replace(slots=slots), timeline_len, lookahead, timings)
            t0 = time.perf_counter()
        s = exe["advance"](params, consts, pk, s, never, unlimited)
        if int(s.engine.status) != SLOTS_FULL:
            break
        _add(timings, "run_s", time.perf_counter() - t0)
    res = jax.tree.map(np.asarray, exe["finish"](rq, s, consts))
    _add(timings, "run_s", time.perf_counter() - t0)
    return res, int(s.engine.peak_running)


_COMPILING = threading.Lock()


def executables_for(params, rq, pk, shapes: ce.Shapes, timeline_len: int, lookahead: int, timings: dict | None = None, *,
                    insert: bool = False) -> dict:
    """The ``start``, ``advance`` (decode stretches of up to ``lookahead`` passes), ``finish`` and, with ``insert``, the
    ``insert`` executables of cached replays at ``shapes`` for arguments shaped as these (through the executable
    cache; one thread compiles, the others then find them compiled)."""
    statics = dict(shapes=shapes, timeline_len=timeline_len)
    rq_abs, pk_abs = jax.eval_shape(lambda a: a, rq), jax.eval_shape(lambda a: a, pk)
    s_abs, c_abs = jax.eval_shape(lambda p, r: ce.cached_start(p, r, **statics), params, rq_abs)
    f64, i64 = jax.ShapeDtypeStruct((), jnp.float64), jax.ShapeDtypeStruct((), jnp.int64)
    calls = {"start": X.Call(X.CACHED_START, (params, rq_abs), statics),
             "advance": X.Call(X.CACHED_ADVANCE_UNTIL, (params, c_abs, pk_abs, s_abs, f64, i64), dict(shapes=shapes, lookahead=lookahead)),
             "finish": X.Call(X.CACHED_FINISH, (rq_abs, s_abs, c_abs))}
    if insert:
        calls["insert"] = X.Call(X.CACHED_INSERT, (s_abs, c_abs, rq_abs, pk_abs, i64, f64, i64, i64, i64, i64))
    with _COMPILING:
        X.compile_calls(list(calls.values()), timings)
    return {name: X.executable(c) for name, c in calls.items()}


def _add(timings: dict | None, key: str, value) -> None:
    if timings is not None:
        timings[key] = timings.get(key, 0) + value
