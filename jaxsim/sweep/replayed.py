"""Sweep points evaluated by replay: every point replayed under its benchmark load, batched.

A point (binding, concurrency C per worker, workload) becomes one replay of one serving unit under the
spec's ``[benchmark]`` (:class:`~jaxsim.replay.loads.Benchmark`): by default a closed loop of C clients
and 10 × C prompts, all C sent at t = 0 (InferenceX's protocol), the prompts' lengths drawn from the
workload's classes (counts by weight, :func:`~jaxsim.replay.loads.mix_lengths`, optionally spread by a
range ratio). A chunk of points is ONE :func:`~jaxsim.replay.orchestrate.run_replays` call: points whose
traces fall in one request bucket share their compiled calls, thousands of replays each (tables padded to
one shape for the whole plan, so every chunk reuses the compilations). The replayed metrics
(:func:`~jaxsim.replay.metrics.aggregate`: vLLM's definitions and NumPy's linear percentiles) fill the
sweep's columns, and the SLA is judged on them.

A disaggregated point (x prefill : y decode workers at C per decode worker, the steady state's y·C clients per
unit) is replayed with y·C clients over its whole pipeline (:mod:`~jaxsim.replay.pd_closed_loop`): a closed loop of
y·N prompts, or the unit's open loop with at most y·C in flight. ``--verify-top`` replays rows at
their own load with the same builders (:func:`point_config`, :func:`point_trace`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import cached_property

import numpy as np

from jaxsim.kernels import status as st
from jaxsim.kernels.rounds import common_tables
from jaxsim.replay.deployment import ReplayConfig, ReplayOutcome, WorkerPool
from jaxsim.replay.loads import LoadModel, benchmark_trace, draw_lengths, mix_lengths, with_load
from jaxsim.replay.metrics import with_overhead
from jaxsim.replay.orchestrate import run_replays
from jaxsim.replay.traces import Trace, request_bucket
from jaxsim.sla import LATENCY_KEYS, LATENCY_METRICS, SLA
from jaxsim.stats import latency_stats
from jaxsim.sweep import evaluate as ev
from jaxsim.sweep.spec import SweepPlan

__all__ = ["METHODS", "CLASS_ITEMS", "REPLAY_CHUNK", "WORK_RATIO", "PointReplays", "binding_config", "point_config", "point_overhead", "point_trace",
           "replay_metrics", "sla_ok", "sweep_configs", "with_overhead", "work_classes"]

METHODS = ("steady", "replay")
"""The ``method`` column's values: which evaluation produced a row."""
REPLAY_CHUNK = 128
"""Replays per compiled call. A call runs until its longest replay finishes, so points sorted by their
expected passes go in calls of this many (measured on 2 CPU cores: 64 runs a 360-point sweep faster
than 512 or 16)."""
WORK_RATIO = 2.0
"""Points whose expected passes differ by more than this factor never share a :func:`run_replays` call
(:func:`work_classes`): a call's replays advance in lockstep until the longest finishes, so a 1,024-token
benchmark batched with an 8,192-token one would idle for 7/8 of the call (the silicon sample's grid)."""
CLASS_ITEMS = 7
"""At most this many points per :func:`run_replays` call (chosen when only groups of fewer than 8 replays advanced
by decode stretches; every group does now: :func:`~jaxsim.replay.runner.stretch_lookahead`). Measured on 2 shared
CPU cores, one Llama-3.1-70B B200 TP1
cell of the silicon sample (5 concurrencies x 3 InferenceX workloads, 10 prompts per client, 492,475 passes):
replay 37.4 s in one lockstep call, 6.5 s (up to 15.5 s under load) in classes of work ratio 2 (one class of 10
runs pass by pass), 2.2-2.4 s in classes of at most 7 (74,683 loop steps instead of 492,484); same metrics."""


def work_classes(work: np.ndarray, ratio: float = WORK_RATIO, max_items: int = 0) -> list[np.ndarray]:
    """Positions of ``work`` (expected passes per point) in ascending order, cut into classes whose largest
    is at most ``ratio`` × their smallest (``ratio`` <= 0: no such cut) and of at most ``max_items`` points
    (0: no limit)."""
    order = np.argsort(np.asarray(work, np.float64), kind="stable")
    if order.size == 0:
        return []
    if ratio <= 0 and not max_items:
        return [order]
    ratio = ratio if ratio > 0 else np.inf
    w = np.maximum(np.asarray(work, np.float64)[order], 1.0)
    out, lo = [], 0
    for i in range(1, order.size + 1):
        if i == order.size or w[i] > ratio * w[lo] or (max_items and i - lo >= max_items):
            out.append(order[lo:i])
            lo = i
    return out



def _name(plan: SweepPlan, config_id: int, b: int, conc: int, units: int) -> str:
    row, labels = plan.bindings.row(b), plan.labels
    mode = labels["mode"][row.mode]
    return (f"#{config_id} {labels['profile'][row.profile]} tp={row.tp} {mode}"
            + (f" {row.prefill_workers}:{row.decode_workers}" if mode == "disaggregated" else "")
            + (f" nextn={row.nextn} {labels['acceptance'][row.acceptance]}" if row.nextn else "") + f" conc={conc}"
            + (f" x{units}" if units > 1 else ""))


def binding_config(plan: SweepPlan, b: int, name: str, *, units: int = 1, max_concurrency: int = 0,
                   tables=None) -> ReplayConfig:
    """Binding ``b`` of a sweep plan as a replay deployment of ``units`` serving units: each pool its role's
    table (``tables``: the plan's tables padded alike, default the plan's own), scheduler envelope and KV
    pool, its replicas × ``units`` (an attention-DP worker: its dp ranks, each an engine of tp GPUs, requests routed
    round-robin); ``max_concurrency`` clients per replica (disaggregated: over the pipeline; 0: open loop)."""
    tables = plan.tables if tables is None else tables
    row, labels = plan.bindings.row(b), plan.labels
    mode = labels["mode"][row.mode]
    rates = np.asarray(plan.rates[row.acceptance_id], np.float64)
    source = labels["data_source"][row.data_source]
    caching = bool(plan.prefix_caching[row.profile])
    ahead = bool(plan.async_scheduling[row.profile])
    dec = WorkerPool(tables[row.decode_table], row.max_num_batched_tokens, row.max_num_seqs, row.block_size, row.kv_blocks,
                     row.max_model_len, units * (row.decode_workers if mode == "disaggregated" else row.dp), row.kv_state_blocks,
                     prefix_caching=caching, async_scheduling=ahead)
    if mode == "aggregated":
        return ReplayConfig(name, row.nextn, rates, aggregated=dec, data_source=source, max_concurrency=int(max_concurrency))
    pre = WorkerPool(tables[row.prefill_table], row.prefill_max_num_batched_tokens, row.prefill_max_num_seqs,
                     row.block_size, row.prefill_kv_blocks, row.max_model_len, units * row.prefill_workers,
                     row.kv_state_blocks, prefix_caching=caching, async_scheduling=ahead)
    return ReplayConfig(name, row.nextn, rates, prefill=pre, decode=dec, kv_bytes_per_token=row.kv_bytes_per_token,
                        kv_transfer_bytes_per_s=row.kv_transfer_bytes_per_s, data_source=source,
                        max_concurrency=int(max_concurrency))


def sweep_configs(plan: SweepPlan) -> list[ReplayConfig]:
    """One replay deployment per valid binding of a plan (``jaxsim replay --sweep``: the trace is the workload, so
    the plan's concurrency and workload axes are not used), named by profile, TP, mode, speculation and envelope."""
    labels, out = plan.labels, []
    for b in range(plan.num_bindings):
        row = plan.bindings.row(b)
        mode = labels["mode"][row.mode]
        name = (f"{labels['profile'][row.profile]} tp={row.tp} {mode}"
                + (f" {row.prefill_workers}:{row.decode_workers}" if mode == "disaggregated" else "")
                + f" nextn={row.nextn} {labels['acceptance'][row.acceptance]} seqs={row.max_num_seqs}"
                + f" tokens={row.max_num_batched_tokens}")
        out.append(binding_config(plan, b, name))
    return out


def point_config(plan: SweepPlan, config_id: int, load: LoadModel, *, units: int = 1, tables=None) -> ReplayConfig:
    """Sweep configuration ``config_id`` as a replay deployment of ``units`` serving units under ``load``
    (:func:`binding_config`), the load's clients split evenly over its replicas (aggregated) or all over its
    pipeline (disaggregated: :func:`~jaxsim.replay.loads.with_load`)."""
    b, c, _ = (int(x[0]) for x in plan.decode_index(np.asarray([config_id], np.int64)))
    config = binding_config(plan, b, _name(plan, config_id, b, int(plan.spec.concurrency[c]), units), units=units,
                            tables=tables)
    return with_load(config, load)


def point_trace(plan: SweepPlan, config_id: int, load: LoadModel, lengths: Trace | None = None) -> Trace:
    """The requests of one point's benchmark: the load's arrivals; lengths from the point's workload (its
    classes by weight, spread by the benchmark's range ratio) or, given, a trace's requests in order."""
    bench = plan.spec.benchmark
    if lengths is not None:
        return benchmark_trace(load, lengths, seed=bench.seed)
    _, _, w = (int(x[0]) for x in plan.decode_index(np.asarray([config_id], np.int64)))
    isl, osl = mix_lengths(plan.wl_isl[w], plan.wl_osl[w], plan.wl_weight[w], load.num_prompts, bench.seed)
    inp, out = draw_lengths(isl, osl, bench.range_ratio, bench.length_rule, bench.seed)
    return benchmark_trace(load, (inp, out), seed=bench.seed, name=plan.labels["workload"][w])


def point_overhead(plan: SweepPlan, config_id: int) -> tuple[float, float, float]:
    """The serving overhead terms (fixed, per prompt token, per output token; ms) of one point's profile."""
    b, _, _ = plan.decode_index(np.asarray([config_id], np.int64))
    return tuple(float(x) for x in plan.overheads[plan.bindings.profile[int(b[0])]])


def _rejection_status(outcome: ReplayOutcome) -> int | None:
    """The sweep status of a replay that rejected requests (a prompt a worker can never hold)."""
    rej = outcome.requests["terminal"] == "rejected"
    if not rej.any():
        return None
    reasons = outcome.config.rejection_reasons(outcome.requests["input_tokens"])[rej]
    return st.REQUEST_EXCEEDS_CONTEXT if any("max_model_len" in r for r in reasons) else st.REQUEST_EXCEEDS_KV_POOL


def replay_metrics(outcome: ReplayOutcome, gpus: int, concurrency: int, max_num_seqs: int, units: int = 1,
                   overhead: Sequence[float] = (0.0, 0.0, 0.0)) -> dict:
    """One replayed point as the sweep's metric columns, over ``units`` serving units of ``gpus`` GPUs each
    (request rate per serving unit, output tokens/s per GPU); NaN where the replay did not complete every
    request inside measured support; the pass-structure columns of the steady state are NaN. ``overhead``
    (the point's profile's serving overhead terms) is added per request (:func:`with_overhead`) and the
    latency statistics recomputed over the adjusted requests; throughput is the engine's, as in the
    steady state."""
    s = outcome.summary
    if any(overhead):
        adj = with_overhead(outcome.requests, overhead)
        done = adj["terminal"] == "completed"
        s = dict(s)
        for metric in LATENCY_METRICS:
            s.update(latency_stats(np.where(done, adj[f"{metric}_ms"], np.nan), metric))
    status = outcome.status
    rejected = _rejection_status(outcome)
    if status == st.COMPLETED and rejected is not None:
        status = rejected
    elif status == st.COMPLETED and s["completed_requests"] < s["num_requests"]:
        status = st.STALLED
    ok = status == st.COMPLETED
    nan = float("nan")
    req = outcome.requests
    done = req["terminal"] == "completed"
    rounds = float(req["decode_rounds"][done].sum())
    reached = min(int(concurrency), int(max_num_seqs))
    preempted = bool(s["preemptions"] > 0)
    limit = 2 if preempted else (0 if reached == concurrency else 1)
    tpot = s["mean_tpot_ms"]
    out = dict(
        status=status, limit=limit, concurrency=reached, kv_preemption=preempted,
        decode_batch=nan, round_ms=nan, pass_ms=nan, prefill_chunks=nan, prefill_queue_ms=nan,
        rounds=float(req["decode_rounds"][done].mean()) if done.any() else nan,
        tokens_per_round=float((req["generated_tokens"][done] - 1).sum()) / rounds if rounds else nan,
        request_rate_per_s=s["request_throughput_rps"] / units,
        output_tokens_per_s_per_gpu=s["output_throughput_tok_s"] / (gpus * units),
        tokens_per_s_per_user=1e3 / tpot if tpot and tpot > 0 else nan,
        **{k: s[k] for k in LATENCY_KEYS},
    )
    if not ok:
        out.update({k: nan for k, v in out.items() if isinstance(v, float)})
    return out


def sla_ok(metrics: dict, status: int, sla: SLA) -> bool:
    """A replayed point meets ``sla``: it completed, and every stated limit holds on its statistics."""
    if status != st.COMPLETED:
        return False
    if any(not metrics[k] <= v for k, v in sla.latency_limits().items()):
        return False
    return sla.min_tokens_per_s_per_user is None or metrics["tokens_per_s_per_user"] >= sla.min_tokens_per_s_per_user


@dataclasses.dataclass(eq=False)
class PointReplays:
    """The replay evaluation of a plan's points (tables padded once for the whole plan)."""

    plan: SweepPlan
    chunk: int = REPLAY_CHUNK
    timings: dict = dataclasses.field(default_factory=dict)
    work_ratio: float = WORK_RATIO
    max_items: int = CLASS_ITEMS

    @cached_property
    def tables(self) -> list:
        return common_tables(self.plan.tables) if self.plan.tables else []

    @cached_property
    def pad_to(self) -> int:
        """Every point's requests padded to the plan's largest benchmark (one request bucket: one set of
        compilations for the whole sweep; a pass costs the same at any padding)."""
        bench = self.plan.spec.benchmark
        return request_bucket(max(bench.load_model(int(c)).num_prompts for c in self.plan.spec.concurrency))

    def replayable(self, config_ids: np.ndarray) -> np.ndarray:
        """Which points a replay evaluates: every one (aggregated or disaggregated, under a closed loop or an open loop
        capped at C)."""
        return np.ones(np.asarray(config_ids).shape, bool)

    def load(self, b: int, concurrency: int) -> LoadModel:
        """The benchmark load of binding ``b``'s point at ``concurrency`` per worker: aggregated, C clients; disaggregated
        (x:y), C per decode worker: a closed loop of y·C clients and y·N prompts (the steady state's y·C clients per
        unit), an open loop at the unit's rate with at most y·C in flight."""
        row = self.plan.bindings.row(int(b))
        bench = self.plan.spec.benchmark
        if self.plan.labels["mode"][row.mode] != "disaggregated":
            return bench.load_model(int(concurrency))
        y = int(row.decode_workers)
        if bench.closed:
            return bench.load_model(int(concurrency), units=y)
        return dataclasses.replace(bench.load_model(int(concurrency)), max_concurrency=int(concurrency) * y)

    def run(self, config_ids: np.ndarray | Sequence[int]) -> list[dict]:
        """Replay each point (one :func:`run_replays` call); per point its metric columns with ``sla_ok``."""
        plan, bench = self.plan, self.plan.spec.benchmark
        ids = np.asarray(config_ids, np.int64)
        if ids.size == 0:
            return []
        b, c, w = plan.decode_index(ids)
        conc = np.asarray(plan.spec.concurrency, np.int64)[c]
        traces: dict[tuple, Trace] = {}
        configs, point_traces = [], []
        for cid, bi, ci, wi in zip(ids, b, conc, w):
            load = self.load(int(bi), int(ci))
            key = (load, int(wi))
            if key not in traces:
                traces[key] = point_trace(plan, int(cid), load)
            configs.append(point_config(plan, int(cid), load, tables=self.tables))
            point_traces.append(traces[key])
        # replays of a batch run in lockstep until its longest finishes: batch those of similar length together
        # (expected passes ~ prompts per client x output tokens)
        work = np.array([t.output_tokens.sum() / max(cfg.max_concurrency, 1) for cfg, t in zip(configs, point_traces)])
        outcomes: list = [None] * len(configs)
        for part in work_classes(work, self.work_ratio, self.max_items):
            ran = run_replays([configs[i] for i in part], [point_traces[i] for i in part], [bench.seed], chunk=self.chunk,
                              pad_to=self.pad_to, timings=self.timings)
            for i, o in zip(part, ran):
                outcomes[i] = o
        B = plan.bindings.take(b)
        overheads = plan.overheads[B.profile]
        out = []
        for i, o in enumerate(outcomes):
            per_rank = -(-int(conc[i]) // int(B.dp[i]))  # the concurrency column is per engine (attention-DP rank), as the steady state's
            m = replay_metrics(o, int(B.gpus[i]), per_rank, int(B.max_num_seqs[i]), overhead=tuple(overheads[i]))
            m["sla_ok"] = sla_ok(m, m["status"], plan.spec.sla)
            out.append(m)
        return out

    def metrics(self, steady: ev.Metrics, start: int, stop: int) -> tuple[dict, np.ndarray]:
        """Configs [start, stop): the columns of the batched steady-state ``steady`` metrics (numpy, first
        ``stop - start`` rows) with every replayable point's replaced by its replay (``evaluate = "auto"``: only the
        points the steady state flags ``kv_preemption``), and each row's method (index into METHODS)."""
        n = stop - start
        cols = {k: np.array(np.asarray(getattr(steady, k))[:n]) for k in steady.__dataclass_fields__}
        ids = np.arange(start, stop, dtype=np.int64)
        mask = self.replayable(ids)
        if self.plan.spec.evaluate == "auto":  # only the points the steady state cannot price: KV preemption
            mask &= cols["kv_preemption"].astype(bool)
        method = np.where(mask, METHODS.index("replay"), METHODS.index("steady")).astype(np.int32)
        for pos, m in zip(np.flatnonzero(mask), self.run(ids[mask])):
            for k, v in m.items():
                cols[k][pos] = v
        return cols, method
