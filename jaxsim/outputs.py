"""One policy for every file jaxsim writes (round, replay, trace synth, sweep, plot, import).

* **Atomic**: data goes to a hidden temporary file next to the target (``.NAME.PID.partial``), which is
  renamed onto the final name only when complete; on any error the temporary file is removed, and a
  killed run leaves nothing under the final name.
* **Folders**: a missing output folder is created (with its parents).
* **Formats**: the extension decides the format; an extension a command cannot write is refused with
  one line before any work starts.
* **Mode**: finished files are ``0666 & ~umask`` (0644 under the usual umask 022), like any file a
  shell redirection creates; never the 0600 of a bare temporary file.
* **Overwrite**: an existing file is refused unless ``--force`` (:func:`check_output`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from jaxsim.errors import JaxsimError

FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".png": "png", ".json": "json", ".jsonl": "jsonl"}


class OutputError(JaxsimError):
    """An output path that cannot be written (format, existing file, folder)."""


def output_format(path: str | os.PathLike, allowed: Sequence[str]) -> str:
    """The format named by ``path``'s extension, if it is one of ``allowed`` (e.g. ``("csv", "parquet")``)."""
    p = Path(path)
    fmt = FORMATS.get(p.suffix.lower())
    if fmt not in allowed:
        exts = ", ".join(sorted(e for e, f in FORMATS.items() if f in allowed))
        got = f"'{p.suffix}'" if p.suffix else "no extension"
        raise OutputError(f"{p}: {got} is not a format this command writes; use {exts}")
    return fmt


def check_output(path: str | os.PathLike, allowed: Sequence[str] | None = None, *, force: bool = False) -> Path:
    """Before any work: the format is writable, an existing file is only replaced with ``force``, and
    the folder is (or can become) a directory. Returns the path."""
    p = Path(path)
    if allowed is not None:
        output_format(p, allowed)
    if p.exists() and not force:
        raise OutputError(f"{p}: exists; pass --force to overwrite")
    if allowed is not None and p.is_dir():
        raise OutputError(f"{p}: is a directory; give a file name")
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise OutputError(f"{p}: {parent} is a file, not a folder")
    return p


def _mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def temp_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p.with_name(f".{p.name}.{os.getpid()}.partial")


def publish(tmp: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Give a finished temporary file its final mode and rename it onto ``path`` (for streamed writers
    that manage their own temporary file from :func:`temp_path`)."""
    os.chmod(tmp, _mode())
    os.replace(tmp, path)
    return Path(path)


@contextmanager
def atomic(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it becomes ``path`` (mode 0644 under umask 022)."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{p}: cannot create folder {p.parent}: {e.strerror or e}") from None
    tmp = temp_path(p)
    try:
        yield tmp
        if not tmp.exists():
            raise OutputError(f"{p}: nothing was written")
        publish(tmp, p)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder next to ``path``; on success it replaces ``path`` (an existing folder is
    removed only after the new one is complete)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(p)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    old = p.with_name(f".{p.name}.{os.getpid()}.old")
    try:
        yield tmp
        mode = _mode()
        for f in tmp.rglob("*"):
            os.chmod(f, (mode | 0o111) if f.is_dir() else mode)
        os.chmod(tmp, mode | 0o111)
        if p.exists():
            os.replace(p, old)
        os.replace(tmp, p)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
        if old.exists():
            shutil.rmtree(old) if old.is_dir() else old.unlink()


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_table(table, path: str | os.PathLike, *, allowed: Sequence[str] = ("csv", "parquet"), **parquet_kw) -> Path:
    """A pyarrow table as CSV or parquet (by extension); dictionary columns become plain strings in CSV."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    fmt = output_format(path, allowed)
    with atomic(path) as tmp:
        if fmt == "parquet":
            pq.write_table(table, tmp, **({"compression": "zstd"} | parquet_kw))
        else:
            cols = {c: (table.column(c).cast(pa.string()) if pa.types.is_dictionary(table.column(c).type) else table.column(c))
                    for c in table.column_names}
            pacsv.write_csv(pa.table(cols), tmp)
    return Path(path)
