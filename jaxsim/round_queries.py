"""A round-timing query file streamed through the compiled kernels into an output file (``jaxsim round``).

The output repeats the query columns and adds ``latency_ms`` (null when unsupported), ``status`` and, when
given, the profile's ``data_source``. Reading and writing are :mod:`jaxsim.query_files`; every latency
comes from :func:`jaxsim.kernels.queries.evaluate`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from jaxsim.errors import QueryError
from jaxsim.kernels import status as st
from jaxsim.kernels.batched import CHUNK
from jaxsim.kernels.queries import evaluate
from jaxsim.kernels.rounds import RoundTable
from jaxsim.outputs import atomic_file, output_format
from jaxsim.query_files import QueryBatch, is_parquet, open_writer, plain_text, stream_queries, validate_queries

__all__ = ["evaluate_file", "result_table"]

_STATUS_LABELS = pa.array([st.name(i) for i in range(64)])


def result_table(q: QueryBatch, lat: np.ndarray, code: np.ndarray, data_source: str | None = None) -> pa.Table:
    """The queries with latency_ms, status and (when given) the profile's data_source appended."""
    keep = [c for c in q.table.column_names if c not in ("latency_ms", "status", "data_source")]
    out = q.table.select(keep)
    out = out.append_column("latency_ms", pa.array(lat, mask=np.isnan(lat)))
    status = pa.DictionaryArray.from_arrays(pa.array(code.astype(np.int32)), _STATUS_LABELS)
    out = out.append_column("status", status)
    if data_source is not None:
        src = pa.DictionaryArray.from_arrays(pa.array(np.zeros(out.num_rows, np.int32)), pa.array([data_source]))
        out = out.append_column("data_source", src)
    return out


def evaluate_file(
    table: RoundTable, queries: str | Path, output: str | Path, *, data_source: str | None = None
) -> tuple[int, int]:
    """Stream ``queries`` through the kernels into ``output`` (CSV or parquet by extension).

    ``data_source`` (the profile's: measured, derived, modelled, calibrated) becomes a column of every row.

    Written to a temporary file renamed at the end, so a bad row leaves nothing behind. Returns
    (queries, answered).
    """
    queries, output = Path(queries), Path(output)
    output_format(output, ("csv", "parquet"))
    if not queries.is_file():
        raise QueryError(f"{queries}: query file not found")
    writer = None
    total = answered = 0
    with atomic_file(output) as tmp:  # a file object on the temporary file
        try:
            for part in stream_queries(queries, CHUNK):
                if part.num_rows == 0:
                    continue
                q = validate_queries(part, queries, total)
                lat, code = evaluate(table, q)
                out = result_table(q, lat, code, data_source)
                if writer is None:
                    writer = open_writer(tmp, output, out.schema)
                writer.write_table(out if is_parquet(output) else plain_text(out))
                total += part.num_rows
                answered += int(np.sum(code < st.FIRST_UNSUPPORTED))
            if writer is None:
                raise QueryError(f"{queries}: no query rows")
        finally:
            if writer is not None:
                writer.close()
    return total, answered
