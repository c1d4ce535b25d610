"""User errors are one line with exit 2; JAXSIM_DEBUG=1 keeps the traceback of any error for a bug report."""

from __future__ import annotations

import pytest
import typer

from jaxsim.cli.common import guarded


@guarded
def _boom(exc: Exception):
    raise exc


@pytest.mark.parametrize("exc", [ValueError("bad value"), TypeError("internal"), IndexError("internal")])
def test_errors_are_one_line_exit_2_by_default(monkeypatch, capsys, exc):
    monkeypatch.delenv("JAXSIM_DEBUG", raising=False)
    with pytest.raises(typer.Exit) as info:
        _boom(exc)
    assert info.value.exit_code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and str(exc) in err


@pytest.mark.parametrize("exc", [ValueError("bad value"), TypeError("internal")])
def test_jaxsim_debug_keeps_the_traceback(monkeypatch, exc):
    monkeypatch.setenv("JAXSIM_DEBUG", "1")
    with pytest.raises(type(exc), match=str(exc)):
        _boom(exc)
