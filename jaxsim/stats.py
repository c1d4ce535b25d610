"""The one statistics vocabulary of jaxsim: how a percentile of a sample is computed and how every
statistic of a latency metric is named, as ``vllm bench serve`` does (plain Python + NumPy).

* Percentiles of a sample: NumPy's ``"linear"`` method (``np.percentile`` / ``np.median``'s default,
  what ``vllm bench serve`` reports): the p-th percentile of n sorted values lies at position
  p/100 · (n − 1), interpolated linearly between its two neighbours. Replay summaries, ``--verify-top``
  and replay-evaluated sweeps all compute percentiles with :func:`percentile`.
* Keys: ``<stat>_<metric>_ms`` with stat ``mean``, ``median``, ``std``, ``min``, ``max`` or ``pNN`` and
  metric ``ttft``, ``tpot``, ``itl``, ``e2e`` (vLLM names the last ``e2el``): ``mean_ttft_ms``,
  ``median_tpot_ms``, ``p99_e2e_ms``. Sweep spec SLA keys, sweep result columns, replay summaries and
  every JSON output use these names (:func:`key`).

The analytic steady state's percentiles are quantiles of a distribution (the workload mix), not of a
sample: the inverse CDF, which a sample's linear percentile converges to as the sample grows
(``jaxsim.sweep.evaluate.weighted_percentiles``; docs/sweep.md).
"""

from __future__ import annotations

import numpy as np

__all__ = ["PERCENTILE_METHOD", "SUMMARY_PERCENTILES", "key", "percentile", "latency_stats"]

PERCENTILE_METHOD = "linear"
"""NumPy's name of the one percentile definition (``np.percentile(x, p, method=PERCENTILE_METHOD)``)."""

SUMMARY_PERCENTILES = (50, 75, 90, 95, 99)
"""The percentiles a replay summary reports for every latency metric (besides mean, median, std, min, max)."""


def key(stat: str, metric: str) -> str:
    """The name of one statistic of one latency metric: ``key("p90", "ttft") == "p90_ttft_ms"``."""
    return f"{stat}_{metric}_ms"


def _finite(values) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64).ravel()
    return v[np.isfinite(v)]


def percentile(values, p: float) -> float:
    """The ``p``-th percentile (0..100) of the finite values by :data:`PERCENTILE_METHOD` (NaN when none)."""
    v = _finite(values)
    return float(np.percentile(v, p, method=PERCENTILE_METHOD)) if v.size else float("nan")


def latency_stats(values, metric: str, percentiles=SUMMARY_PERCENTILES) -> dict[str, float]:
    """mean, median, std (population, as ``np.std``), min, max and ``percentiles`` of the finite values of
    one metric, keyed by :func:`key` (NaN when there are none)."""
    v = _finite(values)
    nan = float("nan")
    out = {
        key("mean", metric): float(v.mean()) if v.size else nan,
        key("median", metric): float(np.median(v)) if v.size else nan,
        key("std", metric): float(v.std()) if v.size else nan,
        key("min", metric): float(v.min()) if v.size else nan,
        key("max", metric): float(v.max()) if v.size else nan,
    }
    for p in percentiles:
        out[key(f"p{p:g}", metric)] = percentile(v, p)
    return out
