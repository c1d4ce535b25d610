"""Benchmark: validate 10,000 deployment configs (target ≤ 1 s on 2 CPU cores).

Configs vary depth, acceptance, block size, scheduler envelope, memory fraction, parallelism, mode and
estimator policy over the golden profiles (valid and invalid mixed). Profile directories and cells are
loaded once (the cache is warmed first and reported separately); the timed loop is pure-Python validation.

    .venv/bin/python scripts/bench_validate.py [--n 10000]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from pathlib import Path

from jaxsim.rules.config import RoleConfig, config_from_dict
from jaxsim.rules.validate import validate_config

TABLES = Path(__file__).resolve().parent.parent / "tests" / "goldens" / "public" / "tables"
MODEL = "golden-ckpt/pub-dense-8b"


def make_configs(n: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    bases = []
    for table, k in (("ar_core", 0), ("ar_decoy", 0), ("sd_k3", 3), ("sd_k2", 2)):
        d = {"model": MODEL, "system": "h200_sxm", "backend_version": "0.24.0", "profile": str(TABLES / table)}
        if k:
            d |= {"nextn": k, "accepted_tokens": 1.0}
        bases.append((config_from_dict(d, source=f"{table}.toml"), k))
    out = []
    for i in range(n):
        cfg, k = bases[i % len(bases)]
        over: dict = {"block_size": rng.choice([16, 32, 64, 128])}
        if k:
            nextn = rng.choice([k, k, k, k - 1])
            over |= {"nextn": nextn, "accepted_tokens": rng.uniform(0, nextn)}
        if rng.random() < 0.1:
            over["method"] = "sol"
        if rng.random() < 0.1:
            over["context_length"] = rng.choice([1024, 32768, 40000])
        role = RoleConfig(
            name="aggregated",
            tp=rng.choice([1] * 9 + [2]),
            max_num_seqs=rng.choice([None] * 6 + [32, 64, 128]),
            gpu_memory_utilization=rng.choice([None] * 4 + [0.88, 0.9, 0.92]),
            replicas=rng.randint(1, 8),
        )
        if rng.random() < 0.2:
            over |= {"mode": "disaggregated", "roles": (dataclasses.replace(role, name="prefill"), dataclasses.replace(role, name="decode"))}
        else:
            over["roles"] = (role,)
        out.append(dataclasses.replace(cfg, **over))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    configs = make_configs(args.n)
    t0 = time.perf_counter()
    for cfg in configs[:8]:
        validate_config(cfg)
    warm = time.perf_counter() - t0
    best = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        invalid = sum(1 for cfg in configs if validate_config(cfg))
        best = min(best, time.perf_counter() - t0)
    print(f"cache warm-up (load 4 profile dirs + cells): {warm:.3f} s")
    print(f"validated {len(configs)} configs ({len(configs) - invalid} valid, {invalid} invalid) in {best:.3f} s "
          f"(best of {args.repeat}; {best / len(configs) * 1e6:.1f} µs/config) — target ≤ 1 s for 10,000")


if __name__ == "__main__":
    main()
