"""Every command's --help says what its text says: rich markup must not eat install hints such as
``pip install -e '.[opmodel]'`` (observed, issue 28: the terminal formatter printed ``pip install -e '.'``)."""

from __future__ import annotations

import re

import typer
from typer.testing import CliRunner

from jaxsim.cli.main import app

runner = CliRunner()
EXTRAS = ("plot", "opmodel", "test")


def _commands(cmd, path=()):
    yield path
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        yield from _commands(sub, (*path, name))


def test_install_hints_survive_the_help_formatter():
    root = typer.main.get_command(app)
    seen = {}
    for path in _commands(root):
        r = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert r.exit_code == 0, (path, r.output)
        for extra in re.findall(r"pip install -e '\.([^']*)'", r.output):
            seen[" ".join(path)] = extra
            assert extra in {f"[{e}]" for e in EXTRAS}, (path, extra)
    assert seen.get("import op-model") == "[opmodel]" and seen.get("plot") == "[plot]", seen
