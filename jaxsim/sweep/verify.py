"""Verify a sweep's best configurations by replaying a trace (``jaxsim sweep ... --verify-top N --trace T``).

The sweep's percentiles are analytic: over its workload mix, with queueing modelled as a constant wait
(docs/sweep.md). Verification replays the best ``N`` SLA-feasible configurations per workload in ONE
batched replay (:func:`jaxsim.replay.orchestrate.run_replays`), each at its own concurrency (``max_num_seqs``
capped at the configuration's concurrency per worker) and replica count, and applies the same SLA to the
replayed per-request distribution: mean and p50/p90/p99 TTFT, TPOT and E2E, and tokens/s per user
(1000 / mean TPOT). A configuration is ``verified`` when its replay completed every request of the
trace inside measured support and met every limit; otherwise ``why`` says what failed.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from jaxsim.replay.deployment import ReplayConfig, WorkerPool
from jaxsim.replay.orchestrate import run_replays
from jaxsim.replay.traces import Trace
from jaxsim.sla import LATENCY_METRICS, LIMIT_QUANTILES, SLA
from jaxsim.stats import key, percentile
from jaxsim.sweep.spec import SweepPlan

def binding_replay_config(plan: SweepPlan, b: int, name: str, *, max_num_seqs_cap: int | None = None,
                          units: int = 1) -> ReplayConfig:
    """Binding ``b`` of a sweep plan as a replay deployment: each pool gets its own role's table,
    envelope (``max_num_seqs`` of the decode or aggregated role capped at ``max_num_seqs_cap``; the
    prefill role's own, uncapped) and KV pool, and ``units`` serving units' worth of replicas."""
    row, labels = plan.bindings.row(b), plan.labels
    mode = labels["mode"][row.mode]
    rates = np.asarray(plan.rates[row.acceptance_id], np.float64)
    source = labels["data_source"][row.data_source] if "data_source" in labels else "measured"
    seqs = row.max_num_seqs if max_num_seqs_cap is None else min(row.max_num_seqs, int(max_num_seqs_cap))
    dec = WorkerPool(plan.tables[row.decode_table], row.max_num_batched_tokens, seqs, row.block_size, row.kv_blocks,
                     row.max_model_len, units * (row.decode_workers if mode == "disaggregated" else 1))
    if mode == "aggregated":
        return ReplayConfig(name, row.nextn, rates, aggregated=dec, data_source=source)
    pre = WorkerPool(plan.tables[row.prefill_table], row.prefill_max_num_batched_tokens, row.prefill_max_num_seqs,
                     row.block_size, row.prefill_kv_blocks, row.max_model_len, units * row.prefill_workers)
    return ReplayConfig(name, row.nextn, rates, prefill=pre, decode=dec, kv_bytes_per_token=row.kv_bytes_per_token,
                        kv_transfer_bytes_per_s=row.kv_transfer_bytes_per_s, data_source=source)


def replay_config(plan: SweepPlan, config_id: int) -> ReplayConfig:
    """The deployment of one sweep configuration as a replay: its tables, envelope and KV pools, its
    replicas (gpu_budget // GPUs per unit), and ``max_num_seqs`` capped at its concurrency per worker."""
    b, c, _ = plan.decode_index(np.asarray([config_id], np.int64))
    b, c = int(b[0]), int(c[0])
    row, labels = plan.bindings.row(b), plan.labels
    conc = int(plan.spec.concurrency[c])
    mode = labels["mode"][row.mode]
    reps = max(row.replicas, 1)
    name = (f"#{config_id} {labels['profile'][row.profile]} tp={row.tp} {mode}"
            + (f" {row.prefill_workers}:{row.decode_workers}" if mode == "disaggregated" else "")
            + (f" nextn={row.nextn} {labels['acceptance'][row.acceptance]}" if row.nextn else "") + f" conc={conc} x{reps}")
    return binding_replay_config(plan, b, name, max_num_seqs_cap=conc, units=reps)


def pick_top(top: pa.Table, n: int) -> list[tuple[str, int]]:
    """(workload, config_id) of the best ``n`` rows per workload of the sweep's top table (already
    ordered best first within each workload)."""
    out: dict[str, list[int]] = {}
    for r in top.select(["workload", "config_id"]).to_pylist():
        lst = out.setdefault(str(r["workload"]), [])
        if len(lst) < n:
            lst.append(int(r["config_id"]))
    return [(w, i) for w, ids in out.items() for i in ids]


def judge(requests: dict, status_text: str, failure: str, sla: SLA) -> tuple[dict, bool, str]:
    """Replayed metrics of one configuration, whether they meet ``sla``, and why not."""
    done = requests["terminal"] == "completed"
    n = done.size
    m: dict[str, float | None] = {"completed": int(done.sum()), "requests": int(n)}
    for metric in LATENCY_METRICS:
        v = np.asarray(requests[f"{metric}_ms"], np.float64)[done]
        m[key("mean", metric)] = float(np.mean(v[np.isfinite(v)])) if np.isfinite(v).any() else None
        for stat, p in LIMIT_QUANTILES.items():
            x = percentile(v, p)
            m[key(stat, metric)] = None if np.isnan(x) else x
    tpot = m["mean_tpot_ms"]
    m["tokens_per_s_per_user"] = 1e3 / tpot if tpot else None
    why = []
    if status_text != "completed":
        why.append(status_text + (f" at {failure}" if failure else ""))
    if m["completed"] < n:
        why.append(f"{n - m['completed']} of {n} requests not completed")
    for k, lim in sla.latency_limits().items():
        if m[k] is not None and m[k] > lim:
            stat, metric, _ = k.split("_")
            why.append(f"{stat} {metric.upper()} {m[k]:,.1f} ms > {lim:,.1f}")
    if sla.min_tokens_per_s_per_user is not None and m["tokens_per_s_per_user"] is not None \
            and m["tokens_per_s_per_user"] < sla.min_tokens_per_s_per_user:
        why.append(f"{m['tokens_per_s_per_user']:,.1f} tok/s/user < {sla.min_tokens_per_s_per_user:,.1f}")
    ok = not why and m["completed"] == n
    return m, ok, "; ".join(why)


def verify_top(plan: SweepPlan, top: pa.Table, trace: Trace, n: int, *, seed: int = 0) -> pa.Table:
    """Replay the best ``n`` configurations per workload in one batched replay; one row each with the
    replayed metrics, ``verified`` and ``why``."""
    picks = pick_top(top, n)
    if not picks:
        return pa.table({"workload": pa.array([], pa.string()), "config_id": pa.array([], pa.int64()),
                         "verified": pa.array([], pa.bool_())})
    configs = [replay_config(plan, cid) for _, cid in picks]
    outcomes = run_replays(configs, trace, [seed])
    rows = []
    for (wl, cid), o in zip(picks, outcomes):
        m, ok, why = judge(o.requests, o.status_text, o.failure, plan.spec.sla)
        rows.append({"workload": wl, "config_id": cid, "replay": o.config.name, "data_source": o.config.data_source,
                     "status": o.status_text, **m, "verified": ok, "why": why})
    return pa.Table.from_pylist(rows)
