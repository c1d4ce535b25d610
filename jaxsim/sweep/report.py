"""What a finished sweep's results say beyond its top rows: the best SLA-feasible configuration per
(workload, profile, TP) — the "which GPU, which TP" table — and, for speculative what-ifs, up to which
concurrency speculation pays against plain decoding on the same deployment.

Both read only the columns they need from a results table (the parquet ``jaxsim sweep`` writes, or a
pyarrow Table of it); every number in them is a sweep row's, nothing is recomputed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from jaxsim.errors import QueryError

__all__ = ["read_results", "results_summary", "best_per_profile_tp", "SpeculationVerdict", "speculation_verdicts"]

Y = "output_tokens_per_s_per_gpu"
X = "tokens_per_s_per_user"
BEST_COLUMNS = (
    "config_id", "workload", "profile", "system", "data_source", "mode", "prefill_workers", "decode_workers", "tp", "gpus",
    "nextn", "acceptance", "concurrency", "concurrency_target", "isl_mean", "osl_mean", X, Y, "request_rate_per_s",
    "usd_per_gpu_hour", "usd_per_hour_per_unit", "usd_per_1m_output_tokens", "goodput_req_per_s", "sla_ok",
)
_SERVING = ("system", "mode", "prefill_workers", "decode_workers", "prefill_tp", "tp")
_ENVELOPE = ("max_num_seqs", "max_num_batched_tokens")
SPECULATION_COLUMNS = ("workload", "profile", "nextn", "acceptance", *_SERVING, *_ENVELOPE, "concurrency_target", X, Y)


def read_results(results: str | os.PathLike | pa.Table, columns: Sequence[str]) -> pa.Table:
    """The ``columns`` of a sweep results table that it has (a parquet path or a Table)."""
    if isinstance(results, pa.Table):
        return results.select([c for c in columns if c in results.column_names])
    import pyarrow.parquet as pq  # noqa: PLC0415

    p = Path(results)
    if not p.is_file():
        raise QueryError(f"{p}: no such sweep results file")
    try:
        names = pq.read_schema(p).names
        t = pq.read_table(p, columns=[c for c in columns if c in names])
    except (OSError, pa.ArrowException) as e:
        raise QueryError(f"{p}: not a readable parquet sweep results file ({type(e).__name__})") from None
    if "sla_ok" not in names or Y not in names:
        raise QueryError(f"{p}: not a sweep results file (no sla_ok / {Y} column); write one with jaxsim sweep")
    return t


def results_summary(results: str | os.PathLike | pa.Table) -> dict:
    """The sweep summary stored with a results file (SLA, prices, profile models, counts); {} when absent."""
    if isinstance(results, pa.Table):
        meta = results.schema.metadata or {}
    else:
        import pyarrow.parquet as pq  # noqa: PLC0415

        try:
            meta = pq.read_schema(results).metadata or {}
        except (OSError, pa.ArrowException):
            return {}
    try:
        return json.loads(meta.get(b"jaxsim.sweep", b"{}")).get("summary", {})
    except ValueError:
        return {}


def _codes(t: pa.Table, name: str) -> np.ndarray:
    """A column as integers: dictionary indices, or the values."""
    col = t.column(name).combine_chunks()
    if pa.types.is_dictionary(col.type):
        return col.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return np.unique(col.to_numpy(zero_copy_only=False).astype(str), return_inverse=True)[1].astype(np.int64)
    return col.to_numpy(zero_copy_only=False).astype(np.int64)


def _group(t: pa.Table, names: Sequence[str]) -> np.ndarray:
    """One integer per distinct combination of ``names`` (in order of their codes)."""
    if not t.num_rows:
        return np.zeros(0, np.int64)
    return np.unique(np.stack([_codes(t, n) for n in names], axis=1), axis=0, return_inverse=True)[1].reshape(-1)


def best_per_profile_tp(results: str | os.PathLike | pa.Table) -> list[dict]:
    """The best SLA-feasible row (by output tokens/s per GPU; ties: the smallest config id) of every
    (workload, profile, TP), in workload, profile and TP order."""
    t = read_results(results, BEST_COLUMNS)
    t = t.filter(pa.array(t.column("sla_ok").to_numpy(zero_copy_only=False)))
    if not t.num_rows:
        return []
    y = np.nan_to_num(t.column(Y).to_numpy(), nan=-np.inf)
    ids = t.column("config_id").to_numpy()
    g = _group(t, ("workload", "profile", "tp"))
    order = np.lexsort((ids, -y, g))
    first = order[np.r_[True, g[order][1:] != g[order][:-1]]]
    rows = t.take(pa.array(first)).to_pylist()
    wl, pr = _codes(t, "workload")[first], _codes(t, "profile")[first]
    return [rows[i] for i in np.lexsort((t.column("tp").to_numpy()[first], pr, wl))]


@dataclass(frozen=True)
class SpeculationVerdict:
    """Speculative rows (``nextn`` > 0) against plain decoding (K = 0) on the same model, GPU, TP and
    serving, concurrency by concurrency (per worker, as targeted): the ratios K / K=0 of output tokens/s
    per GPU and tokens/s per user (K=0: its best scheduler envelope at that concurrency; recorded
    envelopes of speculative and plain profiles often differ). ``pays_until``: the largest concurrency of the run, from the
    lowest, at which speculation gives at least K=0's tokens/s per GPU (None: not even at the lowest);
    ``stops_at``: the first concurrency where it gives less (None: never)."""

    workload: str
    profile: str
    baseline_profile: str
    system: str
    tp: int
    mode: str
    nextn: int
    acceptance: str
    concurrency: tuple[int, ...]
    gpu_ratio: tuple[float, ...]
    user_ratio: tuple[float, ...]
    pays_until: int | None
    stops_at: int | None

    def line(self) -> str:
        """One sentence: where speculation stops paying, and by how much it helps or hurts."""
        what = (f"{self.profile} K={self.nextn} ({self.acceptance}) vs {self.baseline_profile} K=0, "
                f"{self.system} TP{self.tp} {self.mode}, {self.workload}")
        lo, hi = self.concurrency[0], self.concurrency[-1]
        user = f"x{self.user_ratio[0]:.2f} tok/s/user at concurrency {lo}"
        if self.stops_at is None:
            where = f"at every compared concurrency ({lo}-{hi})" if hi > lo else f"at concurrency {lo} (the only one compared)"
            return f"speculation pays {where}: {what}: {user}, x{self.gpu_ratio[-1]:.2f} tok/s/GPU at {hi}"
        k = self.concurrency.index(self.stops_at)
        if self.pays_until is None:
            return f"speculation never pays in tok/s/GPU: {what}: x{self.gpu_ratio[0]:.2f} tok/s/GPU and {user}"
        return (f"speculation pays until concurrency {self.pays_until}: {what}: {user}; falls below K=0 in "
                f"tok/s/GPU from {self.stops_at} (x{self.gpu_ratio[k]:.2f})")

    def to_dict(self) -> dict:
        return {**asdict(self), "line": self.line()}


def _labels(t: pa.Table, name: str) -> np.ndarray:
    return np.asarray(t.column(name).to_numpy(zero_copy_only=False)).astype(str)


def _mode_text(mode: str, p: int, d: int) -> str:
    return mode if mode == "aggregated" else f"disagg {p}:{d}"


def _baseline(candidates: dict[str, int], profile: str) -> tuple[str, int] | None:
    """The K=0 group to compare with: the same profile's, else the only one (None when ambiguous)."""
    if profile in candidates:
        return profile, candidates[profile]
    if len(candidates) == 1:
        return next(iter(candidates.items()))
    return None


def speculation_verdicts(results: str | os.PathLike | pa.Table, profile_models: Mapping[str, str] | None = None) -> list[SpeculationVerdict]:
    """One verdict per speculative variant (profile, K, acceptance, envelope) × workload × deployment that has
    K = 0 rows to compare with, of the same model (``profile_models``: profile label → model id; by default
    the results file's own record; without one every profile counts as one model); only concurrencies
    where both are inside measured support count."""
    t = read_results(results, SPECULATION_COLUMNS)
    missing = [c for c in SPECULATION_COLUMNS if c not in t.column_names]
    if missing or not t.num_rows:
        return []
    nextn = t.column("nextn").to_numpy()
    if not (nextn > 0).any() or not (nextn == 0).any():
        return []
    y, x = t.column(Y).to_numpy(), t.column(X).to_numpy()
    ok = np.isfinite(y) & np.isfinite(x)
    profile, acc, wl = _labels(t, "profile"), _labels(t, "acceptance"), _labels(t, "workload")
    models = profile_models if profile_models is not None else results_summary(results).get("profile_models", {})
    model = np.array([models.get(p, "?") for p in profile])
    serving = [_labels(t, c) if c in ("system", "mode") else t.column(c).to_numpy().astype(str) for c in _SERVING]
    where = np.array(["|".join(v) for v in zip(wl, model, *serving)]) if t.num_rows else np.zeros(0, str)
    conc = t.column("concurrency_target").to_numpy()
    envelope = np.array(["|".join(v) for v in zip(*(t.column(c).to_numpy().astype(str) for c in _ENVELOPE))])
    base: dict[tuple[str, int], tuple[float, float]] = {}
    base_profiles: dict[str, dict[str, int]] = {}
    for i in np.flatnonzero((nextn == 0) & ok):
        key = (f"{where[i]}#{profile[i]}", int(conc[i]))
        if key not in base or y[i] > base[key][0]:
            base[key] = (float(y[i]), float(x[i]))
        base_profiles.setdefault(where[i], {})[profile[i]] = 1
    variants: dict[tuple, list[int]] = {}
    for i in np.flatnonzero((nextn > 0) & ok):
        variants.setdefault((where[i], profile[i], int(nextn[i]), acc[i], envelope[i]), []).append(int(i))
    wl_code = _codes(t, "workload")
    out = []
    for (w, prof, k, a, _), rows in sorted(variants.items(), key=lambda kv: (int(wl_code[kv[1][0]]), kv[1][0])):
        chosen = _baseline(base_profiles.get(w, {}), prof)
        if chosen is None:
            continue
        pairs = sorted((int(conc[i]), float(y[i]) / base[key][0], float(x[i]) / base[key][1]) for i in rows
                       if (key := (f"{w}#{chosen[0]}", int(conc[i]))) in base and base[key][0] > 0 and base[key][1] > 0)
        if not pairs:
            continue
        cs, gr, ur = (tuple(v) for v in zip(*pairs))
        below = [c for c, g in zip(cs, gr) if g < 1.0]
        stops = below[0] if below else None
        pays = [c for c in cs if stops is None or c < stops]
        i0 = rows[0]
        out.append(SpeculationVerdict(
            workload=str(wl[i0]), profile=prof, baseline_profile=chosen[0], system=str(serving[0][i0]), tp=int(t.column("tp")[i0].as_py()),
            mode=_mode_text(str(serving[1][i0]), int(serving[2][i0]), int(serving[3][i0])), nextn=k, acceptance=a,
            concurrency=cs, gpu_ratio=gr, user_ratio=ur, pays_until=pays[-1] if pays else None, stops_at=stops,
        ))
    return out


def jsonable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with non-finite floats as None (JSON)."""
    return [{k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in r.items()} for r in rows]
