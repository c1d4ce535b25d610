"""Held-out accuracy of imported FPM profiles, priced by the compiled round kernels.

The protocol and report behind ``scripts/accuracy.py`` (the command line) and ``docs/accuracy.md``; the
calibration (:mod:`jaxsim.calibrate`) scores its held-out passes with the same split and statistics.

Protocol (split by time, never by random rows):

* blocked time split: the log, in counter_id order, is cut into windows of ``--window`` consecutive
  iterations; the first ``--train-fraction`` of every window trains, the rest is held out (contiguous
  held-out stretches, so neighbouring correlated iterations never straddle train and test);
* chronological split (reported as a stress test): the first ``--train-fraction`` of the whole log trains;
* the training rows go through the importer (classification, binning) and ``compile_round_table``; held-out
  decode-only, prefill-only and mixed iterations are priced with ``rounds.mixed_batch``;
* coverage = share of held-out iterations the table supports; errors = |predicted / measured - 1| over the
  supported ones (median and p90, in %);
* mixed iterations are also scored "paired" when the training log shows mis-split admission steps (the
  decode iteration just before a prefill-bearing one is systematically slow, i.e. time leaks across that
  boundary): a mixed iteration then counts together with the decode iteration before it (sums compared).

The Llama-3.1-8B planner comparison predicts the planner's measured ITL and TTFT points with the bundled
profile's construction, both in-sample and leaving one measured context (decode) / one ISL (prefill) out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from jaxsim.importers import dynamo_planner
from jaxsim.importers.fpm_log import BinnedRows, BinningConfig, FpmLog, bin_rows, classify_rows, read_fpm_log
from jaxsim.kernels import rounds, status

__all__ = ["PHASES", "ape", "ape_stats", "evaluate_split", "planner_comparison", "planner_table", "qwen_table", "run", "time_split"]

PHASES = ("decode", "prefill", "mixed")


def time_split(n: int, *, mode: str = "blocked", train_fraction: float = 0.7, window: int = 100) -> np.ndarray:
    """Boolean training mask over ``n`` time-ordered passes (see the module docstring): ``blocked``, the
    first ``train_fraction`` of every ``window`` passes; ``chronological``, the first ``train_fraction``."""
    idx = np.arange(n)
    if mode == "chronological":
        return idx < int(round(train_fraction * n))
    if mode == "blocked":
        return (idx % window) < int(round(train_fraction * window))
    raise ValueError(f"unknown split mode {mode!r}")


def ape(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    """Absolute percentage errors |pred / meas - 1| x 100."""
    return np.abs(pred / meas - 1.0) * 100.0


def ape_stats(errors: np.ndarray, n: int, covered: int) -> dict:
    """n scored points, how many the table covers, coverage, median and p90 of the covered ones' APE (%)."""
    return {
        "n": int(n), "covered": int(covered), "coverage": covered / n if n else float("nan"),
        "median_ape": float(np.median(errors)) if errors.size else float("nan"),
        "p90_ape": float(np.percentile(errors, 90)) if errors.size else float("nan"),
    }


def evaluate_split(log: FpmLog, train: np.ndarray, binning: BinningConfig = BinningConfig()) -> dict:
    """Build from ``log[train]``, predict ``log[~train]``: stats per phase plus paired mixed stats."""
    tlog = log.take(train)
    classes = classify_rows(tlog, binning)
    table = rounds.compile_round_table(bin_rows(tlog, classes, binning))
    lat, code = rounds.mixed_batch(
        table, log.num_prefill_requests, log.prefill_tokens, log.prefill_kv_tokens, log.num_decode_requests,
        log.decode_kv_tokens,
    )
    lat, ok = np.asarray(lat), np.asarray(status.is_supported(np.asarray(code)))
    kind, meas = log.kind, log.latency_ms
    out: dict = {"train_rows": int(train.sum()), "heldout_rows": int((~train).sum()),
                 "admission_ratio": classes.admission_ratio, "admission_mis_split": classes.admission_dropped}
    for ph in PHASES:
        te = np.flatnonzero(~train & (kind == ph))
        hit = te[ok[te]]
        out[ph] = ape_stats(ape(lat[hit], meas[hit]), te.size, hit.size)
    for name, scope in (("mixed_paired", ~train), ("mixed_all", np.ones_like(train)), ("mixed_all_paired", np.ones_like(train))):
        te = np.flatnonzero(scope & (kind == "mixed") & ok)
        prev = te - 1
        pair = np.zeros(te.size, bool)
        if classes.admission_dropped and name.endswith("paired"):
            valid = prev >= 0
            pv = np.where(valid, prev, 0)
            pair = valid & (kind[pv] == "decode") & ok[pv] & (log.counter_id[pv] == log.counter_id[te] - 1)
        pv = np.maximum(prev, 0)
        p_pred = np.where(pair, lat[te] + lat[pv], lat[te])
        p_meas = np.where(pair, meas[te] + meas[pv], meas[te])
        n_mixed = int((scope & (kind == "mixed")).sum())
        out[name] = dict(ape_stats(ape(p_pred, p_meas), n_mixed, te.size), pairs=int(pair.sum()))
    return out


# ----------------------------------------------------------------------------------------------------
# Llama planner comparison


def _planner_rows(data: dynamo_planner.PlannerData, max_batch: int) -> BinnedRows:
    rows, _ = dynamo_planner.resample_decode(data, max_batch)
    return rows


def planner_comparison(directory: Path, max_batch: int = 1024) -> dict:
    """Predict the planner's own ITL/TTFT points: in-sample and leave-one-context / leave-one-ISL out."""
    data = dynamo_planner.read_planner_dir(directory)
    batch = data.decode_batch()
    keep = batch <= max_batch
    kv = batch * data.context_tokens

    def decode_pred(rows: BinnedRows, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = rounds.compile_round_table(rows)
        lat, code = rounds.decode_batch(t, batch[m], kv[m])
        return np.asarray(lat), np.asarray(status.is_supported(np.asarray(code)))

    full = _planner_rows(data, max_batch)
    lat, ok = decode_pred(full, keep)
    out = {"decode_in_sample": ape_stats(ape(lat[ok], data.itl_ms[keep][ok]), int(keep.sum()), int(ok.sum()))}
    apes, n, cov = [], 0, 0
    for c in np.unique(data.context_tokens):
        hold = keep & (data.context_tokens == c)
        rest = data.context_tokens != c
        sub = dataclasses.replace(
            data, kv_usage=data.kv_usage[rest], context_tokens=data.context_tokens[rest], itl_ms=data.itl_ms[rest],
        )
        lat, ok = decode_pred(_planner_rows(sub, max_batch), hold)
        apes.append(ape(lat[ok], data.itl_ms[hold][ok]))
        n, cov = n + int(hold.sum()), cov + int(ok.sum())
    out["decode_leave_one_context_out"] = ape_stats(np.concatenate(apes), n, cov)
    t = rounds.compile_round_table(full)
    ones, zeros = np.ones_like(data.prefill_isl), np.zeros_like(data.prefill_isl)
    lat, code = rounds.prefill_batch(t, ones, data.prefill_isl, zeros)
    ok = np.asarray(status.is_supported(np.asarray(code)))
    out["prefill_in_sample"] = ape_stats(ape(np.asarray(lat)[ok], data.prefill_ttft_ms[ok]), data.prefill_isl.size, int(ok.sum()))
    apes, cov = [], 0
    for i in range(data.prefill_isl.size):
        m = np.arange(data.prefill_isl.size) != i
        sub = dataclasses.replace(data, prefill_isl=data.prefill_isl[m], prefill_ttft_ms=data.prefill_ttft_ms[m])
        t = rounds.compile_round_table(_planner_rows(sub, max_batch))
        lat, code = rounds.prefill_batch(t, np.array([1]), data.prefill_isl[i : i + 1], np.array([0]))
        if status.is_supported(int(np.asarray(code)[0])):
            apes.append(ape(np.asarray(lat), data.prefill_ttft_ms[i : i + 1]))
            cov += 1
    out["prefill_leave_one_out"] = ape_stats(np.concatenate(apes) if apes else np.array([]), data.prefill_isl.size, cov)
    return out


# ----------------------------------------------------------------------------------------------------
# report


def _fmt(s: dict) -> str:
    if not s["n"]:
        return "- | - | - | -"
    cov = f"{100 * s['coverage']:.1f} %"
    if not s["covered"]:
        return f"{s['n']} | {cov} | - | -"
    return f"{s['n']} | {cov} | {s['median_ape']:.2f} % | {s['p90_ape']:.2f} %"


def qwen_table(results: dict) -> str:
    lines = [
        "| split | TP | phase | held-out iterations | coverage | median APE | p90 APE |",
        "|---|---|---|---|---|---|---|",
    ]
    for split, by_tp in results.items():
        for tp, r in by_tp.items():
            for ph in (*PHASES, "mixed_paired", "mixed_all", "mixed_all_paired"):
                if not r[ph]["n"] or (ph.endswith("paired") and not r[ph]["pairs"]):
                    continue  # nothing held out, or pairing does not apply (identical to the unpaired row)
                label = {"mixed_paired": "mixed, paired", "mixed_all": "mixed, whole log",
                         "mixed_all_paired": "mixed, whole log, paired"}.get(ph, ph)
                if ph.endswith("paired"):
                    label += f" ({r[ph]['pairs']} pairs)"
                lines.append(f"| {split} | TP{tp} | {label} | {_fmt(r[ph])} |")
    return "\n".join(lines)


def planner_table(res: dict) -> str:
    lines = ["| comparison | points | coverage | median APE | p90 APE |", "|---|---|---|---|---|"]
    for k, s in res.items():
        lines.append(f"| {k.replace('_', ' ')} | {_fmt(s)} |")
    return "\n".join(lines)


def run(data: Path, *, window: int, train_fraction: float, tps=(1, 2, 4), chronological: bool = True) -> dict:
    splits = {f"blocked W={window}": ("blocked", window)}
    if chronological:
        splits["chronological"] = ("chronological", window)
    results: dict = {name: {} for name in splits}
    for tp in tps:
        log = read_fpm_log(data / "measured" / "fpm_runs" / f"qwen3_32b_bf16_tp{tp}_ep1" / "fpm_metrics_detail.csv")
        for name, (mode, w) in splits.items():
            results[name][tp] = evaluate_split(log, time_split(len(log), mode=mode, train_fraction=train_fraction, window=w))
    return results
