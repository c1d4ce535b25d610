#!/usr/bin/env python
"""Held-out accuracy of imported FPM profiles, priced by the compiled round kernels.

    .venv/bin/python scripts/accuracy.py DATA [--window 100] [--train-fraction 0.7] [--markdown docs/accuracy.md]

DATA is the measured-data folder (``measured/fpm_runs/qwen3_32b_bf16_tp{1,2,4}_ep1/fpm_metrics_detail.csv`` and
``measured/dynamo_planner_h200_llama31_8b_fp8/``); like the bundled-profile builder, this script reads it
from the path it is given.

The protocol and the tables are :mod:`jaxsim.accuracy`; this is its command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jaxsim.accuracy import planner_comparison, planner_table, qwen_table, run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path, help="measured-data folder (holds measured/fpm_runs and the planner results)")
    ap.add_argument("--window", type=int, default=100, help="blocked split window (iterations)")
    ap.add_argument("--train-fraction", type=float, default=0.7, help="training share of each window / of the log")
    ap.add_argument("--sensitivity", action="store_true", help="also report decode accuracy for windows 50..500")
    ap.add_argument("--markdown", type=Path, help="also write the tables to this markdown file")
    args = ap.parse_args(argv)
    results = run(args.data, window=args.window, train_fraction=args.train_fraction)
    text = ["## Qwen3-32B BF16 (vLLM 0.20.1): held-out forward passes", "", qwen_table(results), ""]
    if args.sensitivity:
        text += ["### Decode accuracy vs blocked-split window", "",
                 "| window | TP | coverage | median APE | p90 APE |", "|---|---|---|---|---|"]
        for w in (50, 100, 200, 500):
            r = run(args.data, window=w, train_fraction=args.train_fraction, chronological=False)[f"blocked W={w}"]
            for tp, x in r.items():
                s = x["decode"]
                text.append(f"| {w} | TP{tp} | {100 * s['coverage']:.1f} % | {s['median_ape']:.2f} % | {s['p90_ape']:.2f} % |")
        text.append("")
    planner = planner_comparison(args.data / "measured" / "dynamo_planner_h200_llama31_8b_fp8")
    text += ["## Llama-3.1-8B-Instruct FP8 on H200: profile vs Dynamo planner measurements", "", planner_table(planner), ""]
    out = "\n".join(text)
    print(out)
    if args.markdown:
        args.markdown.write_text(out + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
