"""What makes a sweep's work directory resumable: its key and its checksummed chunk files.

* **Key** (in ``manifest.json``): the spec's digest, and :func:`plan_digest`, a digest of everything the
  evaluation reads: every round table of every profile (so the profile tables, ``profile.json`` and the
  metadata sidecars as they were bound), the acceptance rates (presets resolved), the workload classes
  (traces binned), the bindings and labels; plus jaxsim's source digest, the chunk size and ``--top``.
  A work directory whose key differs is never reused: the run refuses in one line (``--force`` discards
  it and starts again).
* **Chunks**: each finished chunk is two Arrow IPC files (all rows; the rows finalization needs) and a
  small ``.sha256`` sidecar written last, holding both files' SHA-256. A chunk counts as done only when
  its sidecar exists and both files match it; a resumed run recomputes a truncated or edited chunk, and
  the merge refuses (one line naming the file) a chunk that changed after it was checked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from jaxsim.errors import JaxsimError
from jaxsim.outputs import atomic_file


class ChunkError(JaxsimError):
    """A chunk file of a sweep's work directory is missing, truncated or was changed after it was written."""


def _feed(h, obj: Any) -> None:
    """Hash ``obj``'s content, deterministically (arrays by dtype, shape and bytes; containers in order)."""
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    elif isinstance(obj, Path):
        h.update(f"path:{obj};".encode())
    elif isinstance(obj, np.ndarray) or isinstance(obj, np.generic) or hasattr(obj, "__array__"):
        a = np.asarray(obj)
        if a.dtype == object:
            h.update(f"objects{a.shape};".encode())
            for x in a.ravel():
                _feed(h, x)
        else:
            h.update(f"array:{a.dtype.str}{a.shape};".encode())
            h.update(np.ascontiguousarray(a).tobytes())
    elif isinstance(obj, dict):
        h.update(f"dict{len(obj)};".encode())
        for k in sorted(obj, key=repr):
            _feed(h, k)
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        h.update(f"{type(obj).__name__}{len(items)};".encode())
        for x in items:
            _feed(h, x)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        h.update(f"{type(obj).__qualname__};".encode())
        for f in dataclasses.fields(obj):
            _feed(h, f.name)
            _feed(h, getattr(obj, f.name))
    else:  # anything else (functions, devices) holds no input data: its type, never its address
        h.update(f"<{type(obj).__module__}.{type(obj).__qualname__}>;".encode())


def plan_digest(plan) -> str:
    """SHA-256 of a :class:`~jaxsim.sweep.spec.SweepPlan`'s content: every field the evaluation reads
    (round tables, rates, bindings, labels, workload classes), the spec's digest, and jaxsim's code."""
    from jaxsim._jax import source_digest  # noqa: PLC0415

    h = hashlib.sha256()
    h.update(f"spec:{plan.spec.digest()};code:{source_digest()};".encode())
    for f in dataclasses.fields(plan):
        if f.name != "spec":
            _feed(h, f.name)
            _feed(h, getattr(plan, f.name))
    return h.hexdigest()


def chunk_path(work: Path, k: int) -> Path:
    return work / f"chunk-{k:07d}.arrow"


def best_path(work: Path, k: int) -> Path:
    return work / f"best-{k:07d}.arrow"


def sums_path(work: Path, k: int) -> Path:
    return work / f"chunk-{k:07d}.sha256"


def _ipc_bytes(table: pa.Table) -> bytes:
    """Arrow IPC file bytes (lz4): several times faster to write and read back than parquet."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="lz4")) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _write(path: Path, data: bytes) -> str:
    with atomic_file(path, clean_stale=False) as f:  # the work directory is removed whole after the merge
        f.write(data)
    return hashlib.sha256(data).hexdigest()


def write_chunk(work: Path, k: int, table: pa.Table, best: pa.Table) -> None:
    """Chunk ``k``'s two files, then its checksum sidecar (the chunk is done once the sidecar exists)."""
    sums = {"chunk": _write(chunk_path(work, k), _ipc_bytes(table)), "best": _write(best_path(work, k), _ipc_bytes(best))}
    with atomic_file(sums_path(work, k), "w", clean_stale=False, encoding="utf-8") as f:
        f.write(json.dumps(sums, sort_keys=True) + "\n")


def chunk_written(work: Path, k: int) -> bool:
    """Chunk ``k`` was finished (its sidecar exists; see :func:`chunk_intact` for its content)."""
    return sums_path(work, k).is_file()


def _sums(work: Path, k: int) -> dict:
    p = sums_path(work, k)
    try:
        sums = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        raise ChunkError(f"{p}: chunk checksums missing or unreadable; rerun the sweep to recompute chunk {k}") from None
    if not isinstance(sums, dict) or not all(isinstance(sums.get(x), str) for x in ("chunk", "best")):
        raise ChunkError(f"{p}: not a chunk checksum file; rerun the sweep to recompute chunk {k}")
    return sums


def _verified_bytes(path: Path, want: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ChunkError(f"{path}: cannot read the sweep chunk: {e.strerror or e}; rerun the sweep to recompute it") from None
    if hashlib.sha256(data).hexdigest() != want:
        raise ChunkError(f"{path}: sweep chunk is truncated or was changed after it was written (checksum mismatch); "
                         "rerun the sweep to recompute it")
    return data


def chunk_intact(work: Path, k: int) -> bool:
    """Chunk ``k`` is done and both its files match their checksums."""
    if not chunk_written(work, k):
        return False
    try:
        sums = _sums(work, k)
        _verified_bytes(chunk_path(work, k), sums["chunk"])
        _verified_bytes(best_path(work, k), sums["best"])
    except ChunkError:
        return False
    return True


def discard_chunk(work: Path, k: int) -> None:
    for p in (sums_path(work, k), chunk_path(work, k), best_path(work, k)):
        p.unlink(missing_ok=True)


def read_chunk(work: Path, k: int, *, best: bool = False) -> pa.Table:
    """Chunk ``k``'s table (``best``: its finalization rows), checked against its sidecar: a
    :class:`ChunkError` naming the file when it does not match, never a parse error."""
    path = best_path(work, k) if best else chunk_path(work, k)
    data = _verified_bytes(path, _sums(work, k)["best" if best else "chunk"])
    return pa.ipc.open_file(pa.py_buffer(data)).read_all()


__all__ = ["ChunkError", "best_path", "chunk_intact", "chunk_path", "chunk_written", "discard_chunk", "plan_digest",
           "read_chunk", "sums_path", "write_chunk"]
