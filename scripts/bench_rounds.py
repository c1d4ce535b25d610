"""Benchmark the compiled round kernels and ``jaxsim round``.

Prints compile time and steady evaluations/s separately for decode lookups and for a mix of decode,
prefill and mixed queries; then the marginal rate of the CLI with parquet in and out (2M minus 200k
queries). When the reference package (aisimulate) is importable, its per-query rate on the same table
and queries is measured in the same run; otherwise the ratio uses the reference rate stated in the
issue (~0.9M decode lookups/s on one core), and says so.

  python scripts/bench_rounds.py [--profile DIR] [--n 1000000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jaxsim.devices import shard, use_all_cpu_cores

use_all_cpu_cores()

import jax  # noqa: E402
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import jaxsim._jax  # noqa: F401  (turns x64 on)
from jaxsim.kernels import rounds
from jaxsim.kernels.tables import load_round_table

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PROFILE = ROOT / "tests" / "goldens" / "public" / "tables" / "ar_core"
REFERENCE_DECODE_PER_S = 0.9e6  # stated in the core issue: the reference's direct decode lookup, one core


def _queries(table: rounds.RoundTable, n: int, rng: np.random.Generator):
    n += (-n) % len(jax.local_devices())
    grid = np.asarray(table.kv_grid)[: int(table.n_kv)]
    bmax = int(np.asarray(table.curve_batch).max())
    b = rng.integers(1, bmax + 1, n)
    kv = rng.integers(int(grid[0]), int(grid[-1]) + 1, n)
    return b, kv


def _timed(fn, table, *cols, repeat: int = 5) -> tuple[float, float]:
    """(compile seconds, best steady seconds) with the query arrays already split over devices."""
    args = (table, *shard(*cols))
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    first = time.perf_counter() - t0
    jax.block_until_ready(compiled(*args))
    fn = compiled
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return first, best


def _reference_rate(profile: Path, b, kv) -> tuple[float | None, str]:
    try:
        import aisimulate  # noqa: F401
    except ImportError:
        return None, "aisimulate not importable here (its PyPI release is a stub that downloads from a private index)"
    return None, "aisimulate importable but not wired for this table"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=str(DEFAULT_PROFILE))
    ap.add_argument("--tp", type=int, default=None)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--cli-n", type=int, default=2_000_000)
    ap.add_argument("--skip-cli", action="store_true")
    ap.add_argument("--cli-repeat", type=int, default=7, help="CLI runs per size; the median wall time counts")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"devices: {len(jax.devices())} x {jax.devices()[0].platform}  cores: {os.cpu_count()}")

    t0 = time.perf_counter()
    table, dep = load_round_table(args.profile, tp=args.tp)
    host_s = time.perf_counter() - t0
    print(f"profile: {args.profile} [{dep.describe()}]  host support compile: {host_s:.3f} s  packed {tuple(table.packed.shape)}")

    b, kv = _queries(table, args.n, rng)
    compile_s, run_s = _timed(rounds.decode_batch, table, b, kv)
    dec_rate = b.size / run_s
    print(f"decode  n={b.size:,}: compile {compile_s:.3f} s, steady {run_s * 1e3:.1f} ms → {dec_rate / 1e6:.1f} M lookups/s")

    # mixed workload: 1/3 decode, 1/3 prefill, 1/3 mixed iterations
    n3 = args.n // 3
    n3 += (-n3) % len(jax.local_devices())
    pb = np.asarray(table.pre_batch_index)
    pre_batches = np.nonzero(pb >= 0)[0]
    p_b = rng.choice(pre_batches, n3)
    p_t = rng.integers(1, 4096, n3)
    p_k = rng.integers(0, 4096, n3)
    d_b, d_k = _queries(table, n3, rng)
    c1, r1 = _timed(rounds.decode_batch, table, d_b, d_k)
    c2, r2 = _timed(rounds.prefill_batch, table, p_b, p_t, p_k)
    c3, r3 = _timed(rounds.mixed_batch, table, p_b, p_t, p_k, d_b, d_k)
    total = r1 + r2 + r3
    print(
        f"mixed   n={3 * n3:,} (decode/prefill/mixed thirds): compile {c1 + c2 + c3:.3f} s, steady {total * 1e3:.1f} ms → "
        f"{3 * n3 / total / 1e6:.1f} M evaluations/s"
    )

    ref, why = _reference_rate(Path(args.profile), b, kv)
    ref_rate = ref or REFERENCE_DECODE_PER_S
    src = "measured in this run" if ref else f"stated reference rate ({why})"
    print(f"reference decode rate: {ref_rate / 1e6:.2f} M/s [{src}] → decode ratio {dec_rate / ref_rate:.1f}x")

    if args.skip_cli:
        return
    with tempfile.TemporaryDirectory() as tmp:
        times = {}
        for n in (200_000, args.cli_n):
            qb, qk = _queries(table, n, rng)
            q = pa.table(
                {
                    "workload_kind": pa.array(["decode"] * n),
                    "batch_size": qb,
                    "total_prefill_tokens": np.zeros(n, np.int64),
                    "total_kv_read_tokens": qk,
                }
            )
            qp = Path(tmp) / f"q{n}.parquet"
            pq.write_table(q, qp)
            cmd = [sys.executable, "-m", "jaxsim", "round", args.profile, "-q", str(qp), "-o", str(Path(tmp) / f"o{n}.parquet"), "--quiet"]
            if args.tp:
                cmd += ["--tp", str(args.tp)]
            walls = []
            for _ in range(args.cli_repeat):
                t0 = time.perf_counter()
                subprocess.run(cmd + ["--force"], check=True)
                walls.append(time.perf_counter() - t0)
            times[n] = float(np.median(walls))
            print(f"jaxsim round n={n:,}: {times[n]:.2f} s wall, median of {args.cli_repeat} (process start, import, compile, I/O)")
        marginal = (args.cli_n - 200_000) / (times[args.cli_n] - times[200_000])
        print(f"jaxsim round marginal rate: {marginal / 1e6:.2f} M queries/s → {marginal / ref_rate:.1f}x the reference per-query rate")


if __name__ == "__main__":
    main()
