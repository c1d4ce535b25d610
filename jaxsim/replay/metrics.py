"""Replay metrics: per-request latencies and their aggregates (numpy, after the replay), defined as
``vllm bench serve`` defines them (``calculate_metrics`` in vLLM's ``vllm/benchmarks/serve.py``;
docs/benchmark-loads.md).

Per request: TTFT = first token - send; TTST = second token - first token; TPOT = (E2E - TTFT) /
(output tokens - 1) = (last - first) / (generated - 1), for requests with more than one output token;
E2E = last token - send. The send is the arrival in an open loop; in a closed loop (``max_concurrency``)
it is when the client's semaphore let the request go (vLLM's benchmark measures TTFT from there too).
Aggregates (:func:`aggregate`) use :mod:`jaxsim.stats`: NumPy's "linear" percentiles and vLLM's key names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import SimpleNamespace

import numpy as np

from jaxsim.overhead import added_latency_ms
from jaxsim.replay.engine import DONE, REJECTED, TERMINAL_NAMES, TIMELINE_FIELDS, ReplayResult
from jaxsim.sla import Goodput
from jaxsim.stats import latency_stats

LATENCY_METRICS = ("ttft", "ttst", "tpot", "e2e")
"""Per-request latency columns (``<metric>_ms``) a summary gives statistics of (ITL is pooled, apart)."""


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
        tpot = (last - first) / steps
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
        "tpot_ms": tpot,
        "e2e_ms": np.where(done, last - sent, nan),
        "decode_rounds": r["decode_rounds"][sl].astype(np.int64),
        "preemptions": r["preemptions"][sl].astype(np.int64),
        "admissions": r["admissions"][sl].astype(np.int64),
        "token_gap_sq_ms2": r["token_gap_sq_ms2"][sl],
        "terminal": np.array([TERMINAL_NAMES[int(t)] for t in r["terminal"][sl]], dtype=object),
    }


def with_overhead(req: Mapping[str, np.ndarray], overhead) -> dict:
    """Per-request columns with the serving overhead (fixed, per prompt token, per output token; ms) added as the
    steady state adds it (:func:`~jaxsim.overhead.added_latency_ms`): TTFT + fixed + per prompt token × its
    prompt, each later inter-token gap + per output token (TTST and TPOT + per output token, E2E + both); the
    engine's timeline (first/last token times, so throughput) is unchanged. Zero terms: ``req`` itself."""
    if not any(overhead):
        return req
    later = np.maximum(req["generated_tokens"] - 1, 0).astype(np.float64)
    first, rest = added_latency_ms(*overhead, req["input_tokens"].astype(np.float64), later)
    po = float(overhead[2])
    return dict(req, ttft_ms=req["ttft_ms"] + first, ttst_ms=req["ttst_ms"] + po, tpot_ms=req["tpot_ms"] + rest / np.maximum(later, 1.0),
                e2e_ms=req["e2e_ms"] + first + rest)


def summarize(req: Mapping[str, np.ndarray], goodput: Goodput | None = None, overhead=(0.0, 0.0, 0.0)) -> tuple[dict, dict]:
    """(per-request columns, :func:`aggregate`) with the serving overhead ``overhead`` (fixed, per prompt
    token, per output token; ms) applied per request on the host (:func:`with_overhead`): latency means,
    percentiles and goodput over the adjusted requests; ITL and token-gap means gain the per-output-token
    term spread over the emissions (their std is the engine's); throughput and duration unchanged."""
    req = with_overhead(req, overhead)
    out = aggregate(req, goodput)
    po = float(overhead[2]) if len(overhead) > 2 else 0.0
    if po:
        done = req["terminal"] == TERMINAL_NAMES[DONE]
        later = float(np.sum(np.maximum(req["generated_tokens"][done] - 1, 0)))
        rounds = float(np.sum(req["decode_rounds"][done]))
        out["mean_itl_ms"] += po * later / rounds if rounds > 0 else 0.0
        out["mean_token_gap_ms"] += po
    return req, out


def aggregate(req: Mapping[str, np.ndarray], goodput: Goodput | None = None) -> dict[str, float]:
    """Replay-level metrics from :func:`per_request` columns, as ``vllm bench serve`` reports them
    (:mod:`jaxsim.stats` names and percentiles) over the completed requests:

    * TTFT, TPOT (requests with more than one output token), TTST and E2E: mean, median, std, min, max
      and p50/p75/p90/p95/p99 (``mean_ttft_ms``, ``p99_tpot_ms``, ...);
    * ITL, all inter-token gaps of all requests pooled, one gap per emission as a streaming client sees
      them (a speculative burst arrives as one chunk): ``mean_itl_ms`` and ``std_itl_ms`` (exact, from
      the engine's per-request gap sums); the reference's token-gap ITL (a burst's inner gaps are 0):
      ``mean_token_gap_ms``, ``std_token_gap_ms``;
    * ``duration_ms`` from the first send to the last completion; request, input, output and total
      token throughputs over it; ``goodput`` (optional): requests meeting every per-request limit.
    """
    done = req["terminal"] == TERMINAL_NAMES[DONE]
    rejected = req["terminal"] == TERMINAL_NAMES[REJECTED]
    sent = req["sent_ms"] if "sent_ms" in req else req["arrival_ms"]
    out: dict[str, float] = {
        "num_requests": float(sent.size),
        "completed_requests": float(done.sum()),
        "rejected_requests": float(rejected.sum()),
        "total_input_tokens": float(req["input_tokens"][done].sum()),
        "total_output_tokens": float(req["generated_tokens"][done].sum()),
    }
    end = float(np.max(req["last_token_ms"][done])) if done.any() else float("nan")
    start = float(np.nanmin(sent)) if np.isfinite(sent).any() else float("nan")
    duration = end - start
    out["duration_ms"] = duration
    secs = duration / 1000.0 if duration > 0 else float("nan")
    out["request_throughput_rps"] = out["completed_requests"] / secs
    out["input_throughput_tok_s"] = out["total_input_tokens"] / secs
    out["output_throughput_tok_s"] = out["total_output_tokens"] / secs
    out["total_throughput_tok_s"] = (out["total_input_tokens"] + out["total_output_tokens"]) / secs
    for metric in LATENCY_METRICS:
        out.update(latency_stats(np.where(done, req[f"{metric}_ms"], np.nan), metric))
    span = float(np.sum((req["last_token_ms"] - req["first_token_ms"])[done]))
    sq = float(np.sum(req["token_gap_sq_ms2"][done]))
    out["mean_itl_ms"], out["std_itl_ms"] = _pooled_gaps(span, sq, float(np.sum(req["decode_rounds"][done])))
    out["mean_token_gap_ms"], out["std_token_gap_ms"] = _pooled_gaps(span, sq, float(np.sum(req["generated_tokens"][done] - 1)))
    out["preemptions"] = float(req["preemptions"].sum())
    out["decode_rounds"] = float(req["decode_rounds"].sum())
    if goodput is not None:
        ok = done.copy()  # a request counts when it completed and each of its own latencies meets its limit
        for name, bound in goodput.limits().items():
            v = req[name]
            ok &= np.where(np.isnan(v), name == "tpot_ms", v <= bound)
        out["goodput_requests"] = float(ok.sum())
        out["goodput_rps"] = float(ok.sum()) / secs
        out["goodput_fraction"] = float(ok.sum()) / sent.size if sent.size else float("nan")
    return out


def _pooled_gaps(span_ms: float, sq_ms2: float, gaps: float) -> tuple[float, float]:
    """Mean and (population) std of pooled gaps from their sum, sum of squares and count; any gap not
    counted among the emissions is 0 (a burst's inner tokens)."""
    if gaps <= 0:
        return float("nan"), float("nan")
    mean = span_ms / gaps
    return mean, math.sqrt(max(sq_ms2 / gaps - mean * mean, 0.0))


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
