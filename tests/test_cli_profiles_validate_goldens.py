"""``jaxsim profiles validate`` refuses every folder-detectable reference rejection and passes the goldens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jaxsim.cli.main import app

GOLDENS = Path(__file__).parent / "goldens" / "public"
CASES = json.loads((GOLDENS / "rejections.json").read_text())["cases"]
LATER_OPS = {"config_set", "config_delete", "config_set_fn", "query"}
FOLDER_CASES = [c["id"] for c in CASES if not {ch["op"] for ch in c["changes"]} <= LATER_OPS]
runner = CliRunner()


@pytest.mark.parametrize("table", ["ar_core", "ar_decoy", "sd_k3", "sd_k2"])
def test_golden_tables_validate(table):
    res = runner.invoke(app, ["profiles", "validate", str(GOLDENS / "tables" / table)])
    assert res.exit_code == 0, res.output


def test_every_folder_variant_is_refused_with_one_line_per_problem():
    assert len(FOLDER_CASES) == 59
    for case_id in FOLDER_CASES:
        res = runner.invoke(app, ["profiles", "validate", str(GOLDENS / "rejections" / case_id)])
        assert res.exit_code == 2, (case_id, res.output)
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert lines and "Traceback" not in res.output, case_id
