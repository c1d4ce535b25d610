"""Which serving-overhead form carries from one GPU to another? Leave-one-GPU-out on the fitted GPUs only (issue 27).

Reads the rows scripts/benchmark_accuracy.py evaluated (WORK/bench-rows.jsonl: jaxsim's predictions without overhead,
the measured TTFT) and, for each candidate form of the TTFT overhead (columns of a non-negative weighted least squares on
relative error, :func:`jaxsim.overhead.nonneg_wls`), fits it on the h100_sxm rows and scores the h200_sxm rows, then
the other way round. The held-out GPUs (b200/b300/gb200) are never read unless ``--held-out`` is given, and then only
to score each form fitted on both fitted GPUs, after the choice.

  PYTHONPATH=$PWD python scripts/overhead_forms.py --work /tmp/cov [--held-out]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opmodel_coverage as cov  # noqa: E402

from jaxsim.overhead import nonneg_wls  # noqa: E402

FORMS = {  # name -> columns of the overhead (ms) from predicted TTFT p, ISL i, layers L, concurrency c, predicted TPOT t
    "fixed + per prompt token (jaxsim's)": lambda p, i, L, c, t: [np.ones_like(p), i],
    "relative + fixed": lambda p, i, L, c, t: [p, np.ones_like(p)],
    "per layer + per prompt token": lambda p, i, L, c, t: [L, i],
    "fixed + per prompt token + per client": lambda p, i, L, c, t: [np.ones_like(p), i, c],
    "fixed + per prompt token + per client x prompt token": lambda p, i, L, c, t: [np.ones_like(p), i, c * i],
    "fixed + per prompt token + per predicted TPOT": lambda p, i, L, c, t: [np.ones_like(p), i, t],
    "relative only": lambda p, i, L, c, t: [p],
}


def _layers(model: str) -> float:
    from jaxsim.importers.op_model import _model_config

    cfg, _ = _model_config(cov.ALIASES.get(model, model))
    text = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
    return float(text["num_hidden_layers"])


def _cols(rows):
    layers = {m: _layers(m) for m in {r["model_path"] for r in rows}}
    f = lambda k: np.array([float(r[k]) for r in rows])  # noqa: E731
    return (f("jaxsim_ttft_ms"), f("isl"), f("silicon_ttft_ms"), np.array([layers[r["model_path"]] for r in rows]), f("batch_size"),
            f("jaxsim_tpot_ms"))


def _fit(form, rows):
    p, i, m, L, c, t = _cols(rows)
    return nonneg_wls(np.stack(FORMS[form](p, i, L, c, t), 1), m - p, 1 / m**2)


def _abs_err_pct(form, beta, rows):
    p, i, m, L, c, t = _cols(rows)
    return np.abs((p + np.stack(FORMS[form](p, i, L, c, t), 1) @ beta) / m - 1) * 100


def _q(e) -> str:
    return f"{np.median(e):.1f} % / {np.percentile(e, 90):.1f} %"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/jaxsim-opmodel-coverage"))
    ap.add_argument("--rows", default="bench-rows.jsonl", help="the evaluated rows in WORK (default: the steady state's)")
    ap.add_argument("--held-out", action="store_true",
                    help="also score each form fitted on both fitted GPUs on the held-out rows both tools evaluate")
    args = ap.parse_args()
    res = {}
    for line in (args.work / args.rows).read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            res[d["id"]] = d["result"]
    rows = [dict(r, **res[r["id"]]) for r in cov.agg_rows() if (cov._int(r["attention_dp_size"]) or 1) == 1 and r["id"] in res]
    rows = [r for r in rows if r.get("jaxsim")]
    h100, h200 = ([r for r in rows if r["system"] == s] for s in ("h100_sxm", "h200_sxm"))
    if len(h100) < 8 or len(h200) < 8:
        sys.exit(f"error: {len(h100)} h100_sxm and {len(h200)} h200_sxm rows evaluated: too few for leave-one-GPU-out")
    print(f"| TTFT overhead form | fit h100, score h200 ({len(h200)}) | fit h200, score h100 ({len(h100)}) | both (median / p90 abs error) |")
    print("|---|---:|---:|---:|")
    for form in FORMS:
        a, b = _abs_err_pct(form, _fit(form, h100), h200), _abs_err_pct(form, _fit(form, h200), h100)
        print(f"| {form} | {_q(a)} | {_q(b)} | {_q(np.concatenate([a, b]))} |")
    if args.held_out:
        held = [r for r in rows if r["system"] in ("b200_sxm", "b300_sxm", "gb200", "gb200_sxm") and r.get("aic")]
        print(f"\nheld out ({len(held)} rows both tools evaluate), each form fitted on h100 + h200:")
        for form in FORMS:
            print(f"  {form}: {_q(_abs_err_pct(form, _fit(form, h100 + h200), held))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
