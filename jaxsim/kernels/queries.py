"""Round-timing queries through the compiled kernels: one latency and status code per validated query
(:class:`~jaxsim.query_files.QueryBatch`, read by :mod:`jaxsim.query_files`)."""

from __future__ import annotations

import jax
import numpy as np

from jaxsim._jax import ensure_x64  # noqa: F401  (importing it turns x64 on; entry points call it)
from jaxsim.kernels import rounds
from jaxsim.kernels import status as st
from jaxsim.kernels.batched import run_batched
from jaxsim.query_files import QueryBatch

__all__ = ["MAX_COUNT", "beyond_u32", "evaluate"]


MAX_COUNT = 2**32 - 1
"""The largest request count or token sum a query may hold: the FPM query fields are unsigned 32-bit (the
reference refuses larger ones), so larger rows get ``unsupported:count_beyond_32_bits`` and reach no kernel."""


def beyond_u32(q: QueryBatch) -> np.ndarray:
    """Rows whose count or sum of its kind exceeds :data:`MAX_COUNT` (mixed rows: all five columns)."""
    cols = (q.batch, q.prefill_tokens, q.kv_read, np.where(q.kind == 2, q.decode_requests, 0), np.where(q.kind == 2, q.decode_kv, 0))
    return np.any(np.stack([np.asarray(c, np.int64) for c in cols]) > MAX_COUNT, axis=0)


def evaluate(table: rounds.RoundTable, q: QueryBatch) -> tuple[np.ndarray, np.ndarray]:
    """Latency (NaN where unsupported) and status code per query, from the compiled kernels; rows beyond the
    32-bit query fields are refused before any kernel (:func:`beyond_u32`)."""
    n = q.kind.size
    lat = np.full(n, np.nan)
    code = np.full(n, st.INVALID_QUERY, np.int32)
    wide = beyond_u32(q)
    if wide.any():
        keep = ~wide
        sub = QueryBatch(None, q.kind[keep], q.batch[keep], q.prefill_tokens[keep], q.kv_read[keep],
                         q.decode_requests[keep], q.decode_kv[keep])
        lat[keep], code[keep] = evaluate(table, sub)
        code[wide] = st.COUNT_BEYOND_U32
        return lat, code
    plans = (
        (0, rounds.decode_batch, (q.batch, q.kv_read)),
        (1, rounds.prefill_batch, (q.batch, q.prefill_tokens, q.kv_read)),
        (2, rounds.mixed_batch, (q.batch, q.prefill_tokens, q.kv_read, q.decode_requests, q.decode_kv)),
    )
    for k, fn, cols in plans:
        idx = np.nonzero(q.kind == k)[0]
        if idx.size == 0:
            continue
        if idx.size == n:
            lat, code = run_batched(fn, table, list(cols))
        else:
            lat[idx], code[idx] = run_batched(fn, table, [c[idx] for c in cols])
    jax.block_until_ready(lat)
    return lat, code
