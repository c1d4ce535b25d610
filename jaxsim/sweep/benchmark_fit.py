"""Fit a serving overhead to benchmark results (``jaxsim calibrate PROFILE --benchmark FILE``).

Every benchmark row (a closed-loop run: mean ISL/OSL, concurrency, measured mean TTFT/TPOT) is predicted by
the sweep's steady state on the profile at the row's TP (one sweep over the rows' concurrencies and
lengths, the default closed-loop benchmark of 10 prompts per client, no overhead), and the overhead
(:func:`jaxsim.overhead.fit_overhead`) is fitted to the training rows; the held-out rows are only scored,
before and after. The split is by position in the file: of every 10 rows, the first 7 fit and the last 3
are held out (a file of fewer than 10 rows: its last row, when it has more than the fit needs).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxsim.kernels import status as st
from jaxsim.overhead import MIN_ROWS, BenchmarkRow, OverheadError, ServingOverhead, fit_overhead, relative_errors

__all__ = ["OverheadFit", "held_out_mask", "predict_rows", "fit_benchmark", "matching_rows"]


def _same_model(a: str, b: str) -> bool:
    a, b = a.strip().lower().rstrip("/"), b.strip().lower().rstrip("/")
    return a == b or a.endswith("/" + b.split("/")[-1]) and a.split("/")[-1] == b.split("/")[-1]


def matching_rows(rows: list[BenchmarkRow], model: str, system: str, tps: set[int], source: str) -> list[BenchmarkRow]:
    """The rows that measure the profile's model, system and one of its TPs (a row that does not say is
    taken at its word). A file with several models (a silicon-sample CSV) keeps its matching rows; a file
    whose rows all measure something else is refused, naming the first mismatch."""
    keep, why = [], ""
    for r in rows:
        bad = ("model", r.model, model) if r.model and not _same_model(r.model, model) else \
              ("system", r.system, system) if r.system and r.system != system else \
              ("TP", r.tp, sorted(tps)) if r.tp is not None and r.tp not in tps else None
        if bad is None:
            keep.append(r)
        elif not why:
            why = f"{r.name} measures {bad[0]} {bad[1]!s}, the profile {bad[2]!s}"
    if not keep:
        raise OverheadError(f"{source}: no row measures the profile's model, system and TP ({why})" if why else f"{source}: no rows")
    return keep


def held_out_mask(n: int) -> np.ndarray:
    """Rows held out: positions 7-9 of every 10; below 10 rows, the last one when the rest still fits."""
    i = np.arange(n)
    if n >= 10:
        return i % 10 >= 7
    return (i == n - 1) if n > MIN_ROWS else np.zeros(n, bool)


def predict_rows(profile_dir: Path, rows: list[BenchmarkRow], tp: int, overhead: ServingOverhead | None = None,
                 async_scheduling: bool = False) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Steady-state mean TTFT and TPOT of every row (NaN outside measured support, with the status name),
    from one sweep of the profile at ``tp`` over the rows' concurrencies and lengths (``async_scheduling``: the
    engines schedule asynchronously)."""
    import pyarrow.parquet as pq

    from jaxsim.sweep.run import run_sweep
    from jaxsim.sweep.spec import spec_from_dict

    pairs = sorted({(r.isl, r.osl) for r in rows})
    prof = {"name": str(profile_dir), "tp": [tp], "label": "p", **({"async_scheduling": True} if async_scheduling else {})}
    if overhead is not None:
        prof["overhead"] = {k: v for k, v in overhead.to_json().items()}
    spec = {
        "name": "benchmark-fit",
        "profile": [prof],
        "serving": {"mode": ["aggregated"]},
        "scheduler": {"concurrency": sorted({r.concurrency for r in rows})},
        "workload": [{"name": f"i{i}o{o}", "isl": i, "osl": o} for i, o in pairs],
    }
    with tempfile.TemporaryDirectory(prefix="jaxsim-benchmark-fit-") as tmp:
        res = run_sweep(spec_from_dict(spec, source="benchmark-fit"), Path(tmp) / "fit.parquet", force=True)
        t = pq.read_table(res.output).to_pylist()
    got = {(r["concurrency_target"], str(r["workload"])): r for r in t}
    ttft, tpot, status = [], [], []
    for r in rows:
        g = got.get((r.concurrency, f"i{r.isl}o{r.osl}"))
        ok = g is not None and g["status"] < st.FIRST_UNSUPPORTED
        ttft.append(g["mean_ttft_ms"] if ok else np.nan)
        tpot.append(g["mean_tpot_ms"] if ok else np.nan)
        status.append(str(g["status_name"]) if g is not None else "not evaluated")
    return np.asarray(ttft, np.float64), np.asarray(tpot, np.float64), status


def _stats(e: np.ndarray) -> dict:
    e = e[np.isfinite(e)]
    if not e.size:
        return {"n": 0, "median_pct": float("nan"), "p90_pct": float("nan")}
    return {"n": int(e.size), "median_pct": float(np.percentile(e, 50) * 100), "p90_pct": float(np.percentile(e, 90) * 100)}


@dataclass(frozen=True)
class OverheadFit:
    """A fitted overhead and its scores: per part (train, held-out), per metric, before and after."""

    overhead: ServingOverhead
    rows: int
    predicted: int
    train: int
    held_out: int
    scores: dict  # {part: {metric: {"without": stats, "with": stats}}}

    def summary(self) -> dict:
        return {"overhead": self.overhead.to_json(), "fit": {"rows": self.rows, "predicted": self.predicted, "train": self.train,
                                                             "held_out": self.held_out}, "scores": self.scores}


def fit_benchmark(rows: list[BenchmarkRow], ttft: np.ndarray, tpot: np.ndarray, provenance: str,
                  held: np.ndarray | None = None) -> OverheadFit:
    """Fit on the rows not ``held`` out (default :func:`held_out_mask`), score both parts."""
    held = held_out_mask(len(rows)) if held is None else np.asarray(held, bool)
    isl = np.array([r.isl for r in rows], np.float64)
    mt = np.array([r.ttft_ms for r in rows], np.float64)
    mp = np.array([r.tpot_ms for r in rows], np.float64)
    train = ~held
    ov = fit_overhead(isl[train], ttft[train], tpot[train], mt[train], mp[train], provenance)
    scores = {}
    for part, m in (("train", train), ("held_out", held)):
        scores[part] = {
            "ttft": {"without": _stats(relative_errors(ttft[m], mt[m])), "with": _stats(relative_errors(ttft[m] + ov.ttft_ms(isl[m]), mt[m]))},
            "tpot": {"without": _stats(relative_errors(tpot[m], mp[m])), "with": _stats(relative_errors(tpot[m] + ov.per_output_token_ms, mp[m]))},
        }
    ok = np.isfinite(ttft) & np.isfinite(tpot)
    return OverheadFit(ov, len(rows), int(ok.sum()), int((train & ok).sum()), int((held & ok).sum()), scores)
