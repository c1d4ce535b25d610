"""Benchmark: load time of input files — the bundled traces, a 1M-row query file (CSV and parquet), and
the schema readers (a deployment config, a sweep spec and a profile.json, parsed N times).

Each load is repeated (default 5) and the median and min wall times are printed. Run it from the
checkout whose code you want to time (``PYTHONPATH=CHECKOUT python scripts/bench_inputs.py``); numbers
depend on machine load.

    python scripts/bench_inputs.py [--repeat 5] [--rows 1000000] [--parse 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]


def timed(fn, repeat: int) -> tuple[float, float]:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), min(ts)


def query_table(rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    kind = rng.choice(np.array(["decode", "prefill", "mixed"]), rows)
    batch = rng.integers(1, 256, rows)
    ptok = np.where(kind == "decode", 0, rng.integers(1, 8192, rows))
    return pa.table({
        "workload_kind": kind, "batch_size": batch, "total_prefill_tokens": ptok,
        "total_kv_read_tokens": rng.integers(0, 1 << 20, rows),
        "num_decode_requests": rng.integers(0, 64, rows), "total_decode_kv_tokens": rng.integers(0, 1 << 20, rows),
    })


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--parse", type=int, default=2000, help="schema parses per timed run")
    args = ap.parse_args()

    from jaxsim.profile.model import ModelProfile
    from jaxsim.replay.traces import list_traces, load_trace
    from jaxsim.rules.config import config_from_dict
    from jaxsim.sweep.spec import spec_from_dict

    print(f"{'input':<48} {'median_s':>9} {'min_s':>8}")
    for name in list_traces():
        med, lo = timed(lambda: load_trace(name), args.repeat)
        print(f"{'trace ' + name:<48} {med:9.4f} {lo:8.4f}")

    with tempfile.TemporaryDirectory() as tmp:  # a 1M-request trace in the plain CSV and Mooncake JSONL formats
        rng = np.random.default_rng(0)
        n = args.rows
        arr, inp, out = np.cumsum(rng.exponential(5.0, n)).round(3), rng.integers(1, 8192, n), rng.integers(1, 1024, n)
        csv_path, jsonl_path = Path(tmp) / "t.csv", Path(tmp) / "t.jsonl"
        with open(csv_path, "w") as f:
            f.write("arrival_ms,input_length,output_length\n")
            f.writelines(f"{a},{i},{o}\n" for a, i, o in zip(arr.tolist(), inp.tolist(), out.tolist()))
        with open(jsonl_path, "w") as f:
            for a, i, o in zip(arr.tolist(), inp.tolist(), out.tolist()):
                f.write(f'{{"timestamp": {a}, "input_length": {i}, "output_length": {o}, "hash_ids": [1, 2, 3]}}\n')
        for p in (csv_path, jsonl_path):
            med, lo = timed(lambda: load_trace(p), args.repeat)
            print(f"{f'trace {n:,} rows ({p.suffix[1:]})':<48} {med:9.4f} {lo:8.4f}")

    from jaxsim.query_files import read_queries

    with tempfile.TemporaryDirectory() as tmp:
        table = query_table(args.rows)
        csv_path, pq_path = Path(tmp) / "q.csv", Path(tmp) / "q.parquet"
        pacsv.write_csv(table, csv_path)
        pq.write_table(table, pq_path)
        for p in (csv_path, pq_path):
            med, lo = timed(lambda: read_queries(p), args.repeat)
            print(f"{f'queries {args.rows:,} rows ({p.suffix[1:]})':<48} {med:9.4f} {lo:8.4f}")

    cfg = tomllib.loads((ROOT / "configs" / "deployment_disaggregated.toml").read_text())
    spec = tomllib.loads((ROOT / "configs" / "quickstart.toml").read_text())
    spec.pop("workload", None)
    spec["workload"] = [{"name": "w", "isl": [128, 1024], "osl": [128]}]
    prof = json.loads((ROOT / "tests" / "goldens" / "public" / "tables" / "sd_k3" / "profile.json").read_text())
    for label, fn in (("config", lambda: config_from_dict(cfg, source="c.toml")),
                      ("sweep spec", lambda: spec_from_dict(spec, source="s.toml")),
                      ("profile.json", lambda: ModelProfile.from_dict(prof))):
        med, lo = timed(lambda: [fn() for _ in range(args.parse)], args.repeat)
        print(f"{f'schema: {label} x{args.parse:,}':<48} {med:9.4f} {lo:8.4f}")


if __name__ == "__main__":
    main()
