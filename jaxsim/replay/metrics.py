"""Replay metrics: per-request latencies and their aggregates (numpy, after the replay).

Per request: TTFT = first token - send; TTST = second token - first token; ITL = TPOT =
(last - first) / (generated - 1); E2E = last token - send. The send is the arrival in an open loop;
in a closed loop (``max_concurrency``) it is when the client's semaphore let the request go (vLLM's
benchmark measures TTFT from there too). Aggregates follow the reference's
prediction.json: nearest-rank percentiles at index round(q·(n-1)), ``duration_ms`` from the first
arrival to the last token, token throughputs over that duration. Token-gap ITL statistics (gaps inside a
speculative burst are 0) are given as mean/std; goodput counts completed requests meeting an SLA.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Mapping

import numpy as np

from jaxsim.replay.engine import DONE, REJECTED, TERMINAL_NAMES, TIMELINE_FIELDS, ReplayResult
from jaxsim.sla import SLA

PERCENTILES = (("median", 0.5), ("p75", 0.75), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99))
LATENCY_METRICS = ("ttft_ms", "ttst_ms", "itl_ms", "tpot_ms", "e2e_ms")


def per_request(
    result: ReplayResult | SimpleNamespace, arrival_ms, input_tokens, output_tokens, *, n: int | None = None
) -> dict[str, np.ndarray]:
    """Per-request columns (numpy) for one replay (a :class:`ReplayResult`, or a namespace of its per-request
    fields gathered to numpy); ``n`` trims padding (defaults to all)."""
    r = {k: np.asarray(v) for k, v in vars(result).items() if k != "timeline"}
    arrival = np.asarray(arrival_ms, dtype=np.float64)
    n = arrival.shape[0] if n is None else int(n)
    sl = slice(0, n)
    first, second, last = r["first_token_ms"][sl], r["second_token_ms"][sl], r["last_token_ms"][sl]
    gen = r["output_tokens"][sl].astype(np.int64)
    arr = arrival[sl]
    sent = r["sent_ms"][sl] if "sent_ms" in r else arr
    done = r["terminal"][sl] == DONE
    with np.errstate(invalid="ignore", divide="ignore"):
        steps = np.where(gen > 1, gen - 1, np.nan)
        itl = (last - first) / steps
    nan = np.nan
    return {
        "request": np.arange(n),
        "arrival_ms": arr,
        "sent_ms": sent,
        "input_tokens": np.asarray(input_tokens)[sl].astype(np.int64),
        "output_tokens": np.asarray(output_tokens)[sl].astype(np.int64),
        "generated_tokens": gen,
        "first_token_ms": first,
        "last_token_ms": last,
        "ttft_ms": first - sent,
        "ttst_ms": second - first,
        "itl_ms": itl,
        "tpot_ms": itl,
        "e2e_ms": np.where(done, last - sent, nan),
        "decode_rounds": r["decode_rounds"][sl].astype(np.int64),
        "preemptions": r["preemptions"][sl].astype(np.int64),
        "admissions": r["admissions"][sl].astype(np.int64),
        "token_gap_sq_ms2": r["token_gap_sq_ms2"][sl],
        "terminal": np.array([TERMINAL_NAMES[int(t)] for t in r["terminal"][sl]], dtype=object),
    }


def percentile(values: np.ndarray, q: float) -> float:
    """Nearest-rank percentile at sorted index round_half_up(q·(n-1)) (NaN when empty)."""
    v = np.sort(np.asarray(values, dtype=np.float64)[~np.isnan(values)])
    if v.size == 0:
        return float("nan")
    return float(v[int(math.floor(q * (v.size - 1) + 0.5))])


def summarize(values: np.ndarray) -> dict[str, float]:
    """mean / min / max / std and the standard percentiles of the non-NaN values."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    out = {"mean": float(v.mean()) if v.size else float("nan")}
    out["min"] = float(v.min()) if v.size else float("nan")
    out["max"] = float(v.max()) if v.size else float("nan")
    out["std"] = float(v.std()) if v.size else float("nan")
    for name, q in PERCENTILES:
        out[name] = percentile(v, q)
    return out


def aggregate(req: Mapping[str, np.ndarray], sla: SLA | None = None) -> dict[str, float]:
    """Replay-level metrics from :func:`per_request` columns."""
    done = req["terminal"] == TERMINAL_NAMES[DONE]
    rejected = req["terminal"] == TERMINAL_NAMES[REJECTED]
    arr = req["arrival_ms"]
    out: dict[str, float] = {
        "num_requests": float(arr.size),
        "completed_requests": float(done.sum()),
        "rejected_requests": float(rejected.sum()),
        "total_input_tokens": float(req["input_tokens"][done].sum()),
        "total_output_tokens": float(req["generated_tokens"][done].sum()),
    }
    end = float(np.max(req["last_token_ms"][done])) if done.any() else float("nan")
    start = float(np.min(arr)) if arr.size else float("nan")
    duration = end - start
    out["duration_ms"] = duration
    secs = duration / 1000.0 if duration > 0 else float("nan")
    out["request_throughput_rps"] = out["completed_requests"] / secs
    out["input_throughput_tok_s"] = out["total_input_tokens"] / secs
    out["output_throughput_tok_s"] = out["total_output_tokens"] / secs
    out["total_throughput_tok_s"] = (out["total_input_tokens"] + out["total_output_tokens"]) / secs
    for metric in LATENCY_METRICS:
        vals = np.where(done, req[metric], np.nan)
        for stat, v in summarize(vals).items():
            out[f"{stat}_{metric}"] = v
    # token-gap ITL (a burst's tokens share one timestamp, so its inner gaps are 0)
    gen = req["generated_tokens"][done]
    gaps = float(np.sum(gen - 1)) if done.any() else 0.0
    span = float(np.sum((req["last_token_ms"] - req["first_token_ms"])[done]))
    mean_gap = span / gaps if gaps > 0 else float("nan")
    out["mean_token_gap_ms"] = mean_gap
    out["std_token_gap_ms"] = (
        math.sqrt(max(float(np.sum(req["token_gap_sq_ms2"][done])) / gaps - mean_gap * mean_gap, 0.0)) if gaps > 0 else float("nan")
    )
    out["preemptions"] = float(req["preemptions"].sum())
    out["decode_rounds"] = float(req["decode_rounds"].sum())
    if sla is not None:
        ok = done.copy()  # a request meets the SLA when it completed and each of its own latencies does
        for name, bound in sla.request_limits().items():
            v = req[name]
            ok &= np.where(np.isnan(v), name == "tpot_ms", v <= bound)
        out["goodput_requests"] = float(ok.sum())
        out["goodput_rps"] = float(ok.sum()) / secs
        out["goodput_fraction"] = float(ok.sum()) / arr.size if arr.size else float("nan")
    return out


def timeline_table(result: ReplayResult) -> dict[str, np.ndarray]:
    """Per-pass records kept by a replay run with ``timeline_len > 0`` (rows of unused passes dropped)."""
    tl = np.asarray(result.timeline)
    used = min(int(np.asarray(result.num_passes)), tl.shape[0])
    cols = {name: tl[:used, i] for i, name in enumerate(TIMELINE_FIELDS)}
    cols["latency_ms"] = cols["end_ms"] - cols["start_ms"]
    for name in TIMELINE_FIELDS[2:]:
        cols[name] = cols[name].astype(np.int64)
    cols["pass"] = np.arange(used)
    return cols
