"""Numeric fields of data files (CSV cells, JSON values): the integer test and one parser per kind.

Ground floor: imports nothing of jaxsim but :mod:`jaxsim.errors`. A bool is never a number here (JSON
``true`` is not 1). Each file family states its contract once, as a :class:`FieldReader`:

* strict integers (FPM logs): an int, an integral float or an integer literal (``"12"``), >= 0; refusals
  read ``WHERE: FIELD: expected an integer, got ...`` / ``must be >= 0 (got N)``;
* integral numbers (request traces, matching pyarrow's float64 columns): any finite number with a whole
  value (``"1.2e1"``, ``12.0``), the sign left to the caller's limits; refusals read
  ``WHERE: FIELD=VALUE must be an integer``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from jaxsim.errors import JaxsimError

__all__ = ["FieldReader", "is_int", "is_number"]


def is_int(v: Any) -> bool:
    """A Python int that is not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    """A Python int or float that is not a bool (any value, finite or not)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _whole(value: Any) -> int | None:
    """An int as itself, an integral float, or a string holding an integer literal; else None."""
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def _integral(value: Any) -> int | None:
    """An int as itself; any other value ``float()`` reads as a finite whole number, as an int (through the
    float); else None."""
    if isinstance(value, int):
        return value
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(f) or f != round(f):
        return None
    return int(f)


@dataclass(frozen=True)
class FieldReader:
    """How one file family reads its numeric fields and words a refusal (one line, ``error``).

    ``strict``: integer fields take integer literals only and must be >= 0, refusals say what was
    expected and what was found; otherwise any integral number is an integer and refusals echo
    ``FIELD=VALUE``.
    """

    error: type[JaxsimError]
    strict: bool = True

    def integer(self, value: Any, where: str, field: str) -> int:
        """``value`` (of ``field`` at ``where``) as an int."""
        if isinstance(value, bool):
            raise self._refusal(where, field, value, "an integer", "a boolean")
        out = _whole(value) if self.strict else _integral(value)
        if out is None:
            raise self._refusal(where, field, value, "an integer", repr(value) if isinstance(value, str) else type(value).__name__)
        if self.strict and out < 0:
            raise self.error(f"{where}: {field}: must be >= 0 (got {out})")
        return out

    def number(self, value: Any, where: str, field: str) -> float:
        """``value`` (of ``field`` at ``where``) as a finite float."""
        if isinstance(value, bool):
            raise self._refusal(where, field, value, "a number", "a boolean")
        try:
            out = float(value)
        except (TypeError, ValueError):
            raise self._refusal(where, field, value, "a number", repr(value)) from None
        except OverflowError:  # an int beyond a float (JSON reads 1e400 as inf, but 10**400 as an int)
            out = math.inf
        if not math.isfinite(out):
            if self.strict:
                raise self.error(f"{where}: {field}: must be finite (got {value!r})")
            raise self.error(f"{where}: {field}={value!r} must be finite")
        return out

    def _refusal(self, where: str, field: str, value: Any, want: str, got: str) -> JaxsimError:
        if self.strict:
            return self.error(f"{where}: {field}: expected {want}, got {got}")
        return self.error(f"{where}: {field}={value!r} must be {want}")
