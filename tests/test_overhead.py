"""Serving overhead (issue 27, Deliver 3): the model, its fit, `jaxsim calibrate --benchmark`, and a sweep spec's
[[profile]] overhead. The benchmark files here are synthetic: the calibrated Qwen3-32B B300 profile's own
steady-state predictions plus a known overhead, so the fit must recover it exactly."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import jaxsim._jax  # noqa: F401  (turns x64 on)
from jaxsim.cli.main import app
from jaxsim.overhead import BenchmarkRow, OverheadError, ServingOverhead, fit_overhead, read_benchmark, read_overhead
from jaxsim.profile.resolve import resolve_profile_dir
from jaxsim.sweep import run_sweep
from jaxsim.sweep.spec import spec_from_dict

PROFILE = "qwen3-32b-bf16-b300-calibrated"
KNOWN = (12.0, 0.02, 0.15)
runner = CliRunner()


def test_fit_recovers_a_known_overhead_and_keeps_terms_non_negative():
    rng = np.random.default_rng(0)
    isl = rng.integers(128, 8192, 40).astype(float)
    pt, pp = rng.uniform(20, 2000, 40), rng.uniform(5, 40, 40)
    ov = fit_overhead(isl, pt, pp, pt + KNOWN[0] + KNOWN[1] * isl, pp + KNOWN[2], "synthetic")
    assert ov.terms == pytest.approx(KNOWN, rel=1e-9)
    # measured below the predictions: no negative overhead
    ov = fit_overhead(isl, pt, pp, pt * 0.9, pp * 0.9, "synthetic")
    assert ov.terms == (0.0, 0.0, 0.0)
    with pytest.raises(OverheadError, match="at least 4 rows"):
        fit_overhead(isl[:3], pt[:3], pp[:3], pt[:3], pp[:3], "synthetic")


def test_overhead_values_are_checked():
    with pytest.raises(OverheadError, match="fixed_ms=-1"):
        ServingOverhead(fixed_ms=-1.0)
    with pytest.raises(OverheadError, match="unknown overhead key 'fixed'"):
        read_overhead({"fixed": 1.0}, "spec [[profile]] 1")


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """A synthetic vllm bench serve --save-result JSONL (20 closed-loop runs, TP2 on B300)."""
    from jaxsim.sweep.benchmark_fit import predict_rows

    rows = [BenchmarkRow(f"r{i}", isl, osl, c, 1.0, 1.0) for i, (c, isl, osl) in
            enumerate((c, i, o) for c in (1, 4, 8, 16, 32) for i in (1024, 4096) for o in (256, 512))]
    ttft, tpot, _ = predict_rows(resolve_profile_dir(PROFILE), rows, 2)
    assert np.isfinite(ttft).all() and np.isfinite(tpot).all()
    d = tmp_path_factory.mktemp("bench")
    path = d / "bench.jsonl"
    a, b, c = KNOWN
    with path.open("w") as f:
        for r, t1, t2 in zip(rows, ttft, tpot):
            n = 10 * r.concurrency
            f.write(json.dumps({"model_id": "Qwen/Qwen3-32B", "max_concurrency": r.concurrency, "completed": n,
                                "total_input_tokens": n * r.isl, "total_output_tokens": n * r.osl, "mean_ttft_ms": t1 + a + b * r.isl,
                                "mean_tpot_ms": t2 + c, "tp": 2, "system": "b300_sxm"}) + "\n")
    return path


def test_calibrate_benchmark_fits_writes_and_prints_held_out_error(bench, tmp_path):
    out = tmp_path / "ov.json"
    r = runner.invoke(app, ["calibrate", PROFILE, "--benchmark", str(bench), "--output", str(out)])
    assert r.exit_code == 0, r.output
    assert "held-out (6 rows)" in r.output and "-> 0.0/0.0 %" in r.output
    doc = json.loads(out.read_text())
    assert (doc["overhead"]["fixed_ms"], doc["overhead"]["per_prompt_token_ms"], doc["overhead"]["per_output_token_ms"]) == \
        pytest.approx(KNOWN, rel=1e-6)
    assert doc["overhead"]["provenance"].startswith(f"fitted from {bench}")
    assert doc["fit"] == {"rows": 20, "predicted": 20, "train": 14, "held_out": 6}
    # refused: it exists
    r = runner.invoke(app, ["calibrate", PROFILE, "--benchmark", str(bench), "--output", str(out)])
    assert r.exit_code == 2 and "exists" in r.output


def test_calibrate_benchmark_with_async_scheduling_fits_the_async_predictions(bench, tmp_path):
    """The rows were made from the synchronous predictions: predicted with async scheduling (each later prompt waits
    the passes scheduled ahead), the fitted TTFT overhead is smaller; the file and its provenance say how it was fitted."""
    out = tmp_path / "ov-async.json"
    r = runner.invoke(app, ["calibrate", PROFILE, "--benchmark", str(bench), "--output", str(out), "--async-scheduling"])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    ov = doc["overhead"]
    assert doc["async_scheduling"] is True and "async scheduling" in ov["provenance"]
    a, b, _ = KNOWN
    assert ov["fixed_ms"] + ov["per_prompt_token_ms"] * 2048 < a + b * 2048


def _write(path, lines):
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(model_id="meta-llama/Llama-3.1-8B"), "measures model meta-llama/Llama-3.1-8B"),
    (lambda d: d.update(system="h100_sxm"), "measures system h100_sxm"),
    (lambda d: d.update(tp=8), "measures TP 8"),
    (lambda d: d.pop("max_concurrency"), "no max_concurrency"),
    (lambda d: d.pop("mean_ttft_ms"), "no 'mean_ttft_ms'"),
])
def test_bad_benchmark_files_are_one_line_exit_2_nothing_written(bench, tmp_path, edit, message):
    lines = [json.loads(x) for x in bench.read_text().splitlines()]
    for d in lines:
        edit(d)
    f = _write(tmp_path / "bad.jsonl", lines)
    out = tmp_path / "ov.json"
    r = runner.invoke(app, ["calibrate", PROFILE, "--benchmark", str(f), "--output", str(out)])
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output
    assert not out.exists()


def test_too_few_rows_is_refused(bench, tmp_path):
    f = _write(tmp_path / "few.jsonl", [json.loads(x) for x in bench.read_text().splitlines()[:3]])
    out = tmp_path / "ov.json"
    r = runner.invoke(app, ["calibrate", PROFILE, "--benchmark", str(f), "--output", str(out)])
    assert r.exit_code == 2 and "at least 4 rows" in r.stderr and not out.exists()


def test_silicon_sample_rows_are_read_and_filtered(tmp_path):
    f = tmp_path / "s.csv"
    head = "id,backend,mode,model_path,system,isl,osl,batch_size,tp_size,silicon_ttft_ms,silicon_tpot_ms"
    f.write_text(head + "\nx,vllm,agg,Qwen/Qwen3-32B,b300_sxm,1024,128,8,2,100.5,9.5\n"
                 "y,trtllm,agg,Qwen/Qwen3-32B,b300_sxm,1024,128,8,2,1,1\nz,vllm,agg,Qwen/Qwen3-32B,b200_sxm,4096,256,4,1,50,5\n")
    rows = read_benchmark(f)
    assert [(r.name, r.isl, r.osl, r.concurrency, r.tp, r.system) for r in rows] == [
        ("x", 1024, 128, 8, 2, "b300_sxm"), ("z", 4096, 256, 4, 1, "b200_sxm")]
    (tmp_path / "bad.csv").write_text("id,isl\n1,2\n")
    with pytest.raises(OverheadError, match="no column 'model_path'"):
        read_benchmark(tmp_path / "bad.csv")


def test_a_spec_overhead_adds_to_ttft_and_tpot_only(tmp_path):
    ov = {"fixed_ms": 10.0, "per_prompt_token_ms": 0.01, "per_output_token_ms": 0.2}
    base = {"name": "ov", "profile": [{"name": PROFILE, "tp": [2]}], "serving": {"mode": ["aggregated"]},
            "scheduler": {"concurrency": [1, 8]}, "workload": [{"name": "m", "requests": [[1024, 128, 1], [4096, 256, 1]]}]}
    with_ov = json.loads(json.dumps(base))
    with_ov["profile"][0]["overhead"] = ov
    a = pq.read_table(run_sweep(spec_from_dict(base, source="a.toml"), tmp_path / "a.parquet").output).to_pylist()
    (tmp_path / "ov.json").write_text(json.dumps({"overhead": dict(ov, provenance="fitted from x")}))
    with_file = json.loads(json.dumps(base))
    with_file["profile"][0]["overhead"] = "ov.json"
    for spec in (with_ov, with_file):
        b = pq.read_table(run_sweep(spec_from_dict(spec, source="b.toml", base_dir=tmp_path), tmp_path / "b.parquet", force=True).output).to_pylist()
        for x, y in zip(a, b):
            assert y["mean_ttft_ms"] == pytest.approx(x["mean_ttft_ms"] + 10.0 + 0.01 * (1024 + 4096) / 2, rel=1e-12)
            assert y["mean_tpot_ms"] == pytest.approx(x["mean_tpot_ms"] + 0.2, rel=1e-12)
            assert y["output_tokens_per_s_per_gpu"] == x["output_tokens_per_s_per_gpu"]


def test_nonneg_wls_is_the_best_nonnegative_fit():
    """Against a grid search: no non-negative coefficients fit the weighted rows better, and a coefficient the data
    would make negative is 0."""
    from jaxsim.overhead import nonneg_wls

    rng = np.random.default_rng(4)
    x = np.abs(rng.normal(size=(40, 3))) + 0.1
    y = x @ np.array([2.0, -1.5, 0.7]) + rng.normal(scale=0.05, size=40)
    w = rng.uniform(0.5, 2.0, size=40)
    beta = nonneg_wls(x, y, w)
    assert np.all(beta >= 0) and beta[1] == 0.0
    cost = lambda b: float(np.sum(w * (x @ b - y) ** 2))  # noqa: E731
    grid = np.linspace(0.0, 3.0, 31)
    best_grid = min(cost(np.array([a, b, c])) for a in grid for b in grid for c in grid)
    assert cost(beta) <= best_grid + 1e-12
