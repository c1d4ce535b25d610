"""Service-level limits (plain Python, no JAX): the one SLA vocabulary of sweeps (``[sla]`` in a sweep
spec, judged on the sweep's rows and by ``--verify-top``) and the per-request goodput limits of replays
(``--sla-*-ms``, as ``vllm bench serve --goodput``).

An SLA bounds statistics of a configuration's latency distribution, each named by the key of the statistic
it bounds (:mod:`jaxsim.stats`, vLLM's names): ``mean_ttft_ms = 500`` means "mean TTFT at most 500 ms",
``p90_ttft_ms``, ``median_tpot_ms``, ``p99_e2e_ms``, ...; and ``min_tokens_per_s_per_user`` bounds
1000 / mean TPOT from below. The keys of earlier releases (``max_ttft_ms``, ``max_tpot_ms``,
``max_e2e_ms`` for the means, ``p50_*_ms`` for the medians) are accepted for one release with a
deprecation note (:func:`canonical_keys`).

The compiled sweep evaluator takes the same limits, field for field, as traced scalars
(:class:`jaxsim.sweep.evaluate.SLABounds`, built by ``SLABounds.of(sla)``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from jaxsim.errors import InputError
from jaxsim.stats import key

__all__ = ["SLA", "Goodput", "LATENCY_METRICS", "LIMIT_STATS", "LIMIT_QUANTILES", "LATENCY_KEYS", "PERCENTILE_KEYS",
           "DEPRECATED_KEYS", "canonical_keys"]

LATENCY_METRICS = ("ttft", "tpot", "e2e")
LIMIT_STATS = ("mean", "median", "p90", "p99")
LIMIT_QUANTILES = {"median": 50, "p90": 90, "p99": 99}
"""The percentile of each quantile statistic an SLA can bound."""
LATENCY_KEYS = tuple(key(s, m) for m in LATENCY_METRICS for s in LIMIT_STATS)
"""The latency limits' keys, metric-major (``mean_ttft_ms``, ``median_ttft_ms``, ..., ``p99_e2e_ms``)."""
PERCENTILE_KEYS = tuple(k for k in LATENCY_KEYS if not k.startswith("mean_"))
DEPRECATED_KEYS = {
    **{f"max_{m}_ms": key("mean", m) for m in LATENCY_METRICS},
    **{f"p50_{m}_ms": key("median", m) for m in LATENCY_METRICS},
}
"""Old SLA key → its name now (accepted for one release, with a note on stderr)."""


@dataclass(frozen=True)
class SLA:
    """Limits (None = no limit) on a configuration's latency statistics (:data:`LATENCY_KEYS`, each the
    upper bound of the statistic it names) and on its per-user output rate."""

    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    p90_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    p90_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_e2e_ms: float | None = None
    median_e2e_ms: float | None = None
    p90_e2e_ms: float | None = None
    p99_e2e_ms: float | None = None
    min_tokens_per_s_per_user: float | None = None

    def __post_init__(self):
        for name, v in self.limits().items():
            low_ok = v >= 0 if name == "min_tokens_per_s_per_user" else v > 0
            if not (math.isfinite(v) and low_ok):
                raise InputError(f"SLA {name}={v!r} must be a {'non-negative' if name.startswith('min') else 'positive'} finite number")

    def limits(self) -> dict:
        """The stated limits, by key."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if getattr(self, k) is not None}

    def latency_limits(self) -> dict:
        """The stated latency limits (means and percentiles), by key."""
        return {k: v for k, v in self.limits().items() if k in LATENCY_KEYS}

    def percentile_limits(self) -> dict:
        return {k: v for k, v in self.limits().items() if k in PERCENTILE_KEYS}


def canonical_keys(d: Mapping, where: str) -> tuple[dict, list[str]]:
    """``d`` with deprecated SLA keys renamed, and one deprecation note per renamed key. Both the old and
    the new name of one limit: :class:`InputError` naming them."""
    out, notes = {}, []
    for k, v in d.items():
        new = DEPRECATED_KEYS.get(k)
        if new is None:
            out[k] = v
            continue
        if new in d:
            raise InputError(f"{where}: {k} and {new} name the same limit; keep {new}")
        out[new] = v
        notes.append(f"note: {where}: {k} is deprecated, write {new} (the old name is accepted until the next release)")
    return out, notes


@dataclass(frozen=True)
class Goodput:
    """Per-request limits of a replay's goodput (``vllm bench serve --goodput ttft:MS tpot:MS e2el:MS``):
    a request counts when it completed and its own TTFT, TPOT and E2E meet every stated limit."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self):
        for name, v in self.limits().items():
            if not (math.isfinite(v) and v > 0):
                raise InputError(f"goodput {name}={v!r} must be a positive finite number")

    def limits(self) -> dict:
        """The stated per-request limits, by per-request column (``ttft_ms``, ``tpot_ms``, ``e2e_ms``)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if getattr(self, k) is not None}


assert LATENCY_KEYS == tuple(k for k in SLA.__dataclass_fields__ if k != "min_tokens_per_s_per_user"), \
    "SLA fields and LATENCY_KEYS disagree"
