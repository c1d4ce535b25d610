"""Shared CLI plumbing: one-line errors with exit code 2 for user mistakes; a distinct exit code and a
"this is a bug" line for anything else (``--debug`` or ``JAXSIM_DEBUG=1`` keeps the traceback)."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import typer
import typer.exceptions

from jaxsim.errors import JaxsimError

EXIT_INVALID = 2
"""Bad input (a :class:`~jaxsim.errors.JaxsimError` or an OS file error): one line naming what is wrong."""
EXIT_INTERNAL = 70
"""An internal error, a bug (``EX_SOFTWARE`` of sysexits.h): one line saying so."""


def paragraphs(text: str) -> str:
    """A help text written in source-width lines, as the terminal should wrap it: the lines of each paragraph
    joined by spaces (blank lines separate paragraphs; indented lines, such as examples, stay as they are)."""
    out: list[str] = []
    for line in text.split("\n"):
        joinable = line and not line[0].isspace()
        if joinable and out and out[-1] and not out[-1][0].isspace():
            out[-1] += " " + line
        else:
            out.append(line)
    return "\n".join(out)


def fail(message: str) -> typer.Exit:
    """Print a one-line error to stderr and exit 2."""
    typer.echo(f"error: {' '.join(str(message).split())}", err=True)
    raise typer.Exit(EXIT_INVALID)


_debug_flag = False


def set_debug(ctx: typer.Context, on: bool) -> None:
    """The root ``--debug`` flag: on for this invocation only (reset when its context closes)."""
    global _debug_flag
    _debug_flag = bool(on)
    ctx.call_on_close(_reset_debug)


def _reset_debug() -> None:
    global _debug_flag
    _debug_flag = False


def debug_enabled() -> bool:
    """``--debug`` given to the running command, or ``JAXSIM_DEBUG`` set (not empty, not 0)."""
    return _debug_flag or os.environ.get("JAXSIM_DEBUG", "") not in ("", "0")


def _one_line(text: str, limit: int = 500) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def guarded(fn):
    """User errors (:class:`~jaxsim.errors.JaxsimError`, OS file errors) → one line, exit 2; any other
    exception is a bug → one "internal error (this is a bug)" line, exit 70. With ``--debug`` (or
    ``JAXSIM_DEBUG=1``) every error keeps its traceback instead (for bug reports)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.exceptions.TyperException):
            raise  # typer's own exits and usage errors
        except (JaxsimError, OSError) as exc:
            if debug_enabled():
                raise
            text = str(exc)
            if isinstance(exc, OSError) and getattr(exc, "filename", None):
                text = f"{exc.filename}: {exc.strerror}"
            fail(text)
        except Exception as exc:
            if debug_enabled():
                raise
            typer.echo(f"error: internal error (this is a bug): {type(exc).__name__}: {_one_line(exc)}; "
                       "rerun with --debug (or JAXSIM_DEBUG=1) for the traceback", err=True)
            raise typer.Exit(EXIT_INTERNAL)

    return wrapper


def refuse_overwrite(path: Path, force: bool, formats=None, inputs=()) -> None:
    """Before any work: never overwrite a user's file unless --force, nor one of the command's ``inputs``
    even with it; refuse an extension the command cannot write (``formats``, e.g. ``("csv", "parquet")``)
    and an output whose folder is a file (:mod:`jaxsim.outputs`: one policy for every writer; missing
    folders are created)."""
    from jaxsim.outputs import check_output

    check_output(path, formats, force=force, inputs=inputs)


def refuse_output_dir(path: Path, force: bool, inputs=()) -> None:
    """Before any work, for a command that writes a whole folder: never the working directory, one of its
    parents or the home directory, never a folder holding one of ``inputs``; an existing folder only with
    --force and only if jaxsim wrote it (:func:`jaxsim.outputs.check_output_dir`)."""
    from jaxsim.outputs import check_output_dir

    check_output_dir(path, force=force, inputs=inputs)


def console():
    """A rich console for result tables: the terminal's width, or 200 columns when piped (rich's
    default of 80 cut tables into 'conf…' cells)."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()
