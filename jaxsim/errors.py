"""Exceptions that carry one-line, user-facing messages."""


class JaxsimError(ValueError):
    """Base error: its message is one line naming the file/field/row at fault."""


class ProfileError(JaxsimError):
    """A profile JSON is malformed or breaks a rule."""


class TableError(JaxsimError):
    """An FPM table or its sidecar is malformed or breaks a rule."""


class BindingError(JaxsimError):
    """A deployment config cannot be bound to a profile."""


class QueryError(JaxsimError):
    """A query file is malformed."""


class InputError(JaxsimError):
    """A value given on the command line or to a library function is out of range or malformed."""


def read_text(path, what: str, error: type[JaxsimError]) -> str:
    """A UTF-8 text file's contents; unreadable or non-UTF-8 files raise ``error`` with one line."""
    from pathlib import Path

    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise error(f"{p}: cannot read {what}: {e.strerror or e}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{p}: {what} is not UTF-8 ({e.reason} at byte {e.start})") from None
