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

__all__ = ["evaluate"]


def evaluate(table: rounds.RoundTable, q: QueryBatch) -> tuple[np.ndarray, np.ndarray]:
    """Latency (NaN where unsupported) and status code per query, from the compiled kernels."""
    n = q.kind.size
    lat = np.full(n, np.nan)
    code = np.full(n, st.INVALID_QUERY, np.int32)
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
