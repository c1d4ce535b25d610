"""Bounds: every numeric input has a documented range checked before work starts (docs/limits.md);
the cases observed in issue 12 each get a one-line refusal with exit 2, never a traceback or a lie."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jaxsim import limits
from jaxsim.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
AGG = ROOT / "configs" / "deployment_aggregated.toml"


def _one_line_error(res, *needles):
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in res.output, err
    for n in needles:
        assert n in err, err


def test_docs_table_is_generated_from_limits():
    text = (ROOT / "docs" / "limits.md").read_text(encoding="utf-8")
    table = re.search(r"<!-- limits-table -->\n(.*?)\n<!-- /limits-table -->", text, re.S).group(1)
    assert table == limits.docs_table()


@pytest.mark.parametrize("key, bad, good", [
    ("replicas", [0, 1025, 10**12, 1.5, True], [1, 1024]),
    ("tokens", [0, -5, 10**7 + 1, 99999999999999999999], [1, 10**7]),
    ("rate", [0, -1.0, float("nan"), float("inf"), 1e7], [1e-9, 1e6]),
])
def test_ranges(key, bad, good):
    for v in bad:
        assert limits.problem(key, v) is not None, v
    for v in good:
        assert limits.problem(key, v) is None, v


def _config(tmp_path, old: str = "", new: str = "") -> Path:
    text = AGG.read_text()
    assert old in text
    p = tmp_path / "c.toml"
    p.write_text(text.replace(old, new, 1))
    return p


@pytest.mark.parametrize("old, new, needle", [
    ("", "", None),
    ("replicas = 1\n", "replicas = 1000000000000\n", "roles.aggregated.replicas: must be an integer >= 1 and <= 1,024"),
    ("tp = 1 ", "tp = 4096 ", "roles.aggregated.tp"),
    ("replicas = 1\n", "replicas = 1\nmax_num_seqs = 99999999999999999999\n", "roles.aggregated.max_num_seqs"),
    ("block_size = 64", "block_size = 100000", "block_size"),
    ("block_size = 64", "block_size = 64\ncontext_length = 99999999999", "context_length"),
    ("block_size = 64", "block_size = 64\ngpu_memory_bytes = 99999999999999999", "gpu_memory_bytes"),
])
def test_config_numbers_are_bounded(tmp_path, old, new, needle):
    """Observed: replicas = 1e12 made replay grow to 24 GB and capacity print 156e12, exit 0."""
    cfg = _config(tmp_path, old, new)
    res = runner.invoke(app, ["capacity", str(cfg), "--isl", "4096", "--osl", "512"])
    if needle is None:
        assert res.exit_code == 0, res.output
    else:
        _one_line_error(res, needle)
        res = runner.invoke(app, ["validate", str(cfg)])  # validate lists problems per file on stdout
        assert res.exit_code == 2 and needle in res.stdout and "Traceback" not in res.output


def test_gpu_total_is_bounded(tmp_path):
    cfg = _config(tmp_path, "replicas = 1\n", "replicas = 1024\n")
    cfg.write_text(cfg.read_text().replace("tp = 1 ", "tp = 128 "))
    _one_line_error(runner.invoke(app, ["capacity", str(cfg)]), "the deployment's GPUs", "65,536")


@pytest.mark.parametrize("isl, osl, needle", [
    ("99999999999999999999", "1", "--isl: must be an integer >= 1 and <= 10,000,000"),
    ("100000000", "1", "--isl"),
    ("40000", "2000", "42,000 tokens exceeds the deployment's context length 40,960"),
    ("-1", "5", "--isl"),
    ("5", "0", "--osl"),
])
def test_capacity_refuses_impossible_requests(isl, osl, needle):
    """Observed: an OverflowError traceback; concurrency 17 over the context; concurrency 0; all exit 0."""
    _one_line_error(runner.invoke(app, ["capacity", str(AGG), "--isl", isl, "--osl", osl]), needle)


def test_capacity_warns_beyond_measured_batches():
    """Observed: concurrency 364 reported with no hint that measured decode stops at batch 32."""
    res = runner.invoke(app, ["capacity", str(AGG), "--isl", "4096", "--osl", "512"])
    assert res.exit_code == 0, res.output
    assert "exceeds the largest measured decode batch 32" in res.stderr
    rep = json.loads(runner.invoke(app, ["capacity", str(AGG), "--isl", "4096", "--osl", "512", "--json"]).stdout)
    assert rep["roles"]["aggregated"]["max_measured_decode_batch"] == 32


@pytest.mark.parametrize("args, needle", [
    (["--isl", "fixed:-5"], "fixed lengths must be integers in 1..10,000,000"),
    (["--osl", "uniform:0:10"], "uniform lengths must be integers"),
    (["--isl", "normal:-3:1"], "the mean must be in"),
    (["--n", "100000000"], "--n: must be an integer >= 1 and <= 10,000,000"),
    (["--n", "0"], "--n"),
    (["--rate", "inf"], "--rate"),
    (["--seed", "-1"], "--seed"),
])
def test_trace_synth_bounds(tmp_path, args, needle):
    """Observed: --isl fixed:-5 wrote length 1, exit 0; --n 1e8 wrote 785 MB."""
    out = tmp_path / "t.csv"
    _one_line_error(runner.invoke(app, ["trace", "synth", "--output", str(out), *args]), needle)
    assert not out.exists()


def test_trace_file_lengths_bounded(tmp_path):
    t = tmp_path / "t.csv"
    t.write_text("arrival_ms,input_length,output_length\n0,10,5\n1,99999999999,5\n")
    res = runner.invoke(app, ["replay", str(AGG), "--trace", str(t), "--output", str(tmp_path / "o.parquet")])
    _one_line_error(res, "row 2", "input_length", "10,000,000")


@pytest.mark.parametrize("edit, needle", [
    (("concurrency = [", "concurrency = [100000000, "), "scheduler.concurrency[0]"),
    (("isl = [3072, 4096]", "isl = [3072, 99999999999]"), "workload[0].isl[1]"),
    (("gpu_budget = 8 ", "gpu_budget = 99999999 "), "gpu_budget"),
    (('ratios = ["1:1"', 'ratios = ["1:100000"'), "serving.ratios[0]"),
])
def test_sweep_spec_bounds(tmp_path, edit, needle):
    spec = (ROOT / "configs" / "quickstart.toml").read_text()
    assert edit[0] in spec
    p = tmp_path / "s.toml"
    p.write_text(spec.replace(edit[0], edit[1], 1))
    out = tmp_path / "o.parquet"
    _one_line_error(runner.invoke(app, ["sweep", str(p), "--output", str(out)]), needle)
    assert not out.exists()


def test_replay_with_huge_replicas_is_refused_before_work(tmp_path):
    """Observed: replicas = 1e12 made jaxsim replay grow to 24 GB and be killed after 335 s."""
    import time

    cfg = _config(tmp_path, "replicas = 1\n", "replicas = 1000000000000\n")
    t = tmp_path / "t.csv"
    t.write_text("arrival_ms,input_length,output_length\n0,600,40\n1,700,40\n")
    out = tmp_path / "o.parquet"
    t0 = time.perf_counter()
    res = runner.invoke(app, ["replay", str(cfg), "--trace", str(t), "--output", str(out)])
    _one_line_error(res, "roles.aggregated.replicas: must be an integer >= 1 and <= 1,024")
    assert not out.exists() and time.perf_counter() - t0 < 60  # refused before any compilation
