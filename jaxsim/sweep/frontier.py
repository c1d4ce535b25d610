"""The Pareto frontier of (x, y) points, both maximized (numpy): used by sweep finalization
(``on_pareto``) and by the Pareto plot."""

from __future__ import annotations

import numpy as np

__all__ = ["pareto_mask"]


def pareto_mask(x, y, ids=None, groups=None) -> np.ndarray:
    """Points not dominated in (x, y) (both maximized) within their group (``groups``: one group when
    None).

    NaN rule: a point with a NaN coordinate is never on the frontier and dominates nothing (infinite
    values compare as numbers). Exact duplicates keep the smallest ``ids`` (default: the position).
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    ids = np.arange(x.size) if ids is None else np.asarray(ids)
    groups = np.zeros(x.size, np.int64) if groups is None else np.asarray(groups)
    keep = np.zeros(x.shape, bool)
    idx = np.flatnonzero(~(np.isnan(x) | np.isnan(y)))
    order = idx[np.lexsort((ids[idx], -y[idx], -x[idx], groups[idx]))]
    best, current = -np.inf, None
    for i in order:
        if groups[i] != current:
            current, best = groups[i], -np.inf
        if y[i] > best:
            keep[i] = True
            best = y[i]
    return keep
