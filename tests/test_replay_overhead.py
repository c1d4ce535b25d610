"""Serving overhead in plain ``jaxsim replay`` (issue 27): a deployment config's ``overhead`` key (inline, with
provenance, or the JSON ``jaxsim calibrate --benchmark`` writes) is added per request on the host after the
replay, as the sweep adds it: TTFT + fixed + per prompt token x ISL, each later token + per output token;
throughput unchanged; shown in the summary table and the JSON."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_cli_replay import CASE, _materialize
from typer.testing import CliRunner

from jaxsim.cli.main import app
from jaxsim.errors import BindingError
from jaxsim.overhead import ServingOverhead
from jaxsim.rules.config import config_from_dict, load_config

runner = CliRunner()
OV = {"fixed_ms": 40.0, "per_prompt_token_ms": 0.01, "per_output_token_ms": 1.5}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("ov")
    cfg, trace = _materialize(CASE, root)
    with_ov = root / "with_overhead.toml"
    text = cfg.read_text().replace("[roles.aggregated]", "overhead = { fixed_ms = 40.0, per_prompt_token_ms = 0.01, per_output_token_ms = 1.5 }\n\n"
                                   "[roles.aggregated]")
    with_ov.write_text(text)
    return cfg, with_ov, trace


def _run(cfg, trace, out, *extra):
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--output", str(out), "--no-progress", "--json", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.output[r.output.index("{"):])["replays"][0], pq.read_table(out).to_pydict()


def test_config_overhead_key_inline_file_and_errors(tmp_path):
    base = {"model": "m", "system": "h200_sxm"}
    assert config_from_dict(base).overhead == ServingOverhead()
    c = config_from_dict({**base, "overhead": OV}, source="dep.toml")
    assert c.overhead.terms == (40.0, 0.01, 1.5) and c.overhead.provenance == "set in dep.toml"
    fitted = {"overhead": {**OV, "provenance": "fitted from bench.json (12 rows, TP1)"}, "fit": {}}
    (tmp_path / "ov.json").write_text(json.dumps(fitted))
    (tmp_path / "dep.toml").write_text('model = "m"\nsystem = "h200_sxm"\noverhead = "ov.json"\n')
    c = load_config(tmp_path / "dep.toml")  # relative to the config's folder
    assert c.overhead.terms == (40.0, 0.01, 1.5) and c.overhead.provenance.startswith("fitted from bench.json")
    for bad, needle in (({**OV, "fixed_ms": -1}, "fixed_ms"), ({"per_token_ms": 1}, "per_token_ms"), ("missing.json", "missing.json")):
        with pytest.raises(BindingError) as e:
            config_from_dict({**base, "overhead": bad}, source="dep.toml")
        assert str(e.value).startswith("dep.toml: ") and needle in str(e.value) and "\n" not in str(e.value)


def test_replay_adds_the_overhead_per_request_and_keeps_throughput(setup, tmp_path):
    cfg, with_ov, trace = setup
    s0, t0 = _run(cfg, trace, tmp_path / "a.parquet", "--max-concurrency", "2")
    s1, t1 = _run(with_ov, trace, tmp_path / "b.parquet", "--max-concurrency", "2")
    assert s0["overhead"] is None
    assert s1["overhead"]["fixed_ms"] == 40.0 and "set in" in s1["overhead"]["provenance"]
    done = np.array(t0["terminal"]) == "completed"
    assert done.any() and (np.array(t1["terminal"]) == np.array(t0["terminal"])).all()
    isl = np.array(t0["input_tokens"], np.float64)
    later = np.maximum(np.array(t0["generated_tokens"]) - 1, 0)
    np.testing.assert_allclose(np.array(t1["ttft_ms"])[done], (np.array(t0["ttft_ms"]) + 40.0 + 0.01 * isl)[done], rtol=0, atol=1e-9)
    np.testing.assert_allclose(np.array(t1["e2e_ms"])[done], (np.array(t0["e2e_ms"]) + 40.0 + 0.01 * isl + 1.5 * later)[done],
                               rtol=0, atol=1e-9)
    multi = done & (later > 0)
    np.testing.assert_allclose(np.array(t1["tpot_ms"])[multi], (np.array(t0["tpot_ms"]) + 1.5)[multi], rtol=0, atol=1e-9)
    for k in ("first_token_ms", "last_token_ms", "sent_ms"):  # the engine's timeline is unchanged
        assert t1[k] == t0[k]
    for k in ("output_throughput_tok_s", "request_throughput_rps", "duration_ms", "preemptions"):
        assert s1[k] == s0[k]
    assert s1["mean_ttft_ms"] == pytest.approx(float(np.mean(np.array(t1["ttft_ms"])[done])), rel=1e-12)
    assert s1["mean_tpot_ms"] == pytest.approx(float(np.mean(np.array(t1["tpot_ms"])[multi])), rel=1e-12)
    assert s1["mean_token_gap_ms"] == pytest.approx(s0["mean_token_gap_ms"] + 1.5, rel=1e-12)
    assert s1["mean_itl_ms"] > s0["mean_itl_ms"] and s1["std_itl_ms"] == s0["std_itl_ms"]


def test_replay_table_names_the_overhead(setup, tmp_path):
    _, with_ov, trace = setup
    r = runner.invoke(app, ["replay", str(with_ov), "--trace", str(trace), "--output", str(tmp_path / "c.parquet"), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "latencies include the serving overhead 40 ms + 0.01 ms/prompt token (TTFT) + 1.5 ms/output token" in " ".join(r.output.split())
