"""Replaying deployments: every (configuration, seed) of a trace, one compiled call per group of static
shapes. A pool's requests go to its replicas as its router decides: round-robin unless the deployment
routes them by load or by KV cache, with the router in the loop (:mod:`jaxsim.replay.online`).
Aggregated deployments replay in one stage; disaggregated ones in two: the prefill pools, then the decode pools, fed by prefill completions
plus the KV transfer. Per-request columns come back in trace order, with aggregates, timelines and the
replay status (:class:`~jaxsim.replay.deployment.ReplayOutcome`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from types import SimpleNamespace

import jax
import numpy as np

from jaxsim._jax import ensure_x64
from jaxsim.kernels import status as st
from jaxsim.kernels.capacity import kv_transfer_ms
from jaxsim.replay import cache_engine as ce
from jaxsim.replay import metrics
from jaxsim.replay.cache_runner import CachedItem, run_cached_items
from jaxsim.replay.deployment import ReplayConfig, ReplayOutcome, WorkerPool
from jaxsim.replay.engine import (
    COMPLETED,
    DONE,
    TERMINAL_NAMES,
    UNFINISHED,
    ReplayResult,
    Requests,
    is_stochastic,
    slot_bucket,
    status_name,
)
from jaxsim.replay.online import run_routed
from jaxsim.replay.pd_closed_loop import closed_loop_send_ms, released_send_ms
from jaxsim.replay.routing import RoutingSummary, round_robin
from jaxsim.replay.runner import ReplayItem, ReplayProgress, run_items
from jaxsim.replay.sessions import run_sessions
from jaxsim.replay.traces import Trace, request_bucket
from jaxsim.sla import Goodput

_FIELDS = ("first_token_ms", "second_token_ms", "last_token_ms", "output_tokens", "decode_rounds", "preemptions",
           "admissions", "token_gap_sq_ms2", "terminal", "sent_ms")
"""The per-request result columns a deployment's replay gathers from its workers."""


@dataclass(frozen=True, eq=False)
class Stage:
    """One pool's share of one replay: the requests it serves (sorted by arrival, as columns), split over
    the pool's replicas (``assignment``: each request's replica; None: round-robin), each replica one
    :class:`~jaxsim.replay.runner.ReplayItem`."""

    pool: WorkerPool
    nextn: int
    accept_rates: np.ndarray
    arrival_ms: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    seed: int
    stream: int  # the PRNG stream of the stage within the replay (0: first stage, 1: decode stage)
    materialized: bool  # requests arrive with their prompt KV present (a decode pool)
    max_passes: int
    max_concurrency: int = 0  # closed loop, per replica (ReplayConfig.max_concurrency)
    pad_to: int = 0  # requests per replica padded to at least this (stages of different sizes then share compilations)
    assignment: np.ndarray | None = None  # each request's replica (stage order); None: round-robin
    keys: tuple | None = None  # prefix caching: each request's prompt block keys (stage order); None: no cache
    num_keys: int = 0  # distinct keys

    @cached_property
    def replica(self) -> np.ndarray:
        """Each request's replica (stage order)."""
        return round_robin(self.arrival_ms.size, self.pool.replicas) if self.assignment is None else np.asarray(self.assignment)

    @cached_property
    def parts(self) -> list[np.ndarray]:
        """Each replica's requests (positions in the stage's columns, in arrival order)."""
        return [np.flatnonzero(self.replica == r) for r in range(self.pool.replicas)]

    @cached_property
    def items(self) -> list[ReplayItem]:
        size = max(request_bucket(max(p.size for p in self.parts)), int(self.pad_to))
        params = self.pool.params(self.nextn, self.accept_rates, self.max_passes, self.max_concurrency)
        key = jax.random.fold_in(jax.random.PRNGKey(int(self.seed)), self.stream)
        stochastic = is_stochastic(np.asarray(self.accept_rates)[: self.nextn])
        # a closed loop never runs more than its clients: no slot capacity above them is needed
        slots = slot_bucket(min(self.pool.max_num_seqs, self.max_concurrency or self.pool.max_num_seqs))
        return [ReplayItem(params, self._requests(idx, size), jax.random.fold_in(key, r), slots, stochastic)
                for r, idx in enumerate(self.parts)]

    @cached_property
    def cached_items(self) -> list[CachedItem]:
        """The replicas' replays with prefix caching (each replica its own cache)."""
        size = max(request_bucket(max(p.size for p in self.parts)), int(self.pad_to))
        params = self.pool.params(self.nextn, self.accept_rates, self.max_passes, self.max_concurrency)
        pool = self.pool
        out = []
        for idx in self.parts:
            keys, capacity = ce.prompt_keys([self.keys[i] for i in idx.tolist()], self.num_keys, size)
            shapes = ce.shapes_for(self.input_tokens[idx], self.output_tokens[idx], max_num_seqs=pool.max_num_seqs,
                                   block_size=pool.block_size,
                                   num_gpu_blocks=pool.num_gpu_blocks, max_model_len=pool.max_model_len, num_keys=capacity)
            out.append(CachedItem(params, self._requests(idx, size), keys, shapes))
        return out

    def _requests(self, idx: np.ndarray, size: int) -> Requests:
        pad = size - idx.size
        return Requests(
            # device_put, not jnp.asarray: in this JAX, asarray of a host array traces and dispatches a small
            # jitted function per shape (about 10 ms each in a fresh process)
            arrival_ms=jax.device_put(np.concatenate([self.arrival_ms[idx], np.full(pad, np.inf)])),
            input_tokens=jax.device_put(np.concatenate([self.input_tokens[idx], np.ones(pad, np.int64)]).astype(np.int64)),
            output_tokens=jax.device_put(np.concatenate([self.output_tokens[idx], np.ones(pad, np.int64)]).astype(np.int64)),
            valid=jax.device_put(np.arange(size) < idx.size),
            materialized=jax.device_put(np.full((size,), bool(self.materialized))),
        )


@dataclass(eq=False)
class StageRun:
    """A stage and, once run, its replicas' results."""

    stage: Stage | None  # None: no request reaches this pool
    results: list[ReplayResult] = field(default_factory=list)
    hit_tokens: list[np.ndarray] = field(default_factory=list)  # per replica: prompt tokens read from the cache (first admission)

    @property
    def cached(self) -> bool:
        return self.stage is not None and self.stage.keys is not None

    @property
    def items(self) -> list[ReplayItem]:
        return [] if self.stage is None else self.stage.items

    def columns(self, n: int) -> dict[str, np.ndarray]:
        """Per-request result columns over the stage's ``n`` requests (unserved ones: nan, 0)."""
        cols: dict = {f: None for f in _FIELDS}
        for idx, res in zip(self.stage.parts, self.results):
            for f in _FIELDS:
                a = np.asarray(getattr(res, f))[: idx.size]
                if cols[f] is None:
                    cols[f] = np.zeros(n, a.dtype) if a.dtype != np.float64 else np.full(n, np.nan)
                cols[f][idx] = a
        cols["cache_hit_tokens"] = np.zeros(n, np.int64)
        for idx, hits in zip(self.stage.parts, self.hit_tokens):
            cols["cache_hit_tokens"][idx] = np.asarray(hits)[: idx.size]
        return cols


@dataclass(eq=False)
class DecodeStage:
    """The decode stage of a disaggregated replay: the prefill stage's columns (trace order), the
    requests prefilled in time (trace positions, in order of their arrival at the decode pool) and
    the decode pool's run over them."""

    prefill: dict[str, np.ndarray]
    order: np.ndarray
    run: StageRun


@dataclass(eq=False)
class _Job:
    """One (configuration, seed) replay: its first stage (the aggregated pool, or the prefill pool) and,
    disaggregated, its decode stage."""

    config: ReplayConfig
    seed: int
    trace: Trace
    first: StageRun
    decode: DecodeStage | None = None
    routing: RoutingSummary | None = None  # how the first stage's requests were routed (a routed pool of several replicas)
    sent_ms: np.ndarray | None = None  # a disaggregated closed loop: each request's send time (trace order; NaN: never sent)
    stage_trace: Trace | None = None  # a disaggregated closed loop: its requests that were sent, arriving when sent
    stage_rows: np.ndarray | None = None  # ... and their positions in the trace
    columns: dict[str, np.ndarray] | None = None  # a disaggregated closed loop: its columns, built once by its check


def _max_passes(trace: Trace) -> int:
    return int(16 * (int(trace.output_tokens.sum()) + int(trace.input_tokens.sum() // 16) + len(trace)) + 1000)


def prefix_caching_mode(c: ReplayConfig, trace: Trace) -> str:
    """How a replay of ``trace`` on ``c`` treats shared prompt prefixes: ``modelled`` (vLLM's block cache,
    :mod:`jaxsim.replay.cache_engine`), ``off`` (the role turns it off), ``no hash_ids`` (the trace says nothing
    of shared prefixes: every prompt computed), or ``not modelled: <why>`` (every prompt computed, an upper bound
    on prefill work; replay with ``prefix_caching = false`` to say so)."""
    pool = c.aggregated if c.mode == "aggregated" else c.prefill
    if not pool.prefix_caching:
        return "off"
    if trace.hash_ids is None:
        return "no hash_ids"
    why = ("disaggregated deployment" if c.mode != "aggregated" else "speculative decoding" if c.nextn
           else "grouped KV cache" if pool.state_blocks else "")
    return f"not modelled: {why}" if why else "modelled"


def _first_stage(c: ReplayConfig, seed: int, trace: Trace, max_passes: int, pad_to: int = 0) -> Stage:
    """The aggregated pool, or the prefill pool (each request computes its prompt and first token); with its
    prompts' block keys when the prefix cache is modelled."""
    pool, out = (c.aggregated, trace.output_tokens) if c.mode == "aggregated" else (c.prefill, np.ones_like(trace.output_tokens))
    closed = int(c.max_concurrency) if c.mode == "aggregated" else 0  # a disaggregated closed loop: send times solved first
    stage = Stage(pool, c.nextn, c.accept_rates, trace.arrival_ms, trace.input_tokens, out, seed, stream=0,
                  materialized=False, max_passes=max_passes, max_concurrency=closed, pad_to=pad_to)
    if prefix_caching_mode(c, trace) != "modelled":
        return stage
    keys, num_keys = _block_keys(pool, trace)
    return dataclasses.replace(stage, keys=tuple(keys), num_keys=num_keys)


def _decode_stage(c: ReplayConfig, seed: int, trace: Trace, prefill: StageRun, max_passes: int, pad_to: int = 0) -> DecodeStage:
    """Requests prefilled to completion reach the decode pool after their KV transfer, prompt cached."""
    pre = prefill.columns(len(trace))
    ready = pre["terminal"] == DONE
    xfer = kv_transfer_ms(trace.input_tokens, float(c.kv_bytes_per_token), float(c.kv_transfer_bytes_per_s))
    arrival = np.where(ready, pre["last_token_ms"] + xfer, np.inf)
    order = np.argsort(arrival, kind="stable")
    order = order[np.isfinite(arrival[order])]
    stage = None
    if order.size:
        stage = Stage(c.decode, c.nextn, c.accept_rates, arrival[order], trace.input_tokens[order], trace.output_tokens[order],
                      seed, stream=1, materialized=True, max_passes=max_passes, pad_to=pad_to)
    return DecodeStage(pre, order, StageRun(stage))


def _run_stages(runs: list[StageRun], **kw) -> None:
    """Run every stage's items in one :func:`~jaxsim.replay.runner.run_items` call, and the stages with prefix
    caching in one :func:`~jaxsim.replay.cache_runner.run_cached_items` call; results go to each stage.

    A stage whose requests share no prompt block (:func:`_shares_no_block`) runs with the plain engine first: no
    request can read a block another one cached, and only a preempted request can read its own, so a stage whose
    replicas preempted nothing is exactly its cached replay (no hits; the same passes: tests/test_replay_prefix_caching.py)
    at the plain engine's speed; a stage where a replica preempted runs again with the cache."""
    plain = [r for r in runs if not r.cached or _shares_no_block(r.stage)]
    items = [it for r in plain for it in r.items]
    if items:
        _distribute(plain, run_items(items, **kw), kw.get("timings"))
    cached = [r for r in runs if r.cached and (not _shares_no_block(r.stage) or any(_preempted(x) for x in r.results))]
    timings = kw.get("timings")
    if timings is not None:  # the plain run of a stage that runs again does not count
        kept = {id(x) for r in plain if r not in cached for x in r.results}
        dropped = [x for x in _distinct([x for r in cached for x in r.results]) if id(x) not in kept]
        timings["passes"] = timings.get("passes", 0) - sum(int(x.num_passes) for x in dropped)
        timings["loop_steps"] = timings.get("loop_steps", 0) - sum(int(x.num_steps) for x in dropped)
    if cached:
        out = run_cached_items([it for r in cached for it in r.stage.cached_items], timeline_len=kw["timeline_len"],
                               timings=kw.get("timings"))
        _distribute(cached, [o.result for o in out], kw.get("timings"))
        lo = 0
        for r in cached:
            r.hit_tokens = [o.first_hit_tokens for o in out[lo: lo + len(r.results)]]
            lo += len(r.results)


def _shares_no_block(stage: Stage) -> bool:
    """Whether no prompt block key of the stage's requests appears twice (each key one request's, once)."""
    return stage.keys is not None and sum(int(k.size) for k in stage.keys) == stage.num_keys


def _preempted(result: ReplayResult) -> bool:
    return bool(np.any(np.asarray(result.preemptions) > 0))


def _distinct(results: list) -> list:
    """``results`` without repeats of one object."""
    return list({id(r): r for r in results}.values())


def _distribute(runs: list[StageRun], results: list[ReplayResult], timings: dict | None) -> None:
    """The stages' results, in their order (each its replicas'); passes and loop steps counted in ``timings``."""
    if timings is not None:  # scheduler passes and loop steps (a decode stretch and a pass each) replayed: a result
        # replays that differ only in max_num_seqs share (jaxsim.replay.runner.run_items) counts once
        replayed = _distinct(results)
        timings["passes"] = timings.get("passes", 0) + sum(int(r.num_passes) for r in replayed)
        timings["loop_steps"] = timings.get("loop_steps", 0) + sum(int(r.num_steps) for r in replayed)
    lo = 0
    for r in runs:
        n = len(r.stage.parts)
        r.results = results[lo: lo + n]
        lo += n


def _routed(j: _Job) -> bool:
    """Whether the job's first stage is routed by state (a router other than round-robin, several replicas)."""
    st_ = j.first.stage
    return st_ is not None and j.config.router.routed and st_.pool.replicas > 1


def _multi_turn(j: _Job) -> bool:
    """Whether the job's trace has sessions with later turns (sent as earlier turns complete)."""
    return j.trace.sessions is not None and bool(np.any(j.trace.sessions.previous >= 0)) and j.first.stage is not None


def _block_keys(pool: WorkerPool, trace: Trace) -> tuple[list[np.ndarray], int]:
    """Each request's prompt block keys at the pool's block size (trace order, from its hash ids), and how many differ."""
    from jaxsim.replay.prefix_cache import block_keys  # noqa: PLC0415

    keys, num_keys = block_keys(trace.hash_ids, trace.input_tokens, int(trace.trace_block_size), pool.block_size)
    return keys, int(num_keys)


def _prompt_keys(stage: Stage, trace: Trace) -> list[np.ndarray] | None:
    """The keys a router in the loop scores overlap with (stage order = trace order); None when the trace has no hash ids."""
    if stage.keys is not None:
        return list(stage.keys)
    return None if trace.hash_ids is None else _block_keys(stage.pool, trace)[0]


class _LoopProgress:
    """Progress of the replays that run their engines in the loop (routers, sessions), one after the other, as
    :class:`~jaxsim.replay.runner.ReplayProgress` snapshots: each replay's clock up to its last arrival."""

    def __init__(self, report, jobs: list[_Job]):
        self.report = report
        self.span = np.array([float(np.max(j.trace.arrival_ms)) if len(j.trace) else 0.0 for j in jobs])
        self.requests = np.array([len(j.trace) for j in jobs], np.int64)
        self.now = np.zeros(len(jobs))
        self.done = np.zeros(len(jobs), np.int64)
        self.finished = np.zeros(len(jobs), bool)

    def update(self, k: int, now_ms: float, requests_done: int) -> None:
        self.now[k], self.done[k] = min(max(now_ms, 0.0), self.span[k]), requests_done
        self._send()

    def finish(self, k: int, requests_done: int) -> None:
        self.now[k], self.done[k], self.finished[k] = self.span[k], requests_done, True
        self._send()

    def _send(self) -> None:
        self.report(ReplayProgress(float(self.now.sum()), float(self.span.sum()), int(self.done.sum()), int(self.requests.sum()),
                                   int(self.finished.sum()), len(self.span)))


def _add_time(timings: dict | None, t0: float, compile0: float) -> None:
    """The wall time of a loop with the engines in it (a router, sessions) since ``t0``, less what it spent compiling
    (``compile_s`` was ``compile0`` at ``t0``), counts as replay time."""
    if timings is not None:
        compiled = timings.get("compile_s", 0.0) - compile0
        timings["run_s"] = timings.get("run_s", 0.0) + time.perf_counter() - t0 - compiled


def _check_sessions(c: ReplayConfig) -> None:
    """Multi-turn sessions replay an aggregated open loop (ValueError otherwise; the CLI says so in one line first)."""
    why = session_refusal(c)
    if why:
        raise ValueError(why)


def session_refusal(c: ReplayConfig) -> str | None:
    """Why configuration ``c`` cannot replay multi-turn sessions (None: it can)."""
    if c.mode != "aggregated":
        return f"{c.name}: multi-turn sessions are replayed on aggregated deployments only ({c.name} is {c.mode})"
    if c.max_concurrency:
        return (f"{c.name}: multi-turn sessions with a closed loop (max_concurrency {c.max_concurrency}): a session sends its next turn "
                "when the previous completes; the two client models do not combine")
    return None


def closed_loop_refusal(c: ReplayConfig, trace: Trace) -> str | None:
    """Why a closed loop (``max_concurrency``) over disaggregated configuration ``c`` cannot replay ``trace`` (None: it
    can, or ``c`` is no such loop): every request must fit both pools (a request the server refuses would free its
    client at once, which the loop does not model) and requests are independent (a closed loop routes round-robin:
    :class:`~jaxsim.replay.deployment.ReplayConfig` refuses another router)."""
    if c.mode != "disaggregated" or not c.max_concurrency:
        return None
    if trace.sessions is not None and bool(np.any(trace.sessions.previous >= 0)):
        return session_refusal(c)
    reasons = c.rejection_reasons(trace.input_tokens)
    refused = np.flatnonzero(reasons != "")
    if refused.size:
        q = int(refused[0])
        role = str(reasons[q]).split(" ", 1)[0]  # the first pool it does not fit ("prefill ..." or "decode ...")
        return (f"{c.name}: request row {int(trace.row[q]) + 1} ({int(trace.input_tokens[q])} prompt tokens) never fits the {role} pool; "
                "a closed loop over a disaggregated deployment needs every request to fit both pools")
    return None


def _transfer_ms(c: ReplayConfig, trace: Trace) -> np.ndarray:
    return kv_transfer_ms(trace.input_tokens, float(c.kv_bytes_per_token), float(c.kv_transfer_bytes_per_s))


def _solve_closed_loop(j: _Job, max_passes: int, pad_to: int, timings: dict | None) -> None:
    """A closed loop over a disaggregated deployment: its send times (:mod:`jaxsim.replay.pd_closed_loop`), and its
    stages replayed as an open loop of requests arriving when sent."""
    why = closed_loop_refusal(j.config, j.trace)
    if why:
        raise ValueError(why)
    c, tr = j.config, j.trace
    t0, compile0 = time.perf_counter(), (timings or {}).get("compile_s", 0.0)
    pre = _first_stage(c, j.seed, tr, max_passes)
    dec = Stage(c.decode, c.nextn, c.accept_rates, tr.arrival_ms, tr.input_tokens, tr.output_tokens, j.seed, stream=1,
                materialized=True, max_passes=max_passes)
    j.sent_ms = closed_loop_send_ms(pre, dec, int(c.max_concurrency), _transfer_ms(c, tr), timings)
    _add_time(timings, t0, compile0)
    # the requests never sent (the completions that would free their clients never came) reach no pool
    j.stage_rows = np.flatnonzero(~np.isnan(j.sent_ms))
    j.stage_trace = dataclasses.replace(tr._take(j.stage_rows), arrival_ms=j.sent_ms[j.stage_rows])
    j.first = StageRun(_first_stage(c, j.seed, j.stage_trace, max_passes, pad_to))


def _closed_loop_columns(j: _Job) -> dict[str, np.ndarray]:
    """A disaggregated closed loop's columns over the whole trace: its stages' over the requests sent, a request never
    sent unfinished with no times."""
    cols = _disaggregated_columns(j.decode, j.stage_rows.size)
    n = len(j.trace)
    out = {}
    for f, a in cols.items():
        full = np.full(n, np.nan) if a.dtype == np.float64 else np.zeros(n, a.dtype)
        full[j.stage_rows] = a
        out[f] = full
    out["terminal"][np.setdiff1d(np.arange(n), j.stage_rows)] = UNFINISHED
    out["sent_ms"] = j.sent_ms.copy()
    return out


def _check_closed_loop(j: _Job) -> None:
    """The replay of a disaggregated closed loop's stages releases exactly its send times (their one fixed point); the
    columns checked are kept for its outcome."""
    cols = j.columns = _closed_loop_columns(j)
    completion = np.where(cols["terminal"] == DONE, cols["last_token_ms"], np.nan)
    again = released_send_ms(j.trace.arrival_ms, completion, int(j.config.max_concurrency))
    if not np.array_equal(again, j.sent_ms, equal_nan=True):
        q = int(np.flatnonzero(~((again == j.sent_ms) | (np.isnan(again) & np.isnan(j.sent_ms))))[0])
        raise RuntimeError(f"{j.config.name}: the closed loop's send times are not reproduced (request {q}: "
                           f"{j.sent_ms[q]!r} sent, {again[q]!r} released)")


def _disaggregated_columns(d: DecodeStage, n: int) -> dict[str, np.ndarray]:
    """Decode-stage columns in trace order; preemptions and admissions add up over both stages, a request
    the prefill stage did not finish keeps its prefill terminal."""
    pre = d.prefill
    cols = {f: np.full(n, np.nan) if pre[f].dtype == np.float64 else np.zeros(n, pre[f].dtype) for f in _FIELDS}
    if d.run.stage is not None:
        dec = d.run.columns(d.order.size)
        for f in _FIELDS:
            cols[f][d.order] = dec[f]
    cols["sent_ms"] = pre["sent_ms"]  # the client sends to the prefill pool
    cols["preemptions"] = pre["preemptions"] + cols["preemptions"]
    cols["admissions"] = pre["admissions"] + cols["admissions"]
    cols["terminal"] = np.where(pre["terminal"] == DONE, cols["terminal"], pre["terminal"]).astype(np.int32)
    return cols


def _worst(results: list[ReplayResult]) -> tuple[int, tuple | None]:
    """The first status that is not ``completed``, with its failed lookup when outside measured support."""
    for r in results:
        if int(r.status) != COMPLETED:
            q = tuple(int(x) for x in np.asarray(r.failed_query)) if int(r.status) >= st.FIRST_UNSUPPORTED else None
            return int(r.status), q
    return COMPLETED, None


def _outcome(job: _Job, timeline: bool, goodput: Goodput | None) -> ReplayOutcome:
    trace = job.trace
    n = len(trace)
    if job.decode is None:
        cols, results = job.first.columns(n), job.first.results
    else:
        # a closed loop: sent when a client was free (never: NaN)
        cols = _disaggregated_columns(job.decode, n) if job.sent_ms is None else job.columns
        results = job.first.results + job.decode.run.results
    status, failed = _worst(results)
    timelines = [metrics.timeline_table(r) for r in results] if timeline else None
    req = metrics.per_request(SimpleNamespace(**cols), trace.arrival_ms, trace.input_tokens, trace.output_tokens, n=n)
    req["row"] = trace.row
    req["replica"] = _replicas(job)
    req["cache_hit_tokens"] = cols.get("cache_hit_tokens", np.zeros(n, np.int64))
    ses = trace.sessions
    req["session"] = np.full(n, "", dtype=object) if ses is None else ses.session.astype(object)
    req["turn"] = np.zeros(n, np.int64) if ses is None else ses.turn.astype(np.int64)
    req, summary = metrics.summarize(req, goodput, job.config.overhead.terms)
    summary = dict(summary, **_cache_summary(job, req), async_scheduling=any(pool.async_scheduling for pool in job.config.pools))
    if ses is not None:  # multi-turn: sessions, and turns never sent (their session ended at a rejected or unfinished turn)
        summary = dict(summary, sessions=ses.count, unsent_turns=int(np.sum(np.isnan(req["sent_ms"]) & (ses.previous >= 0))))
    return ReplayOutcome(job.config, job.seed, status, status_name(status), req, summary, timelines, failed,
                         routing=None if job.routing is None else job.routing.to_json())


def _cache_summary(job: _Job, req: dict) -> dict:
    """How the replay treated shared prefixes (:func:`prefix_caching_mode`) and, over the completed requests, the
    prompt tokens read from the cache at first admission and their share of all prompt tokens."""
    done = req["terminal"] == TERMINAL_NAMES[DONE]
    hit, total = float(np.sum(req["cache_hit_tokens"][done])), float(np.sum(req["input_tokens"][done]))
    return {"prefix_caching": prefix_caching_mode(job.config, job.trace), "cache_hit_tokens": hit,
            "prefix_hit_ratio": hit / total if total else 0.0}


def _replicas(job: _Job) -> np.ndarray:
    """Each request's replica in its first pool (trace order; -1 for a request no pool served)."""
    out = np.full(len(job.trace), -1, np.int64)
    st_ = job.first.stage
    if st_ is not None and job.stage_rows is not None:  # a disaggregated closed loop: the requests sent
        out[job.stage_rows] = st_.replica
    elif st_ is not None:
        out[: st_.arrival_ms.size] = st_.replica  # the first stage's columns are the trace's, in order
    return out


def run_replays(
    configs: Sequence[ReplayConfig],
    trace: Trace | Sequence[Trace],
    seeds: Sequence[int] = (0,),
    *,
    timeline: bool = False,
    timeline_len: int | None = None,
    chunk: int | None = 256,
    goodput: Goodput | None = None,
    pad_to: int = 0,
    progress=None,
    timings: dict | None = None,
) -> list[ReplayOutcome]:
    """Replay ``trace`` (one for all, or one per configuration) for every configuration and seed; one
    compiled call per group of static shapes (configurations whose traces fall in one request bucket share
    their calls).

    ``progress(k)`` (optional) is called after every batch of ``k`` replicas has finished. With
    ``timeline``, each worker keeps its first ``timeline_len`` passes (default: a bucket above the
    longest trace's output tokens plus four passes per request, at most 2**18). ``goodput`` (optional):
    per-request limits counted in each summary. ``pad_to``: every replica's requests padded to at least
    this many (traces of different lengths then share one set of compilations). ``timings`` (optional dict) accumulates ``compile_s``
    (lowering + XLA compilation, or an executable-cache load), ``run_s``, ``compilations`` and
    ``executables_loaded``.
    """
    ensure_x64()
    traces = [trace] * len(configs) if isinstance(trace, Trace) else list(trace)
    if len(traces) != len(configs):
        raise ValueError(f"{len(traces)} traces for {len(configs)} configurations")
    if timeline_len is None:
        timeline_len = min(max((request_bucket(int(t.output_tokens.sum()) + 4 * len(t)) for t in traces), default=16), 1 << 18)
    run = dict(timeline_len=int(timeline_len) if timeline else 0, chunk=chunk, progress=progress, timings=timings)
    passes = {id(t): _max_passes(t) for t in traces}
    jobs = [_Job(c, int(s), t, StageRun(_first_stage(c, int(s), t, passes[id(t)], pad_to))) for c, t in zip(configs, traces)
            for s in seeds]
    for j in jobs:  # closed loops over disaggregated deployments: send times first, then open loops of them
        if j.config.mode == "disaggregated" and j.config.max_concurrency:
            _solve_closed_loop(j, passes[id(j.trace)], pad_to, timings)
    # stage 1: aggregated pools, or the prefill pools of disaggregated configs
    _run_stages([j.first for j in jobs if not _routed(j) and not _multi_turn(j)], **run)
    looped = [j for j in jobs if _multi_turn(j) or _routed(j)]
    tracker = None if progress is None else _LoopProgress(progress, looped)
    for k, j in enumerate(looped):  # engines in the loop, one (configuration, seed) at a time
        report = None if tracker is None else partial(tracker.update, k)
        t0, compile0 = time.perf_counter(), (timings or {}).get("compile_s", 0.0)
        if _multi_turn(j):  # multi-turn sessions: later turns sent as earlier ones complete
            _check_sessions(j.config)
            stage, results, j.routing, decided = run_sessions(j.first.stage, j.trace.sessions, j.config.router,
                                                              _prompt_keys(j.first.stage, j.trace), run["timeline_len"], timings, report)
        else:  # a routed pool: the router in the loop
            stage, results, j.routing, decided = run_routed(j.first.stage, j.config.router, _prompt_keys(j.first.stage, j.trace),
                                                            run["timeline_len"], timings, report)
        j.first = StageRun(stage, results, [decided.cache_hit_tokens[idx] for idx in stage.parts])
        _add_time(timings, t0, compile0)
        if tracker is not None:
            tracker.finish(k, sum(int(np.sum(np.asarray(r.terminal) == DONE)) for r in results))
    # stage 2: decode pools, fed by prefill completions plus the KV transfer
    for j in jobs:
        if j.config.mode == "disaggregated":
            j.decode = _decode_stage(j.config, j.seed, j.trace if j.stage_trace is None else j.stage_trace, j.first, passes[id(j.trace)], pad_to)
    _run_stages([j.decode.run for j in jobs if j.decode is not None], **run)
    for j in jobs:
        if j.sent_ms is not None:
            _check_closed_loop(j)
    return [_outcome(j, run["timeline_len"] > 0, goodput) for j in jobs]
