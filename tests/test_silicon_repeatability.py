"""scripts/silicon_repeatability.py: each run of a configuration measured more than once against the others' mean."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

rep = pytest.importorskip("silicon_repeatability")


def _row(system, ttft, tpot, conc="4", isl="1024"):
    return {"model_path": "m", "system": system, "gemm_quant_mode": "fp8", "moe_quant_mode": "", "tp_size": "2", "moe_tp_size": "",
            "moe_ep_size": "", "isl": isl, "osl": "1024", "batch_size": conc, "attention_dp_size": "", "silicon_ttft_ms": str(ttft),
            "silicon_tpot_ms": str(tpot)}


def test_runs_are_scored_against_the_other_runs_and_copies_left_out():
    rows = [_row("b200_sxm", 100, 10), _row("b200_sxm", 50, 10), _row("b200_sxm", 50, 10),  # a copy of the second run
            _row("b200_sxm", 80, 8, conc="8"),  # measured once: not scored
            _row("h200_sxm", 90, 9), _row("h200_sxm", 110, 11, isl="8192")]  # another GPU, another ISL
    s = rep.repeatability(rows, ("b200_sxm",))
    assert (s["configs"], s["runs"], s["copies"]) == (1, 2, 1)
    assert np.allclose(sorted(s["ttft"]), [50.0, 100.0]) and np.allclose(s["tpot"], 0.0)
    everywhere = rep.repeatability(rows, None)
    assert (everywhere["configs"], everywhere["runs"]) == (1, 2)
    three = rep.repeatability([_row("gb200", 100, 10), _row("gb200", 200, 20), _row("gb200", 300, 30)], None)
    assert np.allclose(three["ttft"], [abs(100 / 250 - 1) * 100, 0.0, abs(300 / 150 - 1) * 100])
