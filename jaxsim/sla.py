"""Service-level limits (plain Python, no JAX): the one SLA vocabulary of sweeps (``[sla]`` in a sweep
spec, judged on the steady-state model and by ``--verify-top``) and replays (``--sla-*-ms``: goodput).

The compiled sweep evaluator takes the same limits, field for field, as traced scalars
(:class:`jaxsim.sweep.evaluate.SLABounds`, built by ``SLABounds.of(sla)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jaxsim.errors import InputError

__all__ = ["SLA", "PERCENTILES", "PERCENTILE_METRICS", "PERCENTILE_KEYS"]

PERCENTILES = (50, 90, 99)
PERCENTILE_METRICS = ("ttft", "tpot", "e2e")
PERCENTILE_KEYS = tuple(f"p{p}_{m}_ms" for m in PERCENTILE_METRICS for p in PERCENTILES)
"""The percentile limits' keys, metric-major (``p50_ttft_ms``, ``p90_ttft_ms``, ..., ``p99_e2e_ms``)."""


@dataclass(frozen=True)
class SLA:
    """Limits (None = no limit). Sweeps bound the workload-mix mean (``max_*``), percentiles over the mix
    (``pNN_*_ms``, :data:`PERCENTILE_KEYS`) and the per-user output rate; a replay's goodput counts
    completed requests whose own TTFT, TPOT and E2E meet ``max_ttft_ms``, ``max_tpot_ms`` and ``max_e2e_ms``."""

    max_ttft_ms: float | None = None
    max_tpot_ms: float | None = None
    min_tokens_per_s_per_user: float | None = None
    max_e2e_ms: float | None = None
    p50_ttft_ms: float | None = None
    p90_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    p50_tpot_ms: float | None = None
    p90_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    p50_e2e_ms: float | None = None
    p90_e2e_ms: float | None = None
    p99_e2e_ms: float | None = None

    def __post_init__(self):
        for name, v in self.limits().items():
            low_ok = v >= 0 if name == "min_tokens_per_s_per_user" else v > 0
            if not (math.isfinite(v) and low_ok):
                raise InputError(f"SLA {name}={v!r} must be a {'non-negative' if name.startswith('min') else 'positive'} finite number")

    def limits(self) -> dict:
        """The stated limits, by key."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if getattr(self, k) is not None}

    def percentile_limits(self) -> dict:
        return {k: v for k, v in self.limits().items() if k in PERCENTILE_KEYS}

    def request_limits(self) -> dict:
        """The limits a single replayed request is held to: its TTFT, TPOT and E2E (ms)."""
        return {m: getattr(self, f"max_{m}") for m in ("ttft_ms", "tpot_ms", "e2e_ms") if getattr(self, f"max_{m}") is not None}


assert PERCENTILE_KEYS == tuple(k for k in SLA.__dataclass_fields__ if k.startswith("p")), "SLA fields and PERCENTILE_KEYS disagree"
