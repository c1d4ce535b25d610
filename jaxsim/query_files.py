"""Round-timing query files (CSV or parquet, read by pyarrow): read, validate, stream, write.

A query file has columns ``workload_kind, batch_size, total_prefill_tokens, total_kv_read_tokens``; mixed
rows (``workload_kind=mixed``) also carry ``num_decode_requests, total_decode_kv_tokens`` and use the first
three counts for their prefill part. Errors name the file, the column and the first bad row. The queries
are evaluated by :func:`jaxsim.kernels.queries.evaluate`; :mod:`jaxsim.round_queries` streams a file
through the kernels into an output that repeats the query columns and adds ``latency_ms`` and ``status``.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from jaxsim.errors import QueryError
from jaxsim.outputs import atomic_file, output_format

__all__ = [
    "QUERY_COLUMNS", "MIXED_COLUMNS", "KINDS", "QueryBatch", "is_parquet", "open_writer", "plain_text", "read_queries",
    "stream_queries", "validate_queries", "write_results",
]

QUERY_COLUMNS = ("workload_kind", "batch_size", "total_prefill_tokens", "total_kv_read_tokens")
MIXED_COLUMNS = ("num_decode_requests", "total_decode_kv_tokens")
KINDS = ("decode", "prefill", "mixed")


@dataclass(frozen=True)
class QueryBatch:
    """Validated queries as int64 arrays; ``kind`` indexes KINDS."""

    table: pa.Table
    kind: np.ndarray
    batch: np.ndarray
    prefill_tokens: np.ndarray
    kv_read: np.ndarray
    decode_requests: np.ndarray
    decode_kv: np.ndarray


def is_parquet(path: Path) -> bool:
    return path.suffix.lower() in (".parquet", ".pq")


def read_queries(path: str | Path) -> QueryBatch:
    """Read and validate a query file; errors name the file, column and first bad row."""
    path = Path(path)
    if not path.is_file():
        raise QueryError(f"{path}: query file not found")
    try:
        if is_parquet(path):
            table = pq.read_table(path, read_dictionary=["workload_kind"])
        else:
            opts = pacsv.ConvertOptions(strings_can_be_null=False, column_types={"workload_kind": pa.dictionary(pa.int32(), pa.string())})
            table = pacsv.read_csv(path, convert_options=opts)
    except (pa.ArrowInvalid, OSError) as exc:
        raise _read_error(path, exc) from None
    return validate_queries(table, path)


def _read_error(path: Path, exc: Exception) -> QueryError:
    """pyarrow could not read ``path``: name the first bad row when one can be found, else say why."""
    where = None if is_parquet(path) or isinstance(exc, FileNotFoundError) else _csv_bad_row(path)
    return QueryError(f"{path}: {where}" if where else f"{path}: cannot read query file: {' '.join(str(exc).split())}")


def _csv_bad_row(path: Path, column: str | None = None) -> str | None:
    """The first data row of a CSV query file that pyarrow cannot read as a query ("row N: ..."): a wrong
    number of fields, or a count column (only ``column``, when given) holding something other than an
    integer. Rows are numbered like pyarrow's (blank lines skipped). Only called after a read failed."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = csv.reader(f)
            header = [c.strip() for c in next(rows, [])]
            counts = [c for c in (*QUERY_COLUMNS[1:], *MIXED_COLUMNS) if c in header and column in (None, c)]
            n = 0
            for row in rows:
                if not row:
                    continue
                n += 1
                if len(row) != len(header):
                    return f"row {n}: expected {len(header)} fields ({', '.join(header)}), got {len(row)}"
                for c in counts:
                    v = row[header.index(c)]
                    if v and not _INT_TEXT.fullmatch(v):
                        return f"row {n}: column {c} must hold integers (found {v!r})"
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return None


_INT_TEXT = re.compile(r"[+-]?[0-9]+")


def validate_queries(table: pa.Table, path: Path, first_row: int = 0) -> QueryBatch:
    """Validate one table (or streamed batch) of queries; ``first_row`` numbers its rows in the file."""
    missing = [c for c in QUERY_COLUMNS if c not in table.column_names]
    if missing:
        raise QueryError(f"{path}: missing column(s) {', '.join(missing)} (need {', '.join(QUERY_COLUMNS)})")
    kind = _kind_codes(path, table.column("workload_kind"), first_row)
    n = table.num_rows
    has_mixed = bool(np.any(kind == 2))

    def ints(name: str, required: bool) -> np.ndarray:
        if name not in table.column_names:
            if required:
                raise QueryError(f"{path}: mixed rows need column {name}")
            return np.zeros(n, np.int64)
        col = table.column(name)
        if not pa.types.is_integer(col.type):
            where = None if is_parquet(path) else _csv_bad_row(path, name)
            raise QueryError(f"{path}: {where}" if where else f"{path}: column {name} must hold integers (found {col.type})")
        if col.null_count:
            null = col.is_null().to_numpy(zero_copy_only=False)
            must = null & (kind == 2) if name in MIXED_COLUMNS else null
            if must.any():
                row = int(np.nonzero(must)[0][0])
                raise QueryError(f"{path}: row {first_row + row + 1}: {name} is empty")
            col = pc.fill_null(col, 0)
        arr = col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        neg = np.nonzero(arr < 0)[0]
        if neg.size:
            raise QueryError(f"{path}: row {first_row + int(neg[0]) + 1}: {name}={int(arr[neg[0]])} must be ≥ 0")
        return arr

    batch = ints("batch_size", True)
    ptok = ints("total_prefill_tokens", True)
    kvr = ints("total_kv_read_tokens", True)
    nd = ints("num_decode_requests", has_mixed)
    dkv = ints("total_decode_kv_tokens", has_mixed)
    dec_with_prefill = np.nonzero((kind == 0) & (ptok != 0))[0]
    if dec_with_prefill.size:
        r = int(dec_with_prefill[0])
        raise QueryError(f"{path}: row {first_row + r + 1}: decode rows have total_prefill_tokens = 0 (found {int(ptok[r])})")
    return QueryBatch(table, kind, batch, ptok, kvr, nd, dkv)


def _kind_codes(path: Path, col: pa.ChunkedArray, first_row: int = 0) -> np.ndarray:
    """workload_kind → index into KINDS (dictionary-encoded columns map only their dictionary)."""
    value_type = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
    if not (pa.types.is_string(value_type) or pa.types.is_large_string(value_type)):
        raise QueryError(f"{path}: column workload_kind must hold text (decode|prefill|mixed)")
    parts = []
    for chunk in col.chunks:
        if pa.types.is_dictionary(chunk.type):
            mapping = pc.index_in(chunk.dictionary, value_set=pa.array(KINDS)).to_numpy(zero_copy_only=False)
            mapping = (
                np.where(np.isnan(mapping.astype(np.float64)), -1, mapping).astype(np.int64)
                if mapping.dtype.kind == "f"
                else mapping.astype(np.int64)
            )
            idx = chunk.indices.to_numpy(zero_copy_only=False)
            parts.append(mapping[idx] if mapping.size else np.full(len(chunk), -1, np.int64))
        else:
            m = pc.index_in(chunk, value_set=pa.array(KINDS))
            parts.append(pc.fill_null(m, -1).to_numpy(zero_copy_only=False).astype(np.int64))
    kind = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    bad = np.nonzero(kind < 0)[0]
    if bad.size:
        row = int(bad[0])
        raise QueryError(f"{path}: row {first_row + row + 1}: workload_kind={col[row].as_py()!r} must be decode, prefill or mixed")
    return kind


CSV_KIND_TYPE = pa.dictionary(pa.int32(), pa.string())


def stream_queries(path: Path, rows: int):
    """Stream a query file as tables of at most ``rows`` rows (memory stays bounded and is reused)."""
    try:
        if is_parquet(path):
            pf = pq.ParquetFile(path, read_dictionary=["workload_kind"])
            for rb in pf.iter_batches(batch_size=rows):
                yield pa.Table.from_batches([rb])
        else:
            types = {"workload_kind": CSV_KIND_TYPE, **{c: pa.int64() for c in MIXED_COLUMNS}}
            opts = pacsv.ConvertOptions(strings_can_be_null=False, column_types=types)
            reader = pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=1 << 23), convert_options=opts)
            for rb in reader:
                yield pa.Table.from_batches([rb])
    except (pa.ArrowInvalid, OSError) as exc:
        raise _read_error(path, exc) from None


def plain_text(table: pa.Table) -> pa.Table:
    """``status`` and ``data_source`` as plain strings (CSV has no dictionary columns)."""
    for name in ("status", "data_source"):
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), name, table.column(name).cast(pa.string()))
    return table


def open_writer(tmp, output: Path, schema: pa.Schema):
    """A streaming writer of ``schema`` into ``tmp``, parquet (lz4, text columns dictionary-encoded) or CSV
    by ``output``'s extension."""
    if is_parquet(output):
        text = [f.name for f in schema if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type)]
        return pq.ParquetWriter(tmp, schema, compression="lz4", use_dictionary=text, write_statistics=False)
    plain = schema
    for name in ("status", "data_source"):
        if name in schema.names:
            plain = plain.set(plain.get_field_index(name), pa.field(name, pa.string()))
    return pacsv.CSVWriter(tmp, plain)


def write_results(path: str | Path, table: pa.Table) -> None:
    """Write CSV or parquet (by extension) via a temporary file, then rename."""
    path = Path(path)
    output_format(path, ("csv", "parquet"))
    with atomic_file(path) as tmp:  # a file object on the temporary file
        if is_parquet(path):
            text = [f.name for f in table.schema if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type)]
            pq.write_table(table, tmp, compression="lz4", use_dictionary=text, write_statistics=False)
        else:
            status = table.column("status")
            if pa.types.is_dictionary(status.type):
                table = table.set_column(table.column_names.index("status"), "status", status.cast(pa.string()))
            pacsv.write_csv(table, tmp)
