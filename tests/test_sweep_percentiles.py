"""Percentile SLAs: [sla] takes median/p90/p99 TTFT/TPOT/E2E limits (observed: "unknown key"), the sweep
computes them over its workload mix, and --verify-top replays the best configurations and applies the
SLA to the replayed distribution."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from jaxsim.cli.main import app
from jaxsim.sla import SLA
from jaxsim.sweep import evaluate as ev
from jaxsim.sweep.spec import SpecError, load_spec
from jaxsim.sweep.verify import judge

ROOT = Path(__file__).resolve().parents[1]
PLANNER = ROOT / "configs" / "planner_qwen3_32b.toml"
runner = CliRunner()


def test_weighted_percentiles_are_the_inverse_cdf():
    v = jnp.asarray([300.0, 100.0, 200.0, 999.0])
    w = jnp.asarray([0.05, 0.5, 0.45, 0.0])  # the zero-weight class never counts
    np.testing.assert_array_equal(np.asarray(ev.weighted_percentiles(v, w)), [100.0, 200.0, 300.0])
    w = jnp.asarray([0.2, 0.8, 0.0, 0.0])
    np.testing.assert_array_equal(np.asarray(ev.weighted_percentiles(v, w)), [100.0, 300.0, 300.0])


def test_spec_takes_percentile_keys(tmp_path):
    s = load_spec(PLANNER)
    assert s.sla.p90_ttft_ms == 2000.0 and s.sla.min_tokens_per_s_per_user == 20.0
    assert s.sla.percentile_limits() == {"p90_ttft_ms": 2000.0}
    bad = tmp_path / "b.toml"
    bad.write_text(PLANNER.read_text().replace("p90_ttft_ms = 2000.0", "p95_ttft_ms = 2000.0"))
    with pytest.raises(SpecError, match=r"sla.p95_ttft_ms: unknown key .*p90_ttft_ms"):
        load_spec(bad)
    bad.write_text(PLANNER.read_text().replace("p90_ttft_ms = 2000.0", "p90_ttft_ms = -1"))
    with pytest.raises(SpecError, match="sla.p90_ttft_ms"):
        load_spec(bad)


def test_compiled_bounds_are_the_sla_field_for_field():
    s = SLA(mean_tpot_ms=40.0, min_tokens_per_s_per_user=12.5, p90_ttft_ms=2000.0, p99_e2e_ms=9000.0)
    b = ev.SLABounds.of(s)
    assert list(vars(b)) == list(vars(s))  # one vocabulary: the same keys, in the same order
    for k, v in vars(s).items():
        unset = 0.0 if k == "min_tokens_per_s_per_user" else np.inf
        assert float(getattr(b, k)) == (unset if v is None else v)
    grid = np.asarray(b.latency_ms())  # [metric, stat], metric-major like LATENCY_KEYS
    assert grid[0, 2] == 2000.0 and grid[1, 0] == 40.0 and grid[2, 3] == 9000.0
    assert np.isinf(np.delete(grid.ravel(), [2, 4, 11])).all()
    assert all(np.isinf(float(x)) or float(x) == 0.0 for x in vars(ev.SLABounds.of()).values())


def _sweep(tmp_path, sla: str, *extra):
    spec = tmp_path / "s.toml"
    # the measured profile: smaller tables, faster compiles (the walk-through uses the calibrated one)
    text = PLANNER.read_text().replace('"qwen3-32b-bf16-b300-calibrated"', '"qwen3-32b-bf16-b300"')
    text = text.split("[sla]")[0] + "[sla]\n" + sla + "\n"
    text = text.replace('isl = 4096\nosl = 512', 'requests = [[2048, 256, 0.5], [4096, 512, 0.4], [6144, 512, 0.1]]')
    spec.write_text(text)
    out = tmp_path / "o.parquet"
    r = runner.invoke(app, ["sweep", str(spec), "--output", str(out), "--json", "--quiet", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), pq.read_table(out).to_pandas()


def test_percentiles_over_the_mix_decide_feasibility(tmp_path):
    _, t = _sweep(tmp_path, "")
    ok = t[t.status < 16]
    assert len(ok) > 0
    # p50 <= p90 <= p99 and the mean lies between the extreme classes
    for m in ("ttft", "tpot", "e2e"):
        assert (ok[f"median_{m}_ms"] <= ok[f"p90_{m}_ms"] + 1e-9).all() and (ok[f"p90_{m}_ms"] <= ok[f"p99_{m}_ms"] + 1e-9).all()
    # the 10 % 6k class is p99 and above p90: a limit between them splits the configurations
    assert (ok.p99_ttft_ms > ok.p90_ttft_ms).all()
    row = ok.iloc[0]
    lim = float((row.p90_ttft_ms + row.p99_ttft_ms) / 2)
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    _, t2 = _sweep(tmp_path / "x", f"p90_ttft_ms = {lim}")
    _, t3 = _sweep(tmp_path / "y", f"p99_ttft_ms = {lim}")
    cid = int(row.config_id)
    assert bool(t2.set_index("config_id").loc[cid, "sla_ok"]) and not bool(t3.set_index("config_id").loc[cid, "sla_ok"])
    np.testing.assert_array_equal(t2.sla_ok.to_numpy(), (t2.status < 16).to_numpy() & (t2.p90_ttft_ms <= lim).to_numpy())


def test_judge_applies_the_sla_and_the_tolerance_to_a_replay():
    from jaxsim.kernels import status as st

    row = {"mean_ttft_ms": 500.0, "mean_tpot_ms": 40.0, "mean_e2e_ms": 5000.0, "output_tokens_per_s_per_gpu": 100.0,
           "p90_ttft_ms": 880.0}
    rep = {**row, "p90_ttft_ms": 910.0, "tokens_per_s_per_user": 25.0, **{k: 1.0 for k in ("median_ttft_ms", "p99_ttft_ms")}}
    dev, ok, why = judge(rep, st.COMPLETED, "completed", "", row, SLA(p90_ttft_ms=900.0, min_tokens_per_s_per_user=20.0))
    assert not ok and "replayed p90 TTFT 910.0 ms > 900.0" in why and dev["dev_p90_ttft_ms"] == pytest.approx(30 / 880)
    dev, ok, why = judge(rep, st.COMPLETED, "completed", "", row, SLA(p90_ttft_ms=910.0, min_tokens_per_s_per_user=20.0))
    assert ok and why == "" and dev["dev_mean_ttft_ms"] == 0.0
    dev, ok, why = judge({**rep, "mean_ttft_ms": 700.0}, st.COMPLETED, "completed", "", row, SLA(min_tokens_per_s_per_user=30.0))
    assert not ok and "25.0 tok/s/user < 30.0" in why and "differs from the row by more than 20%: mean TTFT +40%" in why
    dev, ok, why = judge(rep, 17, "stopped: x", "decode(batch=1, kv=5)", row, SLA())
    assert not ok and "stopped: x at decode(batch=1, kv=5)" in why


def test_verify_top_replays_the_best_rows(tmp_path):
    """One batched replay of the best configuration per workload, at its own load (lengths from --trace
    when given); the verdict and why are written."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_ms,input_length,output_length\n0,4096,8\n50,4096,8\n")
    rep, _ = _sweep(tmp_path, "p90_ttft_ms = 2000.0", "--verify-top", "1", "--trace", str(trace), "--allow-unverified")
    v = rep["verified"]
    assert len(v) == 1 and v[0]["config_id"] == rep["top"][0]["config_id"]
    conc = rep["top"][0]["concurrency_target"] * rep["top"][0]["replicas"]
    assert v[0]["requests"] == 10 * conc and v[0]["load"] == f"closed loop: {conc} clients, {10 * conc} prompts"
    assert isinstance(v[0]["verified"], bool) and v[0]["verified"] == (v[0]["why"] == "")
    assert pq.read_table(rep["verified_output"]).num_rows == 1


@pytest.mark.parametrize("args, needle", [
    (["--trace", "mooncake_tiny"], "--trace gives --verify-top's request lengths; add --verify-top N"),
    (["--verify-top", "0"], "--verify-top: must be an integer >= 1"),
    (["--verify-top", "1", "--trace", "nope.csv"], "nope.csv"),
    (["--verify-top", "1", "--verify-tolerance", "0"], "--verify-tolerance: must be a positive number"),
])
def test_verify_top_bad_input(tmp_path, args, needle):
    out = tmp_path / "o.parquet"
    r = runner.invoke(app, ["sweep", str(PLANNER), "--output", str(out), *args])
    assert r.exit_code == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()
