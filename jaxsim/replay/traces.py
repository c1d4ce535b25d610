"""Request traces: loaders for public trace formats, synthetic arrivals, and bundled excerpts.

A :class:`Trace` is three aligned arrays sorted by arrival (stable: ties keep file order): arrival times
in milliseconds from the first request, input (prompt) tokens and output tokens. Every malformed row
raises a one-line :class:`~jaxsim.errors.QueryError` naming the file and the 1-based data row.
"""

from __future__ import annotations

import calendar
import csv
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from importlib import resources
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson

from jaxsim import limits
from jaxsim.arrow_values import numpy_values
from jaxsim.errors import QueryError
from jaxsim.fields import FieldReader, is_int
from jaxsim.kernels.buckets import pow2_bucket
from jaxsim.replay.prefix_cache import DEFAULT_TRACE_BLOCK_SIZE, HashIds, read_hash_id_table

__all__ = [
    "FORMATS", "SESSION_FIELDS", "Sessions", "Trace", "read_sessions",
    "request_bucket", "make_trace", "read_azure_csv", "read_mooncake_jsonl", "read_plain_jsonl",
    "read_plain_csv", "sniff_format", "list_traces", "bundled_trace_path", "load_trace", "write_trace_csv",
    "sample_lengths", "poisson_trace", "gamma_trace",
]

FORMATS = ("azure", "mooncake", "csv", "jsonl")
_BUNDLED = {
    "azure_code_1k": ("azure_code_1k.csv", "azure"),
    "azure_conv_1k": ("azure_conv_1k.csv", "azure"),
    "mooncake_conversation_1k": ("mooncake_conversation_1k.jsonl", "mooncake"),
    "mooncake_tiny": ("mooncake_tiny.jsonl", "mooncake"),
}


@dataclass(frozen=True, eq=False)
class Sessions:
    """Multi-turn sessions of a trace (per request, in the trace's arrival order): ``session`` (its session's
    id), ``turn`` (1-based), ``previous`` (the position of the session's previous turn in the trace, -1 for a
    first turn) and ``delay_ms`` (think time: the turn is sent that long after its previous turn completes; 0
    for a first turn, which is sent at its arrival). A later turn's own arrival time is not used by a replay."""

    session: np.ndarray  # object: session id strings
    turn: np.ndarray  # int64, 1-based
    previous: np.ndarray  # int64, trace position of the previous turn (-1: a first turn)
    delay_ms: np.ndarray  # float64

    def take(self, keep: np.ndarray) -> Sessions:
        """The sessions of the requests at positions ``keep`` (increasing; a later turn whose previous turn is
        dropped is dropped too, as are its later turns)."""
        keep = np.asarray(keep, np.int64)
        new = np.full(self.previous.size, -1, np.int64)
        new[keep] = np.arange(keep.size)
        prev = self.previous[keep]
        if np.any((prev >= 0) & (new[np.maximum(prev, 0)] < 0)):
            raise QueryError("a trace cut drops a session's earlier turn and keeps a later one")
        return Sessions(self.session[keep], self.turn[keep], np.where(prev >= 0, new[np.maximum(prev, 0)], -1), self.delay_ms[keep])

    @property
    def count(self) -> int:
        return int(np.sum(self.previous < 0))

    @classmethod
    def independent(cls, n: int) -> Sessions:
        """``n`` requests, each a session of one turn (sent at its arrival)."""
        return cls(np.full(n, "", dtype=object), np.zeros(n, np.int64), np.full(n, -1, np.int64), np.zeros(n, np.float64))


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests sorted by arrival. ``row`` is each request's 0-based position in the source. ``sessions``: the
    multi-turn sessions the requests belong to (None: independent requests). ``hash_ids``: each request's
    prompt block hashes (Mooncake: one per ``trace_block_size`` tokens, checked against its prompt; None: the
    trace says nothing of shared prefixes), what prefix caching and the KV router read."""

    name: str
    arrival_ms: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    row: np.ndarray
    source: str = ""
    sessions: Sessions | None = None
    hash_ids: HashIds | None = None
    trace_block_size: int = 512  # prompt tokens per hash id (Mooncake's and the reference's default)

    def __len__(self) -> int:
        return int(self.arrival_ms.shape[0])

    def _take(self, keep: np.ndarray) -> Trace:
        keep = np.asarray(keep, np.int64)
        sessions = None if self.sessions is None else self.sessions.take(keep)
        hash_ids = None if self.hash_ids is None else self.hash_ids.take(keep)
        return replace(self, arrival_ms=self.arrival_ms[keep], input_tokens=self.input_tokens[keep], output_tokens=self.output_tokens[keep],
                       row=self.row[keep], sessions=sessions, hash_ids=hash_ids)

    @property
    def duration_ms(self) -> float:
        return float(self.arrival_ms[-1] - self.arrival_ms[0]) if len(self) else 0.0

    def requests(self, pad_to: int | None = None, materialized: bool = False):
        """Padded engine input (:class:`jaxsim.replay.engine.Requests`); ``pad_to`` defaults to the
        bucket of the trace length (powers of two, at least 16)."""
        import jax.numpy as jnp

        from jaxsim.replay.engine import Requests

        n = len(self)
        size = request_bucket(n) if pad_to is None else int(pad_to)
        if size < n:
            raise QueryError(f"{self.name}: {n} requests do not fit pad_to={size}")
        pad = size - n
        return Requests(
            arrival_ms=jnp.asarray(np.concatenate([self.arrival_ms, np.full(pad, np.inf)])),
            input_tokens=jnp.asarray(np.concatenate([self.input_tokens, np.ones(pad, np.int64)])),
            output_tokens=jnp.asarray(np.concatenate([self.output_tokens, np.ones(pad, np.int64)])),
            valid=jnp.asarray(np.arange(size) < n),
            materialized=jnp.full((size,), bool(materialized)),
        )

    def head(self, max_requests: int) -> Trace:
        """The first ``max_requests`` requests."""
        return self._take(np.arange(min(max(0, int(max_requests)), len(self))))

    def scaled(self, time_scale: float) -> Trace:
        """Arrival times multiplied by ``time_scale`` (> 1 slows the trace down, < 1 compresses it)."""
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise QueryError(f"{self.name}: time_scale={time_scale} must be a positive finite number")
        sessions = self.sessions
        if sessions is not None:  # think times stretch with the arrivals
            sessions = Sessions(sessions.session, sessions.turn, sessions.previous, sessions.delay_ms * float(time_scale))
        return replace(self, arrival_ms=self.arrival_ms * float(time_scale), sessions=sessions)

    def window(self, max_duration_ms: float) -> Trace:
        """Requests arriving within ``max_duration_ms`` of the first arrival."""
        keep = self.arrival_ms - (self.arrival_ms[0] if len(self) else 0.0) <= float(max_duration_ms)
        return self._take(np.flatnonzero(keep))


def request_bucket(n: int, minimum: int = 16) -> int:
    """Padded request capacity: the next power of two, at least ``minimum`` (so similar traces share one
    compilation)."""
    return pow2_bucket(n, minimum)


def make_trace(name: str, arrival_ms, input_tokens, output_tokens, *, source: str = "", rebase: bool = True) -> Trace:
    """Validate and sort a trace given as arrays (rows are reported 1-based)."""
    arr = np.asarray(arrival_ms, dtype=np.float64).reshape(-1)
    inp = np.asarray(input_tokens).reshape(-1)
    out = np.asarray(output_tokens).reshape(-1)
    if not (arr.shape == inp.shape == out.shape):
        raise QueryError(f"{name}: arrival_ms, input_length and output_length differ in length")
    if arr.size > limits.LIMITS["requests"].hi:
        raise QueryError(f"{name}: {arr.size:,} requests; at most {int(limits.LIMITS['requests'].hi):,} (docs/limits.md)")
    hi = limits.LIMITS["tokens"].hi
    for label, col in (("input_length", inp), ("output_length", out)):
        f = col.astype(np.float64)
        bad = ~np.isfinite(f) | (f != np.round(f)) | (f < 1) | (f > hi)
        if bad.any():
            i = int(np.argmax(bad))
            v = col[i].item() if hasattr(col[i], "item") else col[i]
            raise QueryError(f"{name}: row {i + 1}: {label}={v!r} must be an integer in 1..{int(hi):,} (docs/limits.md)")
    bad = ~np.isfinite(arr) | (arr < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise QueryError(f"{name}: row {i + 1}: arrival time {float(arr[i])!r} must be a finite number >= 0")
    order = np.argsort(arr, kind="stable")
    arr = arr[order]
    if rebase and arr.size:
        arr = arr - arr[0]
    return Trace(name, arr, inp[order].astype(np.int64), out[order].astype(np.int64), order.astype(np.int64), source)


# ----------------------------------------------------------------------------------------------------
# file formats


_FIELDS = FieldReader(QueryError, strict=False)  # an integer field takes any integral number, as the fast path's float64 columns do


_AZURE_TS = re.compile(r"^(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:\.(\d+))?$")


def _azure_ns(text: str, where: str) -> int:
    """Integer nanoseconds since the epoch (exact, so differences keep every digit)."""
    m = _AZURE_TS.match(str(text).strip())
    if not m:
        raise QueryError(f"{where}: TIMESTAMP={text!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction]'")
    try:
        base = datetime.fromisoformat(m.group(1).replace("T", " "))
    except ValueError:
        raise QueryError(f"{where}: TIMESTAMP={text!r} is not a valid date and time") from None
    frac = (m.group(2) or "0")[:9].ljust(9, "0")
    return calendar.timegm(base.timetuple()) * 1_000_000_000 + int(frac)


def _read_csv_rows(path: Path, required: Sequence[str]) -> list[tuple[int, dict]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields = [c.strip() for c in (reader.fieldnames or [])]
        missing = [c for c in required if c not in fields]
        if missing:
            raise QueryError(f"{path}: missing column {missing[0]!r} (columns: {', '.join(fields) or 'none'})")
        reader.fieldnames = fields
        return [(i + 1, row) for i, row in enumerate(reader)]


# Files are read by pyarrow (C++ CSV / JSON readers, vectorized checks). A file the fast path does not
# accept exactly as it is (a parse error, a missing or empty value, a non-number, a fraction where an
# integer belongs, ...) is read again row by row by the Python readers below, which name the first bad
# row; so every message, and every accepted file's values, are those of the row reader.


def _f64(col: pa.ChunkedArray) -> np.ndarray | None:
    """A null-free float64 column as NumPy (None otherwise)."""
    arr = col.combine_chunks()
    if arr.null_count or arr.type != pa.float64():
        return None
    return numpy_values(arr)


def _counts(col: pa.ChunkedArray) -> np.ndarray | None:
    """Token counts read as numbers: int64 when every value is a finite whole number (the row reader's
    ``int(float(value))``); None otherwise."""
    f = _f64(col)
    if f is None or not np.isfinite(f).all() or (f != np.round(f)).any() or (np.abs(f) > 2.0**53).any():
        return None
    return f.astype(np.int64)


def _arrow_csv(path: Path, types: dict[str, pa.DataType]) -> pa.Table | None:
    try:
        return pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(include_columns=list(types), column_types=types))
    except (pa.ArrowException, OSError):
        return None


def _arrow_jsonl(path: Path, keys: Sequence[str]) -> pa.Table | None:
    schema = pa.schema([(k, pa.float64()) for k in keys])
    try:
        return pajson.read_json(path, parse_options=pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"))
    except (pa.ArrowException, OSError):
        return None


def _fast_columns(table: pa.Table | None, time_key: str, in_key: str, out_key: str):
    """(arrival, input, output) from a pyarrow table, or None when the row reader must judge the file."""
    if table is None or table.num_rows == 0:
        return None
    arr, inp, out = _f64(table.column(time_key)), _counts(table.column(in_key)), _counts(table.column(out_key))
    if arr is None or inp is None or out is None or not np.isfinite(arr).all():
        return None
    return arr, inp, out


def _azure_fast(path: Path):
    """Azure columns by pyarrow: timestamps must match the row reader's pattern, then are cast to ns."""
    table = _arrow_csv(path, {"TIMESTAMP": pa.string(), "ContextTokens": pa.float64(), "GeneratedTokens": pa.float64()})
    if table is None or table.num_rows == 0:
        return None
    ts = table.column("TIMESTAMP")
    if not pc.all(pc.match_substring_regex(ts, _AZURE_TS.pattern)).as_py():
        return None
    try:
        ns = pc.cast(pc.cast(ts, pa.timestamp("ns")), pa.int64()).combine_chunks()
    except pa.ArrowException:  # an impossible date, or a fraction finer than 1 ns (the row reader truncates it)
        return None
    ns = numpy_values(ns)
    inp, out = _counts(table.column("ContextTokens")), _counts(table.column("GeneratedTokens"))
    if inp is None or out is None:
        return None
    return (ns - ns.min()).astype(np.float64) / 1e6, inp, out


def _trace(path: Path, cols) -> Trace:
    try:
        return make_trace(path.stem, *cols, source=str(path))
    except QueryError as exc:  # name the file, not just the trace
        raise QueryError(str(exc).replace(f"{path.stem}: ", f"{path}: ", 1)) from None


def read_azure_csv(path: str | os.PathLike) -> Trace:
    """Azure LLM inference trace 2023: ``TIMESTAMP, ContextTokens, GeneratedTokens``."""
    path = Path(path)
    cols = _azure_fast(path)
    if cols is None:
        rows = _read_csv_rows(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
        ns, inp, out = [], [], []
        for i, row in rows:
            where = f"{path}: row {i}"
            ns.append(_azure_ns(row["TIMESTAMP"], where))
            inp.append(_FIELDS.integer(row["ContextTokens"], where, "ContextTokens"))
            out.append(_FIELDS.integer(row["GeneratedTokens"], where, "GeneratedTokens"))
        t0 = min(ns) if ns else 0
        cols = ([(t - t0) / 1e6 for t in ns], inp, out)
    return _trace(path, cols)


def _read_jsonl(path: Path) -> list[tuple[int, dict]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise QueryError(f"{path}: row {i}: invalid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise QueryError(f"{path}: row {i}: expected a JSON object")
            rows.append((i, obj))
    return rows


def _records(path: Path, rows, time_key: str, in_key: str, out_key: str) -> tuple[list, list, list]:
    arr, inp, out = [], [], []
    for i, obj in rows:
        where = f"{path}: row {i}"
        for key in (time_key, in_key, out_key):
            if key not in obj or obj[key] in ("", None):
                raise QueryError(f"{where}: missing field {key!r}")
        arr.append(_FIELDS.number(obj[time_key], where, time_key))
        inp.append(_FIELDS.integer(obj[in_key], where, in_key))
        out.append(_FIELDS.integer(obj[out_key], where, out_key))
    return arr, inp, out


def _read_jsonl_trace(path: Path, time_key: str) -> Trace:
    keys = (time_key, "input_length", "output_length")
    cols = _fast_columns(_arrow_jsonl(path, keys), *keys)
    return _trace(path, cols if cols is not None else _records(path, _read_jsonl(path), *keys))


def read_mooncake_jsonl(path: str | os.PathLike) -> Trace:
    """Mooncake trace: JSONL with ``timestamp`` (ms), ``input_length``, ``output_length`` (``hash_ids`` is
    read past here: :mod:`jaxsim.replay.prefix_cache` reads it). Rows with a ``session_id`` are the turns of
    multi-turn sessions (:func:`read_sessions`)."""
    path = Path(path)
    if not _mentions(path, (b'"session_id"', b'"turn"', b'"delay')):
        return _read_jsonl_trace(path, "timestamp")
    rows = _read_jsonl(path)
    sessions = read_sessions(path, rows)
    # a later turn may omit its timestamp (it is sent by the replay): it takes its previous turn's, for the order
    filled = [(i, obj if "timestamp" in obj or sessions[2][k] < 0 else dict(obj, timestamp=sessions[4][sessions[2][k]]))
              for k, (i, obj) in enumerate(rows)]
    trace = _trace(path, _records(path, filled, "timestamp", "input_length", "output_length"))
    return trace if not np.any(sessions[0] != "") else _with_sessions(trace, sessions[:4])


def _mentions(path: Path, needles: tuple[bytes, ...]) -> bool:
    """Whether the file holds any of ``needles`` (read in 1 MiB pieces that overlap by 64 bytes)."""
    tail = b""
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            piece = tail + chunk
            if any(n in piece for n in needles):
                return True
            tail = piece[-64:]
    return False


SESSION_FIELDS = ("session_id", "turn", "delay", "delay_ms")
"""A Mooncake row's session fields: ``session_id`` (a non-empty string), ``turn`` (optional, 1-based, in file
order within the session) and the think time ``delay`` or ``delay_ms`` (optional, ms, >= 0; later turns only)."""


def read_sessions(path: str | os.PathLike, rows: list[tuple[int, dict]] | None = None) -> tuple[np.ndarray, ...]:
    """Per file row: session id ("" none), turn (0 none), file position of the previous turn (-1 none), think
    time (ms) and timestamp (a later turn without one: its previous turn's), from a Mooncake JSONL's session
    fields (:data:`SESSION_FIELDS`; ``rows``: the file's rows, already read). A session's turns follow each
    other in file order with non-decreasing timestamps; a ``turn`` must be the next of its session (a turn
    whose previous turn no earlier row has is refused, naming the row)."""
    path = Path(path)
    rows = _read_jsonl(path) if rows is None else rows
    stamp = np.zeros(len(rows), np.float64)
    session = np.full(len(rows), "", dtype=object)
    turn = np.zeros(len(rows), np.int64)
    previous = np.full(len(rows), -1, np.int64)
    delay = np.zeros(len(rows), np.float64)
    last: dict[str, tuple[int, int, float]] = {}  # session -> (position, turn, timestamp) of its latest turn
    for k, (i, obj) in enumerate(rows):
        where = f"{path}: row {i}"
        sid = obj.get("session_id")
        has_delay = [key for key in ("delay", "delay_ms") if obj.get(key) is not None]
        if len(has_delay) > 1:
            raise QueryError(f"{where}: both 'delay' and 'delay_ms' (one think time per turn)")
        if sid is None:
            if has_delay or obj.get("turn") is not None:
                raise QueryError(f"{where}: {(has_delay or ['turn'])[0]!r} without a 'session_id'")
            if obj.get("timestamp") is None:
                raise QueryError(f"{where}: missing field 'timestamp'")
            stamp[k] = _FIELDS.number(obj["timestamp"], where, "timestamp")
            continue
        if not isinstance(sid, str) or not sid:
            raise QueryError(f"{where}: session_id={sid!r} must be a non-empty string")
        prev = last.get(sid)
        n = 1 if prev is None else prev[1] + 1
        if obj.get("turn") is not None:
            t = _FIELDS.integer(obj["turn"], where, "turn")
            if t != n:
                known = f"its latest earlier turn is {prev[1]}" if prev is not None else "no earlier row has it"
                raise QueryError(f"{where}: session {sid!r} turn {t} refers to turn {t - 1}, but {known} (turns are 1, 2, ... in file order)")
        if obj.get("timestamp") is not None:
            ts = _FIELDS.number(obj["timestamp"], where, "timestamp")
        elif prev is not None:
            ts = prev[2]
        else:
            raise QueryError(f"{where}: missing field 'timestamp' (the first turn of session {sid!r} is sent at it)")
        stamp[k] = ts
        d = 0.0
        if has_delay:
            d = _FIELDS.number(obj[has_delay[0]], where, has_delay[0])
            if not (math.isfinite(d) and d >= 0):
                raise QueryError(f"{where}: {has_delay[0]}={obj[has_delay[0]]!r} must be a number of ms >= 0")
            if prev is None and d > 0:
                raise QueryError(f"{where}: {has_delay[0]}={d:g} on the first turn of session {sid!r} (a first turn is sent at its "
                                 "timestamp; a think time follows a previous turn)")
        if prev is not None and ts < prev[2]:
            raise QueryError(f"{where}: session {sid!r} turn {n} has timestamp {ts:g}, before its turn {prev[1]}'s {prev[2]:g}")
        session[k], turn[k], delay[k] = sid, n, d
        previous[k] = -1 if prev is None else prev[0]
        last[sid] = (k, n, ts)
    return session, turn, previous, delay, stamp


def _with_sessions(trace: Trace, cols) -> Trace:
    """``trace`` (sorted by arrival) with its file rows' session columns, in its order."""
    session, turn, previous, delay = cols
    order = trace.row
    position = np.empty(order.size, np.int64)
    position[order] = np.arange(order.size)
    prev = previous[order]
    return replace(trace, sessions=Sessions(session[order], turn[order], np.where(prev >= 0, position[np.maximum(prev, 0)], -1), delay[order]))


def read_plain_jsonl(path: str | os.PathLike) -> Trace:
    """Plain JSONL: ``arrival_ms``, ``input_length``, ``output_length``."""
    return _read_jsonl_trace(Path(path), "arrival_ms")


def read_plain_csv(path: str | os.PathLike) -> Trace:
    """Plain CSV: ``arrival_ms, input_length, output_length``."""
    path = Path(path)
    keys = ("arrival_ms", "input_length", "output_length")
    cols = _fast_columns(_arrow_csv(path, dict.fromkeys(keys, pa.float64())), *keys)
    return _trace(path, cols if cols is not None else _records(path, _read_csv_rows(path, keys), *keys))


_READERS: dict[str, Callable[[Path], Trace]] = {
    "azure": read_azure_csv, "mooncake": read_mooncake_jsonl, "csv": read_plain_csv, "jsonl": read_plain_jsonl,
}


def sniff_format(path: str | os.PathLike) -> str:
    """Guess a trace file's format from its header / first record."""
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        first = ""
        for line in f:
            if line.strip():
                first = line.strip()
                break
    if first.startswith("{"):
        try:
            keys = set(json.loads(first))
        except json.JSONDecodeError:
            raise QueryError(f"{path}: row 1: invalid JSON") from None
        return "mooncake" if "timestamp" in keys else "jsonl"
    header = {c.strip() for c in first.split(",")}
    if "TIMESTAMP" in header:
        return "azure"
    if "arrival_ms" in header:
        return "csv"
    raise QueryError(f"{path}: unknown trace format (expected an Azure CSV, a Mooncake JSONL or arrival_ms/input_length/output_length)")


def list_traces() -> list[str]:
    """Names of the bundled traces (see ``jaxsim/data/traces/README.md`` for sources and licences)."""
    return sorted(_BUNDLED)


def bundled_trace_path(name: str) -> Path:
    return Path(str(resources.files("jaxsim").joinpath("data", "traces", _BUNDLED[name][0])))


def load_trace(
    name_or_path: str | os.PathLike,
    *,
    fmt: str | None = None,
    time_scale: float = 1.0,
    max_requests: int | None = None,
    max_duration_ms: float | None = None,
    trace_block_size: int | None = DEFAULT_TRACE_BLOCK_SIZE,
) -> Trace:
    """Load a bundled trace by name or a trace file (format sniffed unless ``fmt`` is one of
    ``azure | mooncake | csv | jsonl``), then truncate and scale arrival times. A Mooncake trace's ``hash_ids``
    come with it, each row's checked against its prompt at ``trace_block_size`` tokens per hash."""
    key = str(name_or_path)
    if key in _BUNDLED:
        path, kind = bundled_trace_path(key), _BUNDLED[key][1]
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise QueryError(f"{path}: no such trace file or bundled trace (bundled: {', '.join(list_traces())})")
        kind = fmt or sniff_format(path)
    if kind not in _READERS:
        raise QueryError(f"{path}: unknown trace format {kind!r} (one of {', '.join(FORMATS)})")
    trace = _READERS[kind](path)
    if key in _BUNDLED:
        trace = replace(trace, name=key)
    if kind == "mooncake" and _mentions(path, (b'"hash_ids"',)):
        table, trace_block_size = read_hash_id_table(path, trace_block_size)
        trace = replace(trace, hash_ids=table.take(trace.row), trace_block_size=trace_block_size)
    if len(trace) == 0:
        raise QueryError(f"{path}: the trace has no requests")
    if max_duration_ms is not None:
        trace = trace.window(max_duration_ms)
    if max_requests is not None:
        if int(max_requests) < 1:
            raise QueryError(f"{path}: max_requests={max_requests} must be >= 1")
        trace = trace.head(max_requests)
    if time_scale != 1.0:
        trace = trace.scaled(time_scale)
    return trace


def write_trace_csv(trace: Trace, path: str | os.PathLike) -> None:
    """Write a trace in the plain CSV format (``arrival_ms,input_length,output_length``)."""
    from jaxsim.outputs import atomic_file

    with atomic_file(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["arrival_ms", "input_length", "output_length"])
        for a, i, o in zip(trace.arrival_ms, trace.input_tokens, trace.output_tokens):
            w.writerow([repr(float(a)), int(i), int(o)])


# ----------------------------------------------------------------------------------------------------
# synthetic traces


def sample_lengths(spec, n: int, rng: np.random.Generator, *, what: str = "length") -> np.ndarray:
    """Draw ``n`` token counts (integers >= 1) from a length spec: an int, ``fixed:N``,
    ``uniform:LO:HI`` (inclusive), ``normal:MEAN:STD``, ``lognormal:MEAN:CV``, ``exponential:MEAN``,
    or a sequence of values to resample."""
    if is_int(spec) or isinstance(spec, np.integer):
        spec = f"fixed:{int(spec)}"
    if not isinstance(spec, str):
        pool = np.asarray(spec, dtype=np.int64).reshape(-1)
        if pool.size == 0 or (pool < 1).any():
            raise QueryError(f"{what}: an empirical length pool must be non-empty integers >= 1")
        return rng.choice(pool, size=n, replace=True)
    parts = spec.split(":")
    kind, args = parts[0], parts[1:]
    try:
        vals = [float(a) for a in args]
    except ValueError:
        raise QueryError(f"{what}: {spec!r}: arguments must be numbers") from None
    arity = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2, "exponential": 1}
    if kind not in arity:
        raise QueryError(f"{what}: {spec!r}: unknown distribution (fixed, uniform, normal, lognormal, exponential)")
    if len(vals) != arity[kind] or not all(math.isfinite(v) for v in vals):
        raise QueryError(f"{what}: {spec!r}: {kind} takes {arity[kind]} finite argument(s)")
    hi = limits.LIMITS["tokens"].hi
    if kind in ("fixed", "uniform") and not all(1 <= v <= hi and float(v).is_integer() for v in vals):
        raise QueryError(f"{what}: {spec!r}: {kind} lengths must be integers in 1..{int(hi):,} tokens (docs/limits.md)")
    if kind in ("normal", "lognormal", "exponential") and not 1 <= vals[0] <= hi:
        raise QueryError(f"{what}: {spec!r}: the mean must be in 1..{int(hi):,} tokens (docs/limits.md)")
    if kind == "fixed":
        x = np.full(n, vals[0])
    elif kind == "uniform":
        if vals[1] < vals[0]:
            raise QueryError(f"{what}: {spec!r}: uniform needs LO <= HI")
        x = rng.integers(int(vals[0]), int(vals[1]) + 1, size=n)
    elif kind == "normal":
        x = rng.normal(vals[0], vals[1], size=n)
    elif kind == "lognormal":
        mean, cv = vals
        if mean <= 0 or cv < 0:
            raise QueryError(f"{what}: {spec!r}: lognormal needs MEAN > 0 and CV >= 0")
        sigma = math.sqrt(math.log1p(cv * cv))
        x = rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma, size=n)
    else:
        if vals[0] <= 0:
            raise QueryError(f"{what}: {spec!r}: exponential needs MEAN > 0")
        x = rng.exponential(vals[0], size=n)
    return np.clip(np.round(x), 1, hi).astype(np.int64)  # normal/lognormal/exponential tails are cut to 1..hi


def _interarrivals(n: int, rate_rps: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise QueryError(f"rate_rps={rate_rps} must be a positive finite number")
    if not (math.isfinite(cv) and cv > 0):
        raise QueryError(f"cv={cv} must be a positive finite number")
    mean_ms = 1000.0 / rate_rps
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, mean_ms / shape, size=n)


def poisson_trace(n: int, rate_rps: float, input_len="fixed:1024", output_len="fixed:128", *, seed: int = 0, name: str = "poisson") -> Trace:
    """``n`` requests with Poisson arrivals at ``rate_rps`` (first at 0 ms) and sampled lengths."""
    return gamma_trace(n, rate_rps, 1.0, input_len, output_len, seed=seed, name=name)


def gamma_trace(
    n: int, rate_rps: float, cv: float, input_len="fixed:1024", output_len="fixed:128", *, seed: int = 0, name: str = "gamma"
) -> Trace:
    """``n`` requests with gamma inter-arrival times (mean 1/rate, coefficient of variation ``cv``;
    cv = 1 is Poisson, > 1 burstier) and sampled lengths; numpy RNG seeded by ``seed``."""
    limits.check("requests", n, "n", QueryError)
    rng = np.random.default_rng(seed)
    gaps = _interarrivals(int(n), float(rate_rps), float(cv), rng)
    arr = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    inp = sample_lengths(input_len, int(n), rng, what="input_len")
    out = sample_lengths(output_len, int(n), rng, what="output_len")
    return make_trace(name, arr, inp, out, source=f"{name}(n={n}, rate_rps={rate_rps}, cv={cv}, seed={seed})")
