"""``jaxsim trace list|synth`` and the README's in-support replay walk-through."""

from __future__ import annotations

import csv
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from jaxsim.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_trace_list_names_every_bundled_trace():
    res = runner.invoke(app, ["trace", "list"])
    assert res.exit_code == 0, res.output
    for name in ("azure_code_1k", "azure_conv_1k", "mooncake_conversation_1k", "mooncake_tiny"):
        assert name in res.output


def test_synth_writes_a_plain_trace_with_requested_lengths(tmp_path):
    out = tmp_path / "t.csv"
    res = runner.invoke(
        app, ["trace", "synth", "--n", "50", "--rate", "2", "--cv", "0.5", "--isl", "uniform:100:200", "--osl", "fixed:7", "--output", str(out)]
    )
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 50 and rows[0]["arrival_ms"] == "0.0"
    arr = [float(r["arrival_ms"]) for r in rows]
    assert arr == sorted(arr) and 15_000 < arr[-1] < 35_000  # ~49 gaps of 500 ms
    assert all(100 <= int(r["input_length"]) <= 200 and r["output_length"] == "7" for r in rows)
    res = runner.invoke(app, ["trace", "synth", "--output", str(out)])
    assert res.exit_code == 2 and "--force" in res.output


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--rate", "0"], "--rate: must be"),
        (["--cv", "-1"], "--cv: must be"),
        (["--isl", "weird:1"], "input_len"),
        (["--output", "t.txt"], ".csv file name"),
    ],
)
def test_synth_bad_input_one_line(tmp_path, args, msg):
    base = ["trace", "synth", "--output", str(tmp_path / "t.csv")]
    res = runner.invoke(app, base + args if "--output" not in args else ["trace", "synth", *args])
    assert res.exit_code == 2 and msg in res.output and len(res.output.strip().splitlines()) == 1


def test_readme_in_support_replay_completes(tmp_path):
    trace = tmp_path / "t.csv"
    res = runner.invoke(
        app,
        [
            "trace",
            "synth",
            "--n",
            "60",
            "--rate",
            "1",
            "--cv",
            "0.1",
            "--isl",
            "uniform:400:8000",
            "--osl",
            "uniform:32:1000",
            "--output",
            str(trace),
        ],
    )
    assert res.exit_code == 0, res.output
    out = tmp_path / "replay.parquet"
    res = runner.invoke(app, ["replay", str(ROOT / "configs" / "deployment_llama_h200.toml"), "--trace", str(trace), "--output", str(out)])
    assert res.exit_code == 0, res.output
    t = pq.read_table(out).to_pylist()
    assert len(t) == 60
    ttft = [r["ttft_ms"] for r in t]
    assert all(x is not None and x > 0 for x in ttft)
