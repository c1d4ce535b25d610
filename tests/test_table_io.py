"""FPM table reader/writer: golden tables, cell selection, row/sidecar rules, write round trips."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from jaxsim.errors import TableError
from jaxsim.profile import SD_POLICY, load_profile, make_rows, read_table, validate_table, write_table
from jaxsim.profile.table import AR_POLICY, IDENTITY_COLUMNS, PARQUET_NAME, SIDECAR_NAME

GOLDENS = Path(__file__).parent / "goldens" / "public"
TABLES = ("ar_core", "ar_decoy", "sd_k3", "sd_k2")
LOOKUPS = json.loads((GOLDENS / "lookups.json").read_text())
MODEL = "golden-ckpt/pub-dense-8b"


def golden(table: str) -> Path:
    return GOLDENS / "tables" / table


def variant(tmp_path: Path, table: str, rows=None, sidecar=None, recompute: bool = True) -> Path:
    """Copy a golden table into tmp_path with rows (pa.Table -> pa.Table) / sidecar (dict -> None) edits."""
    out = tmp_path / f"{table}-variant"
    out.mkdir()
    arrow = pq.read_table(golden(table) / PARQUET_NAME)
    meta = json.loads((golden(table) / SIDECAR_NAME).read_text())
    if rows is not None:
        arrow = rows(arrow)
        pq.write_table(arrow, out / PARQUET_NAME, compression="zstd")
    else:
        shutil.copyfile(golden(table) / PARQUET_NAME, out / PARQUET_NAME)
    if recompute:
        meta["row_count"] = arrow.num_rows
        meta["parquet_sha256"] = hashlib.sha256((out / PARQUET_NAME).read_bytes()).hexdigest()
    if sidecar is not None:
        sidecar(meta)
    (out / SIDECAR_NAME).write_text(json.dumps(meta, indent=1))
    return out


def set_col(name: str, value, where=None, type_=None):
    """rows edit: set column ``name`` to ``value`` (on rows where ``where(arrow)`` is true)."""

    def edit(t: pa.Table) -> pa.Table:
        n = t.num_rows
        old = t.column(name).to_pylist() if name in t.column_names else [None] * n
        mask = np.ones(n, bool) if where is None else np.asarray(where(t))
        new = [value if m else o for o, m in zip(old, mask)]
        typ = type_ or (t.schema.field(name).type if name in t.column_names else None)
        arr = pa.array(new, type=typ)
        if name in t.column_names:
            return t.set_column(t.column_names.index(name), name, arr)
        return t.append_column(name, arr)

    return edit


def first_row(kind: str, nth: int = 0):
    def where(t):
        idx = np.flatnonzero(np.asarray(pc.equal(t.column("workload_kind"), kind)))[nth]
        m = np.zeros(t.num_rows, bool)
        m[idx] = True
        return m

    return where


# ----------------------------------------------------------------------------------------------------
# goldens


@pytest.mark.parametrize("table", TABLES)
def test_golden_tables_valid_and_cell_counts(table):
    assert validate_table(golden(table), system="h200_sxm", backend="vllm", backend_version="0.24.0") == []
    t = read_table(golden(table) / PARQUET_NAME, system="h200_sxm", backend="vllm", backend_version="0.24.0")
    counts = LOOKUPS["tables"][table]["row_counts"]
    assert t.num_rows == counts["total"]
    assert t.measurement_policy == (SD_POLICY if table.startswith("sd") else AR_POLICY)
    prof = load_profile(golden(table) / "profile.json")
    cell = t.select_cell(MODEL, prof.deployments[0], prof.model_revision)
    assert cell.num_decode_rows == counts["selected_identity_decode"]
    assert cell.num_prefill_rows == counts["selected_identity_prefill"]
    assert cell.source == str(golden(table) / PARQUET_NAME)
    for arr in (cell.decode_batch, cell.decode_kv, cell.prefill_batch, cell.prefill_tokens, cell.prefill_kv):
        assert arr.dtype == np.int64
    assert cell.decode_latency_ms.dtype == cell.prefill_latency_ms.dtype == np.float64
    order = np.lexsort((cell.decode_kv, cell.decode_batch))
    assert (order == np.arange(order.size)).all()
    order = np.lexsort((cell.prefill_tokens, cell.prefill_kv, cell.prefill_batch))
    assert (order == np.arange(order.size)).all()
    assert (cell.decode_latency_ms > 0).all() and (cell.prefill_latency_ms > 0).all()


def test_decoy_rows_never_selected():
    t = read_table(golden("ar_decoy"))
    prof = load_profile(golden("ar_decoy") / "profile.json")
    cell = t.select_cell(MODEL, prof.deployments[0], prof.model_revision)
    assert cell.cell_ids == ("public-ar_decoy-cell",)
    assert cell.decode_latency_ms.max() < 555.0 and cell.prefill_latency_ms.max() < 555.0
    # the bfloat16-KV decoy cell is its own identity
    from dataclasses import replace

    bf16 = replace(prof.deployments[0], kv_cache_dtype="bfloat16")
    assert t.select_cell(MODEL, bf16, prof.model_revision).cell_ids == ("public-ar_decoy-cell-bf16kv",)
    # another model's curves are never substituted, and the lookup is exact
    other = t.select_cell("golden-ckpt/pub-other-model", prof.deployments[0], prof.model_revision)
    assert other.num_prefill_rows == 0 and other.num_decode_rows == 16
    for model in ("golden-ckpt/pub-dense-8b-x", "golden-ckpt/PUB-dense-8b", "golden-ckpt/pub-dense-8b "):
        with pytest.raises(TableError, match="No FPM cell matches model_path=.*FPM never substitutes another model's curves"):
            t.select_cell(model, prof.deployments[0], prof.model_revision)
    # an SD identity does not match AR rows; recorded-DCP identities are distinct
    sd = load_profile(golden("sd_k3") / "profile.json").deployments[0]
    with pytest.raises(TableError, match="execution_profile='speculative_round_v1:"):
        t.select_cell(MODEL, replace(sd, kv_cache_dtype="fp8"), prof.model_revision)
    with pytest.raises(TableError, match="No FPM cell"):
        t.select_cell(MODEL, prof.deployments[0], prof.model_revision, dcp=1)


def test_fake_fallback_only_cell(tmp_path):
    d = variant(tmp_path, "ar_core", rows=set_col("kv_seed_regime", "fake_fallback"))
    t = read_table(d)
    prof = load_profile(golden("ar_core") / "profile.json")
    with pytest.raises(TableError, match="only fake_fallback rows match"):
        t.select_cell(MODEL, prof.deployments[0], prof.model_revision)


def test_sd_cell_requires_exact_selector():
    t = read_table(golden("sd_k3"))
    prof = load_profile(golden("sd_k2") / "profile.json")
    with pytest.raises(TableError, match="No FPM cell"):
        t.select_cell(MODEL, prof.deployments[0], prof.model_revision)  # K=2 identity vs K=3 rows


def test_expected_identity_checked():
    with pytest.raises(TableError, match=r"metadata\.json: system: sidecar system='h200_sxm' does not match the database system 'h100_sxm'"):
        read_table(golden("ar_core"), system="h100_sxm")
    problems = validate_table(golden("ar_core"), backend_version="0.25.0")
    assert len(problems) == 1 and "backend_version" in problems[0]


def test_schema_6_accepted(tmp_path):
    d = variant(tmp_path, "ar_core", sidecar=lambda m: m.update(schema_version=6))
    assert validate_table(d) == []


def test_ar_sidecar_with_timing_scope_accepted(tmp_path):
    # the reference refuses rows-sd-ar-policy on the rows, not on the sidecar's leftover timing_scope
    d = variant(tmp_path, "ar_core", sidecar=lambda m: m.update(timing_scope="model_step_cuda"))
    assert validate_table(d) == []


# ----------------------------------------------------------------------------------------------------
# refusals built here (beyond the materialized rejection variants)

BAD = [
    ("schema-5", "ar_core", None, lambda m: m.update(schema_version=5), "schema_version"),
    ("schema-name", "ar_core", None, lambda m: m.update(schema_name="x"), "schema_name"),
    ("sidecar-no-policy", "ar_core", None, lambda m: m.pop("measurement_policy"), "measurement_policy"),
    ("sidecar-sglang-policy", "ar_core", None, lambda m: m.update(measurement_policy="sglang_native_v1"), "measurement_policy"),
    ("sidecar-backend", "ar_core", None, lambda m: m.update(backend="sglang"), "backend"),
    ("sidecar-scope-wrong", "sd_k3", None, lambda m: m.update(timing_scope="wall_clock"), "timing_scope"),
    ("sidecar-rowcount-str", "ar_core", None, lambda m: m.update(row_count="1842"), "row_count"),
    ("sidecar-dcp-selector", "ar_core", None, lambda m: m.update(configuration_selector={"dcp": 2}), "configuration_selector dcp=2"),
    (
        "rows-backend-version",
        "ar_core",
        set_col("backend_version", "0.25.0", first_row("prefill", 3)),
        None,
        "backend_version='0.25.0' does not match",
    ),
    (
        "rows-int32-tp",
        "ar_core",
        lambda t: t.set_column(t.column_names.index("tp"), "tp", pc.cast(t.column("tp"), pa.int32())),
        None,
        "column 'tp': must be int64",
    ),
    (
        "rows-latency-int",
        "ar_core",
        lambda t: t.set_column(t.column_names.index("latency_ms"), "latency_ms", pc.cast(pc.ceil(t.column("latency_ms")), pa.int64())),
        None,
        "column 'latency_ms': must be floating-point",
    ),
    ("rows-null-model", "ar_core", set_col("model_path", None, first_row("decode", 2)), None, "row 2: model_path: null value"),
    ("rows-empty-moe-backend", "ar_core", set_col("moe_backend", "", first_row("decode", 1)), None, "row 1: moe_backend"),
    ("rows-negative-kv", "ar_core", set_col("total_kv_read_tokens", -4, first_row("decode", 5)), None, "row 5: total_kv_read_tokens: must be >= 0"),
    ("rows-batch-0", "ar_core", set_col("batch_size", 0, first_row("prefill", 0)), None, "batch_size: must be >= 1"),
    ("rows-regime-unknown", "ar_core", set_col("kv_seed_regime", "warm", first_row("decode", 0)), None, "unknown kv_seed_regime='warm'"),
    (
        "rows-config-sha-fake",
        "ar_core",
        lambda t: set_col("kv_seed_regime", "n/a", first_row("decode", 0))(set_col("model_config_sha256", "ab" * 32)(t)),
        None,
        "config-bound cached prefill/decode requires real_kv",
    ),
    ("rows-sd-missing-count", "sd_k3", lambda t: t.drop_columns(["source_sample_count"]), None, "column 'source_sample_count' missing"),
    ("rows-sd-median-1", "sd_k3", lambda t: set_col("measurement_reduction", "actual_upper_median")(t), None, "contract mismatch"),
    ("rows-sd-scope", "sd_k2", set_col("timing_scope", "wall_clock", first_row("decode", 0)), None, "timing_scope"),
    ("rows-sd-modality", "sd_k2", set_col("input_modality", "image", first_row("prefill", 0)), None, "text execution"),
    (
        "rows-sd-selector-key-order",
        "sd_k3",
        lambda t: set_col(
            "execution_profile",
            "speculative_round_v1:"
            + json.dumps(
                {
                    "execution_profile": json.loads(t.column("execution_profile")[0].as_py().split(":", 1)[1])["execution_profile"],
                    "model_revision": "5f3c9a1e0b7d4c2a8e6f1b3d5c7a9e0f2b4d6c8a",
                },
                separators=(",", ":"),
            ),
        )(t),
        None,
        "canonical serialization",
    ),
    (
        "rows-sd-selector-garbage",
        "sd_k3",
        set_col("execution_profile", "speculative_round_v1:{not json", first_row("decode", 0)),
        None,
        "canonical serialization",
    ),
    ("rows-ar-measurement-sd", "ar_core", set_col("measurement_policy", SD_POLICY, first_row("decode", 0)), None, "must match sidecar"),
    ("rows-dcp-not-dividing", "ar_core", set_col("dcp", 3, type_=pa.int64()), None, "divide tp=1"),
    ("rows-collision-other-cell", "ar_decoy", lambda t: pa.concat_tables([t, set_col("cell_id", "x")(t.slice(5, 1))]), None, "collides with row 5"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_refusals(case, tmp_path):
    _, table, rows, sidecar, fragment = case
    d = variant(tmp_path, table, rows=rows, sidecar=sidecar)
    problems = validate_table(d)
    assert problems and any(fragment in p for p in problems), problems
    assert all("\n" not in p and (PARQUET_NAME in p or SIDECAR_NAME in p) for p in problems)
    with pytest.raises(TableError):
        read_table(d)


def test_dcp_column_is_a_distinct_identity(tmp_path):
    d = variant(tmp_path, "ar_core", rows=set_col("dcp", 1, type_=pa.int64()))
    t = read_table(d)
    prof = load_profile(golden("ar_core") / "profile.json")
    with pytest.raises(TableError, match="No FPM cell"):
        t.select_cell(MODEL, prof.deployments[0], prof.model_revision)
    assert t.select_cell(MODEL, prof.deployments[0], prof.model_revision, dcp=1).num_decode_rows == 146


def test_unreadable_files(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    (d / PARQUET_NAME).write_bytes(b"not a parquet")
    (d / SIDECAR_NAME).write_text("{}")
    problems = validate_table(d)
    assert len(problems) == 1 and "cannot read parquet" in problems[0]
    (d / SIDECAR_NAME).write_text("{")
    assert "cannot read sidecar JSON" in validate_table(d)[0]
    (d / SIDECAR_NAME).unlink()
    assert "missing its metadata sidecar" in validate_table(d)[0]
    with pytest.raises(TableError, match="parquet/metadata pair is atomic"):
        read_table(d / PARQUET_NAME)
    assert "parquet file is missing" in validate_table(tmp_path / "nowhere")[0]


# ----------------------------------------------------------------------------------------------------
# writing


def _cell_columns(table: str):
    prof = load_profile(golden(table) / "profile.json")
    dep = prof.deployments[0]
    cell = read_table(golden(table)).select_cell(MODEL, dep, prof.model_revision)
    nd, npf = cell.num_decode_rows, cell.num_prefill_rows
    cols = make_rows(
        dep, model_path=MODEL, model_revision=prof.model_revision,
        workload_kind=["decode"] * nd + ["prefill"] * npf,
        batch_size=np.concatenate([cell.decode_batch, cell.prefill_batch]),
        total_prefill_tokens=np.concatenate([np.zeros(nd, np.int64), cell.prefill_tokens]),
        total_kv_read_tokens=np.concatenate([cell.decode_kv, cell.prefill_kv]),
        latency_ms=np.concatenate([cell.decode_latency_ms, cell.prefill_latency_ms]),
    )
    return prof, dep, cell, cols


@pytest.mark.parametrize("table", ["ar_core", "sd_k3"])
def test_write_round_trip(table, tmp_path):
    prof, dep, cell, cols = _cell_columns(table)
    policy = SD_POLICY if dep.is_speculative else AR_POLICY
    t = write_table(tmp_path / "out", cols, measurement_policy=policy, system="h200_sxm", backend="vllm",
                    backend_version="0.24.0", extra_sidecar={"warmup_repeats": 0, "measurement_repeats": 1})
    assert validate_table(tmp_path / "out", system="h200_sxm") == []
    meta = json.loads((tmp_path / "out" / SIDECAR_NAME).read_text())
    assert meta["row_count"] == cell.num_decode_rows + cell.num_prefill_rows
    assert meta["parquet_sha256"] == hashlib.sha256((tmp_path / "out" / PARQUET_NAME).read_bytes()).hexdigest()
    assert meta["model_paths"] == [MODEL] and meta["warmup_repeats"] == 0
    assert ("timing_scope" in meta) == dep.is_speculative
    assert pq.ParquetFile(tmp_path / "out" / PARQUET_NAME).metadata.row_group(0).column(0).compression == "ZSTD"
    back = t.select_cell(MODEL, dep, prof.model_revision)
    for name in ("decode_batch", "decode_kv", "decode_latency_ms", "prefill_batch", "prefill_tokens", "prefill_kv",
                 "prefill_latency_ms"):
        np.testing.assert_array_equal(getattr(back, name), getattr(cell, name))
    schema = pq.read_schema(tmp_path / "out" / PARQUET_NAME)
    for col in IDENTITY_COLUMNS:
        assert schema.field(col).type == pq.read_schema(golden(table) / PARQUET_NAME).field(col).type


def test_write_deterministic_and_no_overwrite(tmp_path):
    _, _, _, cols = _cell_columns("ar_core")
    kw = dict(measurement_policy=AR_POLICY, system="h200_sxm", backend="vllm", backend_version="0.24.0")
    write_table(tmp_path / "a", cols, **kw)
    write_table(tmp_path / "b", cols, **kw)
    for name in (PARQUET_NAME, SIDECAR_NAME):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    before = (tmp_path / "a" / PARQUET_NAME).read_bytes()
    with pytest.raises(TableError, match="refusing to overwrite"):
        write_table(tmp_path / "a", cols, **kw)
    assert (tmp_path / "a" / PARQUET_NAME).read_bytes() == before
    half = {k: (v[: len(v) // 2] if not isinstance(v, str) else v) for k, v in cols.items()}
    t = write_table(tmp_path / "a", half, overwrite=True, **kw)
    assert t.num_rows == len(cols["latency_ms"]) // 2


def test_write_from_arrow_table(tmp_path):
    src = pq.read_table(golden("sd_k2") / PARQUET_NAME)
    t = write_table(tmp_path / "o", src, measurement_policy=SD_POLICY, system="h200_sxm", backend="vllm",
                    backend_version="0.24.0")
    assert t.num_rows == src.num_rows
    assert pq.read_table(tmp_path / "o" / PARQUET_NAME).equals(src)


@pytest.mark.parametrize(
    "edit,fragment",
    [
        (lambda c: c.update(latency_ms=np.where(np.arange(len(c["latency_ms"])) == 7, 0.0, c["latency_ms"])), "row 7: latency_ms"),
        (lambda c: c.update(batch_size=np.asarray(c["batch_size"], dtype=np.float64)), "column 'batch_size': expected integers"),
        (lambda c: c.update(enable_eplb=[0] * len(c["latency_ms"])), "column 'enable_eplb': expected booleans"),
        (lambda c: c.update(model_path=[None] * len(c["latency_ms"])), "column 'model_path': row 0: expected a string"),
        (lambda c: c.update(total_kv_read_tokens=c["total_kv_read_tokens"][:-1]), "values, expected"),
        (lambda c: c.pop("kv_cache_dtype"), "column 'kv_cache_dtype' missing"),
    ],
)
def test_write_refuses_invalid_rows(edit, fragment, tmp_path):
    _, _, _, cols = _cell_columns("ar_core")
    cols = dict(cols)
    edit(cols)
    with pytest.raises(TableError, match=fragment.replace("(", r"\(")):
        write_table(tmp_path / "x", cols, measurement_policy=AR_POLICY, system="h200_sxm", backend="vllm",
                    backend_version="0.24.0")
    assert not (tmp_path / "x" / PARQUET_NAME).exists() and not (tmp_path / "x" / SIDECAR_NAME).exists()


def test_write_sd_rows_under_ar_policy_refused(tmp_path):
    _, _, _, cols = _cell_columns("sd_k2")
    with pytest.raises(TableError, match="native CUDA measurement policy"):
        write_table(tmp_path / "x", cols, measurement_policy=AR_POLICY, system="h200_sxm", backend="vllm",
                    backend_version="0.24.0")
