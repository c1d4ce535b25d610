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
