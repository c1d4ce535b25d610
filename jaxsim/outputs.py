"""One policy for every file jaxsim writes (round, replay, trace synth, sweep, plot, import, calibrate,
the executable cache).

* **Temporary files**: data goes to a hidden temporary file next to the target, named
  ``.NAME.XXXXXXXX.partial`` with an unpredictable part and created with ``O_CREAT|O_EXCL|O_NOFOLLOW``
  (:func:`tempfile.mkstemp`): nobody can plant a file or a symbolic link under the name jaxsim will
  write. Before the rename the name must still be the file jaxsim created (same device and inode, a plain
  file), its mode is set on the file descriptor, and only then is it renamed onto the final name; a
  killed run leaves nothing under the final name. On any error (and on SIGTERM/SIGINT in the CLI, which
  turns them into exits that run the clean-up) the temporary file is removed; what a ``kill -9`` leaves
  is removed by the next write of the same name once it is older than :data:`STALE_AFTER_S` (only files
  of jaxsim's own naming pattern, owned by the user, never through a symbolic link).
* **Folders**: a missing output folder is created (with its parents). A folder jaxsim writes whole (a
  profile directory, a sweep's work directory) is built in a private temporary folder and carries a
  marker file (:data:`MARKER`); ``--force`` replaces only a folder with that marker, never a folder that
  holds an input of the same command, the working directory or one of its parents, or the home directory
  (:func:`check_output_dir`).
* **Formats**: the extension decides the format; an extension a command cannot write is refused with
  one line before any work starts.
* **Mode**: finished files are ``0666 & ~umask`` (0644 under the usual umask 022), like any file a
  shell redirection creates; never the 0600 of a bare temporary file.
* **Overwrite**: an existing file is refused unless ``--force`` (:func:`check_output`), and never
  replaced when it is one of the command's inputs (the same file, also through a symbolic or hard link).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from jaxsim.errors import JaxsimError

FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".png": "png", ".json": "json", ".jsonl": "jsonl"}
MARKER = ".jaxsim-output"
"""The file in every folder jaxsim writes whole: ``--force`` replaces only folders that carry it."""
TEMP_SUFFIX = ".partial"
STALE_AFTER_S = 3600.0
"""Temporary files of jaxsim's own naming older than this (a killed run's) are removed by the next write."""
_NAME_MAX = 200  # the target name's share of a temporary name (file names are at most 255 bytes)


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


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _stat(path: str | os.PathLike) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


def check_output(path: str | os.PathLike, allowed: Sequence[str] | None = None, *, force: bool = False,
                 inputs: Iterable[str | os.PathLike | None] = ()) -> Path:
    """Before any work: the format is writable, an existing file is only replaced with ``force`` and never
    when it is one of ``inputs`` (the same file, also through a symbolic or hard link) or lies in an input
    folder (a profile directory), and the folder is (or can become) a directory. Returns the path."""
    p = Path(path)
    if allowed is not None:
        output_format(p, allowed)
    here = _stat(p)
    if here is not None:
        for src in inputs:
            st = None if src is None else _stat(src)
            if st is None:
                continue
            if _same_file(st, here):
                raise OutputError(f"{p}: is an input of this command ({src}); write the output elsewhere")
            if stat.S_ISDIR(st.st_mode) and Path(src).resolve() in p.resolve().parents:
                raise OutputError(f"{p}: lies in {src}, an input folder of this command; write the output elsewhere")
    if os.path.lexists(p) and not force:
        raise OutputError(f"{p}: exists; pass --force to overwrite")
    if allowed is not None and p.is_dir():
        raise OutputError(f"{p}: is a directory; give a file name")
    _check_parent_is_a_folder(p)
    return p


def _check_parent_is_a_folder(p: Path) -> None:
    """The nearest existing ancestor of ``p`` must be a folder (``out.csv/x.parquet`` under a file is refused)."""
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise OutputError(f"{p}: {parent} is a file, not a folder")


def is_jaxsim_dir(path: str | os.PathLike) -> bool:
    """A real folder (not a symbolic link) carrying jaxsim's :data:`MARKER` file."""
    p = Path(path)
    try:
        return stat.S_ISDIR(os.lstat(p).st_mode) and stat.S_ISREG(os.lstat(p / MARKER).st_mode)
    except OSError:
        return False


def _protected(real: Path) -> str | None:
    cwd = Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        return "is the working directory" if real == cwd else "holds the working directory"
    try:
        home = Path.home().resolve()
    except (RuntimeError, KeyError):
        home = None
    if real == home:
        return "is the home directory"
    return None


def check_output_dir(path: str | os.PathLike, *, force: bool = False, inputs: Iterable[str | os.PathLike | None] = ()) -> Path:
    """Before any work, for a command that writes a whole folder: never the working directory (``--output
    .``), one of its parents or the home directory; never a folder that holds (or is) one of ``inputs``;
    an existing folder only with ``force`` and only when jaxsim wrote it (:data:`MARKER`). Returns the path."""
    p = Path(path)
    real = p.resolve()
    why = _protected(real)
    if why is not None:
        raise OutputError(f"{p}: {why}; give a new folder for the output")
    for src in inputs:
        if src is None:
            continue
        s = Path(src).resolve()
        if s == real or real in s.parents:
            raise OutputError(f"{p}: holds {src}, an input of this command; give a new folder for the output")
    if not os.path.lexists(p):
        _check_parent_is_a_folder(p)
        return p
    if p.is_symlink() or not p.is_dir():
        raise OutputError(f"{p}: exists and is not a folder jaxsim wrote; give a new folder for the output")
    if not force:
        raise OutputError(f"{p}: exists; pass --force to replace it")
    if not is_jaxsim_dir(p) and any(os.scandir(p)):
        raise OutputError(f"{p}: was not written by jaxsim (no {MARKER} file); refusing to replace it, remove it yourself")
    return p


def _mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _temp_pattern(name: str) -> re.Pattern:
    # ours: .NAME.<8 random chars>.partial (and .old for a folder being replaced); earlier versions: .NAME.PID.partial
    return re.compile(rf"\.{re.escape(name[:_NAME_MAX])}\.(?:[a-z0-9_]{{8}}|[0-9]+)\.(?:partial|old)")


def remove_stale_temps(folder: str | os.PathLike, name: str, *, older_than_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the temporary files and folders an interrupted write of ``folder/name`` left behind: only
    names of jaxsim's own pattern, owned by this user, last modified over ``older_than_s`` ago; symbolic
    links are never followed. Returns what was removed."""
    pattern, now, gone = _temp_pattern(name), time.time(), []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return gone
    for e in entries:
        if not pattern.fullmatch(e.name):
            continue
        try:
            st = e.stat(follow_symlinks=False)
            if st.st_uid != os.getuid() or now - st.st_mtime < older_than_s:
                continue
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(e.path)
            elif stat.S_ISREG(st.st_mode):
                os.unlink(e.path)
            else:
                continue
        except OSError:
            continue
        gone.append(Path(e.path))
    return gone


def _make_folder(p: Path) -> None:
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{p}: cannot create folder {p.parent}: {e.strerror or e}") from None


def create_temp(path: str | os.PathLike, *, clean_stale: bool = True) -> tuple[int, Path]:
    """A new temporary file for ``path`` in its folder (created if missing): ``(fd, temp path)``, mode
    0600 until :func:`publish`; stale temporary files of ``path`` are removed first (``clean_stale``:
    writers of many files in a folder of their own, e.g. a sweep's chunks, skip the listing)."""
    p = Path(path)
    _make_folder(p)
    if clean_stale:
        remove_stale_temps(p.parent, p.name)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{p.name[:_NAME_MAX]}.", suffix=TEMP_SUFFIX, dir=p.parent)
    except OSError as e:
        raise OutputError(f"{p}: cannot write in {p.parent}: {e.strerror or e}") from None
    return fd, Path(name)


def publish(fd: int, tmp: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Rename the finished temporary file ``tmp`` (open as ``fd``) onto ``path``: only if ``tmp`` is still
    the file jaxsim created, with its final mode (``0666 & ~umask``) set on the descriptor."""
    try:
        here = os.lstat(tmp)
    except OSError:
        here = None
    if here is None or not stat.S_ISREG(here.st_mode) or not _same_file(here, os.fstat(fd)):
        raise OutputError(f"{path}: its temporary file was replaced or removed by someone else while writing; nothing written")
    os.fchmod(fd, _mode())
    os.replace(tmp, path)
    return Path(path)


def _discard(tmp: Path) -> None:
    try:
        if stat.S_ISREG(os.lstat(tmp).st_mode):
            os.unlink(tmp)
    except OSError:
        pass


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb", *, clean_stale: bool = True, **open_kw) -> Iterator[io.IOBase]:
    """Yield a file object (``mode`` "wb" or "w") on a new temporary file next to ``path``; on success it
    becomes ``path``, on any error it is removed. Writes go to the descriptor jaxsim created."""
    p = Path(path)
    fd, tmp = create_temp(p, clean_stale=clean_stale)
    try:
        with open(fd, mode, closefd=False, **open_kw) as f:
            yield f
        publish(fd, tmp, p)
    finally:
        os.close(fd)
        _discard(tmp)


def _set_tree_modes(root: Path) -> None:
    mode = _mode()
    for dirpath, dirnames, filenames in os.walk(root):
        for n in filenames:
            f = os.path.join(dirpath, n)
            if stat.S_ISREG(os.lstat(f).st_mode):
                os.chmod(f, mode)  # inside jaxsim's private folder: checked as a plain file just above
        for n in dirnames:
            d = os.path.join(dirpath, n)
            if stat.S_ISDIR(os.lstat(d).st_mode):
                os.chmod(d, mode | 0o111)
    os.chmod(root, mode | 0o111)


def write_marker(folder: str | os.PathLike) -> None:
    """Mark ``folder`` as written by jaxsim (``--force`` may replace it later)."""
    import jaxsim  # noqa: PLC0415

    with atomic_file(Path(folder) / MARKER, "w", encoding="utf-8") as f:
        f.write(f"written by jaxsim {jaxsim.__version__}; jaxsim --force may replace this folder\n")


def _replace_dir(tmp: Path, p: Path) -> None:
    if not os.path.lexists(p):
        os.replace(tmp, p)
        return
    if p.is_symlink() or not p.is_dir() or (not is_jaxsim_dir(p) and any(os.scandir(p))):
        raise OutputError(f"{p}: exists and was not written by jaxsim (no {MARKER} file); refusing to replace it")
    old = Path(tempfile.mkdtemp(prefix=f".{p.name[:_NAME_MAX]}.", suffix=".old", dir=p.parent))
    os.replace(p, old)  # onto the empty folder just made: a name nobody else could predict
    try:
        os.replace(tmp, p)
    except OSError:
        os.replace(old, p)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a private (0700) temporary folder next to ``path``; on success it gets the :data:`MARKER`
    file, its final modes, and replaces ``path`` (an existing folder only if jaxsim wrote it, removed only
    after the new one is complete). Error messages name ``path``, never the temporary folder."""
    p = Path(path)
    _make_folder(p)
    remove_stale_temps(p.parent, p.name)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{p.name[:_NAME_MAX]}.", suffix=TEMP_SUFFIX, dir=p.parent))
    except OSError as e:
        raise OutputError(f"{p}: cannot write in {p.parent}: {e.strerror or e}") from None
    try:
        try:
            yield tmp
        except JaxsimError as e:
            if str(tmp) in str(e):
                raise type(e)(str(e).replace(str(tmp), str(p))) from None
            raise
        write_marker(tmp)
        _set_tree_modes(tmp)
        _replace_dir(tmp, p)
    finally:
        if os.path.lexists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_file(path) as f:
        f.write(data)
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_table(table, path: str | os.PathLike, *, allowed: Sequence[str] = ("csv", "parquet"), **parquet_kw) -> Path:
    """A pyarrow table as CSV or parquet (by extension); dictionary columns become plain strings in CSV."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    fmt = output_format(path, allowed)
    with atomic_file(path) as f:
        if fmt == "parquet":
            pq.write_table(table, f, **({"compression": "zstd"} | parquet_kw))
        else:
            cols = {c: (table.column(c).cast(pa.string()) if pa.types.is_dictionary(table.column(c).type) else table.column(c))
                    for c in table.column_names}
            pacsv.write_csv(pa.table(cols), f)
    return Path(path)


__all__ = [
    "FORMATS", "MARKER", "STALE_AFTER_S", "OutputError", "atomic_dir", "atomic_file", "check_output",
    "check_output_dir", "create_temp", "is_jaxsim_dir", "output_format", "publish", "remove_stale_temps",
    "write_bytes", "write_marker", "write_table", "write_text",
]
