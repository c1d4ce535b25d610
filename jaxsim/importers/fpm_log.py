"""Import per-iteration forward-pass metrics (FPM) logs into an FPM profile directory.

Input: one engine's per-iteration log, either the CSV written by aiconfigurator's FPM runs
(``fpm_metrics_detail.csv``: ``counter_id``, ``num_prefill_requests``, ``sum_prefill_tokens``,
``sum_prefill_kv_tokens``, ``num_decode_requests``, ``sum_decode_kv_tokens``, ``latency_ms``) or JSONL of
Dynamo's ForwardPassMetrics wire format (``{worker_id, dp_rank, counter_id, wall_time [s],
scheduled_requests{...}}``). Rows are put in time order by ``counter_id``.

Rules (``BinningConfig`` holds every constant):

* decode-only iterations -> one decode curve per batch size, binned over total past KV on one grid shared by
  all batch sizes (bins of ``kv_bin_tokens``); interior rows sit at bin centres, a curve's first and last rows
  on its smallest and largest measured KV (a curve spans exactly its measured range; a one-bin curve sits
  on its upper-median sample); each row keeps the upper median latency of its bin's kept samples
  (``measurement_reduction`` "actual_upper_median", or "single_sample" for one sample);
* outliers: a decode sample is dropped when it lies more than ``mad_k`` robust deviations
  (max(1.4826·MAD, ``mad_floor``·median)) from the median of its KV neighbourhood (its bin ± 1) at the same
  batch, or, when that holds fewer than ``min_same_batch`` samples, at batches b-1..b+1;
* mis-split admission steps: when the decode-only iterations that immediately precede a prefill-bearing
  iteration are systematically slow in this log (median ratio to their neighbourhood > ``admission_ratio``),
  the log's boundary between the two is unreliable and all such decode iterations are dropped;
* prefill-only iterations -> grouped by exact batch, token bin (1/16 octave) and KV bin (0, else 1/16
  octave); each group becomes the actual sample at its upper-median latency (real coordinates);
* mixed iterations never enter the table: they are returned for validation.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

import jaxsim
from jaxsim.errors import JaxsimError, ProfileError, TableError, read_text
from jaxsim.fields import FieldReader, is_int
from jaxsim.importers.log_checks import refuse_duplicate_columns, refuse_non_positive, unique_keys
from jaxsim.profile.model import (
    COMM_QUANT_MODES,
    FMHA_QUANT_MODES,
    GEMM_QUANT_MODES,
    KV_CACHE_DTYPES,
    MOE_QUANT_MODES,
    MUTABLE_REFS,
    Deployment,
    ModelProfile,
    Resources,
    RuntimeMemory,
    save_profile,
)
from jaxsim.profile.table import AR_POLICY, PARQUET_NAME, SIDECAR_NAME, make_rows, write_table

DECODE, PREFILL, MIXED, EMPTY = "decode", "prefill", "mixed", "empty"
LOG_COLUMNS = (
    "counter_id", "num_prefill_requests", "sum_prefill_tokens", "sum_prefill_kv_tokens", "num_decode_requests",
    "sum_decode_kv_tokens",
)
PHASE_ALIASES = {"decode": DECODE, "context": PREFILL, "prefill": PREFILL, "mixed": MIXED}
DROP_REASONS = ("empty_iteration", "outlier_mad", "mis_split_admission")


# ----------------------------------------------------------------------------------------------------
# the log


@dataclass(frozen=True, eq=False)
class FpmLog:
    """One engine stream's forward passes in time order (int64 counts, float64 milliseconds)."""

    source: str
    sha256: str
    stream: str
    counter_id: np.ndarray
    num_prefill_requests: np.ndarray
    prefill_tokens: np.ndarray
    prefill_kv_tokens: np.ndarray
    num_decode_requests: np.ndarray
    decode_kv_tokens: np.ndarray
    latency_ms: np.ndarray
    segment: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.counter_id.shape[0])

    @property
    def kind(self) -> np.ndarray:
        """Per row: "decode", "prefill", "mixed" or "empty" (inferred from the scheduled work)."""
        has_p = self.num_prefill_requests > 0
        has_d = self.num_decode_requests > 0
        return np.where(has_p & has_d, MIXED, np.where(has_p, PREFILL, np.where(has_d, DECODE, EMPTY))).astype(object)

    def take(self, mask: np.ndarray) -> FpmLog:
        """The rows where ``mask`` holds (a boolean mask or an index array), in the same order."""
        arrays = {
            k: getattr(self, k)[mask]
            for k in ("counter_id", "num_prefill_requests", "prefill_tokens", "prefill_kv_tokens",
                      "num_decode_requests", "decode_kv_tokens", "latency_ms")
        }
        seg = None if self.segment is None else self.segment[mask]
        return replace(self, segment=seg, **arrays)


_FIELDS = FieldReader(TableError)  # log counts: integer literals >= 0


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_csv(path: Path, text: str) -> tuple[dict[str, list], list[str], list[str]]:
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    refuse_duplicate_columns(path, header)
    missing = [c for c in LOG_COLUMNS if c not in header]
    if "latency_ms" not in header and "wall_time" not in header:
        missing.append("latency_ms (or wall_time in seconds)")
    if missing:
        raise TableError(f"{path}: FPM log column(s) missing: {', '.join(missing)}")
    cols: dict[str, list] = {c: [] for c in (*LOG_COLUMNS, "latency_ms")}
    streams, phases, segments = [], [], []
    for i, row in enumerate(reader):
        where = f"{path}: row {i + 1}"
        for c in LOG_COLUMNS:
            cols[c].append(_FIELDS.integer(row[c], where, c))
        if "latency_ms" in header:
            cols["latency_ms"].append(_FIELDS.number(row["latency_ms"], where, "latency_ms"))
        else:
            cols["latency_ms"].append(1000.0 * _FIELDS.number(row["wall_time"], where, "wall_time"))
        streams.append(f"{row.get('worker_id', '')}/{row.get('dp_rank', '0')}")
        phases.append(row.get("phase"))
        segments.append(row.get("workload_segment", ""))
    cols["_segment"] = segments
    return cols, streams, phases


def _read_jsonl(path: Path, text: str) -> tuple[dict[str, list], list[str], list[str]]:
    cols: dict[str, list] = {c: [] for c in (*LOG_COLUMNS, "latency_ms")}
    streams: list[str] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}: line {n}"
        try:
            obj = json.loads(line, object_pairs_hook=unique_keys)
        except ValueError as e:
            raise TableError(f"{where}: invalid JSON: {str(e).splitlines()[0]}") from None
        if not isinstance(obj, dict):
            raise TableError(f"{where}: expected a ForwardPassMetrics object")
        sched = obj.get("scheduled_requests")
        if not isinstance(sched, dict):
            raise TableError(f"{where}: scheduled_requests: missing or not an object")
        for c in LOG_COLUMNS:
            src, key = (obj, c) if c == "counter_id" else (sched, c)
            if key not in src:
                raise TableError(f"{where}: {'scheduled_requests.' if src is sched else ''}{key}: field required")
            cols[c].append(_FIELDS.integer(src[key], where, key))
        if "wall_time" not in obj:
            raise TableError(f"{where}: wall_time: field required (iteration duration in seconds)")
        cols["latency_ms"].append(1000.0 * _FIELDS.number(obj["wall_time"], where, "wall_time"))
        streams.append(f"{obj.get('worker_id', '')}/{obj.get('dp_rank', 0)}")
    cols["_segment"] = [""] * len(streams)
    return cols, streams, [None] * len(streams)


def read_fpm_log(path: str | os.PathLike) -> FpmLog:
    """Read an FPM log (CSV or Dynamo ForwardPassMetrics JSONL) into time order.

    Raises TableError naming the file and row for malformed input, several (worker_id, dp_rank) streams,
    repeated counter_ids, or a ``phase`` column that disagrees with the scheduled work.
    """
    p = Path(path)
    text = read_text(p, "FPM log", TableError)
    if not text.strip():
        raise TableError(f"{p}: FPM log is empty")
    jsonl = p.suffix.lower() in (".jsonl", ".json", ".ndjson") or text.lstrip().startswith("{")
    try:
        cols, streams, phases = (_read_jsonl if jsonl else _read_csv)(p, text)
    except csv.Error as e:  # e.g. a stray carriage return inside a field
        raise TableError(f"{p}: not a readable CSV file: {e}") from None
    if not cols["counter_id"]:
        raise TableError(f"{p}: FPM log has no rows")
    distinct = sorted(set(streams))
    if len(distinct) > 1:
        raise TableError(
            f"{p}: FPM log holds {len(distinct)} (worker_id/dp_rank) streams ({', '.join(distinct[:4])}"
            f"{', ...' if len(distinct) > 4 else ''}); attention-DP logs are not supported, import one stream per file"
        )
    arr = {c: np.asarray(v, dtype=np.int64) for c, v in cols.items() if c in LOG_COLUMNS}
    lat = np.asarray(cols["latency_ms"], dtype=np.float64)
    has_p, has_d = arr["num_prefill_requests"] > 0, arr["num_decode_requests"] > 0
    work = np.flatnonzero(has_p | has_d)  # a pass that scheduled work takes time (idle heartbeats may record 0)
    if jsonl:
        lines = np.array([n for n, ln in enumerate(text.splitlines(), 1) if ln.strip()])
        refuse_non_positive(p, lat[work], "wall_time", label="line", numbers=lines[work])
    else:
        refuse_non_positive(p, lat[work], "latency_ms" if "latency_ms" in next(csv.reader(io.StringIO(text)), []) else "wall_time",
                            numbers=work + 1)
    bad = np.flatnonzero(~has_p & (arr["sum_prefill_tokens"] > 0))
    if bad.size:
        raise TableError(f"{p}: row {int(bad[0]) + 1}: sum_prefill_tokens > 0 without prefill requests")
    for i, ph in enumerate(phases):
        if ph is None or ph == "":
            continue
        want = PHASE_ALIASES.get(ph)
        got = MIXED if has_p[i] and has_d[i] else PREFILL if has_p[i] else DECODE if has_d[i] else EMPTY
        if want is None or (got != EMPTY and want != got):
            raise TableError(f"{p}: row {i + 1}: phase={ph!r} disagrees with the scheduled work ({got})")
    order = np.argsort(arr["counter_id"], kind="stable")
    cid = arr["counter_id"][order]
    dup = np.flatnonzero(np.diff(cid) == 0)
    if dup.size:
        raise TableError(f"{p}: counter_id {int(cid[dup[0]])} appears more than once in one stream")
    seg = np.asarray(cols["_segment"], dtype=object)[order]
    return FpmLog(
        source=str(p), sha256=_sha256(text.encode("utf-8")), stream=distinct[0], counter_id=cid,
        num_prefill_requests=arr["num_prefill_requests"][order], prefill_tokens=arr["sum_prefill_tokens"][order],
        prefill_kv_tokens=arr["sum_prefill_kv_tokens"][order], num_decode_requests=arr["num_decode_requests"][order],
        decode_kv_tokens=arr["sum_decode_kv_tokens"][order], latency_ms=lat[order], segment=seg,
    )


# ----------------------------------------------------------------------------------------------------
# classification and binning


@dataclass(frozen=True)
class BinningConfig:
    """Constants of the import rules (see the module docstring)."""

    kv_bin_tokens: int = 512
    mad_k: float = 5.0
    mad_floor: float = 0.01
    min_same_batch: int = 5
    admission_ratio: float = 1.05
    prefill_bins_per_octave: int = 16

    def __post_init__(self):
        if self.kv_bin_tokens < 2 or self.kv_bin_tokens % 2:
            raise JaxsimError(f"kv_bin_tokens must be an even integer >= 2 (got {self.kv_bin_tokens})")
        if not (self.mad_k > 0 and self.mad_floor >= 0 and self.admission_ratio >= 1):
            raise JaxsimError("mad_k must be > 0, mad_floor >= 0 and admission_ratio >= 1")

    def describe(self) -> str:
        return (
            f"decode: {self.kv_bin_tokens}-token total-KV bins shared by all batch sizes, rows at bin centres "
            f"(curve ends on the extreme measured KV), "
            f"upper median per bin; outliers beyond {self.mad_k:g} x max(1.4826 MAD, {self.mad_floor:g} x median) "
            f"of the bin +-1 neighbourhood (same batch if >= {self.min_same_batch} samples, else batches b-1..b+1); "
            f"decode iterations just before a prefill-bearing one dropped when such steps are > "
            f"{self.admission_ratio:g}x slower in the log (mis-split); prefill: exact batch, "
            f"1/{self.prefill_bins_per_octave}-octave token and KV groups, upper-median sample"
        )


@dataclass(frozen=True, eq=False)
class RowClasses:
    """Per-row fate of a log: ``used`` rows enter a table bin; ``reason`` names why others were dropped."""

    kind: np.ndarray
    used: np.ndarray
    reason: np.ndarray
    admission_ratio: float
    admission_dropped: bool

    @property
    def mis_split(self) -> np.ndarray:
        """Rows dropped as mis-split admission steps (their next iteration carries prefill work)."""
        return self.reason == "mis_split_admission"


def _robust_keep(lat: np.ndarray, ref_sets: list[np.ndarray], groups: list[np.ndarray], cfg: BinningConfig) -> np.ndarray:
    keep = np.ones(lat.shape[0], dtype=bool)
    for ref, members in zip(ref_sets, groups):
        vals = lat[ref]
        med = float(np.median(vals))
        scale = max(1.4826 * float(np.median(np.abs(vals - med))), cfg.mad_floor * med)
        keep[members] = np.abs(lat[members] - med) <= cfg.mad_k * scale
    return keep


def _neighbourhoods(batch: np.ndarray, bins: np.ndarray, cfg: BinningConfig):
    """For each (batch, bin) group: its member indices and the indices of its reference neighbourhood
    (bins j-1..j+1 at the same batch, or at batches b-1..b+1 when the same batch has too few samples)."""
    keys = np.stack([batch, bins], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    order = np.argsort(inv, kind="stable")
    bounds = np.searchsorted(inv[order], np.arange(uniq.shape[0] + 1))
    members = {(int(b), int(j)): order[bounds[g]:bounds[g + 1]] for g, (b, j) in enumerate(uniq)}
    empty = np.zeros(0, dtype=np.int64)

    def near(b: int, j: int, db: int) -> np.ndarray:
        parts = [members.get((b + x, j + y), empty) for x in range(-db, db + 1) for y in (-1, 0, 1)]
        return np.sort(np.concatenate(parts))

    groups, refs = [], []
    for b, j in members:
        ref = near(b, j, 0)
        if ref.size < cfg.min_same_batch:
            ref = near(b, j, 1)
        groups.append(members[(b, j)])
        refs.append(ref)
    return groups, refs


def classify_rows(log: FpmLog, cfg: BinningConfig = BinningConfig()) -> RowClasses:
    """Decide which rows enter the table and why the others do not (time order matters for mis-splits)."""
    kind = log.kind
    n = len(log)
    reason = np.full(n, "", dtype=object)
    reason[kind == EMPTY] = "empty_iteration"
    dec = np.flatnonzero(kind == DECODE)
    prefill_next = np.zeros(n, dtype=bool)
    consecutive = np.zeros(n, dtype=bool)
    consecutive[:-1] = np.diff(log.counter_id) == 1
    prefill_next[:-1] = consecutive[:-1] & (log.num_prefill_requests[1:] > 0)
    batch, kv, lat = log.num_decode_requests[dec], log.decode_kv_tokens[dec], log.latency_ms[dec]
    bins = kv // cfg.kv_bin_tokens
    groups, refs = _neighbourhoods(batch, bins, cfg)
    # admission steps: compare with the neighbourhood median of the other decode iterations
    adm = prefill_next[dec]
    ratios = []
    for ref, members in zip(refs, groups):
        if not adm[members].any():
            continue
        others = ref[~adm[ref]]
        if others.size:
            med = float(np.median(lat[others]))
            ratios.extend((lat[members][adm[members]] / med).tolist())
    admission_ratio = float(np.median(ratios)) if ratios else 1.0
    admission_dropped = admission_ratio > cfg.admission_ratio
    drop_adm = adm & admission_dropped
    reason[dec[drop_adm]] = "mis_split_admission"
    rest = np.flatnonzero(~drop_adm)
    if rest.size:
        g2, r2 = _neighbourhoods(batch[rest], bins[rest], cfg)
        keep = _robust_keep(lat[rest], r2, g2, cfg)
        reason[dec[rest[~keep]]] = "outlier_mad"
    pre = np.flatnonzero(kind == PREFILL)
    if pre.size:
        keys = _prefill_keys(log, pre, cfg)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        order = np.argsort(inv.reshape(-1), kind="stable")
        bounds = np.searchsorted(inv.reshape(-1)[order], np.arange(uniq.shape[0] + 1))
        groups = [order[bounds[g]:bounds[g + 1]] for g in range(uniq.shape[0])]
        keep = _robust_keep(log.latency_ms[pre], groups, groups, cfg)
        reason[pre[~keep]] = "outlier_mad"
    used = ((kind == DECODE) | (kind == PREFILL)) & (reason == "")
    return RowClasses(kind=kind, used=used, reason=reason, admission_ratio=admission_ratio, admission_dropped=bool(admission_dropped))


def _octave_bin(x: np.ndarray, per_octave: int) -> np.ndarray:
    """0 for x == 0, else 1 + floor(per_octave * log2(x))."""
    out = np.zeros(x.shape, dtype=np.int64)
    pos = x > 0
    out[pos] = 1 + np.floor(per_octave * np.log2(x[pos].astype(np.float64))).astype(np.int64)
    return out


def _prefill_keys(log: FpmLog, idx: np.ndarray, cfg: BinningConfig) -> np.ndarray:
    return np.stack([
        log.num_prefill_requests[idx],
        _octave_bin(log.prefill_tokens[idx], cfg.prefill_bins_per_octave),
        _octave_bin(log.prefill_kv_tokens[idx], cfg.prefill_bins_per_octave),
    ], axis=1)


def upper_median_index(values: np.ndarray) -> int:
    """Index of the upper median (the element of rank n // 2 in ascending order; ties by position)."""
    order = np.argsort(values, kind="stable")
    return int(order[values.shape[0] // 2])


@dataclass(frozen=True, eq=False)
class BinnedRows:
    """Table coordinates after reduction; ``*_count`` = kept samples behind each row."""

    decode_batch: np.ndarray
    decode_kv: np.ndarray
    decode_latency_ms: np.ndarray
    decode_count: np.ndarray
    prefill_batch: np.ndarray
    prefill_tokens: np.ndarray
    prefill_kv: np.ndarray
    prefill_latency_ms: np.ndarray
    prefill_count: np.ndarray

    def cell(self):
        """A ``CellRows``-like view for :func:`jaxsim.kernels.rounds.compile_round_table`."""
        return self


def bin_rows(log: FpmLog, classes: RowClasses, cfg: BinningConfig = BinningConfig()) -> BinnedRows:
    """Reduce the used rows to table rows (decode: shared KV grid, bin centres; prefill: upper-median sample)."""
    w = cfg.kv_bin_tokens
    dec = np.flatnonzero(classes.used & (classes.kind == DECODE))
    db, dk, dl, dn = [], [], [], []
    if dec.size:
        keys = np.stack([log.num_decode_requests[dec], log.decode_kv_tokens[dec] // w], axis=1)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)  # sorted by (batch, bin)
        order = np.argsort(inv.reshape(-1), kind="stable")
        bounds = np.searchsorted(inv.reshape(-1)[order], np.arange(uniq.shape[0] + 1))
        for g, (b, j) in enumerate(uniq):
            members = dec[order[bounds[g]:bounds[g + 1]]]
            lat = log.latency_ms[members]
            kv = log.decode_kv_tokens[members]
            first = g == 0 or uniq[g - 1, 0] != b
            last = g == uniq.shape[0] - 1 or uniq[g + 1, 0] != b
            # a curve spans exactly its measured KV range: end rows sit on the extreme samples
            if first and last:
                coord = int(kv[upper_median_index(lat)])
            elif first:
                coord = int(kv.min())
            elif last:
                coord = int(kv.max())
            else:
                coord = int(j) * w + w // 2
            db.append(int(b))
            dk.append(coord)
            dl.append(float(lat[upper_median_index(lat)]))
            dn.append(int(members.size))
    pre = np.flatnonzero(classes.used & (classes.kind == PREFILL))
    pb, pt, pk, pl, pn = [], [], [], [], []
    if pre.size:
        uniq, inv = np.unique(_prefill_keys(log, pre, cfg), axis=0, return_inverse=True)
        order = np.argsort(inv.reshape(-1), kind="stable")
        bounds = np.searchsorted(inv.reshape(-1)[order], np.arange(uniq.shape[0] + 1))
        for g in range(uniq.shape[0]):
            members = pre[order[bounds[g]:bounds[g + 1]]]
            i = members[upper_median_index(log.latency_ms[members])]
            pb.append(int(log.num_prefill_requests[i]))
            pt.append(int(log.prefill_tokens[i]))
            pk.append(int(log.prefill_kv_tokens[i]))
            pl.append(float(log.latency_ms[i]))
            pn.append(int(members.size))
    i64 = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    f64 = lambda v: np.asarray(v, dtype=np.float64)  # noqa: E731
    return BinnedRows(i64(db), i64(dk), f64(dl), i64(dn), i64(pb), i64(pt), i64(pk), f64(pl), i64(pn))


# ----------------------------------------------------------------------------------------------------
# identity


@dataclass(frozen=True)
class LogIdentity:
    """Everything a profile needs besides the timings; ``notes`` record where each value came from."""

    model: str
    model_revision: str
    architecture: str
    system: str
    backend_version: str
    tp: int
    context_length: int
    num_experts: int
    gemm_quant_mode: str
    moe_quant_mode: str
    fmha_quant_mode: str
    comm_quant_mode: str
    kv_cache_dtype: str
    kv_bytes_per_token: int
    kv_cache_tokens: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_tokens: int
    max_batch_size: int
    notes: tuple[str, ...] = ()
    # (source, max_num_batched_tokens, max_num_seqs) of every file that records a scheduler envelope, first the
    # one the identity took; empty when options set it (see jaxsim.importers.log_reconcile.reconcile_with_log)
    envelope_sources: tuple[tuple[str, int | None, int | None], ...] = ()

    @property
    def kv_cache_bytes(self) -> int:
        return self.kv_cache_tokens * self.kv_bytes_per_token


def _load_json(path: str | os.PathLike | None, what: str) -> dict | None:
    if path is None:
        return None
    p = Path(path)
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ProfileError(f"{p}: cannot read {what}: {e.strerror or e}") from None
    except ValueError as e:
        raise ProfileError(f"{p}: {what} is not valid JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(obj, dict):
        raise ProfileError(f"{p}: {what} must be a JSON object")
    return obj


def _dtype_name(v: Any) -> str | None:
    if not isinstance(v, str):
        return None
    s = v.lower().replace("torch.", "")
    return {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "half": "float16", "fp16": "float16",
            "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float8_e4m3fn": "fp8", "int8": "int8"}.get(s)


def kv_bytes_per_token_from_config(config: Mapping[str, Any], tp: int, kv_cache_dtype: str) -> int:
    """Rank-local KV bytes per token of a standard (GQA/MHA) decoder: layers x KV heads per rank x head_dim x 2 x bytes."""
    cfg = dict(config.get("text_config") or {}, **{k: v for k, v in config.items() if k != "text_config"})
    if "kv_lora_rank" in cfg:
        raise ProfileError("hf config: MLA attention (kv_lora_rank) has no simple per-token KV size; pass --kv-bytes-per-token")
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads", heads))
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError) as e:
        raise ProfileError(f"hf config: cannot derive the KV size ({e}); pass --kv-bytes-per-token") from None
    per_rank = max(1, math.ceil(kv_heads / tp))  # fewer KV heads than ranks: replicated, one per rank
    elem = {"bfloat16": 2, "fp8": 1, "int8": 1}[kv_cache_dtype]
    return layers * per_rank * head_dim * 2 * elem


@dataclass(frozen=True)
class _IdentitySources:
    """The parts of a Dynamo model card, vLLM metadata and HF config.json an identity is read from."""

    card: Mapping[str, Any]  # the card's card_json (or the card itself)
    runtime: Mapping[str, Any]  # card runtime_config
    meta: Mapping[str, Any]  # vLLM metadata
    eff: Mapping[str, Any]  # vLLM effective_config
    req: Mapping[str, Any]  # vLLM requested deployment_config
    hf: Mapping[str, Any]  # HF config.json
    hf_name: str | None  # the HF config's file name (for notes)


class _Picks:
    """Fields picked so far: an option wins, then the first recorded candidate; notes say where a value
    came from, and every field neither gives is listed once in ``missing``."""

    def __init__(self, overrides: Mapping[str, Any]):
        self.ov = {k: v for k, v in overrides.items() if v is not None}
        self.out: dict[str, Any] = {}
        self.notes: list[str] = []
        self.missing: list[str] = []

    def pick(self, name: str, *cands: tuple[str, Any], option: str | None = None, required: bool = True) -> None:
        if name in self.ov:
            self.out[name] = self.ov[name]
            self.notes.append(f"{name} from --{(option or name).replace('_', '-')}")
            return
        for src, v in cands:
            if v is not None and v != "":
                self.out[name] = v
                return
        if required:
            self.missing.append(f"--{(option or name).replace('_', '-')}")


def resolve_identity(
    *,
    model_card: str | os.PathLike | None = None,
    vllm_metadata: str | os.PathLike | None = None,
    hf_config: str | os.PathLike | None = None,
    **overrides: Any,
) -> LogIdentity:
    """Identity and runtime memory from a Dynamo model card, vLLM metadata and/or an HF config.json.

    ``overrides`` (model, model_revision, architecture, system, backend_version, tp, num_experts,
    gemm_quant_mode, kv_cache_dtype, fmha_quant_mode, comm_quant_mode, kv_bytes_per_token, gpu_memory_utilization,
    max_num_tokens, max_batch_size, max_model_len, context_length) win over the files; a value neither gives
    is a ProfileError naming the option to pass. ``model_revision`` is never invented.
    """
    src = _identity_sources(model_card, vllm_metadata, hf_config)
    p = _Picks(overrides)
    _pick_model(p, src)
    _pick_topology(p, src)
    _pick_precisions(p, src)
    _pick_memory(p, src)
    if p.missing:
        raise ProfileError(f"{len(p.missing)} field(s) not recorded in the given files; pass: {', '.join(p.missing)}")
    out = p.out
    for name in ("tp", "context_length", "max_model_len", "num_experts", "kv_bytes_per_token", "kv_cache_tokens", "max_num_tokens", "max_batch_size"):
        v = out[name]
        if not is_int(v) or v < (0 if name == "num_experts" else 1):
            raise ProfileError(f"{name}: expected a positive integer (got {v!r})")
    out["gpu_memory_utilization"] = float(out["gpu_memory_utilization"])
    return LogIdentity(notes=tuple(p.notes), **out)


def _identity_sources(model_card, vllm_metadata, hf_config) -> _IdentitySources:
    card_doc = _load_json(model_card, "model card")
    meta = _load_json(vllm_metadata, "vLLM metadata") or {}
    hf = _load_json(hf_config, "HF config") or {}
    card = (card_doc or {}).get("card_json", card_doc or {})
    return _IdentitySources(
        card=card,
        runtime=card.get("runtime_config") or {},
        meta=meta,
        eff=meta.get("effective_config") or {},
        req=(meta.get("requested") or {}).get("deployment_config") or {},
        hf=hf,
        hf_name=None if hf_config is None else Path(hf_config).name,
    )


def _pick_model(p: _Picks, src: _IdentitySources) -> None:
    """model and its pinned revision (never invented; a mutable reference is refused)."""
    card, eff, req = src.card, src.eff, src.req
    p.pick("model", ("card", card.get("source_path") or card.get("display_name")), ("metadata", req.get("model")))
    rev_cands = [eff.get("model_config.revision"), req.get("revision"), card.get("revision")]
    rev = next((r for r in rev_cands if isinstance(r, str) and r.strip()), None)
    if "model_revision" in p.ov:
        p.out["model_revision"] = p.ov["model_revision"]
    elif rev is not None:
        p.out["model_revision"] = rev
    else:
        pin = (((card.get("model_info") or {}).get("hf_config_json") or {}).get("checksum"))
        hint = f"; the model card pins only config.json content: {pin}" if pin else ""
        p.missing.append(f"--model-revision (a pinned checkpoint revision, never invented{hint})")
    if "model_revision" in p.out and str(p.out["model_revision"]).strip().lower() in MUTABLE_REFS:
        raise ProfileError(f"model_revision: {p.out['model_revision']!r} is a mutable reference; pass a pinned revision")


def _pick_topology(p: _Picks, src: _IdentitySources) -> None:
    """architecture, system, vLLM version, TP (PP1 and no attention DP), context lengths and experts."""
    card, eff, req, hf = src.card, src.eff, src.req, src.hf
    archs = hf.get("architectures") if isinstance(hf.get("architectures"), list) else None
    p.pick("architecture", ("hf", archs[0] if archs else None))
    p.pick("system", required=True)
    p.pick("backend_version", ("metadata", eff.get("vllm_version")))
    p.pick("tp", ("metadata", eff.get("parallel_config.tensor_parallel_size")), ("metadata", req.get("tensor_parallel_size")))
    pp = eff.get("parallel_config.pipeline_parallel_size", 1)
    if pp not in (None, 1):
        raise ProfileError(f"vLLM metadata: pipeline_parallel_size={pp}; FPM profiles support PP1 only")
    dp = src.runtime.get("data_parallel_size", 1)
    if dp not in (None, 1):
        raise ProfileError(f"model card: data_parallel_size={dp}; attention-DP logs are not supported")
    p.pick("context_length", ("card", card.get("context_length")), ("metadata", eff.get("model_config.max_model_len")),
           ("hf", hf.get("max_position_embeddings")))
    p.pick("max_model_len", ("metadata", eff.get("model_config.max_model_len")), ("card", card.get("context_length")))
    n_exp = next((hf[k] for k in ("num_experts", "num_local_experts", "n_routed_experts") if isinstance(hf.get(k), int)), None)
    p.pick("num_experts", ("hf", n_exp), ("dense", 0))
    if "num_experts" not in p.ov and n_exp is None and not hf:
        p.notes.append("num_experts 0 (dense) assumed: no HF config given")


def _pick_precisions(p: _Picks, src: _IdentitySources) -> None:
    """GEMM, KV cache, attention and communication precisions (MoE follows GEMM), each a known mode."""
    eff, hf, out = src.eff, src.hf, p.out
    model_dtype = _dtype_name(eff.get("model_config.dtype")) or _dtype_name(hf.get("torch_dtype"))
    quant = eff.get("model_config.quantization") or (hf.get("quantization_config") or {}).get("quant_method")
    if isinstance(quant, str) and quant:
        gemm = "fp8" if "fp8" in quant.lower() else None
    else:
        gemm = model_dtype if model_dtype in GEMM_QUANT_MODES else None
    p.pick("gemm_quant_mode", ("metadata", gemm))
    cache_dtype = eff.get("cache_config.cache_dtype")
    kv = model_dtype if cache_dtype in (None, "auto") else _dtype_name(cache_dtype)
    p.pick("kv_cache_dtype", ("metadata", kv if kv in KV_CACHE_DTYPES else None))
    p.pick(
        "fmha_quant_mode", ("derived", "fp8" if out.get("kv_cache_dtype") == "fp8" else (model_dtype if model_dtype in FMHA_QUANT_MODES else None))
    )
    p.pick("comm_quant_mode", ("default", "half"))
    out["moe_quant_mode"] = out.get("gemm_quant_mode") if out.get("gemm_quant_mode") in MOE_QUANT_MODES else "bfloat16"
    for name, members in (("gemm_quant_mode", GEMM_QUANT_MODES), ("kv_cache_dtype", KV_CACHE_DTYPES),
                          ("fmha_quant_mode", FMHA_QUANT_MODES), ("comm_quant_mode", COMM_QUANT_MODES)):
        if name in out and out[name] not in members:
            raise ProfileError(f"{name}: {out[name]!r} is not one of {', '.join(members)}")


def _pick_memory(p: _Picks, src: _IdentitySources) -> None:
    """KV bytes per token, the runtime KV pool, GPU memory utilization and the scheduler's limits."""
    card, runtime, eff, req, hf, ov, out = src.card, src.runtime, src.eff, src.req, src.hf, p.ov, p.out
    if "kv_bytes_per_token" in ov:
        out["kv_bytes_per_token"] = int(ov["kv_bytes_per_token"])
        p.notes.append("kv_bytes_per_token from --kv-bytes-per-token")
    elif hf and "tp" in out and "kv_cache_dtype" in out:
        out["kv_bytes_per_token"] = kv_bytes_per_token_from_config(hf, int(out["tp"]), out["kv_cache_dtype"])
        p.notes.append(f"kv_bytes_per_token from {src.hf_name} (layers x KV heads per rank x head_dim x 2 x bytes)")
    elif not hf:
        p.missing.append("--kv-bytes-per-token (or --hf-config to derive it)")
    blocks, block = runtime.get("total_kv_blocks"), card.get("kv_cache_block_size") or eff.get("cache_config.block_size")
    if "kv_cache_tokens" in ov:
        out["kv_cache_tokens"] = int(ov["kv_cache_tokens"])
    elif isinstance(blocks, int) and isinstance(block, int):
        out["kv_cache_tokens"] = blocks * block
        p.notes.append(f"KV pool = {blocks} blocks x {block} tokens (model card runtime_config)")
    else:
        p.missing.append("--kv-cache-tokens (the runtime KV pool; or a model card with total_kv_blocks and kv_cache_block_size)")
    gmu = req.get("gpu_memory_utilization")
    args = (src.meta.get("requested") or {}).get("engine_args") or []
    if gmu is None and "--gpu-memory-utilization" in args:
        gmu = float(args[args.index("--gpu-memory-utilization") + 1])
    p.pick("gpu_memory_utilization", ("metadata", gmu))
    _pick_envelope(p, src)


def _pick_envelope(p: _Picks, src: _IdentitySources) -> None:
    """The scheduler envelope: an option wins; else the vLLM metadata's effective scheduler config, else the model
    card's runtime config. Every file's values are kept (``envelope_sources``) so that the import can check them
    against the log's own passes and say which it used."""
    eff, runtime = src.eff, src.runtime
    cands = [("vLLM metadata (effective_config scheduler_config)",
              eff.get("scheduler_config.max_num_batched_tokens"), eff.get("scheduler_config.max_num_seqs")),
             ("Dynamo model card (runtime_config)",
              runtime.get("max_num_batched_tokens"), runtime.get("max_num_seqs"))]
    cands = [c for c in cands if c[1] is not None or c[2] is not None]
    p.pick("max_num_tokens", *((c[0], c[1]) for c in cands), option="max_num_batched_tokens")
    p.pick("max_batch_size", *((c[0], c[2]) for c in cands), option="max_num_seqs")
    if "max_num_tokens" not in p.ov and "max_batch_size" not in p.ov and cands:
        p.out["envelope_sources"] = tuple(cands)


# ----------------------------------------------------------------------------------------------------
# import


@dataclass(frozen=True)
class ImportSummary:
    """What an import read, used and dropped, and how much of the log its table supports."""

    source: str
    stream: str
    rows_read: int
    rows_used: int
    dropped: dict[str, int]
    mixed_kept_out: int
    decode_curves: int
    decode_bins: int
    prefill_rows: int
    decode_batch_range: tuple[int, int] | None
    decode_kv_range: tuple[int, int] | None
    prefill_token_range: tuple[int, int] | None
    coverage: dict[str, float]
    admission_ratio: float
    admission_dropped: bool
    identity_notes: tuple[str, ...] = ()  # where the envelope and the KV pool came from, and what was checked

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}

    def lines(self) -> list[tuple[str, str]]:
        """(label, value) pairs for a summary table."""
        pct = lambda x: "n/a" if x != x else f"{100 * x:.1f} %"  # noqa: E731
        rng = lambda r: "-" if r is None else f"{r[0]:,} .. {r[1]:,}"  # noqa: E731
        out = [
            ("source", self.source),
            ("rows read", f"{self.rows_read:,}"),
            ("rows used", f"{self.rows_used:,}"),
        ]
        out += [(f"dropped: {k}", f"{v:,}") for k, v in self.dropped.items()]
        out += [
            ("mixed (kept out, for validation)", f"{self.mixed_kept_out:,}"),
            ("decode curves (batch sizes)", f"{self.decode_curves}"),
            ("decode bins (rows)", f"{self.decode_bins:,}"),
            ("decode batch range", rng(self.decode_batch_range)),
            ("decode total-KV range", rng(self.decode_kv_range)),
            ("prefill rows", f"{self.prefill_rows}"),
            ("prefill token range", rng(self.prefill_token_range)),
        ]
        out += [(f"coverage: {k} iterations in support", pct(v)) for k, v in self.coverage.items()]
        out.append(("admission steps vs neighbours", f"x{self.admission_ratio:.3f}" + (" (dropped as mis-split)" if self.admission_dropped else "")))
        out += [("identity", n) for n in self.identity_notes]
        return out


@dataclass(frozen=True, eq=False)
class FpmImport:
    """One imported log: a one-deployment profile, its table columns, the summary and the row classes."""

    profile: ModelProfile
    columns: dict[str, Any]
    summary: ImportSummary
    log: FpmLog
    classes: RowClasses
    binned: BinnedRows

    @property
    def deployment(self) -> Deployment:
        return self.profile.deployments[0]

    @property
    def mixed(self) -> FpmLog:
        """The mixed iterations, kept out of the table (for validation)."""
        return self.log.take(self.classes.kind == MIXED)


def _coverage(binned: BinnedRows, log: FpmLog, kind: np.ndarray) -> dict[str, float]:
    """Share of the log's iterations of each kind that the compiled table supports (in-sample)."""
    from jaxsim.kernels import rounds, status

    out: dict[str, float] = {}
    if binned.decode_batch.size == 0 and binned.prefill_batch.size == 0:
        return {k: float("nan") for k in (DECODE, PREFILL, MIXED)}
    table = rounds.compile_round_table(binned)
    _, code = rounds.mixed_batch(
        table, log.num_prefill_requests, log.prefill_tokens, log.prefill_kv_tokens, log.num_decode_requests,
        log.decode_kv_tokens,
    )
    ok = np.asarray(status.is_supported(np.asarray(code)))
    for k in (DECODE, PREFILL, MIXED):
        m = kind == k
        out[k] = float(ok[m].mean()) if m.any() else float("nan")
    return out


def _range(a: np.ndarray) -> tuple[int, int] | None:
    return None if a.size == 0 else (int(a.min()), int(a.max()))


def build_deployment(ident: LogIdentity, *, resources_provenance: str, memory_provenance: str) -> Deployment:
    """The (aggregated, role-less) deployment entry for ``ident`` with observed runtime memory."""
    res = Resources(
        cache_layout="linear", max_num_tokens=ident.max_num_tokens, max_batch_size=ident.max_batch_size,
        provenance=resources_provenance,
        runtime_memory=RuntimeMemory(
            kv_cache_bytes=ident.kv_cache_bytes, gpu_memory_utilization=ident.gpu_memory_utilization,
            max_model_len=ident.max_model_len, provenance=memory_provenance,
        ),
        kv_bytes_per_token=ident.kv_bytes_per_token,
    )
    return Deployment(
        system=ident.system, backend="vllm", backend_version=ident.backend_version, tp=ident.tp, dp=1,
        moe_tp=ident.tp if ident.num_experts else 1, moe_ep=1, gemm_quant_mode=ident.gemm_quant_mode,
        moe_quant_mode=ident.moe_quant_mode, fmha_quant_mode=ident.fmha_quant_mode,
        comm_quant_mode=ident.comm_quant_mode, kv_cache_dtype=ident.kv_cache_dtype, resources=res,
    )


def table_columns(
    deployment: Deployment, *, model: str, model_revision: str, binned: BinnedRows, cell_id: str,
    latency_decode: np.ndarray | None = None, latency_prefill: np.ndarray | None = None,
) -> dict[str, Any]:
    """Schema-7 columns for ``binned`` at ``deployment`` (latencies may be replaced, e.g. by a derivation)."""
    nd, npf = binned.decode_batch.size, binned.prefill_batch.size
    ld = binned.decode_latency_ms if latency_decode is None else latency_decode
    lp = binned.prefill_latency_ms if latency_prefill is None else latency_prefill
    cols = make_rows(
        deployment, model_path=model, model_revision=model_revision,
        workload_kind=[DECODE] * nd + [PREFILL] * npf,
        batch_size=np.concatenate([binned.decode_batch, binned.prefill_batch]),
        total_prefill_tokens=np.concatenate([np.zeros(nd, np.int64), binned.prefill_tokens]),
        total_kv_read_tokens=np.concatenate([binned.decode_kv, binned.prefill_kv]),
        latency_ms=np.concatenate([ld, lp]).astype(np.float64), cell_id=cell_id,
    )
    counts = np.concatenate([binned.decode_count, binned.prefill_count]).astype(np.int64)
    cols["runtime_backend_version"] = [deployment.backend_version] * (nd + npf)
    cols["parallel_strategy"] = ["pure_tp"] * (nd + npf)
    cols["measurement_reduction"] = ["single_sample" if c == 1 else "actual_upper_median" for c in counts.tolist()]
    cols["source_sample_count"] = counts
    kv = np.asarray(cols["total_kv_read_tokens"])
    cols["kv_seed_regime"] = ["real_kv" if (k == DECODE or v > 0) else "n/a" for k, v in zip(cols["workload_kind"], kv.tolist())]
    return cols


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in text.lower()).strip("-")


def import_fpm_log(
    log: FpmLog | str | os.PathLike,
    identity: LogIdentity,
    *,
    binning: BinningConfig = BinningConfig(),
    provenance: str | None = None,
    widen_kv_pool: bool = False,
) -> FpmImport:
    """Classify, bin and package one FPM log as a one-deployment profile (nothing is written). The identity's
    scheduler envelope and KV pool are first checked against the log's own passes
    (:func:`jaxsim.importers.log_reconcile.reconcile_with_log`)."""
    from jaxsim.importers.log_reconcile import check_physical, reconcile_with_log

    if not isinstance(log, FpmLog):
        log = read_fpm_log(log)
    identity = reconcile_with_log(log, identity, widen_kv_pool=widen_kv_pool)
    classes = classify_rows(log, binning)
    binned = bin_rows(log, classes, binning)
    if binned.decode_batch.size == 0:
        raise TableError(f"{log.source}: no usable decode-only iterations; a profile needs decode curves")
    if binned.prefill_batch.size == 0:
        raise TableError(f"{log.source}: no usable prefill-only iterations; a profile needs prefill rows")
    src = Path(log.source).name
    digest = f"sha256 {log.sha256[:16]}"
    n_mixed = int((classes.kind == MIXED).sum())
    prov = provenance or (
        f"Imported by jaxsim {jaxsim.__version__} from FPM log {src} ({digest}, stream {log.stream}): {len(log)} "
        f"forward passes; {binning.describe()}; {n_mixed} mixed iterations kept out of the table. "
        + " ".join(f"{n}." for n in identity.notes)
    ).strip()
    dep = build_deployment(
        identity,
        resources_provenance=f"scheduler envelope max_num_batched_tokens={identity.max_num_tokens}, "
        f"max_num_seqs={identity.max_batch_size}" + (f" (from the {identity.envelope_sources[0][0]})" if identity.envelope_sources else "")
        + f" and KV geometry of the run that wrote {src}",
        memory_provenance=f"observed KV pool: {identity.kv_cache_tokens} tokens x {identity.kv_bytes_per_token} B/token "
        f"(rank-local), gpu_memory_utilization={identity.gpu_memory_utilization:g}, max_model_len={identity.max_model_len}",
    )
    check_physical(dep, log.source)
    profile = ModelProfile(
        schema_version=1, model=identity.model, model_revision=identity.model_revision,
        architecture=identity.architecture, context_length=identity.context_length, num_experts=identity.num_experts,
        provenance=prov, deployments=(dep,),
    )
    ModelProfile.from_dict(profile.to_dict(), source="imported profile")
    cols = table_columns(dep, model=identity.model, model_revision=identity.model_revision, binned=binned,
                         cell_id=f"{_slug(identity.model)}-tp{identity.tp}-{identity.system}")
    dropped = {r: int((classes.reason == r).sum()) for r in DROP_REASONS}
    summary = ImportSummary(
        source=log.source, stream=log.stream, rows_read=len(log), rows_used=int(classes.used.sum()), dropped=dropped,
        mixed_kept_out=n_mixed, decode_curves=int(np.unique(binned.decode_batch).size),
        decode_bins=int(binned.decode_batch.size), prefill_rows=int(binned.prefill_batch.size),
        decode_batch_range=_range(binned.decode_batch), decode_kv_range=_range(binned.decode_kv),
        prefill_token_range=_range(binned.prefill_tokens), coverage=_coverage(binned, log, classes.kind),
        admission_ratio=classes.admission_ratio, admission_dropped=classes.admission_dropped,
        identity_notes=tuple(n for n in identity.notes if n.startswith(("scheduler envelope", "KV pool"))),
    )
    return FpmImport(profile=profile, columns=cols, summary=summary, log=log, classes=classes, binned=binned)


# ----------------------------------------------------------------------------------------------------
# writing profile directories


def merge_columns(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Concatenate table column dicts that share the same column names."""
    names = list(parts[0])
    for p in parts[1:]:
        if list(p) != names:
            raise TableError("cannot merge tables with different columns")
    out: dict[str, Any] = {}
    for n in names:
        vals = [p[n] for p in parts]
        out[n] = np.concatenate([np.asarray(v) for v in vals]) if isinstance(vals[0], np.ndarray) else sum((list(v) for v in vals), [])
    return out


def combine_profiles(profiles: Sequence[ModelProfile], *, provenance: str) -> ModelProfile:
    """One profile holding the deployments of ``profiles`` (same model identity required)."""
    first = profiles[0]
    for p in profiles[1:]:
        for f in ("model", "model_revision", "architecture", "context_length", "num_experts"):
            if getattr(p, f) != getattr(first, f):
                raise ProfileError(f"cannot combine profiles: {f} differs ({getattr(first, f)!r} vs {getattr(p, f)!r})")
    merged = replace(first, provenance=provenance, deployments=tuple(d for p in profiles for d in p.deployments))
    return ModelProfile.from_dict(merged.to_dict(), source="combined profile")


def write_profile_dir(
    output: str | os.PathLike,
    profile: ModelProfile,
    columns: Mapping[str, Any],
    *,
    measurement_policy: str = AR_POLICY,
    force: bool = False,
    extra_sidecar: Mapping[str, Any] | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> Path:
    """Write ``profile.json`` + the table pair (flat layout) and ``extra_files`` (name -> bytes, e.g.
    ``memory.json``) into ``output``, atomically; an existing dir is refused unless ``force``, and replaced only if
    jaxsim wrote it."""
    out = Path(output)
    if out.exists() and not force:
        raise JaxsimError(f"{out}: exists; pass --force to overwrite")
    if out.exists() and not out.is_dir():
        raise JaxsimError(f"{out}: exists and is not a directory")
    systems = {(d.system, d.backend, d.backend_version) for d in profile.deployments}
    if len(systems) != 1:
        raise ProfileError("a flat profile directory holds one system/backend/backend_version; import each separately")
    system, backend, version = systems.pop()
    from jaxsim.outputs import atomic_dir, write_bytes

    with atomic_dir(out) as tmp:  # a killed or failed import leaves no half-written profile under OUTPUT
        write_table(tmp, columns, measurement_policy=measurement_policy, system=system, backend=backend,
                    backend_version=version, extra_sidecar=extra_sidecar, overwrite=True, read_back=False)  # validated before writing
        save_profile(profile, tmp / "profile.json")
        for name, data in (extra_files or {}).items():
            write_bytes(tmp / name, data)
    return out


def write_import(output: str | os.PathLike, result: FpmImport, *, force: bool = False) -> Path:
    """Write one import as a profile directory."""
    return write_profile_dir(output, result.profile, result.columns, force=force,
                             extra_sidecar={"runtime_run_ids": [f"sha256:{result.log.sha256}"]})


__all__ = [
    "BinnedRows", "BinningConfig", "DROP_REASONS", "FpmImport", "FpmLog", "ImportSummary", "LogIdentity", "RowClasses",
    "bin_rows", "build_deployment", "classify_rows", "combine_profiles", "import_fpm_log", "kv_bytes_per_token_from_config",
    "merge_columns", "read_fpm_log", "resolve_identity", "table_columns", "upper_median_index", "write_import",
    "write_profile_dir", "PARQUET_NAME", "SIDECAR_NAME",
]
