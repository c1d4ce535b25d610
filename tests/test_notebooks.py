"""Every notebook (Jupytext percent-format script) runs top to bottom and writes its figures."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # subprocesses / whole documents: `pytest -m "not slow"` skips them

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
TIMEOUT_S = 120

FIGURES = {
    "01_profiles_and_rounds.py": (
        "01_decode_curves.png", "01_prefill_surface.png", "01_prefill_llama.png", "01_support_map.png",
        "01_support_map_tp1.png", "01_support_map_tp4.png",
    ),
    "02_speculative_what_if.py": ("02_tokens_per_round.png", "02_tpot_throughput.png"),
    "03_sweep_pareto.py": ("03_pareto.png", "03_frontier_by_sla.png", "03_best_per_budget.png"),
    "04_replay_trace.py": ("04_trace.png", "04_latency_cdf.png", "04_kv_timeline.png"),
}


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 400 and height >= 300, (path, width, height)
    import matplotlib.image as mpimg

    rgb = (mpimg.imread(path)[..., :3] * 255).astype(np.uint32)
    colours = np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2])
    assert colours.size > 16, (path, colours.size)


def test_every_notebook_is_listed():
    assert sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.py")) == sorted(FIGURES)


def percent_cells(text: str) -> tuple[str, list[tuple[str, int, list[str]]]]:
    """Split a Jupytext percent script into its header and (kind, first line number, lines) cells."""
    header, cells = [], []
    for no, line in enumerate(text.splitlines(), 1):
        if line.startswith("# %%"):
            kind = "markdown" if line.strip() == "# %% [markdown]" else "code"
            assert kind == "markdown" or line.strip() == "# %%", (no, line)  # no other cell types/options
            cells.append((kind, no, []))
        elif cells:
            cells[-1][2].append(line)
        else:
            header.append(line)
    return "\n".join(header), cells


def test_notebooks_are_clean_percent_scripts():
    """What opens in Jupyter is what runs here: markdown cells hold only comments (code in one would be
    shown as text and never run), every code cell is valid Python on its own (Jupyter runs cells
    separately), the Jupytext header pairs the script with no stored-output .ipynb, and none is committed."""
    repo = NOTEBOOKS.parent
    for name in FIGURES:
        header, cells = percent_cells((NOTEBOOKS / name).read_text(encoding="utf-8"))
        assert "format_name: percent" in header and "formats: py:percent" in header, name
        assert "ipynb" not in header, name  # no paired notebook that would carry outputs
        assert cells[0][0] == "markdown" and any(k == "code" for k, _, _ in cells), name
        for kind, no, lines in cells:
            body = [ln for ln in lines if ln.strip()]
            assert body, f"{name}:{no}: empty cell"
            if kind == "markdown":
                bad = [ln for ln in body if not ln.startswith("#")]
                assert not bad, f"{name}:{no}: markdown cell holds code {bad[:2]}"
            else:
                compile("\n".join(lines), f"{name}:{no}", "exec")
    committed = [p for d in ("notebooks", "docs", "scripts", "tests") for p in (repo / d).rglob("*.ipynb")]
    committed += list(repo.glob("*.ipynb"))
    assert not committed, "commit the percent-format scripts, not .ipynb files"


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_notebook_runs(name, tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, JAXSIM_NOTEBOOK_OUT=str(out), MPLBACKEND="Agg")
    r = subprocess.run(
        [sys.executable, str(NOTEBOOKS / name)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert r.returncode == 0, r.stderr[-4000:]
    for fig in FIGURES[name]:
        assert (out / fig).is_file(), f"{name} did not write {fig}"
        assert_png(out / fig)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "notebooks write only under $JAXSIM_NOTEBOOK_OUT"
