"""Sizing: how many GPUs of which kind, at which TP, serve a target load within a sweep's SLA, and what
they cost (``jaxsim size``).

For every (profile, TP) of a sweep's results, every SLA-feasible row (a deployment at one concurrency per
worker) serves ``request_rate_per_s`` requests/s per serving unit; a target of R requests/s (or T output
tokens/s) needs ``ceil(R / rate)`` serving units of ``gpus`` GPUs each. The option of a (profile, TP) is
the feasible row needing the fewest GPUs (ties: the cheaper, then the faster per user); its cost per hour
is GPUs × $/GPU-hour and its cost per million output tokens is that hour's price over the target's output
tokens in an hour. Every throughput is a sweep row's (steady-state model, docs/sweep.md); nothing is
recomputed, and rows that miss the SLA are never used.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

from jaxsim import limits
from jaxsim.cost import SECONDS_PER_HOUR, TOKENS_PER_MILLION, gpu_name
from jaxsim.errors import InputError, QueryError
from jaxsim.sweep.report import BEST_COLUMNS, read_results, results_summary

__all__ = ["FleetOption", "SizingTarget", "size_fleet", "describe_sla", "describe_workload"]

_EPS = 1e-9  # 20 / 2.0000000001 units is 10 units, not 11


@dataclass(frozen=True)
class SizingTarget:
    """The load to serve: ``request_rate_per_s`` or ``output_tokens_per_s`` (exactly one, > 0)."""

    request_rate_per_s: float | None = None
    output_tokens_per_s: float | None = None

    def __post_init__(self):
        given = [(k, v) for k, v in (("--rate", self.request_rate_per_s), ("--tokens-per-s", self.output_tokens_per_s)) if v is not None]
        if len(given) != 1:
            raise InputError("give the load to serve: --rate REQUESTS_PER_S or --tokens-per-s OUTPUT_TOKENS_PER_S (exactly one)")
        opt, v = given[0]
        limits.check("load", v, opt)

    def describe(self, osl_mean: float) -> str:
        if self.request_rate_per_s is not None:
            return f"{self.request_rate_per_s:,.4g} req/s"
        return f"{self.output_tokens_per_s:,.6g} output tokens/s ({self.output_tokens_per_s / osl_mean:,.3g} req/s)"

    def output_tokens(self, osl_mean: float) -> float:
        """Output tokens/s of the target."""
        return self.output_tokens_per_s if self.output_tokens_per_s is not None else self.request_rate_per_s * osl_mean


@dataclass(frozen=True)
class FleetOption:
    """The fleet one (profile, TP) needs for a target: ``units`` serving units of ``unit_gpus`` GPUs
    (``gpus`` in all) running the sweep row ``config_id`` (its concurrency per worker, mode, K)."""

    profile: str
    system: str
    tp: int
    mode: str
    nextn: int
    acceptance: str
    concurrency: int
    data_source: str
    config_id: int
    unit_gpus: int
    unit_request_rate_per_s: float
    unit_output_tokens_per_s: float
    tokens_per_s_per_user: float
    units: int
    gpus: int
    usd_per_gpu_hour: float
    usd_per_hour: float
    usd_per_1m_output_tokens: float  # at the target load (the fleet's hour over the target's tokens)

    @property
    def gpu(self) -> str:
        return gpu_name(self.system)

    def answer(self) -> str:
        """``14 × B200 at TP2``."""
        return f"{self.gpus} × {self.gpu} at TP{self.tp}"

    def to_dict(self) -> dict:
        d = asdict(self)
        return {**{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}, "gpu": self.gpu,
                "answer": self.answer()}


_PCT = re.compile(r"^(?:p(\d+)_(ttft|tpot|e2e)_ms|(ttft|tpot|e2e)_p(\d+)_ms)$")
_STAT = re.compile(r"^(mean|median|max)_(ttft|tpot|e2e)_ms$")


def describe_sla(limits: Mapping[str, float]) -> str:
    """A sweep's SLA in words (``p90 TTFT ≤ 2,000 ms, mean TPOT ≤ 50 ms``); "no SLA" when none. Reads the
    limit keys of every release (``mean_``/``median_``/``pNN_``, ``max_`` for the mean, ``<metric>_pNN_ms``)."""
    parts = []
    rank = lambda k: next((i for i, m in enumerate(("ttft", "tpot", "e2e", "tokens")) if m in k), 9)  # noqa: E731
    for key, v in sorted(limits.items(), key=lambda kv: rank(kv[0])):
        m, s = _PCT.match(key), _STAT.match(key)
        if m:
            p, metric = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
            parts.append(f"{'median' if p == '50' else 'p' + p} {metric.upper()} ≤ {v:,.4g} ms")
        elif s:  # max_* (earlier releases) bounded the mean
            parts.append(f"{'mean' if s.group(1) == 'max' else s.group(1)} {s.group(2).upper()} ≤ {v:,.4g} ms")
        elif key == "min_tokens_per_s_per_user":
            parts.append(f"≥ {v:,.4g} tok/s per user")
        else:
            parts.append(f"{key} = {v:g}")
    return ", ".join(parts) or "no SLA"


def describe_workload(name: str, isl_mean: float, osl_mean: float, classes: int = 1) -> str:
    """``chat (4,096 in / 512 out)``; a mix of several request classes says "mean"."""
    return f"{name} ({'mean ' if classes > 1 else ''}{isl_mean:,.0f} in / {osl_mean:,.0f} out)"


def _units(t: pa.Table, target: SizingTarget) -> np.ndarray:
    """Serving units each row needs for the target (inf where the row serves nothing)."""
    if target.request_rate_per_s is not None:
        rate, want = t.column("request_rate_per_s").to_numpy(), target.request_rate_per_s
    else:
        rate, want = t.column("output_tokens_per_s_per_gpu").to_numpy() * t.column("gpus").to_numpy(), target.output_tokens_per_s
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.isfinite(rate) & (rate > 0), np.ceil(want / np.where(rate > 0, rate, 1.0) - _EPS), np.inf)


def _workload_rows(t: pa.Table, workload: str | None, source: str) -> tuple[pa.Table, str]:
    names = list(dict.fromkeys(np.asarray(t.column("workload").to_numpy(zero_copy_only=False)).astype(str).tolist()))
    if workload is None:
        if len(names) > 1:
            raise InputError(f"{source}: {len(names)} workloads ({', '.join(names)}); choose one with --workload")
        workload = names[0] if names else ""
    elif workload not in names:
        raise InputError(f"{source}: no workload {workload!r} (workloads: {', '.join(names)})")
    keep = np.asarray(t.column("workload").to_numpy(zero_copy_only=False)).astype(str) == workload
    return t.filter(pa.array(keep)), workload


def size_fleet(results: str | os.PathLike | pa.Table, target: SizingTarget, *, workload: str | None = None,
               prices: Mapping[str, float] | None = None) -> tuple[list[FleetOption], dict]:
    """The fleet each (profile, TP) of ``results`` needs for ``target`` on ``workload`` within the sweep's
    SLA, cheapest first (by $/hour when every option has a price, else by GPUs); and a context dict
    (workload, its mean ISL/OSL, the SLA limits). ``prices`` (system → $/GPU-hour) replace the results'."""
    source = str(results) if not isinstance(results, pa.Table) else "results"
    t = read_results(results, BEST_COLUMNS)
    if not t.num_rows:
        raise QueryError(f"{source}: the sweep results have no rows")
    t, workload = _workload_rows(t, workload, source)
    summary = results_summary(results)
    context = {"workload": workload, "isl_mean": float(t.column("isl_mean")[0].as_py()), "osl_mean": float(t.column("osl_mean")[0].as_py()),
               "sla": summary.get("sla", {}), "classes": int(summary.get("workload_classes", {}).get(workload, 1))}
    t = t.filter(pa.array(t.column("sla_ok").to_numpy(zero_copy_only=False)))
    if not t.num_rows:
        return [], context
    units = _units(t, target)
    gpus = units * t.column("gpus").to_numpy()
    systems = np.asarray(t.column("system").to_numpy(zero_copy_only=False)).astype(str)
    price = np.array([float(prices[s]) if prices and s in prices else p for s, p in zip(systems, t.column("usd_per_gpu_hour").to_numpy())])
    per_hour = gpus * price
    user = np.nan_to_num(t.column("tokens_per_s_per_user").to_numpy(), nan=-np.inf)
    ids = t.column("config_id").to_numpy()
    profiles = np.asarray(t.column("profile").to_numpy(zero_copy_only=False)).astype(str)
    tps = t.column("tp").to_numpy()
    key = np.unique(np.stack([np.unique(profiles, return_inverse=True)[1].reshape(-1), tps], axis=1), axis=0, return_inverse=True)[1].reshape(-1)
    order = np.lexsort((ids, -user, np.nan_to_num(per_hour, nan=np.inf), gpus, key))
    first = order[np.r_[True, key[order][1:] != key[order][:-1]]]
    first = first[np.isfinite(gpus[first])]
    rows = t.take(pa.array(first)).to_pylist()
    out_tokens = target.output_tokens(context["osl_mean"])
    options = []
    for r, i in zip(rows, first):
        mode = r["mode"] if r["mode"] == "aggregated" else f"disagg {r['prefill_workers']}:{r['decode_workers']}"
        options.append(FleetOption(
            profile=r["profile"], system=r["system"], tp=int(r["tp"]), mode=mode, nextn=int(r["nextn"]),
            acceptance=r["acceptance"] if r["nextn"] else "-", concurrency=int(r["concurrency_target"]),
            data_source=str(r.get("data_source", "measured")), config_id=int(r["config_id"]), unit_gpus=int(r["gpus"]),
            unit_request_rate_per_s=float(r["request_rate_per_s"]), unit_output_tokens_per_s=float(r["output_tokens_per_s_per_gpu"] * r["gpus"]),
            tokens_per_s_per_user=float(r["tokens_per_s_per_user"]), units=int(units[i]), gpus=int(gpus[i]),
            usd_per_gpu_hour=float(price[i]), usd_per_hour=float(per_hour[i]),
            usd_per_1m_output_tokens=float(per_hour[i] / (out_tokens * SECONDS_PER_HOUR) * TOKENS_PER_MILLION),
        ))
    priced = all(math.isfinite(o.usd_per_hour) for o in options)
    options.sort(key=lambda o: ((o.usd_per_hour if priced else 0.0), o.gpus, -o.tokens_per_s_per_user, o.config_id))
    return options, context
