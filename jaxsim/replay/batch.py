"""Many replays in one compiled call: the engine vmapped over configurations (tables, scheduler
settings, acceptance rates) and seeds. A batched replay equals the same replays run one by one.

Tables of different sizes are padded to one common bucket shape (padding never changes a lookup), so
a whole sweep compiles once.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxsim._jax import compile_all, ensure_x64, executable_key, jit_x64
from jaxsim.devices import _mesh, batch_sharding, num_devices, replicated
from jaxsim.errors import BindingError
from jaxsim.kernels import status as st
from jaxsim.kernels.capacity import blocks_for, kv_transfer_ms
from jaxsim.kernels.buckets import pow2_bucket
from jaxsim.kernels.rounds import RoundTable, common_tables
from jaxsim.replay import metrics
from jaxsim.replay.engine import (
    COMPLETED,
    DONE,
    SLOTS_FULL,
    EngineParams,
    ReplayResult,
    Requests,
    is_stochastic,
    advance_stack,
    finish_stack,
    make_params,
    param_axes,
    replay_stack,
    slot_bucket,
    start_stack,
    widen_stack,
    status_name,
)
from jaxsim.replay.traces import Trace, request_bucket


def stack_params(params: Sequence[EngineParams]) -> EngineParams:
    """Stack per-configuration parameters along a leading axis (tables padded to a common shape)."""
    tables = common_tables([p.table for p in params])
    params = [dataclasses.replace(p, table=t) for p, t in zip(params, tables)]
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *params)


def unstack(tree, i: int):
    """Element ``i`` of a stacked pytree (results or parameters)."""
    return jax.tree.map(lambda x: x[i], tree)


replay_many = jit_x64(replay_stack, static_argnames=("slots", "stochastic", "timeline_len", "shared_table"))
replay_many.__doc__ = """Replay a stack of (configuration, trace, PRNG key) items (leading axis of every argument).

Result arrays carry the same leading axis; item ``i`` equals ``replay(p[i], rq[i], keys[i])``."""
start_many = jit_x64(start_stack, static_argnames=("slots", "timeline_len", "shared_table"))
advance_many = jit_x64(advance_stack, static_argnames=("stochastic", "shared_table"))
finish_many = jit_x64(finish_stack)


def advance_split(p: EngineParams, arr_sorted, n_acc, keys, s, *, stochastic: bool, shared_table: bool):
    """:func:`~jaxsim.replay.engine.advance_stack` with the items split over the local devices, each
    device running its own loop over its own items (no cross-device step per pass)."""
    items = P("batch")
    p_spec = jax.tree.map(lambda a: P() if a is None else items, param_axes(p, shared_table), is_leaf=lambda a: a is None)
    local = jax.shard_map(
        lambda *a: advance_stack(*a, stochastic=stochastic, shared_table=shared_table), mesh=_mesh(),
        in_specs=(p_spec, items, items, items, items), out_specs=items, check_vma=False,
    )
    return local(p, arr_sorted, n_acc, keys, s)


_FUNCTIONS = {
    "replay-start": start_many, "replay-advance": advance_many, "replay-finish": finish_many,
    "replay-advance-split": jit_x64(advance_split, static_argnames=("stochastic", "shared_table")),
}

FIRST_SLOTS = 16
"""Batched replays start with this many running-list slots and double them when a replay fills them
(``SLOTS_FULL``), up to their max_num_seqs bucket: a pass costs about 0.1 µs per slot per replay on
XLA:CPU, and most passes run far fewer requests than max_num_seqs allows."""
ADAPTIVE_MIN_ITEMS = 8
"""Groups of fewer replays run at their full capacity at once (each capacity step is one more executable)."""


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
    stacked result (numpy). Runs through the same grouped, bucketed runner as :func:`run_replays`.

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
    items = [(p, requests, jax.random.PRNGKey(s), int(slots), bool(stochastic)) for p, s in zip(params, seeds)]
    return jax.tree.map(lambda *xs: np.stack(xs), *_run_items(items, timeline_len=timeline_len, chunk=chunk))


# ----------------------------------------------------------------------------------------------------
# deployments: replicas, disaggregated prefill/decode pools, bindings


@dataclass(frozen=True, eq=False)
class WorkerPool:
    """One role: a compiled table, its scheduler envelope and KV pool, and how many replicas serve it.

    Requests are routed to replicas round-robin in arrival order.
    """

    table: RoundTable
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    num_gpu_blocks: int
    max_model_len: int
    replicas: int = 1
    state_blocks: int = 0  # fixed blocks every request holds (a grouped cache's window and state groups)

    def params(self, nextn: int, accept_rates, max_passes: int) -> EngineParams:
        return make_params(
            self.table, max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=self.max_num_seqs,
            block_size=self.block_size, num_gpu_blocks=self.num_gpu_blocks, num_draft_tokens=nextn,
            accept_rates=accept_rates, max_model_len=self.max_model_len, max_passes=max_passes,
            state_blocks=self.state_blocks,
        )


@dataclass(frozen=True, eq=False)
class ReplayConfig:
    """A deployment to replay: one aggregated pool, or prefill + decode pools joined by a KV link.

    Disaggregated: a prefill replica computes the prompt and its first token; the KV then travels
    (``input_tokens × kv_bytes_per_token / kv_transfer_bytes_per_s``) to a decode replica, where the
    request arrives with its prompt cached and is observed from its first decode round on (TTFT =
    prefill + transfer + first round).
    """

    name: str
    nextn: int
    accept_rates: np.ndarray
    aggregated: WorkerPool | None = None
    prefill: WorkerPool | None = None
    decode: WorkerPool | None = None
    kv_bytes_per_token: int | None = None
    kv_transfer_bytes_per_s: float | None = None
    data_source: str = "measured"  # what the profile's numbers are (measured, derived, modelled, calibrated)

    def __post_init__(self):
        agg = self.aggregated is not None
        pd = self.prefill is not None and self.decode is not None
        if agg == pd:
            raise ValueError(f"{self.name}: give either an aggregated pool or a prefill and a decode pool")
        if pd and not (self.kv_bytes_per_token and self.kv_transfer_bytes_per_s and self.kv_transfer_bytes_per_s > 0):
            raise ValueError(f"{self.name}: disaggregated replay needs kv_bytes_per_token and a positive KV link bandwidth")

    @property
    def mode(self) -> str:
        return "aggregated" if self.aggregated is not None else "disaggregated"

    @property
    def pools(self) -> tuple[WorkerPool, ...]:
        return (self.aggregated,) if self.aggregated is not None else (self.prefill, self.decode)

    @property
    def stochastic(self) -> bool:
        return is_stochastic(np.asarray(self.accept_rates)[: self.nextn])

    def rejection_reasons(self, input_tokens) -> np.ndarray:
        """Why each request would be rejected ('' when a worker can run it): the plain-numpy twin of
        :func:`jaxsim.replay.engine.accepted_mask` applied to every pool the request passes through."""
        inp = np.asarray(input_tokens, np.int64)
        out = np.full(inp.shape, "", dtype=object)
        for role, pool in zip(("",) if self.aggregated is not None else ("prefill ", "decode "), self.pools):
            blocks = blocks_for(inp, pool.block_size) + pool.state_blocks
            too_long = (inp >= pool.max_model_len) & (out == "")
            for i in np.flatnonzero(too_long):
                out[i] = f"{role}prompt of {int(inp[i]):,} tokens >= max_model_len {pool.max_model_len:,}"
            too_big = (blocks > pool.num_gpu_blocks) & (out == "")
            for i in np.flatnonzero(too_big):
                out[i] = f"{role}prompt needs {int(blocks[i]):,} KV blocks > the pool's {pool.num_gpu_blocks:,}"
        return out


def _pool_from_role(rb, block_size: int, context_length: int) -> WorkerPool:
    if rb.blocks.num_gpu_blocks is None:
        raise BindingError(f"roles.{rb.name}: no KV block count for replay ({rb.blocks.problem})")
    return WorkerPool(
        table=rb.table, max_num_batched_tokens=int(rb.max_num_batched_tokens), max_num_seqs=int(rb.max_num_seqs),
        block_size=int(block_size), num_gpu_blocks=int(rb.blocks.num_gpu_blocks),
        max_model_len=min(int(rb.kv.context_length), int(context_length)), replicas=int(rb.replicas),
        state_blocks=int(rb.blocks.state_blocks),
    )


def config_from_binding(b, name: str | None = None) -> ReplayConfig:
    """A :class:`ReplayConfig` from a :class:`jaxsim.deploy.binding.Binding`."""
    label = name or Path(str(b.config.source)).stem
    pools = {role: _pool_from_role(rb, b.block_size, b.context_length) for role, rb in b.roles.items()}
    rates = np.asarray(b.accept_rates, np.float64)
    if b.mode == "aggregated":
        return ReplayConfig(label, int(b.nextn), rates, aggregated=pools["aggregated"], data_source=b.data_source)
    return ReplayConfig(
        label, int(b.nextn), rates, prefill=pools["prefill"], decode=pools["decode"],
        kv_bytes_per_token=int(b.prefill.kv_bytes_per_token), kv_transfer_bytes_per_s=float(b.kv_transfer_bytes_per_s),
        data_source=b.data_source,
    )


@dataclass(eq=False)
class ReplayOutcome:
    """One (configuration, seed) replay of a trace: per-request columns (trace order), aggregates and
    the replay status (``completed`` unless a pass left measured support, a request can never fit, or
    the pass limit was hit)."""

    config: ReplayConfig
    seed: int
    status: int
    status_text: str
    requests: dict
    summary: dict
    timeline: list[dict] | None = None  # one pass timeline per worker pool (metrics.timeline_table)
    failed_query: tuple | None = None

    @property
    def failure(self) -> str:
        """The stopping pass's lookup (for a replay stopped outside measured support), else ''."""
        if self.failed_query is None:
            return ""
        np_, pt, pk, nd, dk = self.failed_query
        parts = []
        if np_:
            parts.append(f"prefill(batch={np_}, tokens={pt}, kv={pk})")
        if nd:
            parts.append(f"decode(batch={nd}, kv={dk})")
        return " + ".join(parts)


def _max_passes(trace: Trace) -> int:
    return int(16 * (int(trace.output_tokens.sum()) + int(trace.input_tokens.sum() // 16) + len(trace)) + 1000)


def _np_stack(trees):
    """Stack pytrees of equal structure along a new leading axis on the host (numpy: no device op, so
    nothing to compile per leaf shape)."""
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *trees)


_EXECUTABLES: dict = {}


def _compile_all(specs, timings: dict | None) -> None:
    """The executables ``specs`` ((name, args, statics); args may be ``ShapeDtypeStruct``) need that
    this process has not got yet (once per shape bucket), through :func:`~jaxsim._jax.compile_all`
    (the executable cache, else parallel XLA compilation). Wall time goes to ``timings``."""
    t0 = time.perf_counter()
    todo = {}
    for name, args, statics in specs:
        key = executable_key(name, args, statics)
        if key not in _EXECUTABLES:
            todo.setdefault(key, (name, _FUNCTIONS[name], args, statics))
    if not todo:
        return
    exes, compiled, loaded = compile_all(list(todo.values()))
    _EXECUTABLES.update(zip(todo, exes))
    if timings is not None:
        timings["compile_s"] = timings.get("compile_s", 0.0) + time.perf_counter() - t0
        timings["compilations"] = timings.get("compilations", 0) + compiled
        timings["executables_loaded"] = timings.get("executables_loaded", 0) + loaded


def _levels(slots: int, n_items: int) -> list[int]:
    """Slot capacities a group of replays runs through: FIRST_SLOTS, doubling, up to ``slots``."""
    if n_items < ADAPTIVE_MIN_ITEMS or slots <= FIRST_SLOTS:
        return [slots]
    out = [FIRST_SLOTS]
    while out[-1] < slots:
        out.append(min(2 * out[-1], slots))
    return out


def _call_size(n: int, chunk: int | None) -> int:
    """Items per call for ``n`` pending items: powers of two up to 16, then multiples of 16 (padding
    stays small), at most ``chunk``."""
    size = pow2_bucket(n) if n <= 16 else -(-n // 16) * 16
    return size if not chunk else max(1, min(int(chunk), size))


def _run_items(items, *, timeline_len: int, chunk: int | None, progress=None, timings: dict | None = None) -> list:
    """Run (params, requests, key, slots, stochastic) items grouped by static arguments.

    Tables are padded to common shapes, so a group (same trace size and sampling mode) shares its
    compilations; a group whose items all use one table passes it once (not a copy per item). Large
    groups run through growing slot capacities (:func:`_levels`), capacity by capacity: the replays
    that fill their slots (``SLOTS_FULL``) continue together at the next capacity from where they
    stopped, the others are done. One executable per capacity, one to start, one to finish.
    ``timings`` (optional) accumulates ``compile_s``, ``run_s``, ``compilations`` and
    ``executables_loaded``."""
    tables = {id(it[0].table): it[0].table for it in items}
    padded = dict(zip(tables, common_tables(list(tables.values()))))
    groups: dict = {}
    for i, it in enumerate(items):
        groups.setdefault((it[4], it[1].size), []).append(i)
    runs = [_Group(items, idx, padded, stochastic, timeline_len, chunk) for (stochastic, _), idx in groups.items()]
    _compile_all([spec for g in runs for spec in g.specs()], timings)
    out = [None] * len(items)
    for g in runs:
        t0 = time.perf_counter()
        for i, res in g.run(progress):
            out[i] = res
        if timings is not None:
            timings["run_s"] = timings.get("run_s", 0.0) + time.perf_counter() - t0
    return out


class _Group:
    """Items of one group on the host: stacked parameters, requests and keys, and each item's slot
    capacities (start, then doubling up to its max_num_seqs bucket)."""

    def __init__(self, items, idx, padded, stochastic: bool, timeline_len: int, chunk: int | None):
        self.idx, self.chunk, self.timeline_len = list(idx), chunk, int(timeline_len)
        self.levels = [_levels(items[i][3], len(idx)) for i in idx]
        tids = {id(items[i][0].table) for i in idx}
        self.shared_table = len(tids) == 1
        shared = {id(x) for x in jax.tree.leaves(padded[next(iter(tids))])} if self.shared_table else set()
        params = [eqx.tree_at(lambda q: q.table, items[i][0], padded[id(items[i][0].table)]) for i in idx]
        self.shared = shared
        self.pp = jax.tree.map(lambda *xs: xs[0] if id(xs[0]) in shared else np.stack([np.asarray(x) for x in xs]), *params)
        self.rq = _np_stack([items[i][1] for i in idx])
        self.keys = np.stack([np.asarray(items[i][2]) for i in idx])
        self.run_statics = dict(stochastic=bool(stochastic), shared_table=self.shared_table)

    def _sizes(self):
        """Call sizes: per (capacity, last) an upper bound on the items that run at that capacity
        (``last``: it is their max_num_seqs bucket, so they run to the end there; the others may fill
        their slots and stop early, so the two never share a call); for starting; for finishing."""
        bound: dict = {}
        for lv in self.levels:
            for x in lv:
                bound[(x, x == lv[-1])] = bound.get((x, x == lv[-1]), 0) + 1
        starts: dict = {}
        for lv in self.levels:
            starts[lv[0]] = starts.get(lv[0], 0) + 1
        size = lambda n: _call_size(n, self.chunk)  # noqa: E731
        return ({k: size(n) for k, n in sorted(bound.items())}, {x: size(n) for x, n in starts.items()}, size(len(self.idx)))

    def _args(self, sel, size: int, abstract: bool = False):
        """Parameters, requests and keys of items ``sel`` (positions in the group), padded to ``size``
        with copies, placed on the devices (``abstract``: their shapes and placements only); and the
        placement of per-item arrays."""
        sel = np.resize(np.asarray(sel), size)
        split = num_devices() > 1 and size % num_devices() == 0  # items split over the devices, a shared table copied to each
        items, rep = (batch_sharding(), replicated()) if split else (None, None)
        if abstract:
            place = lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh or getattr(x, "sharding", None))  # noqa: E731
        else:
            place = (lambda x, sh: jax.device_put(x, sh)) if split else (lambda x, sh: x)
        put = lambda x: place(x, items)  # noqa: E731
        pick = lambda x: x[sel]  # noqa: E731
        pp = jax.tree.map(lambda x: place(x, rep) if id(x) in self.shared else put(pick(x)), self.pp)
        return pp, jax.tree.map(lambda x: put(pick(x)), self.rq), put(self.keys[sel]), put, split

    def specs(self):
        """(name, arguments, statics) of every executable the group needs; arguments as the devices will see them."""
        levels, starts, fin = self._sizes()
        out = []
        for lv, size in starts.items():
            pp, rr, *_ = self._args([0], size, abstract=True)
            out.append(("replay-start", (pp, rr), self._start_statics(lv)))
        for (lv, _), size in levels.items():
            pp, rr, kk, put, split = self._args([0], size, abstract=True)
            s_abs, aux_abs = jax.eval_shape(lambda p, r, lv=lv: start_stack(p, r, slots=lv, timeline_len=self.timeline_len,
                                                                             shared_table=self.shared_table), pp, rr)
            sds = _abstract(split)
            out.append((_advance_name(split), (pp, sds(aux_abs[0]), sds(aux_abs[1]), kk, jax.tree.map(sds, s_abs)), self.run_statics))
        s_abs, aux_abs = widen_stack(s_abs, aux_abs, 0)
        pp, rr, kk, put, split = self._args([0], fin, abstract=True)
        s_abs, aux_abs = jax.tree.map(lambda a: jax.ShapeDtypeStruct((fin,) + a.shape[1:], a.dtype), (s_abs, aux_abs))
        out.append(("replay-finish", (rr, jax.tree.map(_abstract(split), s_abs), jax.tree.map(_abstract(split), aux_abs)), {}))
        return out

    def _start_statics(self, lv: int) -> dict:
        return dict(slots=lv, timeline_len=self.timeline_len, shared_table=self.shared_table)

    def run(self, progress=None):
        """Yield (item index, result) for every item of the group."""
        host = lambda t: jax.tree.map(np.asarray, t)  # noqa: E731
        levels, starts, fin = self._sizes()
        n = len(self.idx)
        state: list = [None] * n  # (s, aux) of a pending item at its current capacity
        done: list = [None] * n  # (s, aux) of a finished item, slot arrays emptied
        at = [lv[0] for lv in self.levels]
        for (lv, last), size in levels.items():
            new = [j for j in range(n) if at[j] == lv and state[j] is None and done[j] is None]  # starting here
            for lo in range(0, len(new), starts.get(lv, 1)):
                sel = new[lo: lo + starts[lv]]
                pp, rr, *_ = self._args(sel, starts[lv])
                s, aux = host(_call("replay-start", (pp, rr), self._start_statics(lv)))
                for k, j in enumerate(sel):
                    state[j] = unstack((s, aux), k)
            pending = [j for j in range(n) if state[j] is not None and at[j] == lv and (self.levels[j][-1] == lv) == last]
            for lo in range(0, len(pending), size):
                sel = pending[lo: lo + size]
                pp, rr, kk, put, split = self._args(sel, size)
                s, aux = _np_stack([state[j] for j in np.resize(np.asarray(sel), size)])
                s = host(_call(_advance_name(split), (pp, put(aux[0]), put(aux[1]), kk, jax.tree.map(put, s)), self.run_statics))
                finished = 0
                for k, j in enumerate(sel):
                    sj, auxj = unstack((s, aux), k)
                    if int(sj.status) == SLOTS_FULL:
                        at[j] = self.levels[j][self.levels[j].index(lv) + 1]
                        state[j] = widen_stack(sj, auxj, at[j])
                    else:
                        state[j], done[j] = None, widen_stack(sj, auxj, 0)
                        finished += 1
                if progress is not None and finished:
                    progress(finished)
        for lo in range(0, n, fin):
            sel = list(range(lo, min(lo + fin, n)))
            pp, rr, kk, put, split = self._args(sel, fin)
            s, aux = _np_stack([done[j] for j in np.resize(np.asarray(sel), fin)])
            res = host(_call("replay-finish", (rr, jax.tree.map(put, s), jax.tree.map(put, aux)), {}))
            for k, j in enumerate(sel):
                yield self.idx[j], unstack(res, k)


def _advance_name(split: bool) -> str:
    return "replay-advance-split" if split else "replay-advance"


def _abstract(split: bool):
    sh = batch_sharding() if split else None
    return lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh)


def _call(name: str, args, statics: dict):
    return _EXECUTABLES[executable_key(name, args, statics)](*args)


def _split(n: int, replicas: int) -> list[np.ndarray]:
    return [np.arange(r, n, replicas) for r in range(replicas)]


def _sub_requests(arrival, inp, out, idx, size, materialized=False) -> Requests:
    pad = size - idx.size
    return Requests(
        arrival_ms=jnp.asarray(np.concatenate([arrival[idx], np.full(pad, np.inf)])),
        input_tokens=jnp.asarray(np.concatenate([inp[idx], np.ones(pad, np.int64)])),
        output_tokens=jnp.asarray(np.concatenate([out[idx], np.ones(pad, np.int64)])),
        valid=jnp.asarray(np.arange(size) < idx.size),
        materialized=jnp.full((size,), bool(materialized)),
    )


def _stage(pool: WorkerPool, nextn, rates, arrival, inp, out, seed, stage, materialized, max_passes):
    """Items of one pool for one replay: requests (sorted by arrival) split round-robin over replicas."""
    parts = _split(arrival.size, pool.replicas)
    size = request_bucket(max(p.size for p in parts))
    p = pool.params(nextn, rates, max_passes)
    base = jax.random.PRNGKey(int(seed))
    return parts, [
        (p, _sub_requests(arrival, inp, out, idx, size, materialized), jax.random.fold_in(jax.random.fold_in(base, stage), r),
         slot_bucket(pool.max_num_seqs), is_stochastic(np.asarray(rates)[:nextn]))
        for r, idx in enumerate(parts)
    ]


_FIELDS = ("first_token_ms", "second_token_ms", "last_token_ms", "output_tokens", "decode_rounds", "preemptions",
           "admissions", "token_gap_sq_ms2", "terminal")


def _gather(parts, results, n: int) -> dict:
    cols = {f: None for f in _FIELDS}
    for idx, res in zip(parts, results):
        for f in _FIELDS:
            a = np.asarray(getattr(res, f))[: idx.size]
            if cols[f] is None:
                cols[f] = np.zeros(n, a.dtype) if a.dtype != np.float64 else np.full(n, np.nan)
            cols[f][idx] = a
    return cols


def _worst(results) -> tuple[int, tuple | None]:
    for r in results:
        if int(r.status) != COMPLETED:
            q = tuple(int(x) for x in np.asarray(r.failed_query)) if int(r.status) >= st.FIRST_UNSUPPORTED else None
            return int(r.status), q
    return COMPLETED, None


def run_replays(
    configs: Sequence[ReplayConfig],
    trace: Trace,
    seeds: Sequence[int] = (0,),
    *,
    timeline: bool = False,
    timeline_len: int | None = None,
    chunk: int | None = 256,
    sla: metrics.SLA | None = None,
    progress=None,
    timings: dict | None = None,
) -> list[ReplayOutcome]:
    """Replay ``trace`` for every configuration and seed; one compiled call per group of static shapes.

    ``progress(k)`` (optional) is called after every batch of ``k`` replicas has finished. With
    ``timeline``, each worker keeps its first ``timeline_len`` passes (default: a bucket above the
    trace's output tokens plus four passes per request, at most 2**18). ``timings`` (optional dict)
    accumulates ``compile_s`` (lowering + XLA compilation, or an executable-cache load), ``run_s``,
    ``compilations`` and ``executables_loaded``.
    """
    ensure_x64()
    arrival, inp, out = trace.arrival_ms, trace.input_tokens, trace.output_tokens
    n = len(trace)
    if timeline_len is None:
        timeline_len = min(request_bucket(int(out.sum()) + 4 * len(trace)), 1 << 18)
    tl = int(timeline_len) if timeline else 0
    mp = _max_passes(trace)
    jobs = [(c, int(s)) for c in configs for s in seeds]
    # stage 1: aggregated pools, or the prefill pools of disaggregated configs
    items, plan = [], []
    for c, s in jobs:
        if c.mode == "aggregated":
            parts, its = _stage(c.aggregated, c.nextn, c.accept_rates, arrival, inp, out, s, 0, False, mp)
        else:
            parts, its = _stage(c.prefill, c.nextn, c.accept_rates, arrival, inp, np.ones_like(out), s, 0, False, mp)
        plan.append((parts, len(items), len(its)))
        items += its
    res1 = _run_items(items, timeline_len=tl, chunk=chunk, progress=progress, timings=timings)
    # stage 2: decode pools, fed by prefill completions plus the KV transfer
    items2, plan2 = [], {}
    for j, (c, s) in enumerate(jobs):
        if c.mode != "disaggregated":
            continue
        parts, lo, k = plan[j]
        pre = _gather(parts, res1[lo: lo + k], n)
        ready = pre["terminal"] == DONE
        xfer = kv_transfer_ms(inp, float(c.kv_bytes_per_token), float(c.kv_transfer_bytes_per_s))
        arr2 = np.where(ready, pre["last_token_ms"] + xfer, np.inf)
        order = np.argsort(arr2, kind="stable")
        order = order[np.isfinite(arr2[order])]
        if order.size == 0:
            plan2[j] = (pre, order, [], len(items2), 0)
            continue
        parts2, its = _stage(c.decode, c.nextn, c.accept_rates, arr2[order], inp[order], out[order], s, 1, True, mp)
        plan2[j] = (pre, order, parts2, len(items2), len(its))
        items2 += its
    res2 = _run_items(items2, timeline_len=tl, chunk=chunk, progress=progress, timings=timings) if items2 else []
    outcomes = []
    for j, (c, s) in enumerate(jobs):
        parts, lo, k = plan[j]
        stage1 = res1[lo: lo + k]
        if c.mode == "aggregated":
            cols = _gather(parts, stage1, n)
            status, failed = _worst(stage1)
            tls = [metrics.timeline_table(r) for r in stage1] if tl else None
        else:
            pre, order, parts2, lo2, k2 = plan2[j]
            stage2 = res2[lo2: lo2 + k2]
            dec = _gather(parts2, stage2, order.size) if k2 else {f: np.zeros(0) for f in _FIELDS}
            cols = {f: np.full(n, np.nan) if pre[f].dtype == np.float64 else np.zeros(n, pre[f].dtype) for f in _FIELDS}
            for f in _FIELDS:
                if k2:
                    cols[f][order] = dec[f]
            cols["preemptions"] = pre["preemptions"] + cols["preemptions"]
            cols["admissions"] = pre["admissions"] + cols["admissions"]
            cols["terminal"] = np.where(pre["terminal"] == DONE, cols["terminal"], pre["terminal"]).astype(np.int32)
            status, failed = _worst(stage1 + stage2)
            tls = [metrics.timeline_table(r) for r in stage1 + stage2] if tl else None
        view = SimpleNamespace(**{f: cols[f] for f in _FIELDS})
        req = metrics.per_request(view, arrival, inp, out, n=n)
        req["row"] = trace.row
        outcomes.append(ReplayOutcome(c, s, status, status_name(status), req, metrics.aggregate(req, sla), tls, failed))
    return outcomes
