"""Why the op model prices MiniMax-M2.5's fp8_block decode ~3x the measured TPOT on B200, and whether pricing the
checkpoint with per-tensor FP8 data instead is a defensible choice (issue #23; docs/accuracy.md).

1. One decode step of MiniMax-M2.5 on B200 TP2 at batch 4 (1024/1024 at concurrency 4, mean context ~1536), priced
   with the checkpoint's fp8_block precision and with per-tensor fp8 for the dense GEMMs and/or the MoE, and its
   largest ops (``decode_step_per_op``); the checkpoint's dense fp8_block GEMMs priced with the collected fp8_block
   GEMM data and with the per-tensor fp8 GEMM data (``jaxsim import op-model --block-gemm-data``, default per-tensor).
2. The op model's GEMM silicon data at decode size (m = 4, k = 3072) per kernel on h200_sxm and b200_sxm; then, for
   every GPU with fp8_block GEMM data, its smallest GEMMs per precision (the block tables' host-bound floor) and the
   fp8_block / per-tensor fp8 ratio by GEMM size (about 1 where the block table is kernel-bound).
3. The choice judged on the GPUs fitting may use (h100_sxm / h200_sxm rows only; B200/B300/GB200 are held out):
   aiconfigurator's own vLLM aggregated TPOT for the sample's fp8_block-checkpoint rows priced at the checkpoint's
   fp8_block and at per-tensor fp8 (the rows' labels), median absolute error against the measured TPOT.

  PYTHONPATH=$PWD python scripts/opmodel_fp8_block.py
"""

from __future__ import annotations

import logging
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def step_breakdown() -> None:
    from jaxsim.importers import op_model as om

    r = om.resolve_request(om.OpModelRequest("MiniMaxAI/MiniMax-M2.5", "b200_sxm", (2,), max_num_seqs=16, max_model_len=2048))
    print("1. MiniMax-M2.5 b200_sxm TP2, one decode step at batch 4, context 1536 (ms)")
    for gemm, moe, data in ((None, None, "collected"), (None, None, "per-tensor"), (None, "fp8", "collected"), ("fp8", None, "collected"),
                            ("fp8", "fp8", "collected")):
        e = om.Engine(r.req.model, "b200_sxm", r.backend_version, 2, gemm=gemm, kv=None, fmha=None, moe=moe, block_gemm_data=data)
        per = e.handle.decode_step_per_op(4, 1536, 0)
        top = sorted(((name, ms) for name, ms, *_ in per), key=lambda x: -x[1])[:3]
        how = f"{e.gemm} ({data} data)" if e.gemm == "fp8_block" else e.gemm
        print(f"   gemm {how:28s} moe {e.moe:9s}: {e.decode_ms(4, 1536):6.2f}   largest ops: "
              + ", ".join(f"{n} {ms:.2f}" for n, ms in top))


def gemm_data() -> None:
    import aiconfigurator_core
    import pyarrow.parquet as pq

    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    print("2. the op model's GEMM data at m=4, k=3072: median latency (ms) per kernel over n")
    for system in ("h200_sxm", "b200_sxm"):
        t = pq.read_table(root / system / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet").to_pandas()
        q = t[(t.m == 4) & (t.k == 3072) & (t.n >= 768)]
        med = q.groupby("kernel_source").latency.median().round(4)
        print(f"   {system}: " + ", ".join(f"{k} {v}" for k, v in med.items()))


def block_tables() -> None:
    """The numbers behind jaxsim.importers.op_model.BLOCK_GEMM_DATA: each vLLM GEMM table's smallest GEMMs, and the
    fp8_block / per-tensor fp8 latency ratio by size (FLOP = 2 m n k) at the shapes both tables hold."""
    import aiconfigurator_core
    import numpy as np
    import pyarrow.parquet as pq

    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    print("2b. smallest GEMMs (m <= 16, n, k <= 1024): min / median latency (us) per precision; fp8_block / fp8 ratio p10/p50/p90 by FLOP")
    for f in sorted(root.glob("*/gemm/vllm/*/gemm_perf.parquet")):
        t = pq.read_table(f).to_pandas()
        if "fp8_block" not in set(t.gemm_dtype):
            continue
        small = t[(t.m <= 16) & (t.n <= 1024) & (t.k <= 1024)]
        floors = ", ".join(f"{d} {g.latency.min() * 1e3:.0f}/{g.latency.median() * 1e3:.0f}" for d, g in small.groupby("gemm_dtype"))
        per = t[t.gemm_dtype == "fp8"].set_index(["m", "n", "k"]).latency
        blk = t[t.gemm_dtype == "fp8_block"].groupby(["m", "n", "k"]).latency.min()
        ratio = (blk / per).dropna()
        flop = np.array([2.0 * m * n * k for m, n, k in ratio.index])
        parts = []
        for lo, hi in ((0, 1e10), (1e10, 1e12), (1e12, np.inf)):
            r = ratio.to_numpy()[(flop >= lo) & (flop < hi)]
            if r.size:
                parts.append(f"[{lo:.0e}, {hi:.0e}) " + "/".join(f"{x:.2f}" for x in np.percentile(r, [10, 50, 90])))
        print(f"   {f.relative_to(root).parts[0]}: {floors}; ratio {'; '.join(parts)}")


def in_sample() -> None:
    import opmodel_coverage as oc

    print("3. aiconfigurator's TPOT on the fp8_block checkpoints' rows of h100_sxm/h200_sxm (median |error| vs measured)")
    res = defaultdict(list)
    for r in oc.agg_rows():
        if r["system"] not in ("h100_sxm", "h200_sxm") or not any(m in r["model_path"] for m in ("MiniMax-M2.5", "Qwen3-235B-A22B-FP8")):
            continue
        key = (r["model_path"], r["system"], f"tp{r['tp_size']} dp{r['attention_dp_size'] or 1} ep{r['moe_ep_size'] or 1}")
        got = []
        for kw in ({"checkpoint_quant": True}, {}):
            try:
                got.append(oc.aic_estimate(r, **kw)[1])
            except Exception:  # noqa: BLE001 - not priced at that precision
                got.append(float("nan"))
        res[key].append((float(r["silicon_tpot_ms"]), *got))

    def med(xs):
        xs = sorted(x for x in xs if x == x)
        return f"{xs[len(xs) // 2]:.1f} %" if xs else "-"

    for key, v in sorted(res.items()):
        print(f"   {' '.join(key)} ({len(v)} rows): fp8_block {med([abs(b / m - 1) * 100 for m, b, _ in v])}, "
              f"per-tensor fp8 {med([abs(f / m - 1) * 100 for m, _, f in v])}")


def main() -> int:
    logging.disable(logging.WARNING)
    step_breakdown()
    gemm_data()
    block_tables()
    in_sample()
    return 0


if __name__ == "__main__":
    sys.exit(main())
