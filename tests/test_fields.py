"""jaxsim.fields: the integer test and the two numeric-field contracts (FPM logs strict, request traces not)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxsim.errors import QueryError, TableError
from jaxsim.fields import FieldReader, is_int

STRICT = FieldReader(TableError)
LOOSE = FieldReader(QueryError, strict=False)


@pytest.mark.parametrize("v, want", [(0, True), (-3, True), (2**70, True), (True, False), (False, False), (1.0, False), ("1", False), (None, False)])
def test_is_int(v, want):
    assert is_int(v) is want


@pytest.mark.parametrize("value, want", [(12, 12), (0, 0), (12.0, 12), ("12", 12), (" 12 ", 12), ("+7", 7), (2**70, 2**70)])
def test_strict_integer_accepts_integer_literals(value, want):
    got = STRICT.integer(value, "log.csv: row 3", "num_decode_requests")
    assert got == want and type(got) is int


@pytest.mark.parametrize("value, msg", [
    (True, "log.csv: row 3: c: expected an integer, got a boolean"),
    ("12.0", "log.csv: row 3: c: expected an integer, got '12.0'"),
    ("1e3", "log.csv: row 3: c: expected an integer, got '1e3'"),
    ("", "log.csv: row 3: c: expected an integer, got ''"),
    (1.5, "log.csv: row 3: c: expected an integer, got float"),
    (float("inf"), "log.csv: row 3: c: expected an integer, got float"),
    (None, "log.csv: row 3: c: expected an integer, got NoneType"),
    ([1], "log.csv: row 3: c: expected an integer, got list"),
    ("-1", "log.csv: row 3: c: must be >= 0 (got -1)"),
    (-2.0, "log.csv: row 3: c: must be >= 0 (got -2)"),
])
def test_strict_integer_refusals(value, msg):
    with pytest.raises(TableError) as e:
        STRICT.integer(value, "log.csv: row 3", "c")
    assert str(e.value) == msg


@pytest.mark.parametrize("value, want", [(12, 12), ("12", 12), ("12.0", 12), ("1.2e1", 12), (12.0, 12), ("-3", -3), (" 4 ", 4)])
def test_loose_integer_accepts_integral_numbers(value, want):
    got = LOOSE.integer(value, "t.jsonl: row 2", "input_length")
    assert got == want and type(got) is int


@pytest.mark.parametrize("value", [True, False, "1.5", 1.5, "nan", float("inf"), "abc", "", None, {}])
def test_loose_integer_refusals_echo_the_value(value):
    with pytest.raises(QueryError) as e:
        LOOSE.integer(value, "t.jsonl: row 2", "input_length")
    assert str(e.value) == f"t.jsonl: row 2: input_length={value!r} must be an integer"


@pytest.mark.parametrize("value, want", [(1, 1.0), ("2.5", 2.5), (" 3 ", 3.0), (-0.5, -0.5), ("1e3", 1000.0)])
def test_number_accepts_finite_numbers(value, want):
    for reader in (STRICT, LOOSE):
        got = reader.number(value, "w", "f")
        assert got == want and type(got) is float


@pytest.mark.parametrize("value, strict_msg, loose_msg", [
    (True, "w: f: expected a number, got a boolean", "w: f=True must be a number"),
    ("abc", "w: f: expected a number, got 'abc'", "w: f='abc' must be a number"),
    (None, "w: f: expected a number, got None", "w: f=None must be a number"),
    ("nan", "w: f: must be finite (got 'nan')", "w: f='nan' must be finite"),
    (float("-inf"), "w: f: must be finite (got -inf)", "w: f=-inf must be finite"),
    (10**400, f"w: f: must be finite (got {10**400!r})", f"w: f={10**400!r} must be finite"),  # no raw OverflowError
])
def test_number_refusals(value, strict_msg, loose_msg):
    with pytest.raises(TableError) as e:
        STRICT.number(value, "w", "f")
    assert str(e.value) == strict_msg
    with pytest.raises(QueryError) as e:
        LOOSE.number(value, "w", "f")
    assert str(e.value) == loose_msg


@given(st.integers(min_value=0, max_value=2**53))
def test_integers_round_trip_through_text(n):
    assert STRICT.integer(str(n), "w", "f") == n
    assert LOOSE.integer(str(n), "w", "f") == n
    assert LOOSE.integer(repr(float(n)), "w", "f") == n


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_loose_integer_is_exactly_the_whole_finite_floats(x):
    whole = math.isfinite(x) and x == round(x)
    try:
        got = LOOSE.integer(x, "w", "f")
    except QueryError:
        assert not whole
    else:
        assert whole and got == int(x)


def test_huge_integers_stay_exact_ints():
    """A JSON integer beyond a float is read exactly (range checks then refuse it in one line), never through a
    float (OverflowError, or a rounded value)."""
    for v in (10**400, 2**63 + 1, 2**53 + 1):
        assert STRICT.integer(v, "w", "f") == v
        assert LOOSE.integer(v, "w", "f") == v
