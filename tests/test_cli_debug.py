"""User errors are one line with exit 2; anything else is a bug: one "internal error (this is a bug)" line
with exit 70. ``--debug`` (or JAXSIM_DEBUG=1) keeps the traceback of any error for a bug report."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from jaxsim.cli import common
from jaxsim.cli.common import EXIT_INTERNAL, EXIT_INVALID, guarded
from jaxsim.cli.main import app
from jaxsim.errors import BindingError, InputError, ProfileError

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@guarded
def _boom(exc: Exception):
    raise exc


@pytest.mark.parametrize("exc", [InputError("bad value"), ProfileError("p.json: bad"),
                                 FileNotFoundError(2, "No such file or directory", "x.toml")])
def test_user_errors_are_one_line_exit_2(monkeypatch, capsys, exc):
    monkeypatch.delenv("JAXSIM_DEBUG", raising=False)
    with pytest.raises(typer.Exit) as info:
        _boom(exc)
    assert info.value.exit_code == EXIT_INVALID == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "bug" not in err


@pytest.mark.parametrize("exc", [ValueError("bad value"), KeyError("k"), TypeError("internal"), IndexError("internal"),
                                 RuntimeError("multi\nline")])
def test_other_errors_are_bugs_exit_70(monkeypatch, capsys, exc):
    monkeypatch.delenv("JAXSIM_DEBUG", raising=False)
    with pytest.raises(typer.Exit) as info:
        _boom(exc)
    assert info.value.exit_code == EXIT_INTERNAL == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"error: internal error (this is a bug): {type(exc).__name__}: ")
    assert "--debug" in err and "JAXSIM_DEBUG=1" in err


@pytest.mark.parametrize("exc", [InputError("bad value"), TypeError("internal")])
def test_jaxsim_debug_keeps_the_traceback(monkeypatch, exc):
    monkeypatch.setenv("JAXSIM_DEBUG", "1")
    with pytest.raises(type(exc), match=str(exc)):
        _boom(exc)


def _break_binding(monkeypatch):
    import jaxsim.deploy.binding

    def broken(*a, **k):
        raise ValueError("an internal invariant broke")

    monkeypatch.setattr(jaxsim.deploy.binding, "bind", broken)


def test_an_internal_error_in_a_command_exits_70_with_the_bug_line(monkeypatch):
    monkeypatch.delenv("JAXSIM_DEBUG", raising=False)
    _break_binding(monkeypatch)
    r = runner.invoke(app, ["capacity", str(ROOT / "configs" / "deployment_aggregated.toml")])
    assert r.exit_code == 70, r.output
    assert r.stderr.strip() == ("error: internal error (this is a bug): ValueError: an internal invariant broke; "
                                "rerun with --debug (or JAXSIM_DEBUG=1) for the traceback")
    assert "Traceback" not in r.output


def test_debug_flag_shows_the_traceback(monkeypatch):
    monkeypatch.delenv("JAXSIM_DEBUG", raising=False)
    _break_binding(monkeypatch)
    r = runner.invoke(app, ["--debug", "capacity", str(ROOT / "configs" / "deployment_aggregated.toml")])
    assert r.exit_code not in (0, 2, 70)
    assert isinstance(r.exception, ValueError) and str(r.exception) == "an internal invariant broke"
    assert r.exc_info is not None and r.exc_info[2] is not None  # the traceback is kept
    assert not common.debug_enabled()  # --debug holds for that one invocation only


def test_a_user_error_in_a_command_stays_exit_2(monkeypatch, tmp_path):
    monkeypatch.delenv("JAXSIM_DEBUG", raising=False)
    import jaxsim.deploy.binding

    def refused(*a, **k):
        raise BindingError("cfg.toml: roles.decode.tp=3 is not a measured identity")

    monkeypatch.setattr(jaxsim.deploy.binding, "bind", refused)
    r = runner.invoke(app, ["capacity", str(ROOT / "configs" / "deployment_aggregated.toml")])
    assert r.exit_code == 2 and r.stderr.strip() == "error: cfg.toml: roles.decode.tp=3 is not a measured identity"
