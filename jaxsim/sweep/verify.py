"""Verify a sweep's best rows by replaying each at its own load (``jaxsim sweep ... --verify-top N``).

A row says: this configuration, at concurrency C per worker (disaggregated: per decode worker),
gives these latencies and this throughput. Verification replays the best ``N`` SLA-feasible rows per
workload in ONE batched replay (:func:`jaxsim.replay.orchestrate.run_replays`), each under the load its
row assumes, across all its replicas:

* aggregated rows: the spec's benchmark (``[benchmark]``, default a closed loop) at the row's
  concurrency per worker × its replicas: C × replicas clients, 10 × C × replicas prompts, all sent at
  t = 0 (or the benchmark's open loop at its rate × replicas, at most C × replicas in flight);
* disaggregated rows (x:y): under a closed-loop benchmark, one closed loop of C × y × replicas clients over
  the replicas' pipelines (:mod:`jaxsim.replay.pd_closed_loop`); under an open-loop benchmark, an open
  Poisson loop at the row's own request rate × replicas, as many prompts;

with the row's workload lengths (its classes by weight), or with ``--trace``'s lengths in order. The
replayed statistics (vLLM's definitions, NumPy's linear percentiles: :mod:`jaxsim.stats`) are compared
with the row's: each compared statistic's relative deviation (replay − row) / row is reported, and a row
is ``verified`` only when its replay completed every request inside measured support, meets the SLA,
and every compared statistic agrees within :data:`TOLERANCE` (``--verify-tolerance``); ``why`` says
what failed. Compared: mean TTFT, TPOT and E2E, output tokens/s per GPU, and every percentile the SLA
bounds. Like for like: the replay's latencies carry the row's profile's serving overhead, as the row's do.
"""

from __future__ import annotations

import math

import pyarrow as pa

from jaxsim.kernels import status as st
from jaxsim.replay.loads import LoadModel, open_loop
from jaxsim.replay.orchestrate import run_replays
from jaxsim.replay.traces import Trace
from jaxsim.sla import LATENCY_KEYS, SLA
from jaxsim.sweep.replayed import point_config, point_overhead, point_trace, replay_metrics, sla_ok
from jaxsim.sweep.spec import SweepPlan

__all__ = ["TOLERANCE", "COMPARED", "pick_top", "row_load", "compared_keys", "judge", "verify_top"]

TOLERANCE = 0.20
"""A verified row's compared statistics agree with its replay within ±20 % (relative to the row)."""
COMPARED = ("mean_ttft_ms", "mean_tpot_ms", "mean_e2e_ms", "output_tokens_per_s_per_gpu")
"""Statistics every verification compares (the SLA's bounded percentiles are added)."""
_LABELS = {"output_tokens_per_s_per_gpu": "tok/s/GPU", "tokens_per_s_per_user": "tok/s/user"}


def pick_top(top: pa.Table, n: int) -> list[dict]:
    """The best ``n`` rows per workload of the sweep's top table (already ordered best first within each
    workload), as dicts."""
    out: dict[str, list[dict]] = {}
    for r in top.to_pylist():
        lst = out.setdefault(str(r["workload"]), [])
        if len(lst) < n:
            lst.append(r)
    return [r for rows in out.values() for r in rows]


def row_load(plan: SweepPlan, row: dict) -> tuple[LoadModel, str]:
    """The load a row assumes, across its replicas, and how it was chosen."""
    reps = max(int(row["replicas"]), 1)
    conc = int(row["concurrency_target"])
    if row["mode"] == "aggregated":
        load = plan.spec.benchmark.load_model(conc, units=reps)
        return load, load.describe()
    workers = int(row["decode_workers"])
    if plan.spec.benchmark.closed:  # C per decode worker: one closed loop over every replica's pipeline
        load = plan.spec.benchmark.load_model(conc, units=workers * reps)
        return load, f"closed loop of {load.max_concurrency} clients over {reps} replica(s) of the pipeline, {load.num_prompts} prompts"
    rate = float(row["request_rate_per_s"]) * reps
    n = plan.spec.benchmark.prompts_per_client * conc * workers * reps
    return open_loop(rate, n), f"open loop at the row's rate, {rate:,.2f} req/s across {reps} replica(s), {n} prompts"


def compared_keys(sla: SLA) -> tuple[str, ...]:
    """The statistics a verification compares under ``sla``."""
    return COMPARED + tuple(k for k in sla.percentile_limits() if k not in COMPARED)


def _label(key: str) -> str:
    if key in _LABELS:
        return _LABELS[key]
    stat, metric, _ = key.split("_")
    return f"{stat} {metric.upper()}"


def judge(replayed: dict, status: int, status_text: str, failure: str, row: dict, sla: SLA,
          tolerance: float = TOLERANCE) -> tuple[dict, bool, str]:
    """Deviations of the replay from the row, whether the replay meets ``sla`` and agrees with the row
    within ``tolerance``, and why not."""
    why = []
    if status_text != "completed":
        why.append(status_text + (f" at {failure}" if failure else ""))
    elif status != st.COMPLETED:
        why.append(st.name(status))
    meets = sla_ok(replayed, status, sla)
    if status == st.COMPLETED and not meets:
        for k, lim in sla.latency_limits().items():
            if not replayed[k] <= lim:
                why.append(f"replayed {_label(k)} {replayed[k]:,.1f} ms > {lim:,.1f}")
        lo = sla.min_tokens_per_s_per_user
        if lo is not None and not replayed["tokens_per_s_per_user"] >= lo:
            why.append(f"replayed {replayed['tokens_per_s_per_user']:,.1f} tok/s/user < {lo:,.1f}")
    dev = {}
    off = []
    for k in compared_keys(sla):
        mine, theirs = replayed.get(k, math.nan), row.get(k, math.nan)
        d = (mine - theirs) / theirs if theirs and math.isfinite(theirs) and math.isfinite(mine) else math.nan
        dev[f"dev_{k}"] = d
        if status == st.COMPLETED and not abs(d) <= tolerance:
            off.append(f"{_label(k)} {d:+.0%}")
    if off:
        why.append(f"differs from the row by more than {tolerance:.0%}: " + ", ".join(off))
    return dev, not why, "; ".join(why)


def verify_top(plan: SweepPlan, top: pa.Table, n: int, *, trace: Trace | None = None, tolerance: float = TOLERANCE) -> pa.Table:
    """Replay the best ``n`` rows per workload, each at its own load, in one batched replay; one row each
    with the load, the replayed statistics, their deviations from the row, ``verified`` and ``why``."""
    picks = pick_top(top, n)
    if not picks:
        return pa.table({"workload": pa.array([], pa.string()), "config_id": pa.array([], pa.int64()),
                         "verified": pa.array([], pa.bool_())})
    loads = [row_load(plan, r) for r in picks]
    configs = [point_config(plan, int(r["config_id"]), load, units=max(int(r["replicas"]), 1)) for r, (load, _) in zip(picks, loads)]
    traces = [point_trace(plan, int(r["config_id"]), load, trace) for r, (load, _) in zip(picks, loads)]
    outcomes = run_replays(configs, traces, [plan.spec.benchmark.seed])
    rows = []
    for r, (load, how), o in zip(picks, loads, outcomes):
        units = max(int(r["replicas"]), 1)
        m = replay_metrics(o, int(r["gpus"]), int(r["concurrency_target"]), int(r["max_num_seqs"]), units,
                           overhead=point_overhead(plan, int(r["config_id"])))
        dev, ok, why = judge(m, m["status"], o.status_text, o.failure, r, plan.spec.sla, tolerance)
        keep = ("mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p90_tpot_ms",
                "p99_tpot_ms", "mean_e2e_ms", "p90_e2e_ms", "p99_e2e_ms", "tokens_per_s_per_user",
                "output_tokens_per_s_per_gpu", "request_rate_per_s")
        rows.append({
            "workload": r["workload"], "config_id": int(r["config_id"]), "method": r.get("method", "steady"),
            "replay": o.config.name, "load": how, "data_source": o.config.data_source, "status": o.status_text,
            "requests": int(o.summary["num_requests"]), "completed": int(o.summary["completed_requests"]),
            **{k: _finite(m[k]) for k in keep},
            **{k: _finite(v) for k, v in dev.items()}, "tolerance": float(tolerance), "verified": ok, "why": why,
        })
    return pa.Table.from_pylist(rows)


def _finite(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


assert set(COMPARED[:3]) <= set(LATENCY_KEYS)
