"""How well do the silicon sample's own runs repeat? A noise floor under issue 27's accuracy targets.

aiconfigurator-core's ``systems/silicon_sample.csv`` holds some benchmark configurations more than once (the same model,
GPU, precisions, parallel layout, ISL/OSL and concurrency, measured in different runs or taken from different sources).
For every vLLM aggregated configuration without attention DP measured more than once with different results, each run's
mean TTFT and TPOT is compared with the mean of the configuration's other runs: the error a predictor that knew each
configuration's true mean would still make on that run. Rows identical in every measured value (copies of one run) are
counted apart and left out. No jaxsim prediction is read.

  PYTHONPATH=$PWD python scripts/silicon_repeatability.py
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import opmodel_coverage as cov  # noqa: E402

GROUPS = (("all GPUs", None), ("held-out GPUs (b200/b300/gb200)", ("b200_sxm", "b300_sxm", "gb200")),
          ("fitted GPUs (h100/h200)", ("h100_sxm", "h200_sxm")))


def config_key(r: dict) -> tuple:
    return (r["model_path"], r["system"], r["gemm_quant_mode"], r["moe_quant_mode"], r["tp_size"], r["moe_tp_size"], r["moe_ep_size"],
            r["isl"], r["osl"], cov.worker_concurrency(r))


def repeatability(rows: list[dict], systems: tuple[str, ...] | None) -> dict:
    """Per-run |run / mean of the other runs - 1| (%) of TTFT and TPOT over the configurations measured more than once."""
    runs = defaultdict(list)
    for r in rows:
        if systems is None or r["system"] in systems:
            runs[config_key(r)].append((float(r["silicon_ttft_ms"]), float(r["silicon_tpot_ms"])))
    ttft, tpot, configs, copies = [], [], 0, 0
    for v in runs.values():
        distinct = sorted(set(v))
        copies += len(v) - len(distinct)
        if len(distinct) < 2:
            continue
        configs += 1
        t, p = np.array(distinct).T
        for i in range(t.size):
            ttft.append(abs(t[i] / np.delete(t, i).mean() - 1) * 100)
            tpot.append(abs(p[i] / np.delete(p, i).mean() - 1) * 100)
    return {"configs": configs, "runs": len(ttft), "copies": copies, "ttft": np.array(ttft), "tpot": np.array(tpot)}


def main() -> int:
    rows = [r for r in cov.agg_rows() if (cov._int(r["attention_dp_size"]) or 1) == 1]
    for label, systems in GROUPS:
        s = repeatability(rows, systems)
        if not s["runs"]:
            print(f"{label}: no configuration measured twice")
            continue
        print(f"{label}: {s['configs']} configurations measured more than once ({s['runs']} runs; {s['copies']} identical copies left "
              f"out); one run against the others' mean: TTFT median {np.median(s['ttft']):.1f} % p90 {np.percentile(s['ttft'], 90):.1f} %, "
              f"TPOT median {np.median(s['tpot']):.1f} % p90 {np.percentile(s['tpot'], 90):.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
