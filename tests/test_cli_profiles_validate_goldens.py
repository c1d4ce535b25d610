"""``jaxsim profiles validate`` refuses every folder-detectable reference rejection and passes the goldens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_profile_rejections import EXPECTED  # the rule each rejections.json case must be refused for
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


def test_every_folder_variant_is_refused_for_its_rule_with_one_line_per_problem():
    assert len(FOLDER_CASES) == 59 and sorted(FOLDER_CASES) == sorted(EXPECTED)
    for case_id in FOLDER_CASES:
        folder = GOLDENS / "rejections" / case_id
        res = runner.invoke(app, ["profiles", "validate", str(folder)])
        assert res.exit_code == 2, (case_id, res.output)
        assert "Traceback" not in res.output, case_id
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        # problem lines name a file of this folder; the last line is the summary
        *problems, summary = lines
        assert problems and summary.startswith("error: ") and f"{len(problems)} problem(s)" in summary, (case_id, lines)
        assert all(ln.startswith(str(folder) + "/") for ln in problems), (case_id, problems)
        # refused for the case's rule, not for some other reason
        assert any(EXPECTED[case_id] in ln for ln in problems), (case_id, EXPECTED[case_id], problems)
