"""One declarative schema layer for jaxsim's input documents: deployment configs, sweep specs, profiles.

A document is read against a tree of declarations: a :class:`Table` maps field names to :class:`Field`
declarations whose types (:class:`Int`, :class:`Num`, :class:`Str`, :class:`Bool`, :class:`Literal`,
:class:`Array`, :class:`Axis`, nested :class:`Table`, or a :class:`Custom` reader) state the type, the
range (directly or as a :mod:`jaxsim.limits` key), and whether the field is required or what it defaults
to. Reading checks, in declaration order, unknown keys, then each field, and returns plain values
(optionally built into the module's frozen dataclass by ``make``); the first mistake raises one line
naming the file and the field path, e.g. ``config.toml: roles.decode.max_num_seqs: must be ...``.

Unknown keys are always refused (like pydantic's ``extra="forbid"``), ``bool`` is never an integer or a
number, and an integer is accepted where a number is expected. Cross-field rules stay with the modules
that own them and raise through :meth:`Doc.error` in the same format.

Plain Python with no third-party imports: ``jaxsim validate`` must start fast (a validation library
such as pydantic costs ~0.12 s to import alone, a quarter of the CLI's start-up budget).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jaxsim import limits
from jaxsim.errors import JaxsimError
from jaxsim.fields import is_int, is_number

__all__ = [
    "MISSING", "Doc", "Field", "Type", "Int", "Num", "Str", "Bool", "Literal", "Array", "Axis", "Table",
    "Custom", "Raw", "sub", "item",
]

MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()


def sub(path: str, key: str) -> str:
    """Field path of ``key`` inside ``path``."""
    return f"{path}.{key}" if path else key


def item(path: str, i: int) -> str:
    """Field path of element ``i`` of the array at ``path``."""
    return f"{path}[{i}]"


class Doc:
    """One document being read: its name (prefixes every message), error class and vocabulary.

    ``json=True`` speaks JSON's words ("object", "field"; pydantic's "field required" and "extra inputs
    are not permitted", as the reference's profile models say); otherwise TOML's ("table", "key").
    ``context`` carries what custom readers need (e.g. the folder relative paths resolve against).
    """

    def __init__(self, source: str, error: type[JaxsimError], *, json: bool = False, **context: Any):
        self.source, self.error_cls, self.json, self.context = source, error, json, context

    def error(self, path: str, msg: str) -> JaxsimError:
        return self.error_cls(f"{self.source}: {path}: {msg}" if path else f"{self.source}: {msg}")

    def type_name(self, v: Any) -> str:
        return {dict: "object" if self.json else "table", list: "array", str: "string", bool: "boolean",
                int: "integer", float: "float", type(None): "null"}.get(type(v), type(v).__name__)

    def got(self, v: Any) -> str:
        """``"string '3'"``: the type, and the value when it is a short scalar."""
        if isinstance(v, (dict, list)) or v is None:
            return self.type_name(v)
        r = repr(v)
        return f"{self.type_name(v)} {r if len(r) <= 60 else r[:57] + '...'}"

    def unknown(self, allowed: tuple[str, ...]) -> str:
        if self.json:
            return "unknown field (extra inputs are not permitted)"
        return f"unknown key (allowed: {', '.join(allowed)})"

    @property
    def required(self) -> str:
        return "field required" if self.json else "required key missing"


def _limit(doc: Doc, path: str, key: str | None, v: Any) -> None:
    if key is not None and (msg := limits.problem(key, v)) is not None:
        raise doc.error(path, msg + " (docs/limits.md)")


class Type:
    """A value type: ``read(doc, value, path)`` returns the checked value or raises one line."""

    def read(self, doc: Doc, v: Any, path: str) -> Any:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Type):
    """An integer (never a bool) in ``[lo, hi]``, then within ``limits.LIMITS[limit]``.

    Without ``lo`` (or with ``upper_only``) the limit's lower bound is left to ``lo`` or a later rule (the
    binding's reason codes): only values above the limit are refused by it. ``also`` names string tokens
    accepted as themselves.
    """

    lo: int | None = None
    hi: int | None = None
    limit: str | None = None
    also: tuple[str, ...] = ()
    upper_only: bool = False

    def read(self, doc: Doc, v: Any, path: str) -> Any:
        if isinstance(v, str) and v in self.also:
            return v
        if not is_int(v):
            extra = "".join(f" or {a!r}" for a in self.also)
            raise doc.error(path, f"expected an integer{extra}, got {doc.got(v)}")
        if (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
            rng = f">= {self.lo}" if self.hi is None else f"<= {self.hi}" if self.lo is None else f"in [{self.lo}, {self.hi}]"
            raise doc.error(path, f"must be an integer {rng} (got {v})")
        if self.limit is not None and ((self.lo is not None and not self.upper_only) or v > limits.LIMITS[self.limit].hi):
            _limit(doc, path, self.limit, v)
        return v


@dataclass(frozen=True)
class Num(Type):
    """A number (an integer is accepted; never a bool) as float: optionally finite, ``> gt`` / ``>= ge``,
    ``<= le``, then within ``limits.LIMITS[limit]``."""

    finite: bool = False
    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    limit: str | None = None

    def read(self, doc: Doc, v: Any, path: str) -> float:
        if not is_number(v):
            raise doc.error(path, f"expected a{' finite' if self.finite else ''} number, got {doc.got(v)}")
        if (self.finite or self.limit is not None) and not math.isfinite(v):
            raise doc.error(path, f"must be a finite number (got {v!r})")
        low_bad = (self.gt is not None and v <= self.gt) or (self.ge is not None and v < self.ge)
        if low_bad or (self.le is not None and v > self.le):
            lo = f"({self.gt:g}" if self.gt is not None else f"[{self.ge:g}" if self.ge is not None else None
            if lo is not None and self.le is not None:
                rng = f"in {lo}, {self.le:g}]"
            elif lo is not None:
                rng = f"{'>' if lo[0] == '(' else '>='} {lo[1:]}"
            else:
                rng = f"<= {self.le:g}"
            raise doc.error(path, f"must be {rng} (got {v!r})")
        _limit(doc, path, self.limit, v)
        return float(v)


@dataclass(frozen=True)
class Str(Type):
    """A non-blank string (``check(value) -> message | None`` adds a rule)."""

    check: Callable[[str], str | None] | None = None

    def read(self, doc: Doc, v: Any, path: str) -> str:
        if not isinstance(v, str):
            raise doc.error(path, f"expected a string, got {doc.got(v)}")
        if not v.strip():
            raise doc.error(path, "must be a non-empty string")
        if self.check is not None and (msg := self.check(v)) is not None:
            raise doc.error(path, msg)
        return v


@dataclass(frozen=True)
class Bool(Type):
    def read(self, doc: Doc, v: Any, path: str) -> bool:
        if not isinstance(v, bool):
            raise doc.error(path, f"expected a boolean, got {doc.got(v)}")
        return v


@dataclass(frozen=True)
class Literal(Type):
    """Exactly one of ``values`` (same type: ``1.0`` is not ``1``, ``0`` is not ``False``).

    ``message(value) -> str`` words the refusal; ``strings=True`` first requires a string.
    """

    values: tuple
    message: Callable[[Any], str] | None = None
    strings: bool = False

    def read(self, doc: Doc, v: Any, path: str) -> Any:
        if self.strings and not isinstance(v, str):
            raise doc.error(path, f"expected a string, got {doc.got(v)}")
        for a in self.values:
            if type(v) is type(a) and v == a:
                return v
        if self.message is not None:
            raise doc.error(path, self.message(v))
        raise doc.error(path, f"must be {' or '.join(repr(a) for a in self.values)} (got {v!r})")


@dataclass(frozen=True)
class Array(Type):
    """An array of ``of`` (a tuple); ``min_len``/``max_len`` bound its length (``empty`` words the refusal)."""

    of: Type
    min_len: int = 0
    max_len: int | None = None
    empty: str = "must not be empty"

    def read(self, doc: Doc, v: Any, path: str) -> tuple:
        if not isinstance(v, list):
            raise doc.error(path, f"expected an array, got {doc.got(v)}")
        if len(v) < self.min_len:
            raise doc.error(path, self.empty)
        if self.max_len is not None and len(v) > self.max_len:
            raise doc.error(path, f"at most {self.max_len} elements (got {len(v)})")
        return tuple(self.of.read(doc, x, item(path, i)) for i, x in enumerate(v))


@dataclass(frozen=True)
class Axis(Type):
    """A sweep axis: one value or a non-empty array of them; a tuple without repeats, in order."""

    of: Type

    def read(self, doc: Doc, v: Any, path: str) -> tuple:
        if not isinstance(v, list):
            return (self.of.read(doc, v, path),)
        if not v:
            raise doc.error(path, "must not be empty")
        return tuple(dict.fromkeys(self.of.read(doc, x, item(path, i)) for i, x in enumerate(v)))


@dataclass(frozen=True)
class Raw(Type):
    """Any value of a JSON/TOML kind (``dict`` or ``list``), passed through unchecked (a shallow copy)."""

    kind: type = dict

    def read(self, doc: Doc, v: Any, path: str) -> Any:
        if not isinstance(v, self.kind):
            word = doc.type_name(self.kind())
            raise doc.error(path, f"expected a{'n' if word[0] in 'aeiou' else ''} {word}, got {doc.got(v)}")
        return self.kind(v)


@dataclass(frozen=True)
class Custom(Type):
    """A reader written by hand for a value with several shapes: ``fn(doc, value, path) -> value``."""

    fn: Callable[[Doc, Any, str], Any]

    def read(self, doc: Doc, v: Any, path: str) -> Any:
        return self.fn(doc, v, path)


@dataclass(frozen=True)
class Field:
    """A declared field: its type, and ``required`` or a ``default`` (MISSING = absent from the result).

    ``nullable``: an explicit null reads as None (JSON). ``required`` may be a message string.
    """

    type: Type
    required: bool | str = False
    default: Any = MISSING
    nullable: bool = False


@dataclass(frozen=True)
class Table(Type):
    """A table/object of declared fields; unknown keys refused. Returns a dict of the present fields
    (and defaults), or ``make(doc, path, values)`` of it (cross-field rules live there)."""

    fields: Mapping[str, Field]
    make: Callable[[Doc, str, dict], Any] | None = None
    names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _plan: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(self.fields))
        object.__setattr__(self, "_plan", tuple(
            (name, f.type.read, f.required, f.default, f.nullable) for name, f in self.fields.items()))

    def read(self, doc: Doc, v: Any, path: str = "") -> Any:
        if not isinstance(v, dict):
            article = "an" if doc.json else "a"
            raise doc.error(path, f"expected {article} {doc.type_name({})}, got {doc.got(v)}")
        fields = self.fields
        for k in v:
            if k not in fields:
                raise doc.error(sub(path, str(k)), doc.unknown(self.names))
        out: dict[str, Any] = {}
        for name, read, required, default, nullable in self._plan:
            if name not in v:
                if required:
                    raise doc.error(sub(path, name), required if isinstance(required, str) else doc.required)
                if default is not MISSING:
                    out[name] = default
                continue
            x = v[name]
            out[name] = None if (x is None and nullable) else read(doc, x, f"{path}.{name}" if path else name)
        return out if self.make is None else self.make(doc, path, out)
