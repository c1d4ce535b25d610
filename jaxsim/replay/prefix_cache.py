"""Automatic prefix caching (vLLM's block-level APC, as the reference's replay implements it).

Host side (numpy, plain Python): a trace's ``hash_ids`` become per-request keys of KV blocks
(:func:`block_keys`). The reference synthesizes a prompt's token ids from its hash ids (token ``t`` of
the prompt is the hash id of trace block ``t // trace_block_size``) and hashes the engine's KV blocks
of ``block_size`` tokens as vLLM does (each block's hash chains its parent's): two requests share
engine block ``j`` exactly when their hash ids agree on every trace block that covers tokens
``[0, (j + 1) * block_size)``. The keys are small integers, one per distinct (block index, hash-id
prefix), numbered in order of first appearance.

A trace's hash ids are kept flat (:class:`HashIds`) and read by pyarrow (:func:`read_hash_id_table`). The
compiled side is :mod:`jaxsim.replay.block_pool` (vLLM's block pool) and :mod:`jaxsim.replay.cache_engine`
(the replay engine that reads it); this module has no JAX code.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxsim.arrow_values import numpy_values
from jaxsim.errors import QueryError

DEFAULT_TRACE_BLOCK_SIZE = 512  # Mooncake: one hash id per 512 prompt tokens (the reference's default)


@dataclass(frozen=True, eq=False)
class HashIds:
    """Per request, its prompt's hash ids, flat: request ``i``'s are ``values[offsets[i]:offsets[i + 1]]`` (a
    sequence of int64 arrays; a million-row trace is two arrays, not a million lists)."""

    values: np.ndarray  # int64
    offsets: np.ndarray  # int64, one more than the requests

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[int]]) -> HashIds:
        lengths = np.array([len(r) for r in rows], np.int64)
        values = np.concatenate([np.asarray(r, np.int64) for r in rows]) if rows else np.zeros(0, np.int64)
        return cls(values.astype(np.int64), np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i]: self.offsets[i + 1]]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def take(self, index) -> HashIds:
        """The requests at ``index`` (in that order)."""
        index = np.asarray(index, np.int64)
        starts, lengths = self.offsets[:-1][index], np.diff(self.offsets)[index]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return HashIds(self.values[np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]))], offsets)


def check_hash_ids(hash_ids: Sequence[int], input_tokens: int, trace_block_size: int) -> str | None:
    """Why ``hash_ids`` do not describe a prompt of ``input_tokens`` tokens at ``trace_block_size``
    tokens per hash (None when they do): one hash per started trace block, ``ceil(input / size)``."""
    want = -(-int(input_tokens) // int(trace_block_size))
    if len(hash_ids) != want:
        return (f"{len(hash_ids)} hash_ids for {int(input_tokens)} input tokens at {int(trace_block_size)} tokens per hash "
                f"(expected {want})")
    return None


def block_keys(
    hash_ids: Sequence[Sequence[int]] | HashIds, input_tokens: Sequence[int] | np.ndarray, trace_block_size: int, block_size: int,
) -> tuple[list[np.ndarray], int]:
    """Per request, the keys (int64, from 0, numbered in order of first appearance) of its prompt's full KV blocks of
    ``block_size`` tokens, and the number of distinct keys. Equal keys are equal blocks: the same position under the
    same hash-id prefix (the prefix is the trie node of the trace block covering the block's last token).

    Vectorised (numpy): the hash-id prefixes get their ids level by level (one ``np.unique`` of (parent prefix, hash)
    pairs per prefix length), the blocks their keys by one ``np.unique`` of (position, covering prefix)."""
    tbs, bs = int(trace_block_size), int(block_size)
    table = hash_ids if isinstance(hash_ids, HashIds) else HashIds.from_rows([list(h) for h in hash_ids])
    n_tokens = np.asarray(input_tokens, np.int64)
    starts, lengths = table.offsets[:-1], np.diff(table.offsets)
    full = n_tokens // bs
    needed = np.minimum(-(-full * bs // tbs), lengths)  # the trace blocks covering the full KV blocks
    node = np.full(table.values.size, -1, np.int64)  # per hash id: the id of the prefix ending at it
    parent = np.full(n_tokens.size, -1, np.int64)
    base = 0
    for level in range(int(needed.max()) if needed.size else 0):
        active = np.flatnonzero(needed > level)
        at = starts[active] + level
        _, inverse = np.unique(_pair_codes(parent[active] + 1, table.values[at]), return_inverse=True)
        ids = base + inverse.reshape(-1)
        node[at] = ids
        parent[active] = ids
        base = int(ids.max()) + 1
    owner = np.repeat(np.arange(n_tokens.size), full)
    j = np.arange(int(full.sum())) - np.repeat(np.cumsum(full) - full, full)
    covering = node[starts[owner] + ((j + 1) * bs - 1) // tbs] if owner.size else np.zeros(0, np.int64)
    if not j.size:
        return [np.zeros(0, np.int64) for _ in range(n_tokens.size)], 0
    _, first, inverse = np.unique(_pair_codes(covering, j), return_index=True, return_inverse=True)
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    keys = rank[inverse.reshape(-1)]
    return np.split(keys, np.cumsum(full)[:-1]), int(first.size)


def _pair_codes(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One code per pair of non-negative int64 (``a``, ``b``), equal codes for equal pairs: ``a * (max b + 1) + b`` when
    that fits in int64, else the rows' ranks among the distinct pairs."""
    span = int(b.max()) + 1 if b.size else 1
    if a.size and int(a.max()) < np.iinfo(np.int64).max // span:
        return a * span + b
    return np.unique(np.stack([a, b], axis=1), axis=0, return_inverse=True)[1].reshape(-1)


def inferred_trace_block_size(path: str | os.PathLike) -> int:
    """The tokens per hash id of a Mooncake trace whose size is not stated: the power of two that the most rows fit
    (``ceil(input_length / size)`` hash ids each), :data:`DEFAULT_TRACE_BLOCK_SIZE` (512, as Mooncake and the reference)
    when it fits as many: a trace hashed per 16-token vLLM block reads at 16, a Mooncake trace at 512 (then the reader
    names a row that does not fit it). A file the Arrow reader does not take: 512 (the row reader names the bad row)."""
    cols = _arrow_hash_columns(Path(path))
    return DEFAULT_TRACE_BLOCK_SIZE if cols is None else _size_most_rows_fit(*cols)


def _size_most_rows_fit(hashes, inp) -> int:
    """:func:`inferred_trace_block_size` of the Arrow ``hash_ids`` and ``input_length`` columns."""
    import pyarrow.compute as pc

    n_hash = numpy_values(pc.list_value_length(hashes)).astype(np.int64)
    n_tokens = numpy_values(inp).astype(np.int64)
    sizes = np.array([1 << k for k in range(31)], np.int64)
    fits = np.sum(n_hash[None, :] == -(-n_tokens[None, :] // sizes[:, None]), axis=1)
    best = int(sizes[np.argmax(fits)])
    return DEFAULT_TRACE_BLOCK_SIZE if fits[sizes == DEFAULT_TRACE_BLOCK_SIZE][0] == fits.max() else best


def _arrow_hash_columns(path: Path):
    """The ``hash_ids`` (list<int64>) and ``input_length`` (int64) columns by pyarrow, null-free; None when a row is
    malformed or the file unreadable (the row reader then names the row)."""
    import pyarrow as pa
    import pyarrow.json as pajson

    schema = pa.schema([("hash_ids", pa.list_(pa.int64())), ("input_length", pa.int64())])
    try:
        table = pajson.read_json(path, parse_options=pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"))
    except (pa.ArrowException, OSError):
        return None
    hashes, inp = table.column("hash_ids").combine_chunks(), table.column("input_length").combine_chunks()
    if table.num_rows == 0 or hashes.null_count or inp.null_count:
        return None
    return hashes, inp


def read_hash_id_table(path: str | os.PathLike, trace_block_size: int | None = DEFAULT_TRACE_BLOCK_SIZE) -> tuple[HashIds, int]:
    """:func:`read_hash_ids` as a flat :class:`HashIds`, with the tokens per hash id it was read at: ``trace_block_size``,
    or when None the size :func:`inferred_trace_block_size` gives, from the same read of the file (by pyarrow when
    every row is well formed)."""
    if trace_block_size is not None:
        _check_block_size(trace_block_size)
    path = Path(path)
    cols = _arrow_hash_columns(path)
    if trace_block_size is None:
        trace_block_size = DEFAULT_TRACE_BLOCK_SIZE if cols is None else _size_most_rows_fit(*cols)
    fast = None if cols is None else _hash_ids_of_columns(*cols, int(trace_block_size))
    table = fast if fast is not None else HashIds.from_rows(read_hash_ids(path, trace_block_size))
    return table, int(trace_block_size)


def _check_block_size(trace_block_size) -> None:
    if isinstance(trace_block_size, bool) or int(trace_block_size) != trace_block_size or int(trace_block_size) < 1:
        raise QueryError(f"trace_block_size={trace_block_size!r} must be an integer >= 1")


def read_hash_ids(path: str | os.PathLike, trace_block_size: int = DEFAULT_TRACE_BLOCK_SIZE) -> list[list[int]]:
    """The ``hash_ids`` of a Mooncake JSONL trace, in row order, each checked against its row's
    ``input_length`` at ``trace_block_size`` tokens per hash (:func:`check_hash_ids`). Bad input: a
    one-line :class:`~jaxsim.errors.QueryError` naming the file and the 1-based row."""
    from jaxsim.replay.traces import _read_jsonl

    _check_block_size(trace_block_size)
    path = Path(path)
    cols = _arrow_hash_columns(path)
    fast = None if cols is None else _hash_ids_of_columns(*cols, int(trace_block_size))
    if fast is not None:
        return [row.tolist() for row in fast]
    out = []
    for i, obj in _read_jsonl(path):
        where = f"{path}: row {i}"
        hashes = obj.get("hash_ids")
        if not isinstance(hashes, list) or not hashes:
            raise QueryError(f"{where}: hash_ids must be a non-empty list of integers (prefix caching reads them)")
        if any(isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in hashes):
            raise QueryError(f"{where}: hash_ids must be integers >= 0")
        n = obj.get("input_length")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise QueryError(f"{where}: input_length={n!r} must be an integer >= 1")
        why = check_hash_ids(hashes, n, trace_block_size)
        if why is not None:
            raise QueryError(f"{where}: {why}")
        out.append([int(h) for h in hashes])
    return out


def _hash_ids_of_columns(hashes, inp, trace_block_size: int) -> HashIds | None:
    """:func:`read_hash_ids` of the Arrow columns when every row is well formed (None otherwise: the row reader then
    names the first bad row)."""
    import pyarrow.compute as pc

    n = numpy_values(inp)
    lengths = numpy_values(pc.list_value_length(hashes))
    values = numpy_values(hashes.flatten())
    if np.any(n < 1) or np.any(lengths != -(-n // trace_block_size)) or (values.size and int(values.min()) < 0):
        return None
    return HashIds(values.astype(np.int64), np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


def measured_hit_ratio(hash_ids: Sequence[Sequence[int]], input_tokens: Sequence[int],
                       trace_block_size: int = DEFAULT_TRACE_BLOCK_SIZE) -> float:
    """The share of a trace's prompt tokens an unbounded prefix cache would serve, requests in trace
    order: each prompt's leading full trace blocks seen in an earlier prompt (at most ``(length - 1)
    // trace_block_size`` of them: one token is always computed), over all prompt tokens. An upper
    bound of what a finite pool and a smaller engine block keep (the steady-state ratio a sweep
    workload uses; a replay measures the real one)."""
    keys, _ = block_keys(hash_ids, input_tokens, trace_block_size, trace_block_size)
    seen: set[int] = set()
    hit = 0
    for row, n in zip(keys, input_tokens):
        limit = (int(n) - 1) // int(trace_block_size)
        j = 0
        while j < min(limit, len(row)) and int(row[j]) in seen:
            j += 1
        hit += j * int(trace_block_size)
        seen.update(int(k) for k in row)
    total = int(np.sum(np.asarray(input_tokens, np.int64)))
    return float(hit) / total if total else 0.0
