"""Benchmark ``jaxsim sweep``: compile time and configs/s, separately, from 10^3 to 10^6 (10^7) configs.

Each size runs in a fresh process (so compile time is a cold compile and peak RSS is the run's own) on
the bundled Qwen3-32B profiles (autoregressive + derived EAGLE-3 K=1..3, TP1/2/4, aggregated and
disaggregated, a grid of ISL/OSL workloads; the concurrency axis is stretched to reach the size).
Reported per size: valid bindings, chunk size, backend compilations in the run (the sweep's evaluator
compiles once per shape bucket), evaluator compile seconds, configs/s of the compiled evaluator alone
(decode index → inputs → device → metrics on the host), configs/s of the whole streaming sweep
(parquet chunks, merge, Pareto), wall seconds and peak RSS.

When the reference package (aisimulate) is importable here, or its venv's python is given with
--reference-python, its static estimate rate (prefill + decode estimate per configuration, every call
answered) over the golden ``ar_core`` table is measured in the same run, with the ratio.

  python scripts/bench_sweep.py                 # 10^3 .. 10^6
  python scripts/bench_sweep.py --max 1e7       # also 10^7 (a few minutes on 2 cores)
  python scripts/bench_sweep.py --reference-python /path/to/ais-venv/bin/python   # with the reference's rate
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "goldens" / "public"
PROFILES = ["qwen3-32b-bf16-b300", *(f"qwen3-32b-bf16-b300-eagle3-k{k}" for k in (1, 2, 3))]
WORKLOADS = [{"name": "grid", "isl": [512, 1024, 2048, 3072, 4096, 6144, 8192, 16384], "osl": [64, 128, 256, 512, 1024, 4096]}]


def spec_for(n: int) -> dict:
    """A spec of about ``n`` configurations (exact count is reported)."""
    if n < 5_000:
        profiles, modes, acc = PROFILES[:1], ["aggregated"], []
    elif n < 50_000:
        profiles, modes, acc = PROFILES, ["aggregated"], ["eagle3-mtbench-qwen3-8b", 1.0, [0.9, 0.8, 0.7]]
    else:
        profiles, modes = PROFILES, ["aggregated", "disaggregated"]
        acc = ["eagle3-mtbench-qwen3-8b", "eagle3-mtbench-llama-3.1-8b-instruct", "eagle3-mtbench-gpt-oss-20b",
               0.5, 1.0, 1.5, 2.0, [0.9, 0.8, 0.7], [0.6, 0.5, 0.4]]
    d = {
        "name": f"bench-{n}",
        "block_size": 16,
        "gpu_budget": 16,
        "kv_transfer_gbps": 50,
        "profile": [{"name": p, "tp": [1, 2, 4]} for p in profiles],
        "serving": {"mode": modes, "ratios": ["1:1", "1:2", "2:1", "1:3", "3:1", "2:3"]},
        "speculation": {"nextn": ["profile"], "acceptance": acc},
        "scheduler": {"concurrency": [1]},
        "workload": WORKLOADS,
        "sla": {"mean_ttft_ms": 2000, "mean_tpot_ms": 50},
    }
    return d


def child(n: int, out_json: str) -> None:
    from jaxsim.devices import use_all_cpu_cores

    use_all_cpu_cores()
    import jax
    import numpy as np

    compiles = [0]
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, *a, **k: compiles.__setitem__(0, compiles[0] + (name == "/jax/core/compile/backend_compile_duration"))
    )
    import jaxsim  # noqa: F401
    from jaxsim.sweep import run as rn
    from jaxsim.sweep import spec as sp

    d = spec_for(n)
    t0 = time.perf_counter()
    base = sp.plan_sweep(sp.spec_from_dict(d, source=f"bench-{n}"))
    per_conc = max(base.num_configs, 1)
    d["scheduler"]["concurrency"] = list(range(1, max(1, round(n / per_conc)) + 1))
    plan = sp.plan_sweep(sp.spec_from_dict(d, source=f"bench-{n}"))
    plan_s = time.perf_counter() - t0
    size = rn.chunk_size_for(plan, rn.DEFAULT_CHUNK_SIZE, len(jax.local_devices()))

    # the compiled evaluator alone: every chunk decoded, evaluated and fetched to the host
    ev = rn.Evaluator(plan, size)
    chunks = plan.chunks(size)
    first = ev.dispatch(*chunks[0])
    jax.block_until_ready(first)
    t0 = time.perf_counter()
    pending = None
    for c in chunks:
        r = ev.dispatch(*c)
        if pending is not None:
            np.asarray(pending.status)
        pending = r
    np.asarray(pending.status)
    eval_s = time.perf_counter() - t0

    # the whole streaming sweep (the evaluator is already compiled in this process)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        rn.run_sweep(plan.spec, Path(tmp) / "r.parquet", plan=plan)
        run_s = time.perf_counter() - t0
        size_mb = (Path(tmp) / "r.parquet").stat().st_size / 2**20
    rep = {
        "configs": plan.num_configs,
        "bindings": plan.num_bindings,
        "chunk": size,
        "devices": len(jax.local_devices()),
        "compiles_total": compiles[0],
        "evaluator_compiles": ev.compiles,
        "plan_s": plan_s,
        "compile_s": ev.compile_s,
        "eval_configs_per_s": plan.num_configs / eval_s,
        "sweep_configs_per_s": plan.num_configs / run_s,
        "sweep_s": run_s,
        "parquet_mb": size_mb,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    Path(out_json).write_text(json.dumps(rep))


def reference_rate(seconds: float = 3.0) -> dict | None:
    """aisimulate's static estimate rate over the golden ar_core table: one configuration = its prefill
    and its decode estimate (``static_phase_latency``), on a (batch 1-4, ISL 128/512, OSL 32/64) grid
    inside that table's support, so every call is answered (refusals are counted apart)."""
    try:
        from aisimulate_core.sdk import ForwardPassPerfModelConfig, RustForwardPassPerfModel  # type: ignore
    except ImportError:
        return None
    import numpy as np

    cfg = json.loads((GOLDEN / "lookups.json").read_text())["tables"]["ar_core"]["aisimulate_config"]
    cwd = os.getcwd()
    os.chdir(GOLDEN)  # the reference resolves the model path against the set directory
    try:
        model = RustForwardPassPerfModel.best_available(ForwardPassPerfModelConfig(**cfg))
        rng = np.random.default_rng(0)
        n = 1_000_000
        grid = list(zip(rng.integers(1, 5, n).tolist(), rng.choice([128, 512], n).tolist(), rng.choice([32, 64], n).tolist()))
        answered = refused = 0
        t0 = time.perf_counter()
        for b, i, o in grid:
            try:
                model.static_phase_latency(batch_size=b, input_tokens=i, output_tokens=o, prefill=True)
                model.static_phase_latency(batch_size=b, input_tokens=i, output_tokens=o, prefill=False)
                answered += 1
            except Exception:  # noqa: BLE001 (outside support: counted, not timed as an answer)
                refused += 1
            if time.perf_counter() - t0 > seconds:
                break
        dt = time.perf_counter() - t0
        return {"calls": answered + refused, "answered": answered, "refused": refused, "per_s": answered / dt}
    finally:
        os.chdir(cwd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max", type=float, default=1e6, help="largest size (10^7 takes a few minutes on 2 cores)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--reference-python", default=None,
                    help="python of a venv with aisimulate (it pins its own jax): its static estimate rate runs there")
    ap.add_argument("--reference-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.reference_only:
        print(json.dumps(reference_rate()))
        return
    if a.child:
        child(a.child, a.out)
        return
    sizes = [10**k for k in range(3, 8) if 10**k <= a.max]
    rows = []
    print(f"{'configs':>11} {'bindings':>8} {'chunk':>6} {'dev':>3} {'compiles':>8} {'compile s':>9} {'eval cfg/s':>11} "
          f"{'sweep cfg/s':>11} {'sweep s':>8} {'RSS MB':>7}", flush=True)
    for n in sizes:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            env = dict(os.environ, JAX_COMPILATION_CACHE_DIR="", JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
            subprocess.run([sys.executable, __file__, "--child", str(n), "--out", f.name], check=True, env=env)
            r = json.loads(Path(f.name).read_text())
        rows.append(r)
        print(f"{r['configs']:>11,} {r['bindings']:>8} {r['chunk']:>6} {r['devices']:>3} {r['evaluator_compiles']:>3}/{r['compiles_total']:<4} "
              f"{r['compile_s']:>9.1f} {r['eval_configs_per_s']:>11,.0f} {r['sweep_configs_per_s']:>11,.0f} {r['sweep_s']:>8.1f} "
              f"{r['peak_rss_mb']:>7.0f}", flush=True)
    if a.reference_python:
        out = subprocess.run([a.reference_python, __file__, "--reference-only"], check=True, capture_output=True, text=True)
        ref = json.loads(out.stdout.strip().splitlines()[-1])
    else:
        ref = reference_rate()
    if ref is None:
        print("reference: aisimulate is not importable here; no reference rate or ratio measured")
    else:
        best = max(r["eval_configs_per_s"] for r in rows)
        print(f"reference: aisimulate static estimates {ref['per_s']:,.0f} answered configs/s ({ref['answered']} answered, "
              f"{ref['refused']} refused); jaxsim evaluator "
              f"{best:,.0f} configs/s: ratio {best / ref['per_s']:,.0f}x")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "reference": ref}, indent=1))


if __name__ == "__main__":
    main()
