"""Serving overhead: what a benchmark measures outside the forward passes (HTTP, tokenisation, scheduling,
detokenisation and streaming), stated and fitted (issue 27, Deliver 3).

The model (:class:`ServingOverhead`): a request's TTFT gains ``fixed_ms + per_prompt_token_ms × ISL`` (the
request's path into the engine and its first token's way out: a fixed cost and one that grows with the
prompt, its tokenisation and transfer) and each later token ``per_output_token_ms`` (its detokenisation
and streaming), so TPOT gains ``per_output_token_ms``. Zero unless set or fitted; it is added to the
steady state's latencies (the engine's throughput is unchanged: the serving path runs beside the engine).
Why this form: in aiconfigurator-core's silicon sample a measured TTFT at concurrency 4 holds 70-80 ms no
forward pass accounts for, growing with the prompt, and aiconfigurator itself fits a per-layer constant
to that corpus; three terms are the fewest that separate the fixed, the prompt-sized and the per-token
costs.

:func:`fit_overhead` fits the three terms to measured rows against the tool's own predictions of the
same rows, minimising the relative error (TTFT: weighted least squares in ``(1, ISL)``; TPOT: one offset),
with every term held ≥ 0. :func:`read_benchmark` reads the rows: ``vllm bench serve --save-result`` JSON
(one result, a list, or JSON lines) or CSV rows in aiconfigurator-core's silicon-sample schema.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from jaxsim.errors import InputError

__all__ = ["ServingOverhead", "BenchmarkRow", "OverheadError", "MIN_ROWS", "added_latency_ms", "fit_overhead", "nonneg_wls",
           "read_benchmark", "read_overhead", "relative_errors"]

MIN_ROWS = 4
"""Rows an overhead fit needs in its training part (three terms, and one row to spare)."""


def added_latency_ms(fixed_ms, per_prompt_token_ms, per_output_token_ms, prompt_tokens, later_tokens):
    """The serving overhead one request's latencies gain (ms): its TTFT's, ``fixed + per prompt token ×
    prompt_tokens``, and its later tokens' together, ``per output token × later_tokens`` (the tokens after
    its first: each inter-token gap gains ``per_output_token_ms``, so TPOT gains it and E2E gains both).
    Arithmetic only, so numpy and jax arrays alike: the ONE home of the model, used by the steady state
    (inside jit, per workload class) and by replay-evaluated rows (per request, after the replay). The
    engine's timeline, and so throughput, is unchanged: the serving path runs beside the engine."""
    return fixed_ms + per_prompt_token_ms * prompt_tokens, per_output_token_ms * later_tokens


class OverheadError(InputError):
    """A benchmark file or an overhead fit that cannot be used (one line naming the problem)."""


@dataclass(frozen=True)
class ServingOverhead:
    """Per-request serving overhead outside the forward passes (ms); zero unless set or fitted."""

    fixed_ms: float = 0.0
    per_prompt_token_ms: float = 0.0
    per_output_token_ms: float = 0.0
    provenance: str = "none: zero unless set or fitted"

    def __post_init__(self):
        for k in ("fixed_ms", "per_prompt_token_ms", "per_output_token_ms"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise OverheadError(f"overhead {k}={v!r} must be a finite number >= 0")

    def ttft_ms(self, isl) -> np.ndarray:
        return added_latency_ms(*self.terms, np.asarray(isl, np.float64), 0.0)[0]

    @property
    def terms(self) -> tuple[float, float, float]:
        return (float(self.fixed_ms), float(self.per_prompt_token_ms), float(self.per_output_token_ms))

    def describe(self) -> str:
        return (f"{self.fixed_ms:.2f} ms + {self.per_prompt_token_ms:.4f} ms/prompt token (TTFT), "
                f"{self.per_output_token_ms:.3f} ms/output token (TPOT); {self.provenance}")

    def to_json(self) -> dict:
        return asdict(self)


def read_overhead(obj, where: str) -> ServingOverhead:
    """A :class:`ServingOverhead` from a dict (a sweep spec's inline table) or a JSON file path (what
    ``jaxsim calibrate --benchmark`` writes: its ``overhead`` object)."""
    if isinstance(obj, (str, Path)):
        p = Path(obj)
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise OverheadError(f"{where}: cannot read overhead file {p}: {e}") from None
        obj = doc.get("overhead", doc) if isinstance(doc, dict) else doc
        obj = dict(obj, provenance=obj.get("provenance", f"read from {p}")) if isinstance(obj, dict) else obj
    if not isinstance(obj, dict):
        raise OverheadError(f"{where}: overhead must be a table (fixed_ms, per_prompt_token_ms, per_output_token_ms) or a file")
    known = {"fixed_ms", "per_prompt_token_ms", "per_output_token_ms", "provenance"}
    extra = sorted(set(obj) - known - {"fit", "held_out"})
    if extra:
        raise OverheadError(f"{where}: unknown overhead key {extra[0]!r} (known: {', '.join(sorted(known))})")
    try:
        return ServingOverhead(**{k: obj[k] for k in known if k in obj} | ({} if "provenance" in obj else {"provenance": "set in the spec"}))
    except OverheadError as e:
        raise OverheadError(f"{where}: {e}") from None


# ----------------------------------------------------------------------------------------------------
# benchmark rows


@dataclass(frozen=True)
class BenchmarkRow:
    """One measured benchmark run: mean lengths, concurrency, mean TTFT/TPOT, and what it ran on (when
    the file says)."""

    name: str
    isl: int
    osl: int
    concurrency: int
    ttft_ms: float
    tpot_ms: float
    model: str = ""
    system: str = ""
    tp: int | None = None


def _num(v, what: str, where: str, positive: bool = True) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise OverheadError(f"{where}: {what}={v!r} is not a number") from None
    if not math.isfinite(x) or (positive and x <= 0):
        raise OverheadError(f"{where}: {what}={v!r} must be a finite number > 0")
    return x


def _vllm_result(d: dict, where: str) -> BenchmarkRow:
    """A ``vllm bench serve --save-result`` object: mean ISL/OSL from its token totals over completed
    requests, ``max_concurrency`` (a closed loop; required), ``mean_ttft_ms``, ``mean_tpot_ms``; model
    from ``model_id``; system and TP from ``--metadata`` keys when given (``system``, ``tp`` or
    ``tensor_parallel_size``)."""
    for k in ("completed", "total_input_tokens", "total_output_tokens", "mean_ttft_ms", "mean_tpot_ms"):
        if k not in d:
            raise OverheadError(f"{where}: no {k!r}: not a vllm bench serve --save-result file")
    if d.get("max_concurrency") in (None, "", 0):
        raise OverheadError(f"{where}: no max_concurrency: an overhead fit needs closed-loop runs (vllm bench serve --max-concurrency C)")
    n = _num(d["completed"], "completed", where)
    tp = d.get("tp", d.get("tensor_parallel_size"))
    return BenchmarkRow(
        name=str(d.get("date", where)), isl=round(_num(d["total_input_tokens"], "total_input_tokens", where) / n),
        osl=round(_num(d["total_output_tokens"], "total_output_tokens", where) / n),
        concurrency=int(_num(d["max_concurrency"], "max_concurrency", where)),
        ttft_ms=_num(d["mean_ttft_ms"], "mean_ttft_ms", where), tpot_ms=_num(d["mean_tpot_ms"], "mean_tpot_ms", where),
        model=str(d.get("model_id", "")), system=str(d.get("system", "")), tp=int(_num(tp, "tp", where)) if tp not in (None, "") else None,
    )


SILICON_COLUMNS = ("model_path", "system", "isl", "osl", "batch_size", "tp_size", "silicon_ttft_ms", "silicon_tpot_ms")


def _silicon_rows(path: Path) -> list[BenchmarkRow]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in SILICON_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise OverheadError(f"{path}: no column {missing[0]!r}: not the silicon-sample schema ({', '.join(SILICON_COLUMNS)})")
        out = []
        for i, r in enumerate(reader, start=2):
            if r.get("backend", "vllm") != "vllm" or r.get("mode", "agg") != "agg":
                continue
            where = f"{path} row {i}"
            out.append(BenchmarkRow(
                name=r.get("id") or f"row {i}", isl=int(_num(r["isl"], "isl", where)), osl=int(_num(r["osl"], "osl", where)),
                concurrency=int(_num(r["batch_size"], "batch_size", where)), ttft_ms=_num(r["silicon_ttft_ms"], "silicon_ttft_ms", where),
                tpot_ms=_num(r["silicon_tpot_ms"], "silicon_tpot_ms", where), model=r["model_path"], system=r["system"],
                tp=int(_num(r["tp_size"], "tp_size", where)),
            ))
    return out


def read_benchmark(path: Path) -> list[BenchmarkRow]:
    """The rows of one benchmark file: ``.csv`` in the silicon-sample schema (its vLLM aggregated rows), else
    ``vllm bench serve --save-result`` JSON (one object, a list, or one object per line)."""
    path = Path(path)
    if not path.is_file():
        raise OverheadError(f"{path}: no such benchmark file")
    if path.suffix.lower() == ".csv":
        return _silicon_rows(path)
    text = path.read_text(encoding="utf-8")
    try:
        doc = json.loads(text)
        docs = doc if isinstance(doc, list) else [doc]
    except ValueError:
        try:
            docs = [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as e:
            raise OverheadError(f"{path}: neither JSON nor JSON lines ({e}); a CSV needs the .csv suffix") from None
    if not docs or not all(isinstance(d, dict) for d in docs):
        raise OverheadError(f"{path}: expected vllm bench serve result objects")
    return [_vllm_result(d, f"{path}" + (f" result {i + 1}" if len(docs) > 1 else "")) for i, d in enumerate(docs)]


# ----------------------------------------------------------------------------------------------------
# fit


def relative_errors(pred, meas) -> np.ndarray:
    """|pred / meas − 1| (NaN where either is missing)."""
    pred, meas = np.asarray(pred, np.float64), np.asarray(meas, np.float64)
    return np.abs(pred / meas - 1.0)


def nonneg_wls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """min Σ w (x·β − y)² with β ≥ 0: exhaustive over the active sets (2^k − 1 weighted least-squares fits for k
    columns; the fits here have one to four)."""
    k = x.shape[1]
    best, best_cost = np.zeros(k), float(np.sum(w * y * y))
    for mask in range(1, 1 << k):
        cols = [j for j in range(k) if mask >> j & 1]
        sw = np.sqrt(w)
        beta, *_ = np.linalg.lstsq(x[:, cols] * sw[:, None], y * sw, rcond=None)
        if np.any(beta < 0):
            continue
        full = np.zeros(k)
        full[cols] = beta
        cost = float(np.sum(w * (x @ full - y) ** 2))
        if cost < best_cost:
            best, best_cost = full, cost
    return best


def fit_overhead(isl, pred_ttft_ms, pred_tpot_ms, meas_ttft_ms, meas_tpot_ms, provenance: str) -> ServingOverhead:
    """The overhead that brings predictions closest to measurements in relative terms: TTFT residuals
    (measured − predicted) by weighted least squares on (1, ISL) with weights 1/measured², TPOT residuals by
    one offset with the same weights; every term ≥ 0. Rows with a missing prediction are left out; fewer
    than :data:`MIN_ROWS` usable rows is refused."""
    isl = np.asarray(isl, np.float64)
    pt, pp = np.asarray(pred_ttft_ms, np.float64), np.asarray(pred_tpot_ms, np.float64)
    mt, mp = np.asarray(meas_ttft_ms, np.float64), np.asarray(meas_tpot_ms, np.float64)
    ok = np.isfinite(pt) & np.isfinite(pp) & np.isfinite(mt) & np.isfinite(mp) & (mt > 0) & (mp > 0)
    if ok.sum() < MIN_ROWS:
        raise OverheadError(f"an overhead fit needs at least {MIN_ROWS} rows the profile predicts; got {int(ok.sum())}")
    isl, pt, pp, mt, mp = isl[ok], pt[ok], pp[ok], mt[ok], mp[ok]
    x = np.stack([np.ones_like(isl), isl], axis=1)
    a, b = nonneg_wls(x, mt - pt, 1.0 / mt**2)
    c = nonneg_wls(np.ones((mp.size, 1)), mp - pp, 1.0 / mp**2)[0]
    return ServingOverhead(float(a), float(b), float(c), provenance)
