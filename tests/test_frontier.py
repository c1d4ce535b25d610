"""The one Pareto-frontier function (sweep ``on_pareto`` and the Pareto plot): brute-force checks."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hst

from jaxsim.sweep.frontier import pareto_mask

_values = hst.one_of(hst.integers(0, 20).map(float), hst.just(np.nan), hst.just(np.inf))


@settings(max_examples=80, deadline=None)
@given(hst.lists(hst.tuples(_values, _values, hst.integers(0, 2)), min_size=1, max_size=40))
def test_pareto_mask_is_the_non_dominated_set_per_group(points):
    x = np.array([p[0] for p in points])
    y = np.array([p[1] for p in points])
    g = np.array([p[2] for p in points])
    ids = np.arange(x.size)[::-1].copy()  # duplicates keep the smallest id: here the last position
    m = pareto_mask(x, y, ids, g)
    for i in range(x.size):
        if np.isnan(x[i]) or np.isnan(y[i]):
            assert not m[i]
            continue
        peers = (g == g[i]) & ~(np.isnan(x) | np.isnan(y))
        dominated = np.any(peers & (x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i])))
        if dominated:
            assert not m[i]
        else:  # on the frontier, or an identical point with a smaller id represents it
            same = np.flatnonzero(peers & (x == x[i]) & (y == y[i]))
            assert m[same].tolist() == [bool(ids[j] == ids[same].min()) for j in same]


def test_pareto_mask_nan_rule():
    m = pareto_mask(np.array([1.0, np.nan, 3.0, 0.5]), np.array([5.0, 100.0, 1.0, np.nan]))
    assert m.tolist() == [True, False, True, False]
    # infinite values compare as numbers: +inf per user dominates every finite x with no better y
    assert pareto_mask(np.array([np.inf, 2.0]), np.array([1.0, 1.0])).tolist() == [True, False]
