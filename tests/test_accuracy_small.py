"""The accuracy protocol (jaxsim.accuracy, behind scripts/accuracy.py) on a small real excerpt (Qwen3-32B TP1, 1,200 passes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from jaxsim import accuracy as acc
from jaxsim.importers.fpm_log import read_fpm_log

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "tests" / "data" / "fpm_qwen3_32b_tp1_excerpt" / "fpm_metrics_detail.csv"




@pytest.fixture(scope="module")
def log():
    return read_fpm_log(LOG)


@pytest.fixture(scope="module")
def blocked(log):
    return acc.evaluate_split(log, acc.time_split(len(log), mode="blocked", window=100, train_fraction=0.7))


def test_time_splits_hold_out_contiguous_stretches(log):
    train = acc.time_split(len(log), mode="blocked", window=100, train_fraction=0.7)
    assert train.sum() == 840 and np.all(train[:70]) and not np.any(train[70:100])
    chrono = acc.time_split(len(log), mode="chronological", train_fraction=0.7)
    assert chrono.sum() == 840 and np.all(chrono[:840]) and not np.any(chrono[840:])


def test_held_out_decode_is_covered_and_accurate(blocked):
    d = blocked["decode"]
    assert d["n"] > 300
    assert d["coverage"] >= 0.9
    assert d["median_ape"] <= 1.0
    assert d["p90_ape"] <= 4.0
    assert blocked["admission_mis_split"]  # learned from the training split alone


def test_paired_mixed_scoring_repairs_the_mis_split_boundary(log, blocked):
    whole, paired = blocked["mixed_all"], blocked["mixed_all_paired"]
    assert paired["pairs"] > 0 and paired["covered"] == whole["covered"]
    assert paired["median_ape"] < whole["median_ape"]
    assert paired["median_ape"] <= 10.0


def test_held_out_rows_never_reach_the_table(log, blocked):
    train = acc.time_split(len(log), mode="blocked", window=100, train_fraction=0.7)
    lat = log.latency_ms.copy()
    lat[~train] *= 3.0
    from dataclasses import replace

    worse = acc.evaluate_split(replace(log, latency_ms=lat), train)
    assert worse["decode"]["covered"] == blocked["decode"]["covered"]
    # predictions unchanged, measurements tripled: |p / 3m - 1| ~ 2/3 for every supported held-out pass
    assert worse["decode"]["median_ape"] == pytest.approx(100 * (1 - (1 + blocked["decode"]["median_ape"] / 100) / 3), abs=1.0)

