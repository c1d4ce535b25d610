"""FPM timing table (schema 7): ``fpm_forward_perf.parquet`` + ``fpm_forward_perf.metadata.json``.

One row = one measured engine iteration of one phase. Coordinates are iteration totals: ``batch_size``
(requests), ``total_prefill_tokens`` (new tokens, 0 for decode), ``total_kv_read_tokens`` (past KV read);
``latency_ms`` in milliseconds. The parquet/sidecar pair is atomic and checked as the reference does;
every problem is one line naming the file and the column / row index.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from jaxsim.arrow_values import numpy_values
from jaxsim.errors import ProfileError, TableError
from jaxsim.fields import is_int
from jaxsim.profile.model import HEX40, SD_TIMING_SCOPE, SELECTOR_PREFIX, Deployment, ExecutionProfile

PARQUET_NAME = "fpm_forward_perf.parquet"
SIDECAR_NAME = "fpm_forward_perf.metadata.json"
SCHEMA_NAME = "aic_fpm_forward_perf"
SCHEMA_VERSION = 7
ACCEPTED_SCHEMA_VERSIONS = (6, 7)  # the reference accepts a schema-6 sidecar (goldens: sidecar-schema-6)
COORDINATE_SYSTEM = "iteration_totals_balanced_v1"
SD_POLICY = "vllm_native_fpm_model_step_cuda_v1"
AR_POLICY = "dynamo_native_single_sample_v1"
SUPPORTED_POLICIES = (
    AR_POLICY,
    "per_row_single_sample_or_median_of_3",
    "per_row_single_sample_or_full_grid_median_v1",
    "vllm_native_fpm_prefix_seed_median_v1",
    SD_POLICY,
)
PARTITION_POLICY = "balanced_v1"
WORKLOAD_KINDS = ("prefill", "decode")
KV_SEED_REGIMES = ("real_kv", "fake_fallback", "legacy", "n/a")  # plus "skip:<reason>"
SD_REDUCTIONS = {"single_sample": (1, 1), "actual_upper_median": (2, None)}  # name -> (min, max) count

PARALLEL_COLUMNS = ("tp", "pp", "dp", "moe_tp", "moe_ep", "cp")
PRECISION_COLUMNS = ("gemm_quant_mode", "moe_quant_mode", "fmha_quant_mode", "comm_quant_mode", "kv_cache_dtype")
EXECUTION_COLUMNS = ("model_config_sha256", "execution_profile", "engram_residency", "input_modality")
IDENTITY_COLUMNS = (
    *PRECISION_COLUMNS, *PARALLEL_COLUMNS, "moe_backend", "attention_backend", "enable_wideep", "enable_eplb",
    *EXECUTION_COLUMNS,
)  # the 19 strings compared with Deployment.match_identity() + execution_identity()
COORDINATE_COLUMNS = ("batch_size", "total_prefill_tokens", "total_kv_read_tokens")

# column -> kind: "str", "int64" (exactly int64), "int" (any integer), "bool", "float"
REQUIRED_COLUMNS: dict[str, str] = {
    "cell_id": "str", "model_path": "str", "system": "str", "backend": "str", "backend_version": "str",
    "weight_quantization": "str", **{c: "str" for c in PRECISION_COLUMNS}, **{c: "int64" for c in PARALLEL_COLUMNS},
    "moe_backend": "str", "attention_backend": "str", "enable_wideep": "bool", "enable_eplb": "bool",
    **{c: "str" for c in EXECUTION_COLUMNS}, "partition_policy": "str", "workload_kind": "str",
    **{c: "int64" for c in COORDINATE_COLUMNS}, "latency_ms": "float",
}
SD_REQUIRED_COLUMNS: dict[str, str] = {
    "kv_seed_regime": "str", "measurement_policy": "str", "timing_scope": "str", "measurement_reduction": "str",
    "source_sample_count": "int",
}
OPTIONAL_TYPED_COLUMNS: dict[str, str] = {"dcp": "int", **SD_REQUIRED_COLUMNS}

# Canonical column order used by write_table (the goldens' order); unknown extra columns go last.
COLUMN_ORDER = (
    "cell_id", "model_path", "system", "backend", "backend_version", "runtime_backend_version",
    "weight_quantization", "gemm_quant_mode", "moe_quant_mode", "fmha_quant_mode", "fmha_resolution",
    "comm_quant_mode", "kv_cache_dtype", "parallel_strategy", *PARALLEL_COLUMNS, "dcp", "moe_backend",
    "attention_backend", "enable_wideep", "enable_eplb", *EXECUTION_COLUMNS, "partition_policy", "kv_seed_regime",
    "global_warmup_iterations", "warmup_repeats", "measurement_repeats", "measurement_policy",
    "model_support_level", "model_template_id", "model_template_version", "aic_database_version",
    "source_plan_sha256", "collector_attempt_id", "runtime_run_id", "runtime_grid_digest", "timing_scope",
    "timing_boundary", "measurement_reduction", "source_sample_count", "workload_kind", *COORDINATE_COLUMNS,
    "latency_ms",
)
_ARROW_TYPES = {"str": pa.string(), "int64": pa.int64(), "int": pa.int64(), "bool": pa.bool_(), "float": pa.float64()}
_EXTRA_TYPES = {"global_warmup_iterations": "int", "warmup_repeats": "int", "measurement_repeats": "int"}


def _kind_of(col: str) -> str:
    return REQUIRED_COLUMNS.get(col) or OPTIONAL_TYPED_COLUMNS.get(col) or _EXTRA_TYPES.get(col) or "str"


# ----------------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True, eq=False)
class CellRows:
    """The genuine (non-fake_fallback) rows of one (model_path, 19-string identity) cell.

    Decode rows are sorted by (batch, kv); prefill rows by (batch, kv, tokens). Coordinates are int64
    iteration totals, latencies float64 milliseconds.
    """

    decode_batch: np.ndarray
    decode_kv: np.ndarray
    decode_latency_ms: np.ndarray
    prefill_batch: np.ndarray
    prefill_tokens: np.ndarray
    prefill_kv: np.ndarray
    prefill_latency_ms: np.ndarray
    cell_ids: tuple[str, ...]
    source: str

    @property
    def num_decode_rows(self) -> int:
        return int(self.decode_batch.shape[0])

    @property
    def num_prefill_rows(self) -> int:
        return int(self.prefill_batch.shape[0])

    def missing_phases(self, role: str | None) -> list[str]:
        """Phases the worker ``role`` runs (aggregated/None: both; prefill; decode) that have no genuine rows."""
        need = {"prefill": ("prefill",), "decode": ("decode",)}.get(role or "aggregated", ("decode", "prefill"))
        have = {"decode": self.num_decode_rows, "prefill": self.num_prefill_rows}
        return [p for p in need if have[p] == 0]

    def require_phases(self, role: str | None) -> CellRows:
        """This cell, or TableError when a phase its worker role runs has no genuine measurements (the
        reference refuses to build such a model, as it does for an identity with only one phase)."""
        missing = self.missing_phases(role)
        if missing:
            raise TableError(
                f"{self.source}: the matching FPM cell has no genuine {' or '.join(missing)} measurements, which a "
                f"{role or 'aggregated'} worker needs; refusing to load it"
            )
        return self


class FpmTable:
    """A validated FPM table. Build with :func:`read_table` (or :func:`write_table`)."""

    def __init__(self, path: Path, sidecar_path: Path, sidecar: dict, arrow: pa.Table, cols: dict[str, np.ndarray]):
        self.path = path
        self.sidecar_path = sidecar_path
        self.sidecar = sidecar
        self.arrow = arrow
        self._cols = cols
        # (model_path, 19 identity strings, dcp or -1) -> row indices (ascending), in first-row order
        cell, first = cols["_cell"], cols["_cell_first"]
        order = np.argsort(cell, kind="stable")
        bounds = np.cumsum(np.bincount(cell, minlength=first.size))[:-1]
        self._cells = {_cell_key(cols, int(i)): rows.astype(np.int64) for i, rows in zip(first, np.split(order, bounds))}

    # sidecar identity
    @property
    def num_rows(self) -> int:
        return self.arrow.num_rows

    @property
    def measurement_policy(self) -> str:
        return self.sidecar["measurement_policy"]

    @property
    def system(self) -> str | None:
        return self.sidecar.get("system")

    @property
    def backend(self) -> str | None:
        return self.sidecar.get("backend")

    @property
    def backend_version(self) -> str | None:
        return self.sidecar.get("backend_version")

    def column(self, name: str) -> np.ndarray:
        """A column as numpy (strings as an object array)."""
        return self._cols[name] if name in self._cols else _to_numpy(self.arrow.column(name), _kind_of(name))

    def identity_problems(self, system: str, backend: str, backend_version: str | None) -> list[str]:
        """Mismatches between the sidecar identity and the expected database identity."""
        return _identity_problems(self.sidecar, self.sidecar_path, system, backend, backend_version)

    def identities(self) -> list[tuple[str, tuple[str, ...]]]:
        """Distinct (model_path, 19-string identity) pairs present, in first-row order."""
        return list(dict.fromkeys((mp, ident) for mp, ident, _ in self._cells))

    def select_cell(
        self, model: str, deployment: Deployment, model_revision: str, *, dcp: int | None = None
    ) -> CellRows:
        """Genuine rows for ``model`` (exact model_path) at the deployment's 19-string identity.

        Rows with a recorded ``dcp`` form a distinct identity matched only by an equal explicit ``dcp``.
        Raises TableError when nothing matches; FPM never substitutes another model's curves.
        """
        want = tuple(deployment.match_identity() + deployment.execution_identity(model_revision))
        c = self._cols
        hit = np.zeros(self.num_rows, dtype=bool)
        hit[self._cells.get((model, want, -1 if dcp is None else dcp), [])] = True
        genuine = hit & (c["kv_seed_regime"] != "fake_fallback")
        if not genuine.any():
            ident = ", ".join(f"{k}={v!r}" for k, v in zip(IDENTITY_COLUMNS, want))
            dcp_text = "" if dcp is None else f", dcp={dcp}"
            why = " (only fake_fallback rows match: no genuine measurements)" if hit.any() else ""
            raise TableError(
                f"{self.path}: No FPM cell matches model_path={model!r} with identity {{{ident}{dcp_text}}}{why}; "
                "FPM never substitutes another model's curves"
            )
        kind = c["workload_kind"]
        b, t, k, lat = c["batch_size"], c["total_prefill_tokens"], c["total_kv_read_tokens"], c["latency_ms"]
        dec = np.flatnonzero(genuine & (kind == "decode"))
        dec = dec[np.lexsort((k[dec], b[dec]))]
        pre = np.flatnonzero(genuine & (kind == "prefill"))
        pre = pre[np.lexsort((t[pre], k[pre], b[pre]))]
        return CellRows(
            decode_batch=b[dec].copy(), decode_kv=k[dec].copy(), decode_latency_ms=lat[dec].copy(),
            prefill_batch=b[pre].copy(), prefill_tokens=t[pre].copy(), prefill_kv=k[pre].copy(),
            prefill_latency_ms=lat[pre].copy(), cell_ids=tuple(sorted(set(c["cell_id"][genuine]))),
            source=str(self.path),
        )


# ----------------------------------------------------------------------------------------------------
# checks


def _pair_paths(path_or_dir: str | os.PathLike) -> tuple[Path, Path]:
    p = Path(path_or_dir)
    if p.is_dir():
        return p / PARQUET_NAME, p / SIDECAR_NAME
    if p.name.endswith(".metadata.json"):
        return p.with_name(p.name[: -len(".metadata.json")] + ".parquet"), p
    if p.suffix == ".parquet":
        return p, p.with_name(p.stem + ".metadata.json")
    return p, p.with_name(p.name + ".metadata.json")


def _identity_problems(sidecar: Mapping, where: Path, system, backend, backend_version) -> list[str]:
    out = []
    for key, want in (("system", system), ("backend", backend), ("backend_version", backend_version)):
        if want is not None and sidecar.get(key) != want:
            out.append(f"{where}: {key}: sidecar {key}={sidecar.get(key)!r} does not match the database {key} {want!r}")
    return out


def check_sidecar(sidecar: Any, where: Path, *, num_rows: int | None, sha256: str | None) -> list[str]:
    """Problems with a parsed sidecar (``num_rows``/``sha256`` of the parquet when known)."""
    if not isinstance(sidecar, dict):
        return [f"{where}: sidecar must be a JSON object"]
    out = []

    def need(key: str, ok, msg: str) -> None:
        if not ok(sidecar.get(key)):
            out.append(f"{where}: {key}: {msg} (got {sidecar.get(key)!r})")

    need("schema_name", lambda v: v == SCHEMA_NAME, f"must be {SCHEMA_NAME!r}")
    need("schema_version", lambda v: is_int(v) and v in ACCEPTED_SCHEMA_VERSIONS, f"must be {SCHEMA_VERSION}")
    need("coordinate_system", lambda v: v == COORDINATE_SYSTEM, f"unsupported FPM coordinate_system (expected {COORDINATE_SYSTEM!r})")
    need("backend", lambda v: v == "vllm", "FPM tables are supported for backend 'vllm' only")
    need("measurement_policy", lambda v: v in SUPPORTED_POLICIES, "unsupported FPM measurement_policy for schema 7 backend 'vllm'")
    policy = sidecar.get("measurement_policy")
    if policy == SD_POLICY:
        need("timing_scope", lambda v: v == SD_TIMING_SCOPE, f"native CUDA FPM sidecar requires timing_scope={SD_TIMING_SCOPE}")
    for key in ("system", "backend_version"):
        need(key, lambda v: isinstance(v, str) and v.strip() != "", "must be a non-empty string")
    need("row_count", is_int, "must be an integer")
    if num_rows is not None and is_int(sidecar.get("row_count")) and sidecar["row_count"] != num_rows:
        out.append(f"{where}: row_count: FPM row_count mismatch: sidecar={sidecar['row_count']} actual={num_rows}")
    need("parquet_sha256", lambda v: isinstance(v, str), "must be a sha256 hex string")
    if sha256 is not None and isinstance(sidecar.get("parquet_sha256"), str) and sidecar["parquet_sha256"] != sha256:
        out.append(
            f"{where}: parquet_sha256: FPM parquet digest mismatch: sidecar={sidecar['parquet_sha256']!r} "
            f"actual={sha256!r} (interrupted writer?)"
        )
    sel = sidecar.get("configuration_selector")
    if sel is not None and not isinstance(sel, dict):
        out.append(f"{where}: configuration_selector: must be an object")
    return out


def _column_kind_ok(t: pa.DataType, kind: str) -> bool:
    if kind == "str":
        return pa.types.is_string(t) or pa.types.is_large_string(t)
    if kind == "int64":
        return t == pa.int64()
    if kind == "int":
        return pa.types.is_integer(t)
    if kind == "bool":
        return pa.types.is_boolean(t)
    return pa.types.is_floating(t)


def _strings(col) -> tuple[np.ndarray, np.ndarray]:
    """A null-free string column as (object array of its values, int64 code of each row's value): each
    distinct string is decoded once (a dictionary encoding), not once per row."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    enc = arr.dictionary_encode()
    codes = np.asarray(numpy_values(enc.indices), dtype=np.int64)
    values = np.empty(len(enc.dictionary), dtype=object)
    values[:] = enc.dictionary.to_pylist()
    return values[codes], codes


def _to_numpy(col: pa.ChunkedArray, kind: str) -> np.ndarray:
    if kind == "str":
        return np.array(col.to_pylist(), dtype=object)
    if kind in ("int64", "int"):
        return np.asarray(numpy_values(col), dtype=np.int64)
    if kind == "bool":
        return np.asarray(numpy_values(col), dtype=bool)
    return np.asarray(numpy_values(col), dtype=np.float64)


def _selector_problem(text: str) -> str | None:
    """Why a ``speculative_round...`` execution_profile string is not a canonical v1 selector, or None."""
    if not text.startswith(SELECTOR_PREFIX):
        return "invalid FPM execution identity: unsupported speculative_round selector version"
    try:
        body = json.loads(text[len(SELECTOR_PREFIX):])
        if not isinstance(body, dict) or list(body) != ["model_revision", "execution_profile"]:
            raise ValueError
        rev = body["model_revision"]
        if not isinstance(rev, str) or not HEX40.fullmatch(rev):
            return "invalid FPM execution identity: model_revision must be a lowercase 40-hex immutable checkpoint revision"
        prof = ExecutionProfile._parse(body["execution_profile"], "selector", "execution_profile")
    except ProfileError as e:
        return f"invalid FPM execution identity: {str(e).split(': ', 1)[1]}"
    except (ValueError, KeyError):
        return "invalid FPM execution identity: speculative_round selector must use canonical serialization"
    if prof.selector(rev) != text:
        return "invalid FPM execution identity: speculative_round selector must use canonical serialization"
    return None


def _per_value(c: dict[str, np.ndarray], col: str, test) -> np.ndarray:
    """``test`` of each row's value of a string column (evaluated once per distinct value), as booleans."""
    codes = c.get(f"_code_{col}")
    if codes is None:
        return np.array([bool(test(v)) for v in c[col]], dtype=bool)
    values = np.empty(int(codes.max()) + 1 if codes.size else 0, dtype=object)
    values[codes] = c[col]
    return np.array([bool(test(v)) for v in values], dtype=bool)[codes] if codes.size else np.zeros(0, dtype=bool)


class _Rows:
    """Collects row problems: one line per rule, naming the first offending row and the count."""

    def __init__(self, where: Path):
        self.where = where
        self.problems: list[str] = []

    def flag(self, mask: np.ndarray, column: str, msg) -> None:
        idx = np.flatnonzero(mask)
        if idx.size:
            i = int(idx[0])
            more = f" ({idx.size} rows)" if idx.size > 1 else ""
            text = msg(i) if callable(msg) else msg
            self.problems.append(f"{self.where}: row {i}: {column}: {text}{more}")


def check_rows(table: pa.Table, sidecar: Mapping, where: Path) -> tuple[list[str], dict[str, np.ndarray] | None]:
    """Column and row problems of ``table`` under ``sidecar``; also the parsed columns when usable."""
    policy = sidecar.get("measurement_policy")
    problems, c = _typed_columns(table, policy == SD_POLICY, where)
    if c is None:
        return problems, None
    n = table.num_rows
    c.setdefault("dcp", np.full(n, -1, dtype=np.int64))
    if "kv_seed_regime" not in c:
        c["kv_seed_regime"] = np.full(n, "", dtype=object)
    rows = _Rows(where)
    recorded = set(table.column_names)
    _check_labels(rows, c, sidecar)
    _check_coordinates(rows, c)
    _check_seed_and_dcp(rows, c, sidecar, recorded)
    _check_execution_identity(rows, c, policy)
    _add_cells(c)
    _check_collisions(rows, c)
    return rows.problems, c


def _typed_columns(table: pa.Table, sd_policy: bool, where: Path) -> tuple[list[str], dict[str, np.ndarray] | None]:
    """(problems, columns): every required column present, typed and null-free (``dcp`` nulls read -1);
    the columns are None when there is any problem."""
    required = dict(REQUIRED_COLUMNS, **(SD_REQUIRED_COLUMNS if sd_policy else {}))
    problems: list[str] = []
    names = table.column_names
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        return [f"{where}: column {dup!r} appears more than once"], None
    for col in required:
        if col not in names:
            why = " (required by the native CUDA policy)" if col not in REQUIRED_COLUMNS else ""
            problems.append(f"{where}: column {col!r} missing{why}")
    cols: dict[str, np.ndarray] = {}
    for col in names:
        kind = required.get(col) or OPTIONAL_TYPED_COLUMNS.get(col)
        if kind is None:
            continue
        arr = table.column(col)
        if pa.types.is_dictionary(arr.type):
            arr = arr.cast(arr.type.value_type)
        if not _column_kind_ok(arr.type, kind):
            want = {"str": "string", "int64": "int64", "int": "integer", "bool": "boolean", "float": "floating-point"}[kind]
            problems.append(f"{where}: column {col!r}: must be {want}, got {arr.type}")
            continue
        if arr.null_count and col != "dcp":
            first = int(np.flatnonzero(np.asarray(arr.is_null()))[0])
            problems.append(f"{where}: row {first}: {col}: null value ({arr.null_count} rows)")
            continue
        if col == "dcp":
            cols[col] = np.array([-1 if v is None else v for v in arr.to_pylist()], dtype=np.int64)
        elif kind == "str":
            cols[col], cols[f"_code_{col}"] = _strings(arr)
        else:
            cols[col] = _to_numpy(arr, kind)
    return (problems, None) if problems else (problems, cols)


def _check_labels(rows: _Rows, c: dict[str, np.ndarray], sidecar: Mapping) -> None:
    """The strings naming where a row comes from and which phase it measures."""
    for key in ("system", "backend", "backend_version"):
        want = sidecar.get(key)
        if isinstance(want, str):
            rows.flag(c[key] != want, key, lambda i, key=key, want=want: f"{key}={c[key][i]!r} does not match the sidecar/database {key} {want!r}")
    for key in ("model_path", "cell_id"):
        rows.flag(_per_value(c, key, lambda s: not s.strip()), key, "must be a non-empty string")
    for key in ("moe_backend", "attention_backend"):
        rows.flag(_per_value(c, key, lambda s: not s.strip()), key, f"{key} must be a non-empty string (\"auto\" or a pinned name)")
    rows.flag(c["partition_policy"] != PARTITION_POLICY, "partition_policy",
              lambda i: f"unsupported partition_policy={c['partition_policy'][i]!r} (expected {PARTITION_POLICY!r})")
    kind = c["workload_kind"]
    rows.flag(~((kind == "decode") | (kind == "prefill")), "workload_kind", lambda i: f"unknown workload_kind={kind[i]!r}")


def _check_coordinates(rows: _Rows, c: dict[str, np.ndarray]) -> None:
    """Parallel sizes, iteration totals (per phase) and latencies."""
    decode, prefill = c["workload_kind"] == "decode", c["workload_kind"] == "prefill"
    b, t, k, lat = c["batch_size"], c["total_prefill_tokens"], c["total_kv_read_tokens"], c["latency_ms"]
    for col in PARALLEL_COLUMNS:
        rows.flag(c[col] < 1, col, lambda i, col=col: f"must be >= 1 (got {c[col][i]})")
    rows.flag(b < 1, "batch_size", lambda i: f"must be >= 1 (got {b[i]})")
    rows.flag(t < 0, "total_prefill_tokens", lambda i: f"must be >= 0 (got {t[i]})")
    rows.flag(k < 0, "total_kv_read_tokens", lambda i: f"must be >= 0 (got {k[i]})")
    rows.flag(decode & (t != 0), "total_prefill_tokens", lambda i: f"decode point carrying prefill tokens ({t[i]})")
    rows.flag(prefill & (t == 0), "total_prefill_tokens", "prefill point with no prefill tokens (a prefill row must compute at least one token)")
    rows.flag(~np.isfinite(lat) | ~(lat > 0), "latency_ms", lambda i: f"non-finite/non-positive latency_ms={float(lat[i])!r}")


def _check_seed_and_dcp(rows: _Rows, c: dict[str, np.ndarray], sidecar: Mapping, recorded: set[str]) -> None:
    """The KV seed regime and decode context parallelism, where the table records them."""
    regime, dcp = c["kv_seed_regime"], c["dcp"]
    if "kv_seed_regime" in recorded:
        bad = _per_value(c, "kv_seed_regime", lambda r: r not in KV_SEED_REGIMES and not (r.startswith("skip:") and len(r) > 5))
        rows.flag(bad, "kv_seed_regime", lambda i: f"unknown kv_seed_regime={regime[i]!r}")
    if "dcp" in recorded:
        rows.flag((dcp != -1) & ((dcp < 1) | (c["tp"] % np.maximum(dcp, 1) != 0)), "dcp",
                  lambda i: f"recorded dcp={dcp[i]} must be >= 1 and divide tp={c['tp'][i]}")
    sel = sidecar.get("configuration_selector")
    if isinstance(sel, dict) and "dcp" in sel:
        rows.flag(
            dcp != sel["dcp"],
            "dcp",
            lambda i: f"dcp={None if dcp[i] == -1 else dcp[i]} disagrees with the sidecar configuration_selector dcp={sel['dcp']!r}",
        )


def _selector_rows(rows: _Rows, c: dict[str, np.ndarray]) -> np.ndarray:
    """Which rows carry a speculative-round selector; a selector that is not canonical v1 is flagged."""
    ex = c["execution_profile"]
    is_selector = _per_value(c, "execution_profile", lambda s: s.startswith("speculative_round"))
    cache: dict[str, str | None] = {}
    sel_bad = np.zeros(ex.size, dtype=bool)
    for i in np.flatnonzero(is_selector):
        s = ex[i]
        if s not in cache:
            cache[s] = _selector_problem(s)
        sel_bad[i] = cache[s] is not None
    rows.flag(sel_bad, "execution_profile", lambda i: cache[ex[i]])
    return is_selector


def _check_execution_identity(rows: _Rows, c: dict[str, np.ndarray], policy: Any) -> None:
    """Speculative-round rows and the native CUDA measurement policy imply each other, with that policy's
    timing/reduction contract, pure-TP text execution and real-KV provenance for config-bound rows."""
    sd_policy = policy == SD_POLICY
    is_selector = _selector_rows(rows, c)
    rows.flag(is_selector != sd_policy, "execution_profile",
              "speculative-round identity requires the native CUDA measurement policy, and vice versa")
    if "measurement_policy" in c:
        mp = c["measurement_policy"]
        rows.flag((mp != policy) & (sd_policy | (mp == SD_POLICY)), "measurement_policy",
                  lambda i: f"measurement_policy={mp[i]!r} must match sidecar {policy!r}")
    if sd_policy:
        rows.flag(c["timing_scope"] != SD_TIMING_SCOPE, "timing_scope",
                  lambda i: f"native CUDA timing/reduction/count contract mismatch (timing_scope={c['timing_scope'][i]!r})")
        red, cnt = c["measurement_reduction"], c["source_sample_count"]
        ok = np.array([r in SD_REDUCTIONS and SD_REDUCTIONS[r][0] <= n_ and (SD_REDUCTIONS[r][1] is None or n_ <= SD_REDUCTIONS[r][1])
                       for r, n_ in zip(red, cnt)], dtype=bool)
        rows.flag(~ok, "measurement_reduction",
                  lambda i: f"native CUDA timing/reduction/count contract mismatch ({red[i]!r}, source_sample_count={cnt[i]})")
    sd_bad = is_selector & (
        (c["dp"] != 1) | (c["moe_ep"] != 1) | (c["pp"] != 1) | (c["cp"] != 1)
        | (c["engram_residency"] != "none") | (c["input_modality"] != "text")
    )
    rows.flag(sd_bad, "execution_profile", "speculative-round data requires vLLM pure TP, DP1/PP1/CP1 and text execution")
    dcp, regime, kind = c["dcp"], c["kv_seed_regime"], c["workload_kind"]
    rows.flag(is_selector & (dcp != -1) & (dcp != 1), "dcp", "speculative-round data requires DCP1")
    config_bound = is_selector | (c["model_config_sha256"] != "")
    needs_real = config_bound & ((kind == "decode") | ((kind == "prefill") & (c["total_kv_read_tokens"] > 0)))
    rows.flag(needs_real & (regime != "real_kv"), "kv_seed_regime",
              lambda i: f"config-bound cached prefill/decode requires real_kv provenance (got {regime[i]!r})")


def _codes(c: dict[str, np.ndarray], col: str) -> np.ndarray:
    """Integer codes of a column's values (equal values, equal codes; distinct values, distinct codes)."""
    if f"_code_{col}" in c:
        return c[f"_code_{col}"]
    v = c[col]
    if v.dtype == object:
        c[f"_code_{col}"] = np.unique(v, return_inverse=True)[1].reshape(-1).astype(np.int64)
        return c[f"_code_{col}"]
    return v.astype(np.int64)


def _group(keys: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(group of each row, first row of each group): rows with equal ``keys`` (integer columns) share a
    group; groups are numbered in order of their first row."""
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    code, size = np.zeros(n, np.int64), 1
    for k in keys:  # mixed-radix codes of the key tuples, made dense again before they could overflow
        k = np.asarray(k, np.int64)
        if int(k.max()) - int(k.min()) >= n:  # a wide range: its values' ranks instead
            k = np.unique(k, return_inverse=True)[1].reshape(-1).astype(np.int64)
        k = k - k.min()
        m = int(k.max()) + 1
        if size * m >= 2**62:
            code = np.unique(code, return_inverse=True)[1].reshape(-1).astype(np.int64)
            size = int(code.max()) + 1
        code, size = code * m + k, size * m
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return rank[inverse.reshape(-1)], np.sort(first)


def _identity_string(c: dict[str, np.ndarray], col: str, i: int) -> str:
    """Row ``i``'s identity column ``col`` as the string compared with a deployment's identity."""
    v = c[col][i]
    if REQUIRED_COLUMNS[col] == "bool":
        return "True" if v else "False"
    if REQUIRED_COLUMNS[col] == "int64":
        return str(int(v))
    return v


def _cell_key(c: dict[str, np.ndarray], i: int) -> tuple:
    """(model_path, 19 identity strings, dcp or -1) of row ``i``."""
    return c["model_path"][i], tuple(_identity_string(c, col, i) for col in IDENTITY_COLUMNS), int(c["dcp"][i])


def _add_cells(c: dict[str, np.ndarray]) -> None:
    """``_cell``: each row's cell (model_path, 19 identity strings, dcp), numbered in first-row order;
    ``_cell_first``: each cell's first row."""
    n = c["model_path"].size
    c["_cell"], c["_cell_first"] = _group([_codes(c, "model_path"), *(_codes(c, col) for col in IDENTITY_COLUMNS), c["dcp"]], n)


def _check_collisions(rows: _Rows, c: dict[str, np.ndarray]) -> None:
    """The first row measuring the same coordinates as an earlier row of its identity (never overwritten)."""
    kind, b, t, k = c["workload_kind"], c["batch_size"], c["total_prefill_tokens"], c["total_kv_read_tokens"]
    group, first = _group([c["_cell"], _codes(c, "workload_kind"), b, t, k], kind.size)
    later = np.flatnonzero(first[group] != np.arange(kind.size))
    if later.size:
        i = int(later[0])
        j = int(first[group[i]])
        rows.problems.append(
            f"{rows.where}: row {i}: batch_size/total_prefill_tokens/total_kv_read_tokens: FPM row {i} collides with "
            f"row {j} at the same cell coordinates (phase={kind[i]!r}, batch_size={int(b[i])}, "
            f"total_prefill_tokens={int(t[i])}, total_kv_read_tokens={int(k[i])}); refusing to silently overwrite latencies"
        )


# ----------------------------------------------------------------------------------------------------
# read


def load_table_problems(path_or_dir, system, backend, backend_version) -> tuple[list[str], FpmTable | None]:
    """(problems, table): the table is None unless the pair is clean. Never raises for bad files."""
    pq_path, sc_path = _pair_paths(path_or_dir)
    if not pq_path.is_file():
        return [f"{pq_path}: FPM parquet file is missing"], None
    if not sc_path.is_file():
        return [
            f"{sc_path}: FPM database is missing its metadata sidecar; the parquet/metadata pair is atomic, "
            "refusing to load an unmatched parquet"
        ], None
    try:
        sidecar = json.loads(sc_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return [f"{sc_path}: cannot read sidecar JSON: {str(e).splitlines()[0]}"], None
    try:
        data = pq_path.read_bytes()
        table = pq.ParquetFile(pa.BufferReader(data)).read()  # not pq.read_table: its dataset layer imports pandas (0.25 s)
    except (OSError, pa.ArrowException, ValueError) as e:
        return [f"{pq_path}: cannot read parquet: {str(e).splitlines()[0] if str(e) else type(e).__name__}"], None
    problems = check_sidecar(sidecar, sc_path, num_rows=table.num_rows, sha256=hashlib.sha256(data).hexdigest())
    if not isinstance(sidecar, dict):
        return problems, None
    problems += _identity_problems(sidecar, sc_path, system, backend, backend_version)
    row_problems, cols = check_rows(table, sidecar, pq_path)
    problems += row_problems
    if problems or cols is None:
        return problems, None
    return [], FpmTable(pq_path, sc_path, sidecar, table, cols)


def validate_table(
    path_or_dir: str | os.PathLike, *, system: str | None = None, backend: str | None = None,
    backend_version: str | None = None,
) -> list[str]:
    """Every sidecar/column/row problem of a table pair, one line each (empty = valid)."""
    return load_table_problems(path_or_dir, system, backend, backend_version)[0]


def read_table(
    path_or_dir: str | os.PathLike, *, system: str | None = None, backend: str | None = None,
    backend_version: str | None = None,
) -> FpmTable:
    """Load and validate a table pair (a directory, the parquet or the sidecar path).

    ``system``/``backend``/``backend_version``, when given, must equal the sidecar's. Raises TableError
    with the first problem (and how many more there are).
    """
    problems, table = load_table_problems(path_or_dir, system, backend, backend_version)
    if problems:
        more = f" (+{len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise TableError(problems[0] + more)
    assert table is not None
    return table


# ----------------------------------------------------------------------------------------------------
# write


def make_rows(
    deployment: Deployment,
    *,
    model_path: str,
    model_revision: str,
    workload_kind: str | Sequence[str],
    batch_size: Sequence[int] | np.ndarray,
    total_prefill_tokens: Sequence[int] | np.ndarray,
    total_kv_read_tokens: Sequence[int] | np.ndarray,
    latency_ms: Sequence[float] | np.ndarray,
    cell_id: str | None = None,
) -> dict[str, Any]:
    """Columns for rows measured at ``deployment``'s identity: coordinates + latency + identity.

    Pass the result to :func:`write_table`, which fills the provenance columns (see ``write_table``).
    """
    n = len(latency_ms)
    kinds = [workload_kind] * n if isinstance(workload_kind, str) else list(workload_kind)
    ident = dict(zip(IDENTITY_COLUMNS, deployment.match_identity() + deployment.execution_identity(model_revision)))
    cols: dict[str, Any] = {
        "cell_id": [cell_id or f"{model_path}-cell"] * n,
        "model_path": [model_path] * n,
        "system": [deployment.system] * n,
        "backend": [deployment.backend] * n,
        "backend_version": [deployment.backend_version] * n,
    }
    for col in IDENTITY_COLUMNS:
        kind = REQUIRED_COLUMNS[col]
        v = getattr(deployment, col) if kind in ("int64", "bool") else ident[col]
        cols[col] = [v] * n
    cols.update(workload_kind=kinds, batch_size=batch_size, total_prefill_tokens=total_prefill_tokens,
                total_kv_read_tokens=total_kv_read_tokens, latency_ms=latency_ms)
    return cols


def _array(col: str, values: Any, n: int) -> pa.Array:
    kind = _kind_of(col)
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        if not _column_kind_ok(arr.type, kind):
            raise TableError(f"column {col!r}: expected {kind}, got {arr.type}")
        return arr.cast(_ARROW_TYPES[kind]) if kind != "float" else arr.cast(pa.float64())
    if kind == "str":
        seq = list(values)
        if not all(isinstance(v, str) for v in seq):
            bad = next(i for i, v in enumerate(seq) if not isinstance(v, str))
            raise TableError(f"column {col!r}: row {bad}: expected a string, got {type(seq[bad]).__name__}")
        arr = pa.array(seq, type=pa.string())
    else:
        a = np.asarray(values)
        if kind in ("int64", "int") and a.dtype.kind not in "iu":
            raise TableError(f"column {col!r}: expected integers, got dtype {a.dtype}")
        if kind == "bool" and a.dtype.kind != "b":
            raise TableError(f"column {col!r}: expected booleans, got dtype {a.dtype}")
        if kind == "float" and a.dtype.kind not in "fiu":
            raise TableError(f"column {col!r}: expected numbers, got dtype {a.dtype}")
        arr = pa.array(a.astype({"int64": np.int64, "int": np.int64, "bool": bool, "float": np.float64}[kind]))
    if len(arr) != n:
        raise TableError(f"column {col!r}: has {len(arr)} values, expected {n}")
    return arr


def _with_defaults(cols: dict[str, Any], n: int, *, policy: str, system: str, backend: str, backend_version: str) -> dict:
    """Fill the columns an importer need not supply."""
    out = dict(cols)
    const = {
        "system": system, "backend": backend, "backend_version": backend_version, "pp": 1, "cp": 1,
        "moe_backend": "auto", "attention_backend": "auto", "enable_wideep": False, "enable_eplb": False,
        "model_config_sha256": "", "execution_profile": "full", "engram_residency": "none",
        "input_modality": "text", "partition_policy": PARTITION_POLICY, "measurement_policy": policy,
    }
    if policy == SD_POLICY:
        const.update(timing_scope=SD_TIMING_SCOPE, measurement_reduction="single_sample", source_sample_count=1)
    for col, v in const.items():
        out.setdefault(col, [v] * n)
    if "weight_quantization" not in out and "gemm_quant_mode" in out:
        out["weight_quantization"] = list(out["gemm_quant_mode"])
    if "cell_id" not in out and "model_path" in out:
        out["cell_id"] = [f"{m}-cell" for m in out["model_path"]]
    if "kv_seed_regime" not in out and "workload_kind" in out and "total_kv_read_tokens" in out:
        kv = np.asarray(out["total_kv_read_tokens"])
        out["kv_seed_regime"] = [
            "real_kv" if (w == "decode" or kv_ > 0) else "n/a" for w, kv_ in zip(out["workload_kind"], kv.tolist())
        ]
    return out


def _atomic_write(path: Path, data: bytes) -> None:
    from jaxsim.outputs import write_bytes

    write_bytes(path, data)


def write_table(
    directory: str | os.PathLike,
    columns: Mapping[str, Any] | pa.Table,
    *,
    measurement_policy: str,
    system: str,
    backend: str,
    backend_version: str,
    extra_sidecar: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    read_back: bool = True,
) -> FpmTable | None:
    """Write a validated table pair into ``directory``; returns it as read back (``read_back=False``: None, for a
    writer that reads it later anyway or only needs the files: the rows were validated before writing).

    ``columns`` needs model_path, the 5 precision columns, tp, dp, moe_tp, moe_ep, workload_kind, the three
    coordinates and latency_ms (see :func:`make_rows`). Defaults fill the rest: system/backend/version from
    the arguments, pp=cp=1, backends "auto", enable_*=False, the AR execution identity ("", "full", "none",
    "text"), partition_policy balanced_v1, measurement_policy, weight_quantization = gemm_quant_mode,
    cell_id "<model_path>-cell", kv_seed_regime real_kv (decode or KV>0) / n/a, and for the SD policy
    timing_scope model_step_cuda, single_sample, source_sample_count 1. The parquet is zstd and
    byte-deterministic; the sidecar is written last. Existing files are refused unless ``overwrite``.
    """
    d = Path(directory)
    pq_path, sc_path = d / PARQUET_NAME, d / SIDECAR_NAME
    if not overwrite:
        for p in (pq_path, sc_path):
            if p.exists():
                raise TableError(f"{p}: already exists; refusing to overwrite (pass overwrite=True)")
    if isinstance(columns, pa.Table):
        columns = {name: columns.column(name) for name in columns.column_names}
    if "latency_ms" not in columns:
        raise TableError(f"{pq_path}: column 'latency_ms' missing")
    n = len(columns["latency_ms"])
    filled = _with_defaults(
        {k: (v.to_pylist() if isinstance(v, (pa.Array, pa.ChunkedArray)) and _kind_of(k) == "str" else v) for k, v in columns.items()},
        n, policy=measurement_policy, system=system, backend=backend, backend_version=backend_version,
    )
    order = [c for c in COLUMN_ORDER if c in filled] + [c for c in filled if c not in COLUMN_ORDER]
    table = pa.table({c: _array(c, filled[c], n) for c in order})
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    data = buf.getvalue()
    sidecar: dict[str, Any] = {
        "schema_name": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "coordinate_system": COORDINATE_SYSTEM,
        "measurement_policy": measurement_policy,
    }
    for k, v in (extra_sidecar or {}).items():
        sidecar[k] = v
    sidecar.update(
        row_count=n, parquet_sha256=hashlib.sha256(data).hexdigest(), system=system, backend=backend,
        backend_version=backend_version,
    )
    sidecar.setdefault("model_paths", sorted(set(filled["model_path"])) if "model_path" in filled else [])
    if measurement_policy == SD_POLICY:
        sidecar.setdefault("timing_scope", SD_TIMING_SCOPE)
    problems = check_sidecar(sidecar, sc_path, num_rows=n, sha256=sidecar["parquet_sha256"])
    problems += check_rows(table, sidecar, pq_path)[0]
    if problems:
        more = f" (+{len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise TableError(problems[0] + more)
    d.mkdir(parents=True, exist_ok=True)
    _atomic_write(pq_path, data)
    _atomic_write(sc_path, (json.dumps(sidecar, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
    return read_table(d, system=system, backend=backend, backend_version=backend_version) if read_back else None

