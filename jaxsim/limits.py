"""Documented ranges for every numeric input (see docs/limits.md).

Every count, length, rate and size a user can give (config keys, sweep-spec keys, CLI options, trace
rows) is checked against one of these ranges in plain Python before any work starts, so that no
input makes the work grow without bound and no value reaches numpy/JAX as an overflowing integer.
Readers raise their own one-line error naming the file/key; :func:`problem` supplies the wording.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    lo: float
    hi: float
    what: str
    integer: bool = True
    lo_open: bool = False  # lo itself is excluded (rates, scales, SLA bounds)

    def text(self) -> str:
        lo = f"> {_num(self.lo)}" if self.lo_open else f">= {_num(self.lo)}"
        kind = "an integer" if self.integer else "a finite number"
        return f"{kind} {lo} and <= {_num(self.hi)}"


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


# One entry per kind of quantity; docs/limits.md is generated from this table (tests/test_limits.py checks it).
LIMITS: dict[str, Range] = {
    "replicas": Range(1, 1024, "replicas of one role (workers of one pool)"),
    "parallel": Range(1, 1024, "tp, pp, dp, cp, dcp, moe_tp, moe_ep (per role)"),
    "gpus": Range(1, 65536, "GPUs of a whole deployment; sweep gpu_budget"),
    "tokens": Range(1, 10_000_000, "token lengths: isl, osl, trace lengths, context_length, max_num_batched_tokens"),
    "max_num_seqs": Range(1, 65536, "max_num_seqs; sweep concurrency; replay --max-concurrency"),
    "op_model_seqs": Range(1, 1024, "jaxsim import op-model --max-num-seqs (one decode curve per batch size)"),
    "op_model_prefill_batch": Range(1, 64, "jaxsim import op-model --max-prefill-batch (prefill rows per batch size)"),
    "block_size": Range(1, 65536, "KV block size (tokens)"),
    "requests": Range(1, 10_000_000, "requests in a trace: trace synth --n, replay --max-requests, trace files"),
    "seeds": Range(1, 1024, "replay --seeds"),
    "seed": Range(0, 2**32 - 1, "RNG seeds (--seed)"),
    "rate": Range(0, 1e6, "arrival rates (requests/s), trace synth --rate and --cv", integer=False, lo_open=True),
    "time_scale": Range(0, 1e6, "replay --time-scale", integer=False, lo_open=True),
    "ms": Range(0, 1e12, "latency bounds (SLA keys, --sla-*-ms), milliseconds", integer=False, lo_open=True),
    "gbps": Range(0, 1e9, "link bandwidths (kv_transfer_gbps)", integer=False, lo_open=True),
    "bytes": Range(1, 2**53, "memory sizes in bytes (gpu_memory_bytes)"),
    "top": Range(1, 1000, "sweep --top and --verify-top"),
    "blocks": Range(1, 2**40, "KV block counts (plot timeline --num-gpu-blocks)"),
    "usd_per_gpu_hour": Range(0, 1e4, "GPU prices, US dollars per GPU-hour (sweep [cost] usd_per_gpu_hour, --price)", integer=False, lo_open=True),
    "load": Range(0, 1e12, "target loads of jaxsim size (--rate requests/s, --tokens-per-s output tokens/s)", integer=False, lo_open=True),
}


def problem(key: str, value) -> str | None:
    """``None`` when ``value`` lies in the range of ``key``; else what is wrong ("must be ...")."""
    r = LIMITS[key]
    if isinstance(value, bool):
        return f"must be {r.text()} (got {value!r})"
    if r.integer:
        if not isinstance(value, int):
            try:
                ok = isinstance(value, float) and value.is_integer()
            except Exception:  # noqa: BLE001 - any non-number
                ok = False
            if not ok:
                return f"must be {r.text()} (got {value!r})"
    elif not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"must be {r.text()} (got {value!r})"
    if value < r.lo or value > r.hi or (r.lo_open and value == r.lo):
        return f"must be {r.text()} (got {value:,})" if isinstance(value, int) else f"must be {r.text()} (got {value!r})"
    return None


def check(key: str, value, where: str, error: type[Exception] | None = None):
    """Return ``value`` if it lies in ``key``'s range, else raise ``error("WHERE: must be ...")``."""
    msg = problem(key, value)
    if msg is not None:
        if error is None:
            from jaxsim.errors import InputError as error
        raise error(f"{where}: {msg}")
    return value


def docs_table() -> str:
    """The markdown table of docs/limits.md."""
    lines = ["| kind | range | applies to |", "|---|---|---|"]
    for k, r in LIMITS.items():
        lo = ("(" if r.lo_open else "[") + _num(r.lo)
        lines.append(f"| `{k}` | {lo}, {_num(r.hi)}]{' integer' if r.integer else ''} | {r.what} |")
    return "\n".join(lines)
