"""Import Dynamo planner profiling results (``prefill.csv`` TTFT vs ISL, ``decode.csv`` ITL vs KV usage and
context) as an FPM profile directory.

The planner measures whole-engine sweeps, not single forward passes, so the conversion is approximate and
the profile's provenance says how:

* prefill: one row per measured ISL at batch 1, cold (no cached KV): ``latency = TTFT`` (a prefill
  worker's time to first token, which also holds scheduling and first-token sampling);
* decode: the planner reports ITL at KV-cache usage ``u`` for requests of context ``c``; the active batch
  is approximated as ``b ~= round(u * max_kv_tokens / c)`` (at least 1) with total KV ``b * c``. Rows whose
  approximated batch exceeds the engine's ``max_num_seqs`` are dropped (the approximation has broken down
  there: generated tokens also occupy KV). To give every batch size a curve over KV (the FPM lookup only
  interpolates along a batch's own curve or between covering batch curves), rows are resampled on a
  power-of-two batch grid: at each measured context, the ITL is interpolated linearly in batch between
  that context's measured points (no extrapolation), and placed at (b, b * c).

``*_raw_data.npz`` (full precision) is preferred over the rounded CSV when present.
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import jaxsim
from jaxsim.errors import JaxsimError, ProfileError, TableError
from jaxsim.importers.fpm_log import BinnedRows, LogIdentity, build_deployment, table_columns
from jaxsim.importers.log_checks import refuse_duplicate_columns, refuse_non_positive
from jaxsim.profile.model import ModelProfile

# Public facts of nvidia/Llama-3.1-8B-Instruct-FP8 (config.json: 32 layers, 8 KV heads, head_dim 128, BF16 KV)
# and vLLM's scheduler defaults on a >= 70 GiB non-A100 GPU; used by the bundled-profile builder.
LLAMA31_8B_FP8_DEFAULTS: dict[str, Any] = {
    "model_revision": "unrecorded:ai-dynamo-1.6.1:H200_TP1P_TP1D",
    "architecture": "LlamaForCausalLM",
    "kv_bytes_per_token": 32 * 8 * 128 * 2 * 2,
    "gemm_quant_mode": "fp8",
    "kv_cache_dtype": "bfloat16",
    "gpu_memory_utilization": 0.9,
    "max_num_tokens": 8192,
    "max_batch_size": 1024,
    "context_length": 16384,
    "max_model_len": 16384,
}


@dataclass(frozen=True)
class PlannerData:
    """The planner's measured points (ms, tokens)."""

    source: str
    sha256: str
    prefill_isl: np.ndarray
    prefill_ttft_ms: np.ndarray
    kv_usage: np.ndarray
    context_tokens: np.ndarray
    itl_ms: np.ndarray
    max_kv_tokens: int
    model: str | None

    def decode_batch(self) -> np.ndarray:
        """Approximate active requests per measured decode point: round(u * max_kv / c), at least 1."""
        return np.maximum(1, np.rint(self.kv_usage * self.max_kv_tokens / self.context_tokens)).astype(np.int64)


def _csv(path: Path, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TableError(f"{path}: cannot read: {e.strerror or e}") from None
    reader = csv.DictReader(text.splitlines())
    refuse_duplicate_columns(path, reader.fieldnames or [])
    rows = list(reader)
    if not rows:
        raise TableError(f"{path}: no rows")
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise TableError(f"{path}: column(s) missing: {', '.join(missing)}")
    out = {}
    for c in columns:
        try:
            out[c] = np.array([float(r[c]) for r in rows])
        except ValueError:
            bad = next(i for i, r in enumerate(rows) if not _is_float(r[c]))
            raise TableError(f"{path}: row {bad + 1}: {c}: not a number ({rows[bad][c]!r})") from None
        if not np.all(np.isfinite(out[c])):
            raise TableError(f"{path}: {c}: non-finite values")
        if c.endswith("_ms"):
            refuse_non_positive(path, out[c], c)
    return out


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def read_planner_dir(directory: str | os.PathLike) -> PlannerData:
    """Read ``prefill.csv``/``decode.csv`` (or the ``*_raw_data.npz`` twins) and the model from ``disagg.yaml``."""
    d = Path(directory)
    if not d.is_dir():
        raise TableError(f"{d}: not a directory of planner profiling results")
    digest = hashlib.sha256()
    pre_npz, dec_npz = d / "prefill_raw_data.npz", d / "decode_raw_data.npz"
    if pre_npz.is_file() and dec_npz.is_file():
        with np.load(pre_npz, allow_pickle=False) as z:
            isl, ttft = np.asarray(z["prefill_isl"], np.int64), np.asarray(z["prefill_ttft"], np.float64)
        with np.load(dec_npz, allow_pickle=False) as z:
            usage, ctx, itl = (np.asarray(z[k], np.float64) for k in ("x_kv_usage", "y_context_length", "z_itl"))
            max_kv = int(np.asarray(z["max_kv_tokens"]).reshape(-1)[0])
        for p in (pre_npz, dec_npz):
            digest.update(p.read_bytes())
        source = f"{pre_npz.name} + {dec_npz.name}"
    else:
        for name in ("prefill.csv", "decode.csv"):
            if not (d / name).is_file():
                raise TableError(f"{d / name}: missing (expected the planner's prefill.csv and decode.csv)")
            digest.update((d / name).read_bytes())
        pre = _csv(d / "prefill.csv", ("isl_tokens", "ttft_ms"))
        dec = _csv(d / "decode.csv", ("kv_usage_fraction", "context_length_tokens", "itl_ms", "max_kv_tokens"))
        isl, ttft = pre["isl_tokens"].astype(np.int64), pre["ttft_ms"]
        usage, ctx, itl = dec["kv_usage_fraction"], dec["context_length_tokens"], dec["itl_ms"]
        kvs = np.unique(dec["max_kv_tokens"])
        if kvs.size != 1:
            raise TableError(f"{d / 'decode.csv'}: max_kv_tokens must be one value (got {kvs.tolist()})")
        max_kv = int(kvs[0])
        source = "prefill.csv + decode.csv"
    if np.any(ttft <= 0) or np.any(itl <= 0) or np.any(isl <= 0) or np.any(ctx <= 0) or max_kv <= 0:
        raise TableError(f"{d}: latencies, ISLs, contexts and max_kv_tokens must be positive")
    if np.any((usage < 0) | (usage > 1)):
        raise TableError(f"{d}: kv_usage_fraction must lie in [0, 1]")
    model = None
    yaml = d / "disagg.yaml"
    if yaml.is_file():
        m = re.search(r"--model[ =]([^\s\"']+)", yaml.read_text(encoding="utf-8"))
        model = m.group(1) if m else None
    return PlannerData(f"{Path(d).name} ({source})", digest.hexdigest(), isl, ttft, usage, ctx.astype(np.int64), itl, max_kv, model)


def power_of_two_grid(max_batch: int) -> np.ndarray:
    """1, 2, 4, ... up to ``max_batch``."""
    return np.array([1 << i for i in range(int(max_batch).bit_length()) if (1 << i) <= max_batch], dtype=np.int64)


def resample_decode(data: PlannerData, max_batch_size: int) -> tuple[BinnedRows, int]:
    """Decode rows on the power-of-two batch grid (module docstring); also how many points were dropped."""
    batch = data.decode_batch()
    keep = batch <= max_batch_size
    db, dk, dl = [], [], []
    for c in np.unique(data.context_tokens):
        m = keep & (data.context_tokens == c)
        if not m.any():
            continue
        b, lat = batch[m], data.itl_ms[m]
        o = np.argsort(b, kind="stable")
        b, lat = b[o], lat[o]
        if np.any(np.diff(b) == 0):
            raise TableError(f"{data.source}: two decode points at context {c} map to the same batch")
        for g in power_of_two_grid(int(b.max())):
            if g < b[0]:
                continue
            db.append(int(g))
            dk.append(int(g) * int(c))
            dl.append(float(np.interp(g, b, lat)))
    o = np.lexsort((dk, db))
    i64 = lambda v: np.asarray(v, np.int64)[o]  # noqa: E731
    rows = BinnedRows(
        i64(db), i64(dk), np.asarray(dl, np.float64)[o], np.ones(len(db), np.int64),
        np.ones(data.prefill_isl.size, np.int64), data.prefill_isl.astype(np.int64), np.zeros(data.prefill_isl.size, np.int64),
        data.prefill_ttft_ms.astype(np.float64), np.ones(data.prefill_isl.size, np.int64),
    )
    return rows, int((~keep).sum())


@dataclass(frozen=True, eq=False)
class PlannerImport:
    profile: ModelProfile
    columns: dict
    rows: BinnedRows
    data: PlannerData
    dropped_above_max_num_seqs: int


def import_planner_dir(
    directory: str | os.PathLike,
    *,
    model: str | None = None,
    model_revision: str,
    architecture: str,
    system: str,
    backend_version: str,
    kv_bytes_per_token: int,
    gemm_quant_mode: str = "bfloat16",
    kv_cache_dtype: str = "bfloat16",
    fmha_quant_mode: str | None = None,
    gpu_memory_utilization: float = 0.9,
    max_num_tokens: int = 8192,
    max_batch_size: int = 1024,
    context_length: int,
    max_model_len: int | None = None,
    tp: int = 1,
    num_experts: int = 0,
) -> PlannerImport:
    """Convert a planner profiling directory into a one-deployment profile (nothing is written)."""
    data = read_planner_dir(directory)
    model = model or data.model
    if not model:
        raise ProfileError(f"{directory}: no model recorded (disagg.yaml --model); pass --model")
    for name, v in (("model_revision", model_revision), ("architecture", architecture), ("system", system),
                    ("backend_version", backend_version)):
        if not v:
            raise JaxsimError(f"{name}: not recorded in planner results; pass --{name.replace('_', '-')}")
    rows, dropped = resample_decode(data, max_batch_size)
    ident = LogIdentity(
        model=model, model_revision=model_revision, architecture=architecture, system=system,
        backend_version=backend_version, tp=tp, context_length=context_length, num_experts=num_experts,
        gemm_quant_mode=gemm_quant_mode, moe_quant_mode=gemm_quant_mode if gemm_quant_mode in ("bfloat16", "fp8") else "bfloat16",
        fmha_quant_mode=fmha_quant_mode or ("fp8" if kv_cache_dtype == "fp8" else "bfloat16"), comm_quant_mode="half",
        kv_cache_dtype=kv_cache_dtype, kv_bytes_per_token=kv_bytes_per_token, kv_cache_tokens=data.max_kv_tokens,
        gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len or context_length,
        max_num_tokens=max_num_tokens, max_batch_size=max_batch_size,
    )
    dep = build_deployment(
        ident,
        resources_provenance=f"scheduler envelope max_num_batched_tokens={max_num_tokens}, max_num_seqs={max_batch_size} "
        "assumed (vLLM defaults on a >= 70 GiB non-A100 GPU unless given); not recorded in the planner results",
        memory_provenance=f"observed KV pool: planner max_kv_tokens {data.max_kv_tokens} x {kv_bytes_per_token} B/token; "
        f"gpu_memory_utilization {gpu_memory_utilization:g} and max_model_len {ident.max_model_len} as given (not recorded)",
    )
    provenance = (
        f"MEASURED (whole-engine planner sweep, approximate per-pass coordinates). Imported by jaxsim "
        f"{jaxsim.__version__} (jaxsim.importers.dynamo_planner) from Dynamo planner profiling results {data.source} "
        f"(sha256 {data.sha256[:16]}): {data.prefill_isl.size} prefill points (TTFT vs ISL at batch 1, cold) and "
        f"{data.itl_ms.size} decode points (ITL vs KV usage u and context c). Decode batch approximated as "
        f"round(u x max_kv_tokens / c) with total KV = batch x c; {dropped} points above max_num_seqs={max_batch_size} "
        f"dropped; ITL resampled on power-of-two batches by linear interpolation in batch at each measured context "
        f"(no extrapolation). Prefill rows are TTFT (scheduling and first-token sampling included). "
        f"model_revision {model_revision!r} as given."
    )
    profile = ModelProfile(
        schema_version=1, model=model, model_revision=model_revision, architecture=architecture,
        context_length=context_length, num_experts=num_experts, provenance=provenance, deployments=(dep,),
    )
    profile = ModelProfile.from_dict(profile.to_dict(), source="planner profile")
    cols = table_columns(dep, model=model, model_revision=model_revision, binned=rows,
                         cell_id=f"dynamo-planner-{system}-tp{tp}")
    for k in ("measurement_reduction", "source_sample_count"):
        cols.pop(k)
    cols["collector_attempt_id"] = [f"sha256:{data.sha256}"] * len(cols["latency_ms"])
    return PlannerImport(profile, cols, rows, data, dropped)
