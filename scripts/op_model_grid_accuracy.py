"""Grid accuracy and import time of `jaxsim import op-model`.

For each (model, system, TP) cell: import it (timed), compile the written table with jaxsim's kernels, draw
random OFF-GRID decode (batch, total KV) and prefill (batch, tokens, cached KV) points inside the table's
support, and compare jaxsim's direct interpolation of the table with the op model priced at the same point.
Prints per-cell import, write and table-compile seconds (wall, and CPU seconds of this process, which a
loaded machine inflates less) and median / p90 / max absolute % difference. Needs the `opmodel` extra.

  PYTHONPATH=$PWD python scripts/op_model_grid_accuracy.py [--points 400] [--cells Qwen/Qwen3-32B:h200_sxm:1 ...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

DEFAULT_CELLS = ("Qwen/Qwen3-32B:h200_sxm:1", "Qwen/Qwen3-32B:b200_sxm:2", "meta-llama/Meta-Llama-3.1-70B:h100_sxm:4",
                 "meta-llama/Meta-Llama-3.1-8B:l40s:1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=400)
    ap.add_argument("--cells", nargs="*", default=list(DEFAULT_CELLS))
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    args = ap.parse_args()

    from jaxsim.importers.op_model import Engine, OpModelRequest, import_op_model, resolve_request, write_op_model
    from jaxsim.kernels import rounds, status
    from jaxsim.profile import load_profile_dir

    rng = np.random.default_rng(args.seed)
    out = []
    for cell in args.cells:
        model, system, tp = cell.split(":")
        req = OpModelRequest(model, system, (int(tp),), max_num_seqs=args.max_num_seqs)
        t0, c0 = time.perf_counter(), time.process_time()
        res = import_op_model(req)
        t_import, c_import = time.perf_counter() - t0, time.process_time() - c0
        with tempfile.TemporaryDirectory() as d:
            t1, c1 = time.perf_counter(), time.process_time()
            write_op_model(Path(d) / "p", res)
            t_write, c_write = time.perf_counter() - t1, time.process_time() - c1
            bundle = load_profile_dir(Path(d) / "p")
            dep = bundle.profile.deployments[0]
            t1, c1 = time.perf_counter(), time.process_time()
            table = rounds.compile_round_table(bundle.cell(dep))
            t_compile, c_compile = time.perf_counter() - t1, time.process_time() - c1
        r = resolve_request(req)
        c = res.cells[0]
        eng = Engine(model, system, r.backend_version, int(tp), gemm=c.engine_modes["gemm_quant_mode"],
                     kv=c.engine_modes["kv_cache_dtype"], fmha=None)
        rows = c.rows
        # decode: random batch in [1, max], per-request context in the curve's range, off-grid
        n = args.points
        bmax = int(rows.decode_batch.max())
        db = rng.integers(1, bmax + 1, n)
        caps = np.minimum(r.max_model_len - 1, c.pool_tokens // db)
        ds = np.maximum(2, np.exp(rng.uniform(0, np.log(caps)))).astype(np.int64)
        ds = np.minimum(ds, caps)
        lat, code = rounds.decode_batch(table, db, db * ds)
        ok = np.array([status.is_supported(int(x)) for x in code])
        ref = np.array([eng.decode_ms(int(b), int(s)) for b, s in zip(db, ds)])
        derr = np.abs(np.asarray(lat)[ok] / ref[ok] - 1) * 100
        # prefill
        pbmax = int(rows.prefill_batch.max())
        pb = rng.integers(1, pbmax + 1, n)
        tcap = np.minimum(req.max_num_batched_tokens // pb, r.max_model_len - 1)
        pt = np.maximum(1, np.exp(rng.uniform(0, np.log(tcap)))).astype(np.int64)
        pp = np.where(rng.random(n) < 0.3, 0, np.exp(rng.uniform(np.log(16), np.log(r.max_model_len - 1), n))).astype(np.int64)
        lat, code = rounds.prefill_batch(table, pb, pb * pt, pb * pp)
        okp = np.array([status.is_supported(int(x)) for x in code])
        ref = np.array([eng.prefill_ms(int(b), int(t), int(p)) for b, t, p in zip(pb, pt, pp)])
        perr = np.abs(np.asarray(lat)[okp] / ref[okp] - 1) * 100
        row = {
            "cell": cell, "import_s": round(t_import, 2), "write_s": round(t_write, 2), "compile_s": round(t_compile, 2),
            "import_cpu_s": round(c_import, 2), "write_cpu_s": round(c_write, 2), "compile_cpu_s": round(c_compile, 2),
            "decode_rows": int(rows.decode_batch.size), "prefill_rows": int(rows.prefill_batch.size),
            "decode_supported": f"{ok.sum()}/{n}", "decode_median_pct": round(float(np.median(derr)), 4),
            "decode_p90_pct": round(float(np.percentile(derr, 90)), 4), "decode_max_pct": round(float(derr.max()), 3),
            "prefill_supported": f"{okp.sum()}/{n}", "prefill_median_pct": round(float(np.median(perr)), 4),
            "prefill_p90_pct": round(float(np.percentile(perr, 90)), 4), "prefill_max_pct": round(float(perr.max()), 3),
        }
        print(json.dumps(row), flush=True)
        out.append(row)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
