#!/usr/bin/env python
"""End to end against real vLLM: replay each measured log's `real` workload on a profile and compare with the log.

    .venv/bin/python scripts/e2e_vs_vllm.py DATA [--profile qwen3-32b-bf16-b300-calibrated] [--tp 1,2,4] [--markdown FILE]

DATA holds ``measured/fpm_runs/qwen3_32b_bf16_tp{1,2,4}_ep1/`` (``fpm_metrics_detail.csv``, ``request_workload.csv``,
``dynamo_model_card_runtime.json``); the tests use the TP1 copy in ``tests/data/fpm_qwen3_32b_tp1``.

For each TP: the 128 requests labelled ``real`` in ``request_workload.csv`` (prompt_tokens, max_tokens) are queued
at t = 0 and served closed loop at the recorded concurrency (32 in flight: max_num_seqs = 32), with the run's
scheduler budget (max_num_batched_tokens 8192), KV block 16 and its measured KV pool (model card), by jaxsim's
replay engine on the profile's TP deployment (no prefix caching: the prompts are random tokens). The log's
``real`` segment is the reference: its passes (rows), their summed latency (the engine's busy time: the
closed loop never idles) and the decode batch of every pass.

Compared: total duration, number of passes, per-pass latency median and p90, and the decode batch-size
distribution (mean, median, p10, p90 of decode requests per pass carrying decodes). Differences are
(jaxsim / log - 1).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import jax  # noqa: E402

from jaxsim.importers.fpm_log import read_fpm_log  # noqa: E402
from jaxsim.kernels import rounds  # noqa: E402
from jaxsim.profile.resolve import load_bundle, resolve_profile_dir  # noqa: E402
from jaxsim.replay.engine import make_params, replay_jit, slot_bucket, status_name  # noqa: E402
from jaxsim.replay.metrics import timeline_table  # noqa: E402
from jaxsim.replay.traces import make_trace  # noqa: E402

CONCURRENCY = 32
BUDGET = 8192
BLOCK = 16


def real_requests(run: Path) -> tuple[np.ndarray, np.ndarray]:
    with (run / "request_workload.csv").open(encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["workload_label"] == "real"]
    rows.sort(key=lambda r: int(r["request_index"]))
    return np.array([int(r["prompt_tokens"]) for r in rows]), np.array([int(r["max_tokens"]) for r in rows])


def _decode_stats(batch: np.ndarray) -> dict:
    b = batch[batch > 0]
    if b.size == 0:
        return {"mean": float("nan"), "p10": float("nan"), "median": float("nan"), "p90": float("nan")}
    return {"mean": float(b.mean()), "p10": float(np.percentile(b, 10)), "median": float(np.median(b)),
            "p90": float(np.percentile(b, 90))}


def compare(run: Path, profile: str, tp: int) -> dict:
    log = read_fpm_log(run / "fpm_metrics_detail.csv")
    real = log.take(log.segment == "real")
    isl, osl = real_requests(run)
    card = json.loads((run / "dynamo_model_card_runtime.json").read_text(encoding="utf-8"))["card_json"]
    blocks = int(card["runtime_config"]["total_kv_blocks"]) * int(card["kv_cache_block_size"]) // BLOCK
    bundle = load_bundle(resolve_profile_dir(profile))
    dep = next(d for d in bundle.profile.deployments if d.tp == tp)
    table = rounds.compile_round_table(bundle.cell(dep))
    p = make_params(table, max_num_batched_tokens=BUDGET, max_num_seqs=CONCURRENCY, block_size=BLOCK, num_gpu_blocks=blocks,
                    max_model_len=40960)
    trace = make_trace("real", np.zeros(isl.size), isl, osl)
    n_pass_cap = 2 * len(real) + 1000
    res = replay_jit(p, trace.requests(isl.size), jax.random.PRNGKey(0), slots=slot_bucket(CONCURRENCY), stochastic=False,
                     timeline_len=n_pass_cap)
    res = jax.tree.map(np.asarray, res)
    tl = timeline_table(res)
    if tl["latency_ms"].size == 0:
        raise SystemExit(f"TP{tp}: the replay made no pass ({status_name(int(res.status))}, failed lookup {res.failed_query.tolist()})")
    sim_lat = tl["latency_ms"]
    out = {
        "tp": tp, "profile": profile, "requests": int(isl.size), "status": status_name(int(res.status)),
        "log": {"duration_s": float(real.latency_ms.sum() / 1000), "passes": len(real),
                "median_ms": float(np.median(real.latency_ms)), "p90_ms": float(np.percentile(real.latency_ms, 90)),
                "decode_batch": _decode_stats(real.num_decode_requests)},
        "jaxsim": {"duration_s": float(res.end_ms / 1000), "passes": int(res.num_passes),
                   "median_ms": float(np.median(sim_lat)), "p90_ms": float(np.percentile(sim_lat, 90)),
                   "decode_batch": _decode_stats(tl["decode_requests"])},
    }
    if out["status"] != "completed":
        out["stopped_at"] = {"passes": int(res.num_passes), "failed_lookup": res.failed_query.tolist()}
    out["diff_pct"] = {k: 100 * (out["jaxsim"][k] / out["log"][k] - 1) for k in ("duration_s", "passes", "median_ms", "p90_ms")}
    return out


def table(results: list[dict]) -> str:
    lines = [
        "| TP | status | duration log → jaxsim | passes log → jaxsim | pass median ms | pass p90 ms | decode batch mean / p10 / median / "
        "p90 (log → jaxsim) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lg, js, d = r["log"], r["jaxsim"], r["diff_pct"]
        db = lambda s: f"{s['mean']:.1f} / {s['p10']:.0f} / {s['median']:.0f} / {s['p90']:.0f}"  # noqa: E731
        lines.append(
            f"| TP{r['tp']} | {r['status']} | {lg['duration_s']:.1f} s → {js['duration_s']:.1f} s ({d['duration_s']:+.1f} %) | "
            f"{lg['passes']:,} → {js['passes']:,} ({d['passes']:+.1f} %) | {lg['median_ms']:.2f} → {js['median_ms']:.2f} "
            f"({d['median_ms']:+.1f} %) | {lg['p90_ms']:.2f} → {js['p90_ms']:.2f} ({d['p90_ms']:+.1f} %) | "
            f"{db(lg['decode_batch'])} → {db(js['decode_batch'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("--profile", default="qwen3-32b-bf16-b300-calibrated")
    ap.add_argument("--tp", default="1,2,4")
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results = [compare(args.data / "measured" / "fpm_runs" / f"qwen3_32b_bf16_tp{tp}_ep1", args.profile, int(tp))
               for tp in args.tp.split(",")]
    text = table(results)
    print(json.dumps(results, indent=1) if args.json else text)
    if args.markdown:
        args.markdown.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
