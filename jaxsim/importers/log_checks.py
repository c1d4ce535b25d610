"""Checks every measured-pass log passes before import or calibration (one set of rules, one line each,
naming the file, the row or line and the column): no column twice in a header, no key twice in a JSON
record, every latency a positive finite duration."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from jaxsim.errors import TableError


def refuse_duplicate_columns(path: str | os.PathLike, header: Sequence[str]) -> None:
    """A CSV header naming one column twice (a CSV reader would silently keep the last) is refused."""
    seen: dict[str, int] = {}
    for i, name in enumerate(header, start=1):
        if name in seen:
            raise TableError(f"{path}: column {name!r} appears twice in the header (columns {seen[name]} and {i}); keep one")
        seen[name] = i


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """``object_pairs_hook`` for :func:`json.loads`: a key given twice in one object is an error."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} appears twice in one object")
        out[k] = v
    return out


def refuse_non_positive(path: str | os.PathLike, values: np.ndarray, column: str, *, label: str = "row",
                        numbers: Sequence[int] | None = None) -> None:
    """Every value of ``column`` (a pass's duration) must be > 0 and finite; the first one that is not is
    refused, naming its row (``numbers[i]``, default i + 1)."""
    v = np.asarray(values, dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(v) & (v > 0)))
    if bad.size:
        i = int(bad[0])
        n = int(numbers[i]) if numbers is not None else i + 1
        more = f" ({bad.size - 1} more such rows)" if bad.size > 1 else ""
        raise TableError(f"{path}: {label} {n}: {column} must be a positive duration (got {v[i]:g}){more}")


__all__ = ["refuse_duplicate_columns", "refuse_non_positive", "unique_keys"]
