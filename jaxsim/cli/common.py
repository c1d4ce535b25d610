"""Shared CLI plumbing: one-line errors with exit code 2, no tracebacks for user mistakes."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import typer

from jaxsim.errors import JaxsimError

EXIT_INVALID = 2


def fail(message: str) -> "typer.Exit":
    """Print a one-line error to stderr and exit 2."""
    typer.echo(f"error: {' '.join(str(message).split())}", err=True)
    raise typer.Exit(EXIT_INVALID)


def guarded(fn):
    """Turn user errors (bad files, bad values) into one-line messages with exit code 2.

    With ``JAXSIM_DEBUG=1`` in the environment every error keeps its traceback instead (for bug reports).
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if os.environ.get("JAXSIM_DEBUG", "") not in ("", "0"):
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        except (JaxsimError, FileNotFoundError, IsADirectoryError, PermissionError, ValueError, KeyError) as exc:
            text = str(exc) if not isinstance(exc, KeyError) else f"missing key {exc}"
            if isinstance(exc, OSError) and getattr(exc, "filename", None):
                text = f"{exc.filename}: {exc.strerror}"
            fail(text)
        except (TypeError, ArithmeticError, RecursionError, UnicodeError, IndexError) as exc:
            # a value no check anticipated: still one line, never a traceback (and worth a bug report)
            fail(f"unexpected input ({type(exc).__name__}: {exc}); please report the command that caused it "
                 "(JAXSIM_DEBUG=1 shows the traceback)")

    return wrapper


def refuse_overwrite(path: Path, force: bool, formats=None) -> None:
    """Before any work: never overwrite a user's file unless --force; refuse an extension the command
    cannot write (``formats``, e.g. ``("csv", "parquet")``) and an output whose folder is a file
    (:mod:`jaxsim.outputs`: one policy for every writer; missing folders are created)."""
    from jaxsim.outputs import check_output

    check_output(path, formats, force=force)


def write_atomic_bytes(path: Path, data: bytes) -> None:
    from jaxsim.outputs import write_bytes

    write_bytes(path, data)


def console():
    """A rich console for result tables: the terminal's width, or 200 columns when piped (rich's
    default of 80 cut tables into 'conf…' cells)."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()
