"""The documentation stays true: generated CLI reference, links, commands and the Python example."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))


def _code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def _command_tree() -> dict[tuple[str, ...], object]:
    import typer

    from jaxsim.cli.main import app

    tree = {}

    def walk(cmd, path):
        tree[path] = cmd
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(None):
                walk(cmd.get_command(None, name), path + (name,))

    walk(typer.main.get_command(app), ())
    return tree


@pytest.mark.slow
def test_cli_reference_is_up_to_date():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_cli_docs.py"), "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr + r.stdout


def test_cli_reference_covers_every_command():
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    for path in _command_tree():
        assert f"\n## {' '.join(('jaxsim', *path))}\n" in text or f"\n### {' '.join(('jaxsim', *path))}\n" in text, path


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_documented_commands_exist(page):
    tree = _command_tree()
    for block in _code_blocks(page.read_text(encoding="utf-8"), "bash"):
        for line in block.splitlines():
            words = line.split("#", 1)[0].split()
            if not words or not (words[0] == "jaxsim" or words[0].endswith("/jaxsim")):
                continue
            path = ()
            for w in words[1:]:
                if w.startswith("-") or path + (w,) not in tree:
                    break
                path += (w,)
            assert path, f"{page.name}: unknown command in: {line.strip()}"
            cmd = tree[path]
            assert not hasattr(cmd, "list_commands") or len(words) == len(path) + 1 or words[len(path) + 1] in ("--help", "-h"), (
                f"{page.name}: '{' '.join(words[: len(path) + 2])}' is not a command"
            )
            options = {o for p in cmd.params for o in getattr(p, "opts", [])}
            for w in words[len(path) + 1 :]:
                if w.startswith("--"):
                    assert w.split("=", 1)[0] in options | {"--help"}, f"{page.name}: {w} is not an option of jaxsim {' '.join(path)}"


def test_byo_data_python_example_runs(tmp_path, monkeypatch):
    blocks = _code_blocks((DOCS / "byo-data.md").read_text(encoding="utf-8"), "python")
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], "byo-data.md", "exec"), {})
    from jaxsim.kernels.batched import support_grid
    from jaxsim.plots import load_view

    view = load_view(tmp_path / "my-profile")
    lat, code = support_grid(view.table, [4], [4 * 4096])
    assert code[0, 0] == 0 and abs(lat[0, 0] - (6.0 + 0.3 * 4 + 4 * 4096 / 40_000)) < 1e-12
