"""Compiled kernels called on host query columns: padded to a compile-shape bucket, cut into chunks,
split over the local devices; results come back as numpy (latency ms, NaN outside support; status).

Used by query files (:mod:`jaxsim.kernels.queries`), figures (:mod:`jaxsim.plots`) and notebooks.
"""

from __future__ import annotations

import numpy as np

from jaxsim._jax import ensure_x64
from jaxsim.devices import num_devices, shard
from jaxsim.errors import QueryError
from jaxsim.kernels.buckets import pow2_bucket
from jaxsim.kernels.rounds import RoundTable, decode_batch, prefill_batch

__all__ = ["CHUNK", "decode_points", "prefill_grid", "run_batched", "support_grid"]

CHUNK = 1 << 18  # most queries per compiled call


def run_batched(fn, table: RoundTable, cols) -> tuple[np.ndarray, np.ndarray]:
    """``fn(table, *cols)`` (a vmapped, jitted kernel) over fixed-size padded chunks of the int64 query
    columns (one compile per bucket), each chunk split over the local devices."""
    ensure_x64()
    cols = [np.asarray(c, dtype=np.int64) for c in cols]
    n = cols[0].size
    lat = np.empty(n)
    code = np.empty(n, np.int32)
    size = min(CHUNK, pow2_bucket(n, 256))
    size += (-size) % num_devices()
    for start in range(0, n, size):
        stop = min(start + size, n)
        part = [np.zeros(size, np.int64) for _ in cols]
        for dst, src in zip(part, cols):
            dst[: stop - start] = src[start:stop]
        out_l, out_c = fn(table, *shard(*part))
        lat[start:stop] = np.asarray(out_l)[: stop - start]
        code[start:stop] = np.asarray(out_c)[: stop - start]
    return lat, code


def decode_points(table: RoundTable, batches, total_kv_tokens) -> tuple[np.ndarray, np.ndarray]:
    """Decode latency (ms, NaN outside support) and status codes for paired (batch, total KV) queries."""
    b = np.asarray(batches, dtype=np.int64).ravel()
    k = np.asarray(total_kv_tokens, dtype=np.int64).ravel()
    if b.shape != k.shape:
        raise QueryError(f"{b.size} batch sizes but {k.size} KV totals")
    return run_batched(decode_batch, table, [b, k])


def support_grid(table: RoundTable, batches, kv_tokens) -> tuple[np.ndarray, np.ndarray]:
    """Decode latency (ms, NaN outside support) and status codes on a batch × total-KV grid.
    Shapes ``(len(batches), len(kv_tokens))``."""
    b = np.asarray(batches, dtype=np.int64)
    k = np.asarray(kv_tokens, dtype=np.int64)
    bb, kk = np.meshgrid(b, k, indexing="ij")
    lat, code = run_batched(decode_batch, table, [bb.ravel(), kk.ravel()])
    return lat.reshape(bb.shape), code.reshape(bb.shape)


def prefill_grid(table: RoundTable, batch: int, prefill_tokens, kv_read_tokens) -> tuple[np.ndarray, np.ndarray]:
    """Prefill latency (ms, NaN outside support) and status codes for paired (tokens, cached KV)
    queries at one batch size."""
    t = np.asarray(prefill_tokens, dtype=np.int64).ravel()
    k = np.broadcast_to(np.asarray(kv_read_tokens, dtype=np.int64), np.shape(prefill_tokens)).ravel()
    return run_batched(prefill_batch, table, [np.full(t.size, int(batch), np.int64), t, k])
