"""Calibrate a modelled profile to measured forward passes: a smooth multiplicative correction per phase.

Input: a profile directory (typically ``modelled``, from ``jaxsim import op-model``) and a measured
per-pass log of the same deployment (an FPM ``fpm_metrics_detail.csv`` / ForwardPassMetrics JSONL, or a
Dynamo planner profiling folder, read as batch-1 prefill passes and approximate-batch decode passes).
Output: a ``calibrated`` profile whose rows are the modelled rows times the correction, at the log's
identity (backend version included; the op model's own database version is recorded in the provenance).

The correction model (chosen for few, noisy, unevenly spread samples; stated in every output):

* the log is split by time (:func:`jaxsim.accuracy.time_split`): windows of ``window`` consecutive passes, the first
  ``train_fraction`` of each window fits, the rest is held out and only scored;
* decode: r = measured / modelled for the training decode-only passes the modelled table supports (after
  the FPM importer's robust rules drop stalls and mis-split admission steps). log r is reduced to robust
  medians per (batch, quarter-octave total-KV) bin; a weighted least-squares polynomial of total degree
  ``decode_degree`` in (log2 batch, log2 total KV) is fitted to the bin medians (weights sqrt(samples), a
  small ridge). Outside the training box of the two features the factor is held at the box edge
  (features are clipped): a correction never extrapolates a trend. Then one offset per measured batch:
  the median residual of that batch, shrunk by n / (n + ``level_shrink``), linear in log2 batch between
  measured batches and held beyond them. Why: vLLM pads a decode batch to its CUDA-graph capture size, so
  measured latency steps in batch (Qwen3-32B TP2: +9 to +15 % at batches 17-22 against -3 to -7 % at
  10-13 after the smooth fit), a shape no low-order surface follows, while within one batch the residual
  is smooth in KV (p10-p90 spread < 1 %);
* prefill: samples are the prefill-only passes (r = measured / modelled) and the mixed passes whose
  modelled prefill part is at least ``mixed_prefill_share`` of the pass, which contribute the prefill
  ratio implied once the decode correction is applied: r = 1 + (measured - modelled pass with corrected
  decode) / modelled prefill part. A polynomial of degree ``prefill_degree`` in log2 prefill tokens (and
  log2 batch, log2 (1 + cached KV / tokens) when the log varies them) is fitted to per-bin medians;
* factors are clipped to [``clip_lo``, ``clip_hi``]; the corrected rows are made monotone-safe: along each
  decode curve (fixed batch), wherever the base rows do not fall as KV grows, the corrected rows do not
  fall either; likewise along each prefill token line (fixed batch and cached KV). The correction never
  inverts the base's order (rows raised to their predecessor are counted and reported).

Scoring (held-out passes): coverage = share the profile supports (no extrapolation); errors =
|predicted / measured - 1|, median and p90, per phase, for three profiles side by side:
``measured-direct`` (the FPM importer's table built from the training passes alone), ``modelled`` and
``calibrated``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from jaxsim.accuracy import ape, ape_stats, time_split
from jaxsim.errors import JaxsimError, ProfileError, TableError
from jaxsim.fields import is_int, is_number
from jaxsim.importers.fpm_log import (
    DECODE,
    MIXED,
    PREFILL,
    BinnedRows,
    FpmLog,
    _dtype_name,
    _load_json,
    bin_rows,
    classify_rows,
    read_fpm_log,
    table_columns,
)
from jaxsim.profile.directory import ProfileBundle
from jaxsim.profile.model import Deployment, ModelProfile, RuntimeMemory
from jaxsim.profile.resolve import cell_rows, load_bundle
from jaxsim.profile.table import CellRows

PHASES = (DECODE, PREFILL, MIXED)
DATA_SOURCE = "calibrated"


# ----------------------------------------------------------------------------------------------------
# configuration and the correction model


@dataclass(frozen=True)
class CalibrationConfig:
    """Every constant of the split and the correction model (see the module docstring)."""

    window: int = 100
    train_fraction: float = 0.7
    decode_degree: int = 2
    prefill_degree: int = 2
    kv_bins_per_octave: int = 4
    token_bins_per_octave: int = 4
    min_bin_samples: int = 1
    ridge: float = 1e-3
    clip_lo: float = 0.5
    clip_hi: float = 2.0
    mixed_prefill_share: float = 0.25
    level_min_samples: int = 3
    decode_degrees: tuple[int, ...] = (1, 2, 3)
    ridges: tuple[float, ...] = (1e-4, 1e-3, 1e-2)
    cv_tolerance: float = 0.02
    level_shrink: float = 3.0

    def __post_init__(self):
        if self.window < 2 or not 0.0 < self.train_fraction < 1.0:
            raise JaxsimError(f"calibration split: window must be >= 2 and train fraction in (0, 1) (got {self.window}, {self.train_fraction})")
        if int(round(self.train_fraction * self.window)) in (0, self.window):
            raise JaxsimError(
                f"calibration split: window {self.window} x train fraction {self.train_fraction} leaves no training or no held-out pass"
            )

    def describe(self) -> str:
        return (
            f"blocked time split (windows of {self.window} passes, first {self.train_fraction:g} fit, rest held out); "
            f"decode: a polynomial (degree in {list(self.decode_degrees)} and ridge in {list(self.ridges)} chosen by an inner "
            f"time-blocked split of the training passes, the most regular within {self.cv_tolerance:g} of the best) of "
            "log(measured/modelled) in (log2 batch, log2 total KV) on "
            f"per-bin medians ({self.kv_bins_per_octave} KV bins per octave) plus a per-measured-batch median offset shrunk by "
            f"n/(n+{self.level_shrink:g}) (CUDA-graph batch padding makes latency step in batch); prefill: degree-{self.prefill_degree} "
            f"polynomial in log2 tokens (+ log2 batch, log2(1 + cached KV/tokens) where the log varies them) on per-bin "
            f"medians of prefill-only passes and of mixed passes' implied prefill ratios (prefill part >= "
            f"{self.mixed_prefill_share:g} of the pass); features clipped to the training box, factors to "
            f"[{self.clip_lo:g}, {self.clip_hi:g}], corrected rows monotone-safe (running max along KV / tokens)"
        )


def _terms(n_features: int, degree: int, active: np.ndarray) -> list[tuple[int, ...]]:
    """Monomial exponent tuples of total degree <= degree over the active features."""
    out: list[tuple[int, ...]] = [tuple([0] * n_features)]

    def rec(prefix: list[int], i: int, left: int):
        if i == n_features:
            if sum(prefix) > 0:
                out.append(tuple(prefix))
            return
        top = left if active[i] else 0
        for e in range(top + 1):
            rec(prefix + [e], i + 1, left - e)

    rec([], 0, degree)
    return list(dict.fromkeys(out))


@dataclass(frozen=True, eq=False)
class Correction:
    """factor(x) = clip(exp(sum_k coef_k * prod_j z_j^e_kj), lo, hi), z = (clip(x, box) - centre) / scale."""

    phase: str
    feature_names: tuple[str, ...]
    terms: tuple[tuple[int, ...], ...]
    coef: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    clip_lo: float
    clip_hi: float
    samples: int
    bins: int
    level_x: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))  # feature-0 levels (log2 batch)
    level_offset: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))  # log offsets at those levels

    @staticmethod
    def identity(phase: str, feature_names: tuple[str, ...]) -> Correction:
        n = len(feature_names)
        return Correction(phase, feature_names, (tuple([0] * n),), np.zeros(1), np.zeros(n), np.zeros(n), 1.0, 1.0, 0, 0)

    def _level(self, x0: np.ndarray) -> np.ndarray:
        if self.level_x.size == 0:
            return np.zeros_like(x0)
        return np.interp(x0, self.level_x, self.level_offset)  # linear between levels, held beyond the outer ones

    def _z(self, x: np.ndarray) -> np.ndarray:
        xc = np.clip(x, self.lo, self.hi)
        mid, half = (self.lo + self.hi) / 2, np.maximum((self.hi - self.lo) / 2, 1e-9)
        return (xc - mid) / half

    def log_factor(self, x: np.ndarray) -> np.ndarray:
        z = self._z(np.atleast_2d(np.asarray(x, np.float64)))
        design = np.stack([np.prod(z ** np.asarray(t), axis=1) for t in self.terms], axis=1)
        return design @ self.coef + self._level(np.atleast_2d(np.asarray(x, np.float64))[:, 0])

    def factor(self, x: np.ndarray) -> np.ndarray:
        return np.clip(np.exp(self.log_factor(x)), self.clip_lo, self.clip_hi)

    def to_dict(self) -> dict:
        return {
            "phase": self.phase, "features": list(self.feature_names), "terms": [list(t) for t in self.terms],
            "coef": [float(c) for c in self.coef], "box_lo": [float(v) for v in self.lo], "box_hi": [float(v) for v in self.hi],
            "clip": [self.clip_lo, self.clip_hi], "samples": self.samples, "bins": self.bins,
            "level_log2_batch": [float(v) for v in self.level_x], "level_log_offset": [float(v) for v in self.level_offset],
        }


def _bin_medians(x: np.ndarray, y: np.ndarray, keys: np.ndarray, min_samples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct key row: mean feature vector, median y, sample count."""
    _, inv, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    xs, ys, ns = [], [], []
    for g in range(counts.size):
        m = inv == g
        if counts[g] < min_samples:
            continue
        xs.append(np.median(x[m], axis=0))
        ys.append(np.median(y[m]))
        ns.append(counts[g])
    return np.asarray(xs).reshape(-1, x.shape[1]), np.asarray(ys), np.asarray(ns, np.float64)


def fit_correction(
    phase: str, feature_names: tuple[str, ...], x: np.ndarray, log_ratio: np.ndarray, keys: np.ndarray,
    degree: int, cfg: CalibrationConfig,
) -> Correction:
    """Weighted least squares of per-bin median log ratios on a low-order polynomial (module docstring)."""
    x = np.asarray(x, np.float64).reshape(len(log_ratio), -1)
    if log_ratio.size == 0:
        return Correction.identity(phase, feature_names)
    bx, by, bn = _bin_medians(x, log_ratio, keys, cfg.min_bin_samples)
    if by.size == 0:
        return Correction.identity(phase, feature_names)
    lo, hi = x.min(axis=0), x.max(axis=0)
    # a feature takes part only where the bins spread it; the degree per feature is capped by its distinct bins
    distinct = np.array([np.unique(np.round(bx[:, j], 6)).size for j in range(bx.shape[1])])
    active = distinct > 1
    deg = int(min(degree, max(0, by.size - 1)))
    terms = [t for t in _terms(x.shape[1], deg, active) if all(e < distinct[j] for j, e in enumerate(t))]
    corr = Correction(phase, feature_names, tuple(terms), np.zeros(len(terms)), lo, hi, cfg.clip_lo, cfg.clip_hi,
                      int(log_ratio.size), int(by.size))
    z = corr._z(bx)
    design = np.stack([np.prod(z ** np.asarray(t), axis=1) for t in terms], axis=1)
    w = np.sqrt(bn)
    a = design * w[:, None]
    ata = a.T @ a
    reg = cfg.ridge * float(np.trace(ata)) / len(terms) * np.eye(len(terms))
    reg[0, 0] = 0.0
    coef = np.linalg.solve(ata + reg, a.T @ (by * w))
    return replace(corr, coef=coef)


def add_levels(corr: Correction, x: np.ndarray, log_ratio: np.ndarray, cfg: CalibrationConfig) -> Correction:
    """Per measured level of feature 0 (decode batch): the median residual of the smooth fit, shrunk by
    n / (n + level_shrink) (a level with few samples stays near the smooth surface)."""
    if log_ratio.size == 0 or cfg.level_shrink < 0:
        return corr
    resid = log_ratio - corr.log_factor(x)
    lv, inv = np.unique(x[:, 0], return_inverse=True)
    inv = inv.reshape(-1)
    keep, off = [], []
    for g in range(lv.size):
        r = resid[inv == g]
        if r.size < cfg.level_min_samples:
            continue
        keep.append(lv[g])
        off.append(float(np.median(r)) * r.size / (r.size + cfg.level_shrink))
    return replace(corr, level_x=np.asarray(keep, np.float64), level_offset=np.asarray(off, np.float64))


# ----------------------------------------------------------------------------------------------------
# the log: reading, identity, split


@dataclass(frozen=True)
class LogFacts:
    """What the log's own files say about the deployment it measured (None = not recorded)."""

    model: str | None
    tp: int | None
    gemm_quant_mode: str | None
    kv_cache_dtype: str | None
    backend_version: str | None
    kv_cache_tokens: int | None
    gpu_memory_utilization: float | None
    max_model_len: int | None
    max_num_tokens: int | None
    max_batch_size: int | None
    source: str
    kind: str  # "fpm" | "planner"
    model_revision: str | None = None
    revision_note: str = ""


def _facts_from_files(log_path: Path, model_card: Path | None, vllm_metadata: Path | None) -> LogFacts:
    folder = log_path.parent
    card_p = model_card or (folder / "dynamo_model_card_runtime.json")
    meta_p = vllm_metadata or (folder / "vllm_metadata.json")
    card_doc = _load_json(card_p, "model card") if (model_card or card_p.is_file()) else None
    meta = (_load_json(meta_p, "vLLM metadata") if (vllm_metadata or meta_p.is_file()) else None) or {}
    card = (card_doc or {}).get("card_json", card_doc or {})
    runtime = card.get("runtime_config") or {}
    eff = meta.get("effective_config") or {}
    req = (meta.get("requested") or {}).get("deployment_config") or {}
    model = card.get("source_path") or card.get("display_name") or req.get("model")
    tp = eff.get("parallel_config.tensor_parallel_size", req.get("tensor_parallel_size"))
    model_dtype = _dtype_name(eff.get("model_config.dtype"))
    quant = eff.get("model_config.quantization")
    gemm = ("fp8" if "fp8" in quant.lower() else quant) if isinstance(quant, str) and quant else model_dtype
    cache_dtype = eff.get("cache_config.cache_dtype")
    kv = model_dtype if cache_dtype in (None, "auto") else _dtype_name(cache_dtype)
    blocks, block = runtime.get("total_kv_blocks"), card.get("kv_cache_block_size") or eff.get("cache_config.block_size")
    gmu = req.get("gpu_memory_utilization")
    rev = next((r for r in (eff.get("model_config.revision"), req.get("revision"), card.get("revision")) if isinstance(r, str) and r.strip()), None)
    note = ""
    checksum = ((card.get("model_info") or {}).get("hf_config_json") or {}).get("checksum")
    if rev is None and isinstance(checksum, str) and ":" in checksum and len(checksum.split(":", 1)[1]) >= 40:
        rev = checksum.split(":", 1)[1][:40]
        note = (f"model_revision {rev} is a PLACEHOLDER: the first 40 hex digits of the config.json checksum recorded in the "
                f"log's model card ({checksum}); the log records no Hugging Face revision")
    return LogFacts(
        model=model if isinstance(model, str) and model else None,
        tp=tp if is_int(tp) else None,
        gemm_quant_mode=gemm if isinstance(gemm, str) else None, kv_cache_dtype=kv,
        backend_version=eff.get("vllm_version") if isinstance(eff.get("vllm_version"), str) else None,
        kv_cache_tokens=blocks * block if isinstance(blocks, int) and isinstance(block, int) else None,
        gpu_memory_utilization=float(gmu) if is_number(gmu) else None,
        max_model_len=eff.get("model_config.max_model_len") if isinstance(eff.get("model_config.max_model_len"), int) else None,
        max_num_tokens=runtime.get("max_num_batched_tokens") if isinstance(runtime.get("max_num_batched_tokens"), int) else None,
        max_batch_size=runtime.get("max_num_seqs") if isinstance(runtime.get("max_num_seqs"), int) else None,
        source=str(log_path), kind="fpm", model_revision=rev, revision_note=note,
    )


def planner_log(directory: str | os.PathLike, max_batch_size: int = 1024) -> tuple[FpmLog, LogFacts]:
    """A Dynamo planner folder as passes: prefill points at batch 1 (TTFT), decode points at the approximate batch
    round(u x max_kv / c) with total KV = batch x c (ITL); in the planner's sweep order (prefill, then decode)."""
    from jaxsim.importers.dynamo_planner import read_planner_dir

    data = read_planner_dir(directory)
    batch = data.decode_batch()
    keep = batch <= max_batch_size
    b, c, itl = batch[keep], data.context_tokens[keep], data.itl_ms[keep]
    n_p, n_d = data.prefill_isl.size, int(keep.sum())
    i64 = lambda *parts: np.concatenate([np.asarray(p, np.int64) for p in parts])  # noqa: E731
    log = FpmLog(
        source=str(directory), sha256=data.sha256, stream="planner", counter_id=np.arange(n_p + n_d, dtype=np.int64),
        num_prefill_requests=i64(np.ones(n_p), np.zeros(n_d)), prefill_tokens=i64(data.prefill_isl, np.zeros(n_d)),
        prefill_kv_tokens=i64(np.zeros(n_p), np.zeros(n_d)), num_decode_requests=i64(np.zeros(n_p), b),
        decode_kv_tokens=i64(np.zeros(n_p), b * c), latency_ms=np.concatenate([data.prefill_ttft_ms, itl]).astype(np.float64),
    )
    facts = LogFacts(model=data.model, tp=None, gemm_quant_mode=None, kv_cache_dtype=None, backend_version=None,
                     kv_cache_tokens=data.max_kv_tokens, gpu_memory_utilization=None, max_model_len=None,
                     max_num_tokens=None, max_batch_size=None, source=data.source, kind="planner")
    return log, facts


def read_log(path: str | os.PathLike, *, model_card=None, vllm_metadata=None) -> tuple[FpmLog, LogFacts]:
    """An FPM log (CSV/JSONL, with the model card and vLLM metadata beside it when present) or a planner folder."""
    p = Path(path)
    if p.is_dir():
        if (p / "decode.csv").is_file() or (p / "decode_raw_data.npz").is_file():
            return planner_log(p)
        raise TableError(f"{p}: a directory, but not Dynamo planner results (no decode.csv); pass an FPM log file")
    log = read_fpm_log(p)
    if len(log) == 0:
        raise TableError(f"{p}: the log holds no forward passes")
    return log, _facts_from_files(p, Path(model_card) if model_card else None, Path(vllm_metadata) if vllm_metadata else None)


def match_deployment(profile: ModelProfile, facts: LogFacts, *, tp: int | None, where: str, model: str | None = None) -> Deployment:
    """The profile deployment the log measured; refuses a log of another model, TP or precision.

    ``model`` declares the name the log measured the profile's model under (another checkpoint name of the
    same architecture, e.g. a quantized release); without it the names must agree."""
    want = (model or profile.model).strip().lower()
    if facts.model is not None and facts.model.strip().lower() != want:
        hint = "" if model else " (pass --model if the log measured this model under another name)"
        raise ProfileError(f"{facts.source}: the log measured model {facts.model!r}, but {where} is {model or profile.model!r}{hint}")
    want_tp = tp if tp is not None else facts.tp
    if tp is not None and facts.tp is not None and tp != facts.tp:
        raise ProfileError(f"{facts.source}: --tp {tp} contradicts the log's tensor_parallel_size {facts.tp}")
    deps = [d for d in profile.deployments if want_tp is None or d.tp == want_tp]
    if not deps:
        have = ", ".join(f"TP{d.tp}" for d in profile.deployments)
        raise ProfileError(f"{facts.source}: the log measured TP{want_tp}; {where} has no TP{want_tp} deployment (has {have})")
    if len(deps) > 1:
        tps = sorted({d.tp for d in deps})
        if len(tps) > 1:
            raise ProfileError(f"{facts.source}: the log does not record its TP and {where} has TP {tps}; pass --tp")
    dep = deps[0]
    for field, got in (("gemm_quant_mode", facts.gemm_quant_mode), ("kv_cache_dtype", facts.kv_cache_dtype)):
        if got is not None and got != getattr(dep, field):
            raise ProfileError(f"{facts.source}: the log's {field} is {got!r}, but {where} TP{dep.tp} is {getattr(dep, field)!r}")
    return dep


# ----------------------------------------------------------------------------------------------------
# pricing


def _compile(cell):
    from jaxsim.kernels import rounds

    return rounds.compile_round_table(cell)


def _profile_table(bundle: ProfileBundle, dep: Deployment):
    """The deployment's compiled table (from the one cache, :func:`jaxsim.kernels.tables.round_table`), priced as
    plain forward passes: a log records engine iterations, not speculative rounds."""
    from jaxsim.kernels import rounds, tables

    t = tables.round_table(bundle, dep)
    return rounds.pad_round_table(t, rounds.table_shapes(t), speculative=False, num_draft_tokens=0) if t.speculative else t


def price(table, log: FpmLog) -> tuple[np.ndarray, np.ndarray]:
    """(latency_ms, supported) of every pass of ``log`` on a compiled table."""
    from jaxsim.kernels import rounds, status

    if len(log) == 0:
        return np.zeros(0), np.zeros(0, bool)
    lat, code = rounds.mixed_batch(table, log.num_prefill_requests, log.prefill_tokens, log.prefill_kv_tokens,
                                   log.num_decode_requests, log.decode_kv_tokens)
    return np.asarray(lat, np.float64), np.asarray(status.is_supported(np.asarray(code)), bool)


def _prefill_part(table, log: FpmLog, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from jaxsim.kernels import rounds, status

    if idx.size == 0:
        return np.zeros(0), np.zeros(0, bool)
    lat, code = rounds.prefill_batch(table, log.num_prefill_requests[idx], log.prefill_tokens[idx], log.prefill_kv_tokens[idx])
    return np.asarray(lat, np.float64), np.asarray(status.is_supported(np.asarray(code)), bool)


def _decode_features(batch, kv) -> np.ndarray:
    return np.stack([np.log2(np.maximum(batch, 1)), np.log2(np.maximum(kv, 1))], axis=1).astype(np.float64)


def _prefill_features(batch, tokens, kv) -> np.ndarray:
    t = np.maximum(np.asarray(tokens, np.float64), 1.0)
    return np.stack([np.log2(t), np.log2(np.maximum(batch, 1)), np.log2(1.0 + np.asarray(kv, np.float64) / t)], axis=1)


def _monotone(lat: np.ndarray, base: np.ndarray, groups: tuple[np.ndarray, ...], order_key: np.ndarray) -> tuple[np.ndarray, int]:
    """Monotone-safe: within each group, in ``order_key`` order, wherever the base rows do not fall, the corrected
    rows do not fall either (the correction never inverts the base's order). Returns (latencies, rows raised)."""
    o = np.lexsort((order_key, *groups[::-1]))
    gk = np.stack([g[o] for g in groups], axis=1)
    same = np.zeros(o.size, bool)
    same[1:] = np.all(gk[1:] == gk[:-1], axis=1)
    bs, cs = base[o], lat[o].copy()
    rises = np.zeros(o.size, bool)
    rises[1:] = same[1:] & (bs[1:] >= bs[:-1])
    raised = 0
    for i in np.flatnonzero(rises):
        if cs[i] < cs[i - 1]:
            cs[i] = cs[i - 1]
            raised += 1
    out = lat.copy()
    out[o] = cs
    return out, raised


def apply_corrections(rows: CellRows, dec: Correction, pre: Correction) -> tuple[CellRows, dict]:
    """Corrected rows (monotone-safe) and how many were raised by the monotone pass."""
    ld = rows.decode_latency_ms * dec.factor(_decode_features(rows.decode_batch, rows.decode_kv))
    lp = rows.prefill_latency_ms * pre.factor(_prefill_features(rows.prefill_batch, rows.prefill_tokens, rows.prefill_kv))
    ld, nd = _monotone(ld, rows.decode_latency_ms, (rows.decode_batch,), rows.decode_kv) if ld.size else (ld, 0)
    lp, np_ = (_monotone(lp, rows.prefill_latency_ms, (rows.prefill_batch, rows.prefill_kv), rows.prefill_tokens)
               if lp.size else (lp, 0))
    return replace(rows, decode_latency_ms=ld, prefill_latency_ms=lp), {"decode_rows_raised": nd, "prefill_rows_raised": np_}


# ----------------------------------------------------------------------------------------------------
# fitting and scoring


def _stats(pred: np.ndarray, meas: np.ndarray, ok: np.ndarray, idx: np.ndarray) -> dict:
    """:func:`jaxsim.accuracy.ape_stats` of the passes ``idx`` (those with ``ok`` are covered)."""
    hit = idx[ok[idx]]
    return ape_stats(ape(pred[hit], meas[hit]), idx.size, hit.size)


def select_decode_model(pos: np.ndarray, x: np.ndarray, y: np.ndarray, keys: np.ndarray, cfg: CalibrationConfig):
    """(degree, ridge) for the decode surface by an inner time-blocked split of the TRAINING samples only
    (``pos`` = their pass positions): the first train_fraction of each window of training samples fits, the
    rest validates; score = median + p90/4 of the validation |error| (%); the most regular candidate within
    ``cv_tolerance`` of the best score wins (larger ridge, then lower degree). Held-out passes are never seen."""
    inner = time_split(pos.size, window=max(2, min(cfg.window, pos.size // 3)), train_fraction=cfg.train_fraction)
    table: dict = {}
    scored = []
    if inner.all() or not inner.any() or pos.size < 8:
        return cfg.decode_degree, cfg.ridge, table
    for deg in cfg.decode_degrees:
        for ridge in cfg.ridges:
            c2 = replace(cfg, ridge=ridge)
            corr = fit_correction(DECODE, ("b", "kv"), x[inner], y[inner], keys[inner], deg, c2)
            corr = add_levels(corr, x[inner], y[inner], c2)
            err = np.abs(np.exp(y[~inner] - corr.log_factor(x[~inner])) - 1.0) * 100.0
            sc = float(np.median(err) + np.percentile(err, 90) / 4)
            table[f"degree {deg}, ridge {ridge:g}"] = round(sc, 3)
            scored.append((sc, deg, ridge))
    # the most regular model within cfg.cv_tolerance of the best score: larger ridge first, then lower degree
    top = min(sc for sc, _, _ in scored)
    ok = [(-ridge, deg) for sc, deg, ridge in scored if sc <= top * (1 + cfg.cv_tolerance)]
    r, deg = min(ok)
    return deg, -r, table


def _require_samples(log: FpmLog, n: int, what: str) -> None:
    """A correction is fitted to at least one usable training pass of its phase: else one line, naming the log."""
    if n < 1:
        raise TableError(f"{log.source}: too few passes to calibrate: no usable {what} training pass inside the profile's "
                         f"support among its {len(log)} passes (calibration fits decode and prefill corrections to a "
                         "training split and scores held-out passes; give a longer log)")


def fit(rows: CellRows, log: FpmLog, train: np.ndarray, cfg: CalibrationConfig, *, base=None) -> tuple[Correction, Correction, dict]:
    """Fit the decode then the prefill correction on the training passes of ``log`` (``base``: ``rows``
    compiled, when the caller has them)."""
    kind = log.kind
    meas = log.latency_ms
    base = _compile(rows) if base is None else base
    pred, ok = price(base, log)
    good = train & ok & (meas > 0) & (pred > 0)
    # the importer's robust rules (stalls beyond 5 robust deviations, mis-split admission steps) drop samples first
    tidx = np.flatnonzero(train)
    classes = classify_rows(log.take(tidx))
    dropped = np.zeros(len(log), bool)
    dropped[tidx] = np.isin(classes.reason, ("outlier_mad", "mis_split_admission"))
    good &= ~dropped
    info: dict = {"train_passes": int(train.sum()), "train_passes_dropped": int(dropped.sum())}
    # decode
    d = np.flatnonzero(good & (kind == DECODE))
    _require_samples(log, d.size, "decode-only")
    xd = _decode_features(log.num_decode_requests[d], log.decode_kv_tokens[d])
    yd = np.log(meas[d] / pred[d])
    keys = np.stack([log.num_decode_requests[d], np.floor(xd[:, 1] * cfg.kv_bins_per_octave)], axis=1)
    deg, ridge, cv = select_decode_model(d, xd, yd, keys, cfg)
    fcfg = replace(cfg, ridge=ridge)
    dec = fit_correction(DECODE, ("log2_batch", "log2_total_kv"), xd, yd, keys, deg, fcfg)
    dec = add_levels(dec, xd, yd, fcfg)
    info.update(decode_degree=deg, decode_ridge=ridge, decode_inner_cv=cv)
    info["decode_samples"] = int(d.size)
    # prefill: prefill-only passes directly, mixed passes through their implied prefill ratio
    mid, _ = apply_corrections(rows, dec, Correction.identity(PREFILL, ("", "", "")))
    t_mid = _compile(mid)
    pred_mid, ok_mid = price(t_mid, log)
    p = np.flatnonzero(good & ok_mid & (kind == PREFILL))
    m = np.flatnonzero(good & ok_mid & (kind == MIXED))
    part, ok_part = _prefill_part(t_mid, log, m)
    share_ok = ok_part & (part >= cfg.mixed_prefill_share * pred_mid[m]) & (part > 0)
    m, part = m[share_ok], part[share_ok]
    r_m = 1.0 + (meas[m] - pred_mid[m]) / part
    keep_m = r_m > 0.05
    m, r_m = m[keep_m], r_m[keep_m]
    idx = np.concatenate([p, m])
    _require_samples(log, idx.size, "prefill-only or mixed")
    y = np.concatenate([np.log(meas[p] / pred_mid[p]), np.log(r_m)])
    xp = _prefill_features(log.num_prefill_requests[idx], log.prefill_tokens[idx], log.prefill_kv_tokens[idx])
    keys = np.stack([np.floor(xp[:, 0] * cfg.token_bins_per_octave), np.round(xp[:, 1]), np.floor(xp[:, 2] * 2)], axis=1)
    pre = fit_correction(PREFILL, ("log2_tokens", "log2_batch", "log2_1p_cached_over_tokens"), xp, y, keys, cfg.prefill_degree, cfg)
    info.update(prefill_samples=int(p.size), mixed_samples=int(m.size))
    return dec, pre, info


def measured_direct_table(log: FpmLog, train: np.ndarray):
    """The FPM importer's table built from the training passes alone (None when it has no decode rows)."""
    tlog = log.take(train)
    classes = classify_rows(tlog)
    binned: BinnedRows = bin_rows(tlog, classes)
    if binned.decode_batch.size == 0 and binned.prefill_batch.size == 0:
        return None
    return _compile(binned)


def score(log: FpmLog, held: np.ndarray, tables: dict) -> dict:
    """Per profile label and phase: coverage and median/p90 APE over the held-out passes."""
    kind = log.kind
    out: dict = {}
    for label, table in tables.items():
        if table is None:
            out[label] = {
                ph: _stats(np.zeros(len(log)), log.latency_ms, np.zeros(len(log), bool), np.flatnonzero(held & (kind == ph))) for ph in PHASES
            }
            continue
        pred, ok = price(table, log)
        out[label] = {ph: _stats(pred, log.latency_ms, ok, np.flatnonzero(held & (kind == ph))) for ph in PHASES}
    return out


@dataclass(frozen=True, eq=False)
class Calibration:
    """A fitted calibration: the corrected rows, the corrections, held-out scores and what was done."""

    profile: ModelProfile
    deployment: Deployment
    rows: CellRows
    decode: Correction
    prefill: Correction
    scores: dict
    info: dict
    log: FpmLog
    facts: LogFacts
    config: CalibrationConfig

    def summary(self) -> dict:
        return {
            "model": self.profile.model, "tp": self.deployment.tp, "system": self.deployment.system,
            "backend_version": self.deployment.backend_version, "log": self.facts.source,
            "passes": len(self.log), **self.info, "corrections": {"decode": self.decode.to_dict(), "prefill": self.prefill.to_dict()},
            "held_out": self.scores, "weak_phase_threshold_pct": WEAK_PHASE_APE_PCT, "weak_phases": weak_phases(self.scores),
        }


WEAK_PHASE_APE_PCT = 10.0
"""A calibrated phase whose held-out median |error| stays above this (%) is flagged weak (calibration.json
``weak_phases``, a warning from ``jaxsim calibrate``, the profile's provenance and ``jaxsim profiles show``)."""


def weak_phases(scores: dict, threshold_pct: float = WEAK_PHASE_APE_PCT) -> dict[str, float]:
    """Phases whose held-out median |error| of the calibrated profile (``scores[DATA_SOURCE]``, see :func:`score`)
    stays above ``threshold_pct``: phase -> that median (%)."""
    out = {}
    for ph, st in (scores.get(DATA_SOURCE) or {}).items():
        med = st.get("median_ape")
        if st.get("n") and isinstance(med, (int, float)) and med == med and med > threshold_pct:
            out[ph] = round(float(med), 2)
    return out


def weak_note(scores: dict) -> str:
    """One sentence for a weak calibration ('' when every phase is within the threshold)."""
    weak = weak_phases(scores)
    if not weak:
        return ""
    what = ", ".join(f"{ph} {v:.1f} %" for ph, v in weak.items())
    return (f"WEAK CALIBRATION: held-out median |error| stays above {WEAK_PHASE_APE_PCT:g} % for {what}; "
            "do not read this profile as calibrated in those phases.")


def _source_data_label(bundle) -> str:
    """measured / derived / modelled / calibrated, from the profile (or its table's) stated data source."""
    import re

    for text in (getattr(bundle.profile, "data_source", None), bundle.table.sidecar.get("data_source"),
                 bundle.table.sidecar.get("provenance"), bundle.profile.provenance):
        if isinstance(text, str):
            m = re.match(r"\s*(measured|derived|modelled|calibrated)\b", text, re.IGNORECASE)
            if m:
                return m.group(1).lower()
    return "source"


def calibrate(
    profile_dir: str | os.PathLike,
    log_path: str | os.PathLike,
    *,
    tp: int | None = None,
    backend_version: str | None = None,
    model_card: str | os.PathLike | None = None,
    vllm_metadata: str | os.PathLike | None = None,
    model: str | None = None,
    model_revision: str | None = None,
    config: CalibrationConfig = CalibrationConfig(),
) -> Calibration:
    """Fit and score a calibration (nothing is written; see :func:`write_calibration`)."""
    bundle = load_bundle(Path(profile_dir))
    log, facts = read_log(log_path, model_card=model_card, vllm_metadata=vllm_metadata)
    dep = match_deployment(bundle.profile, facts, tp=tp, where=f"profile {bundle.root}", model=model)
    cell = cell_rows(bundle, dep)
    rows = cell
    kind = log.kind
    if not np.any(kind == DECODE) and not np.any(kind == PREFILL):
        raise TableError(f"{facts.source}: no decode-only or prefill-only pass to calibrate against")
    train = time_split(len(log), window=config.window, train_fraction=config.train_fraction)
    base = _profile_table(bundle, dep)
    _, ok = price(base, log)
    if not np.any(ok & train & (kind == DECODE)) and not np.any(ok & train & (kind == PREFILL)):
        raise TableError(
            f"{facts.source}: no training pass of the log lies inside profile {bundle.root}'s support; nothing to calibrate against"
        )
    dec, pre, info = fit(rows, log, train, config, base=base)
    corrected, mono = apply_corrections(rows, dec, pre)
    info.update(mono)
    info["source_data"] = _source_data_label(bundle)
    tables = {"measured-direct": measured_direct_table(log, train), info["source_data"]: base, DATA_SOURCE: _compile(corrected)}
    scores = score(log, ~train, tables)
    dep_out = _log_deployment(dep, facts, backend_version)
    info["source_backend_version"] = dep.backend_version
    info["source_model"] = bundle.profile.model
    info["source_provenance"] = bundle.profile.provenance
    info["source_model_revision"] = bundle.profile.model_revision
    ident = {"model": model or facts.model or bundle.profile.model,
             "model_revision": model_revision or facts.model_revision or bundle.profile.model_revision}
    info["revision_note"] = "" if model_revision else facts.revision_note
    profile = replace(bundle.profile, **ident)
    return Calibration(profile, dep_out, corrected, dec, pre, scores, info, log, facts, config)


def _log_deployment(dep: Deployment, facts: LogFacts, backend_version: str | None) -> Deployment:
    """The calibrated deployment: the profile's parallelism and precisions at the log's version and runtime."""
    version = backend_version or facts.backend_version or dep.backend_version
    res = dep.resources
    mem = res.runtime_memory
    if facts.kv_cache_tokens is not None and res.kv_bytes_per_token:
        mem = RuntimeMemory(
            kv_cache_bytes=int(facts.kv_cache_tokens) * int(res.kv_bytes_per_token),
            gpu_memory_utilization=facts.gpu_memory_utilization or (mem.gpu_memory_utilization if mem else 0.9),
            max_model_len=facts.max_model_len or (mem.max_model_len if mem else None),
            provenance=f"observed KV pool of the calibration log {facts.source}: {facts.kv_cache_tokens} tokens x "
            f"{res.kv_bytes_per_token} B/token (rank-local)",
        )
    res = replace(
        res, runtime_memory=mem, max_num_tokens=facts.max_num_tokens or res.max_num_tokens,
        max_batch_size=facts.max_batch_size or res.max_batch_size,
    )
    return replace(dep, backend_version=version, resources=res)


# ----------------------------------------------------------------------------------------------------
# output


def _pct(x: float) -> str:
    return "-" if x != x else f"{x:.2f} %"


def score_lines(scores: dict) -> list[list[str]]:
    """Rows ``phase, held-out, then (coverage, median, p90) per profile label``."""
    labels = list(scores)
    out = []
    for ph in PHASES:
        n = scores[labels[0]][ph]["n"]
        row = [ph, f"{n:,}"]
        for lab in labels:
            s = scores[lab][ph]
            row += ["-" if not s["n"] else f"{100 * s['coverage']:.1f} %", _pct(s["median_ape"]), _pct(s["p90_ape"])]
        out.append(row)
    return out


def _source_provenance(cal: Calibration) -> str:
    return cal.info.get("source_provenance", "")[:700]


def calibrated_profile(cal: Calibration, *, provenance_extra: str = "") -> tuple[ModelProfile, dict]:
    """The calibrated one-deployment profile and its table columns."""
    src = cal.profile
    prov = (
        f"CALIBRATED. The {cal.info['source_data']} rows of profile {src.model} (deployment {cal.deployment.system} "
        f"TP{cal.deployment.tp}) times a smooth multiplicative correction fitted to measured forward passes of "
        f"{cal.facts.source} (sha256 {cal.log.sha256[:16]}, {len(cal.log)} passes; {cal.info['decode_samples']} decode, "
        f"{cal.info['prefill_samples']} prefill-only and {cal.info['mixed_samples']} mixed training passes used). "
        f"Model: {cal.config.describe()}. Latencies stored to 1 us. Identity of the log: backend {cal.deployment.backend} "
        f"{cal.deployment.backend_version} (the source profile's is {cal.info['source_backend_version']}); model "
        f"{src.model} (source profile: {cal.info['source_model']}, revision {cal.info['source_model_revision']}). "
        + (cal.info["revision_note"] + ". " if cal.info.get("revision_note") else "")
        + (weak_note(cal.scores) + " " if weak_note(cal.scores) else "")
        + f"Source profile provenance: {_source_provenance(cal)}"
        + (" " + provenance_extra if provenance_extra else "")
    )
    profile = ModelProfile.from_dict(
        {**src.to_dict(), "provenance": prov, "deployments": [cal.deployment.to_dict()], "data_source": DATA_SOURCE}, source="calibrated profile"
    )
    r = cal.rows
    # stored to 1 us (1e-3 ms): far below any pass's accuracy, and a third of the bytes (rounding keeps order)
    ld, lp = np.round(r.decode_latency_ms, 3), np.round(r.prefill_latency_ms, 3)
    binned = BinnedRows(r.decode_batch, r.decode_kv, ld, np.ones(r.decode_batch.size, np.int64),
                        r.prefill_batch, r.prefill_tokens, r.prefill_kv, lp, np.ones(r.prefill_batch.size, np.int64))
    slug = "".join(c if c.isalnum() else "-" for c in src.model.lower())
    cols = table_columns(cal.deployment, model=src.model, model_revision=src.model_revision, binned=binned,
                         cell_id=f"{slug}-tp{cal.deployment.tp}-{cal.deployment.system}-calibrated")
    cols["model_support_level"] = [DATA_SOURCE] * len(cols["latency_ms"])
    cols["collector_attempt_id"] = [f"sha256:{cal.log.sha256}"] * len(cols["latency_ms"])
    return profile, cols


def write_calibrated(output: str | os.PathLike, parts: list[tuple[ModelProfile, dict]], *, force: bool = False,
                     extra_sidecar: dict | None = None, report: dict | None = None) -> Path:
    """Write one or more calibrated deployments as one profile directory, atomically (temp dir, then rename)."""
    from jaxsim.importers.fpm_log import combine_profiles, merge_columns, write_profile_dir

    out = Path(output)
    if out.exists() and not force:
        raise JaxsimError(f"{out}: exists; pass --force to overwrite")
    profile = parts[0][0] if len(parts) == 1 else combine_profiles([p for p, _ in parts], provenance=parts[0][0].provenance)
    columns = parts[0][1] if len(parts) == 1 else merge_columns([c for _, c in parts])
    extra = {} if report is None else {"calibration.json": (json.dumps(report, indent=1, default=_json_default) + "\n").encode("utf-8")}
    return write_profile_dir(out, profile, columns, force=True, extra_sidecar={"data_source": DATA_SOURCE, **(extra_sidecar or {})},
                             extra_files=extra)


def _json_default(v: Any):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        f = float(v)
        return None if math.isnan(f) else f
    if dataclasses.is_dataclass(v):
        return dataclasses.asdict(v)
    raise TypeError(type(v).__name__)


__all__ = [
    "Calibration", "CalibrationConfig", "Correction", "DATA_SOURCE", "LogFacts", "PHASES", "apply_corrections",
    "calibrate", "calibrated_profile", "fit", "fit_correction", "match_deployment", "planner_log", "price", "read_log",
    "score", "score_lines", "WEAK_PHASE_APE_PCT", "weak_note", "weak_phases", "write_calibrated",
]
