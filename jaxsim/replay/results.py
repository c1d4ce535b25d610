"""A replay's results as tables and files: one row per request (per configuration and seed), the per-replay
summaries in the parquet's metadata, and the per-pass timeline of every worker.

The CLI (``jaxsim replay``) and library users write the same files with :func:`write_results`; the numbers
all come from :class:`~jaxsim.replay.deployment.ReplayOutcome` (the compiled engine), nothing is recomputed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jaxsim.outputs import atomic_file
from jaxsim.replay.deployment import ReplayOutcome

__all__ = ["REQUEST_COLUMNS", "SUMMARY_METADATA_KEY", "rejection_lines", "replay_status", "request_table", "summaries",
           "timeline_table", "write_results"]

REQUEST_COLUMNS = (
    "config", "seed", "request", "row", "arrival_ms", "sent_ms", "input_tokens", "output_tokens", "generated_tokens",
    "first_token_ms", "last_token_ms", "ttft_ms", "ttst_ms", "tpot_ms", "e2e_ms", "decode_rounds",
    "preemptions", "admissions", "terminal", "reason", "status", "data_source", "replica", "session", "turn", "cache_hit_tokens",
)
"""The request table's columns, in order."""
SUMMARY_METADATA_KEY = b"jaxsim.replay.summary"
"""Parquet schema-metadata key holding the JSON list of per-replay summaries."""
_PER_REPLAY = ("config", "seed", "status", "reason", "data_source")


def replay_status(o: ReplayOutcome) -> str:
    """A replay's status as reported: the engine's (``completed``, or where and why it stopped), and for a
    replay that ran to its end but rejected requests, ``rejected: N of M requests`` (an incomplete replay)."""
    rejected = int(np.sum(o.requests["terminal"] == "rejected"))
    if o.status_text == "completed" and rejected:
        return f"rejected: {rejected} of {len(o.requests['terminal'])} requests"
    return o.status_text


def request_table(outcomes: Sequence[ReplayOutcome]):
    """One pyarrow row per request of every outcome (columns :data:`REQUEST_COLUMNS`)."""
    import pyarrow as pa

    cols: dict[str, list] = {c: [] for c in REQUEST_COLUMNS}
    for o in outcomes:
        r = o.requests
        n = len(r["request"])
        cols["config"].append(np.full(n, o.config.name, dtype=object))
        cols["seed"].append(np.full(n, o.seed, np.int64))
        cols["status"].append(np.full(n, replay_status(o), dtype=object))
        reasons = o.config.rejection_reasons(r["input_tokens"])
        cols["reason"].append(np.where(r["terminal"] == "rejected", reasons, "").astype(object))
        cols["data_source"].append(np.full(n, o.config.data_source, dtype=object))
        for c in REQUEST_COLUMNS:
            if c not in _PER_REPLAY:
                cols[c].append(r[c])
    return pa.table({c: _arrow(np.concatenate(v)) if v else np.zeros(0) for c, v in cols.items()})


def _arrow(a: np.ndarray):
    """A pyarrow column built from its buffers: ``pa.array`` imports pandas on first use (a third of a
    second of every replay command). Numbers as they are (NaN stays NaN, not null, as ``pa.array`` leaves
    NumPy floats); strings as UTF-8; anything else through ``pa.array``."""
    import pyarrow as pa

    a = np.asarray(a)
    n = a.size
    if a.dtype.kind in "iuf" and a.ndim == 1:
        return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), n, [None, pa.py_buffer(np.ascontiguousarray(a))])
    if a.dtype == object and a.ndim == 1 and all(isinstance(v, str) for v in a.tolist()):
        data = [v.encode("utf-8") for v in a.tolist()]
        offsets = np.zeros(n + 1, np.int64)
        offsets[1:] = np.cumsum([len(b) for b in data])
        if offsets[-1] < 2**31:
            return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(data))])
    return pa.array(a.tolist() if a.dtype == object else a)


def summaries(outcomes: Sequence[ReplayOutcome]) -> list[dict]:
    """One JSON-ready dict per outcome: configuration, mode, source, seed, status, where it stopped, the
    serving overhead its latencies carry (its terms and provenance; None when zero), how a routed pool's requests
    went to its replicas (None when round-robin) and the summary metrics (NaN written as None)."""
    out = []
    for o in outcomes:
        s = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in o.summary.items()}
        out.append({"config": o.config.name, "mode": o.config.mode, "data_source": o.config.data_source, "seed": o.seed,
                    "status": replay_status(o), "stopped_at": o.failure or None,
                    "overhead": o.config.overhead.to_json() if any(o.config.overhead.terms) else None, "router": o.routing, **s})
    return out


def timeline_table(outcomes: Sequence[ReplayOutcome]):
    """Every worker's per-pass records (replays run with a timeline), with its role and KV pool size."""
    import pyarrow as pa

    parts = []
    for o in outcomes:
        roles = ("aggregated",) if o.config.mode == "aggregated" else ("prefill", "decode")
        workers = [(role, pool) for role, pool in zip(roles, o.config.pools) for _ in range(pool.replicas)]  # timeline order
        for w, tl in enumerate(o.timeline or []):
            n = len(tl["pass"])
            role, pool = workers[w] if w < len(workers) else ("", None)
            cols = {"config": np.full(n, o.config.name, dtype=object), "data_source": np.full(n, o.config.data_source, dtype=object),
                    "seed": np.full(n, o.seed, np.int64),
                    "worker": np.full(n, w, np.int64), "role": np.full(n, role, dtype=object),
                    "kv_pool_blocks": np.full(n, pool.num_gpu_blocks if pool is not None else 0, np.int64), **tl}
            parts.append(pa.table({k: _arrow(np.asarray(v)) for k, v in cols.items()}))
    return pa.concat_tables(parts) if parts else pa.table({"config": []})


def write_results(outcomes: Sequence[ReplayOutcome], path: str | Path, timeline_path: str | Path | None = None) -> list[dict]:
    """Write the request table to ``path`` (zstd parquet, the summaries under :data:`SUMMARY_METADATA_KEY`) and,
    given ``timeline_path``, the timeline table; each file replaced atomically. Returns the summaries."""
    import pyarrow.parquet as pq

    rows = summaries(outcomes)
    table = request_table(outcomes)
    meta = dict(table.schema.metadata or {})
    meta[SUMMARY_METADATA_KEY] = json.dumps(rows).encode()
    with atomic_file(Path(path)) as f:
        pq.write_table(table.replace_schema_metadata(meta), f, compression="zstd")
    if timeline_path is not None:
        with atomic_file(Path(timeline_path)) as f:
            pq.write_table(timeline_table(outcomes), f, compression="zstd")
    return rows


def rejection_lines(outcomes: Sequence[ReplayOutcome], show: int = 5) -> list[str]:
    """One line per configuration with rejected requests: how many, and the first few by trace row with the reason."""
    lines = []
    for o in outcomes:
        rej = o.requests["terminal"] == "rejected"
        if o.seed != outcomes[0].seed or not rej.any():
            continue
        reasons = o.config.rejection_reasons(o.requests["input_tokens"])
        idx = np.flatnonzero(rej)
        named = "; ".join(f"row {int(o.requests['row'][i]) + 1}: {reasons[i] or 'rejected'}" for i in idx[:show])
        more = f"; and {idx.size - show} more (column 'reason')" if idx.size > show else ""
        lines.append(f"{o.config.name}: {idx.size} request(s) rejected: {named}{more}")
    return lines
