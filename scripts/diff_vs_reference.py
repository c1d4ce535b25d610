"""Differential check: `jaxsim round` lookups against the reference on random tables.

For each seed, writes TABLES random FPM profile directories (tests/fuzz_tables.py: autoregressive and
speculative-round tables with batch ladders, capture-regime jumps, irregular KV grids, noisy and
non-monotone latencies, ties, decoy identities; a few tables the reference refuses to build) and
QUERIES boundary-biased decode / prefill / mixed queries per table. jaxsim answers them with the same
code as `jaxsim round` (load_round_table + queries.evaluate). With --reference-python, the reference
(aisimulate_core, in its own venv) answers the same queries in a child process: decode rows with its
decode lookup (predict_decode_latency_total), prefill rows with its prefill lookup
(predict_prefill_latency_total), mixed rows with its forward-pass lookup (estimate_forward_pass_time_ms).

Agreement = the same decision (answer or refusal; load accepted or refused) and, for answers, latency
within --rtol relative (default 1e-9). Prints the counts per seed and in total, and the first
disagreements with a reproduction (the table is kept under WORKDIR). Exit 1 on any disagreement.

  python scripts/diff_vs_reference.py --reference-python /work/ais-venv/bin/python \\
      --seeds 0 1 2 3 4 5 --tables 20 --queries 7000 [--workdir DIR]

Without --reference-python only jaxsim runs, and the script checks jaxsim-only invariants (no
negative latency, answers finite, refusals NaN). Latencies are SYNTHETIC; this measures agreement,
not accuracy. Timings it prints are wall clock on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import fuzz_tables as ft

# Runs inside the reference's venv: reads a manifest, answers every table's queries, writes JSON.
REFERENCE_WORKER = r'''
import json, sys
from aisimulate_core.sdk.rust_engine_step import RustForwardPassPerfModel as M

def fpm(np_, pt, pk, nd, dk):
    z = {"num_prefill_requests": 0, "sum_prefill_tokens": 0, "var_prefill_length": 0.0, "sum_prefill_kv_tokens": 0,
         "num_decode_requests": 0, "sum_decode_kv_tokens": 0, "var_decode_kv_tokens": 0.0}
    s = dict(z, num_prefill_requests=np_, sum_prefill_tokens=pt, sum_prefill_kv_tokens=pk, num_decode_requests=nd, sum_decode_kv_tokens=dk)
    return {"worker_id": "fuzz", "dp_rank": 0, "counter_id": 0, "wall_time": 0.0, "scheduled_requests": s, "queued_requests": z}

def err(e):
    return (type(e).__name__ + ": " + " ".join(str(e).split()))[:300]

manifest = json.load(open(sys.argv[1]))
out = []
for item in manifest:
    prof = json.load(open(item["dir"] + "/profile.json"))
    d = prof["deployments"][0]
    cfg = {"model": prof["model"], "system": d["system"], "backend": d["backend"], "backend_version": d["backend_version"],
           "worker_type": "aggregated", "tp": d["tp"], "pp": 1, "attention_dp": 1, "fpm_profile": prof,
           "estimation_mode": "fpm_interpolation", "fallback_policy": "deny", "database_mode": "SILICON",
           "estimator_config": {"fpm_interpolation": {"method": "direct", "fpm_parquet_path": item["dir"] + "/fpm_forward_perf.parquet"}}}
    if "execution_profile" in d:
        cfg["nextn"] = d["execution_profile"]["num_draft_tokens"]
    try:
        m = M.best_available(cfg)
    except Exception as e:
        out.append({"load": err(e), "answers": []})
        continue
    dec, pre, fwd = m.predict_decode_latency_total, m.predict_prefill_latency_total, m.estimate_forward_pass_time_ms
    answers = []
    for kind, b, p, kv, nd, dk in json.load(open(item["queries"])):
        try:
            if kind == "decode":
                v = dec(b, kv)
            elif kind == "prefill":
                v = pre(b, p, kv)
            else:
                v = fwd(fpm(b, p, kv, nd, dk))
            answers.append([True, v])
        except Exception as e:
            answers.append([False, err(e)])
    out.append({"load": "accepted", "answers": answers})
json.dump(out, open(sys.argv[2], "w"))
'''


def jaxsim_side(table_dir: Path, q: dict):
    """(load decision, latency, status, clamp binds) from the code `jaxsim round` runs."""
    from jaxsim.errors import JaxsimError
    from jaxsim.kernels import queries
    from jaxsim.kernels.tables import load_round_table
    from jaxsim.query_files import QueryBatch

    try:
        table, _ = load_round_table(table_dir)
    except JaxsimError as e:
        return "refused: " + str(e), None, None, None
    batch = QueryBatch(None, q["kind"], q["batch"], q["prefill_tokens"], q["kv_read"], q["decode_requests"], q["decode_kv"])
    lat, code = queries.evaluate(table, batch)
    return "accepted", lat, code, _clamp_binds(table, q, code)


def _clamp_binds(table, q: dict, code: np.ndarray) -> np.ndarray:
    """Mixed rows composed from both parts where decode < its baseline (the max(0, ·) clamp binds)."""
    import jax

    from jaxsim.kernels import rounds
    from jaxsim.kernels import status as st

    idx = np.flatnonzero((q["kind"] == 2) & (code == st.COMPOSED))
    out = np.zeros(code.size, bool)
    if idx.size:
        nd, dk = q["decode_requests"][idx], q["decode_kv"][idx]
        ld, _ = rounds.decode_batch(table, nd, dk)
        base = jax.jit(jax.vmap(rounds.decode_baseline_ms, in_axes=(None, 0, 0)))(table, nd, dk)
        out[idx] = np.asarray(ld) < np.asarray(base)
    return out


def run_reference(python: str, workdir: Path, cwd: Path, items: list[dict]) -> list[dict]:
    manifest, result, worker = workdir / "manifest.json", workdir / "reference.json", workdir / "reference_worker.py"
    worker.write_text(REFERENCE_WORKER)
    manifest.write_text(json.dumps(items))
    proc = subprocess.run([python, str(worker), str(manifest), str(result)], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"reference worker failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}")
    return json.loads(result.read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reference-python", default=None, help="python of a venv with aisimulate installed (omit: jaxsim-only checks)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--tables", type=int, default=20, help="random tables per seed")
    ap.add_argument("--queries", type=int, default=7000, help="queries per table")
    ap.add_argument("--rtol", type=float, default=1e-9)
    ap.add_argument("--show", type=int, default=10, help="disagreements to print")
    ap.add_argument("--workdir", default=None, help="where tables go (default: a temporary folder, kept on disagreement)")
    args = ap.parse_args(argv)

    import jaxsim._jax  # noqa: F401  (turns x64 on)
    from jaxsim.kernels import status as st

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="jaxsim-diff-"))
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / "golden-ckpt" / "fuzz-dense-8b"
    if not ckpt.exists():  # the reference checks the profile's architecture against this config.json
        shutil.copytree(ft.CASES / "golden-ckpt", work / "golden-ckpt", dirs_exist_ok=True)
    totals = dict(tables=0, tables_refused=0, queries=0, answered=0, agree=0, disagree=0, load_disagree=0, clamp=0)
    by_status: dict[tuple[str, str], int] = {}
    shown = 0
    t0 = time.time()
    for seed in args.seeds:
        rng = np.random.default_rng(seed)
        seed_dir = work / f"seed{seed}"
        items, tabs = [], []
        for i in range(args.tables):
            t = ft.random_table(rng)
            q = ft.random_queries(rng, t, args.queries)
            d = ft.write_profile_dir(t, seed_dir / f"t{i:03d}", name=f"s{seed}t{i}")
            (seed_dir / f"t{i:03d}" / "queries.json").write_text(json.dumps(ft.query_rows(q)))
            items.append({"dir": str(d.resolve()), "queries": str((d / "queries.json").resolve())})
            tabs.append((t, q, d))
        ref = run_reference(args.reference_python, seed_dir, work, items) if args.reference_python else None
        counts = dict(tables=0, tables_refused=0, queries=0, answered=0, agree=0, disagree=0, load_disagree=0, clamp=0)
        for i, (t, q, d) in enumerate(tabs):
            load, lat, code, clamp = jaxsim_side(d, q)
            counts["tables"] += 1
            n = q["kind"].size
            if ref is None:
                if load == "accepted":
                    counts["clamp"] += int(clamp.sum())
                    for kname, c in zip(q["kind"], code):
                        key = (ft.KINDS[int(kname)], st.name(int(c)))
                        by_status[key] = by_status.get(key, 0) + 1
                    ok = code < st.FIRST_UNSUPPORTED
                    bad = (ok & ~(np.isfinite(lat) & (lat >= 0))) | (~ok & ~np.isnan(lat))
                    counts["queries"] += n
                    counts["answered"] += int(ok.sum())
                    counts["disagree"] += int(bad.sum())
                    counts["agree"] += int(n - bad.sum())
                else:
                    counts["tables_refused"] += 1
                continue
            r = ref[i]
            if (load == "accepted") != (r["load"] == "accepted"):
                counts["load_disagree"] += 1
                if shown < args.show:
                    shown += 1
                    print(f"LOAD seed {seed} table {d}: jaxsim {load[:160]!r}; reference {r['load'][:160]!r}")
                continue
            if load != "accepted":
                counts["tables_refused"] += 1
                continue
            counts["queries"] += n
            counts["clamp"] += int(clamp.sum())
            for kname, c in zip(q["kind"], code):
                key = (ft.KINDS[int(kname)], st.name(int(c)))
                by_status[key] = by_status.get(key, 0) + 1
            rows = ft.query_rows(q)
            for j, (rok, rv) in enumerate(r["answers"]):
                jok = bool(code[j] < st.FIRST_UNSUPPORTED)
                same = jok == rok and (not rok or math.isclose(float(lat[j]), float(rv), rel_tol=args.rtol, abs_tol=1e-12))
                counts["answered"] += int(jok)
                if same:
                    counts["agree"] += 1
                    continue
                counts["disagree"] += 1
                if shown < args.show:
                    shown += 1
                    jv = float(lat[j]) if jok else st.name(int(code[j]))
                    print(f"DIFF seed {seed} {d} ({t.style}, {'SD' if t.speculative else 'AR'}): {rows[j]}: jaxsim {jv!r} "
                          f"[{st.name(int(code[j]))}]; reference {rv if rok else str(rv)[:200]!r}")
        print(
            f"seed {seed}: tables {counts['tables']} ({'refused at load by both' if ref is not None else 'refused at load'}: "
            f"{counts['tables_refused']}), "
            f"queries {counts['queries']}, answered {counts['answered']}, agree {counts['agree']}, "
            f"disagree {counts['disagree']}, load disagreements {counts['load_disagree']}, "
            f"mixed rows where the clamp binds {counts['clamp']}",
            flush=True,
        )
        for k in totals:
            totals[k] += counts[k]
        if not args.workdir and counts["disagree"] == 0 and counts["load_disagree"] == 0:
            shutil.rmtree(seed_dir, ignore_errors=True)
    side = "jaxsim vs reference" if args.reference_python else "jaxsim only (no reference given)"
    refused = "refused at load by both" if args.reference_python else "refused at load"
    print(f"TOTAL ({side}, {len(args.seeds)} seeds, {time.time() - t0:.0f} s wall): tables {totals['tables']} "
          f"({refused}: {totals['tables_refused']}), queries {totals['queries']}, answered {totals['answered']}, "
          f"agree {totals['agree']}, disagree {totals['disagree']}, load disagreements {totals['load_disagree']}, "
          f"mixed rows where the clamp binds {totals['clamp']}")
    if by_status:
        print("queries by kind and jaxsim status:")
        for (kname, sname), c in sorted(by_status.items()):
            print(f"  {kname:8s} {sname:60s} {c}")
    bad = totals["disagree"] + totals["load_disagree"]
    if bad and not args.workdir:
        print(f"tables kept under {work}")
    elif not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
