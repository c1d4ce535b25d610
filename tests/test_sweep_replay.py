"""Sweeps evaluated by replay (evaluate = "replay"), closed-loop replay against a hand-built sequential
case, verification at each row's own load, and the benchmark-load CLI (jaxsim replay --load, jaxsim
sweep --evaluate replay / --verify-top without a trace), bad input included."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from replay_support import pad_rates, padded_tables
from typer.testing import CliRunner

import jaxsim._jax  # noqa: F401  (turns x64 on)
from jaxsim.cli.main import app
from jaxsim.kernels import status as st
from jaxsim.replay.deployment import ReplayConfig, WorkerPool
from jaxsim.replay.loads import Benchmark, open_loop
from jaxsim.replay.orchestrate import run_replays
from jaxsim.replay.traces import make_trace
from jaxsim.sla import LATENCY_KEYS, SLA
from jaxsim.sweep import run_sweep
from jaxsim.sweep.replayed import PointReplays, point_config, point_trace, replay_metrics, work_classes
from jaxsim.sweep.spec import plan_sweep, spec_from_dict
from jaxsim.sweep.verify import verify_top

TABLES = Path(__file__).parent / "goldens" / "public" / "tables"
runner = CliRunner()


def spec_dict(**over) -> dict:
    d = {
        "name": "bench",
        "gpu_budget": 2,
        "kv_transfer_gbps": 40,
        "profile": [{"name": str(TABLES / "ar_core"), "label": "ar"}],
        "serving": {"mode": ["aggregated", "disaggregated"], "ratios": ["1:1"]},
        "scheduler": {"concurrency": [1, 3, 8]},
        "workload": [{"name": "a", "isl": 200, "osl": 24}, {"name": "m", "requests": [[128, 16, 3], [400, 30, 1]]}],
        "evaluate": "replay",
        "benchmark": {"prompts_per_client": 3},
    }
    d.update(over)
    return d


def toml(d: dict) -> str:
    out = [f"{k} = {json.dumps(d[k])}" for k in ("name", "gpu_budget", "kv_transfer_gbps", "evaluate") if k in d]
    for p in d["profile"]:
        out.append("[[profile]]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in p.items()))
    for sec in ("serving", "speculation", "scheduler", "sla", "benchmark"):
        if sec in d:
            out.append(f"[{sec}]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in d[sec].items()))
    for w in d["workload"]:
        out.append("[[workload]]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in w.items()))
    return "\n\n".join(out) + "\n"


@pytest.fixture(scope="module")
def replay_sweep(tmp_path_factory):
    spec = spec_from_dict(spec_dict(), source="bench.toml")
    out = tmp_path_factory.mktemp("rs") / "r.parquet"
    res = run_sweep(spec, out, top=3)
    return spec, res, pq.read_table(out).to_pylist()


def test_replay_sweep_rows_are_their_points_replayed_one_by_one(replay_sweep):
    """A batched, chunked, padded replay sweep gives every point exactly what replaying that point alone gives
    (vmap/batch == loop): aggregated points a closed loop of C clients, disaggregated (x:y) points one closed loop
    of y·C clients over the pipeline."""
    spec, res, rows = replay_sweep
    plan = res.plan
    assert {r["method"] for r in rows} == {"replay"} and len(rows) == 12  # 3 concurrencies x 2 workloads x 2 modes
    assert res.summary["methods"] == {"replay": 12}
    assert any(r["status"] == st.COMPLETED for r in rows if r["mode"] == "aggregated")
    assert any(r["status"] == st.COMPLETED for r in rows if r["mode"] == "disaggregated")
    for r in rows:
        cid, conc = r["config_id"], r["concurrency_target"]
        load = spec.benchmark.load_model(conc, units=1 if r["mode"] == "aggregated" else r["decode_workers"])
        assert load.num_prompts == 3 * load.max_concurrency
        [alone] = run_replays([point_config(plan, cid, load)], [point_trace(plan, cid, load)], [spec.benchmark.seed])
        m = replay_metrics(alone, r["gpus"], conc, r["max_num_seqs"])
        assert m["status"] == r["status"]
        for k in ("request_rate_per_s", "output_tokens_per_s_per_gpu", "tokens_per_s_per_user", *LATENCY_KEYS):
            a, b = m[k], r[k]
            assert (math.isnan(a) and math.isnan(b)) or a == b, (cid, k, a, b)


def test_an_open_loop_benchmark_replays_disaggregated_points_with_at_most_y_c_in_flight(tmp_path):
    """Under an open-loop [benchmark] a disaggregated x:y point is the unit's open loop (its rate, its prompts) with at
    most y·C requests in flight over the pipeline; each row equals its point replayed alone."""
    bench = {"load": "poisson", "request_rate": 4.0, "num_prompts": 12}
    spec = spec_from_dict(spec_dict(benchmark=bench, scheduler={"concurrency": [3]}), source="bench.toml")
    res = run_sweep(spec, tmp_path / "o.parquet", top=3)
    rows = pq.read_table(res.output).to_pylist()
    assert {(r["mode"], r["method"]) for r in rows} == {("aggregated", "replay"), ("disaggregated", "replay")}
    for r in rows:
        if r["mode"] != "disaggregated":
            continue
        load = spec.benchmark.load_model(3)
        load = type(load)(load.kind, load.num_prompts, max_concurrency=3 * r["decode_workers"], request_rate=load.request_rate,
                          burstiness=load.burstiness, arrival_rule=load.arrival_rule)
        [alone] = run_replays([point_config(res.plan, r["config_id"], load)], [point_trace(res.plan, r["config_id"], load)],
                              [spec.benchmark.seed])
        m = replay_metrics(alone, r["gpus"], 3, r["max_num_seqs"])
        assert m["status"] == r["status"]
        for k in ("request_rate_per_s", "output_tokens_per_s_per_gpu", *LATENCY_KEYS):
            a, b = m[k], r[k]
            assert (math.isnan(a) and math.isnan(b)) or a == b, (r["config_id"], k, a, b)


def test_work_classes_cut_sorted_points_by_work_ratio_and_size():
    work = np.array([9000.0, 100.0, 150.0, 8000.0, 190.0, 210.0, 1.0])
    classes = work_classes(work, 2.0)
    assert [list(c) for c in classes] == [[6], [1, 2, 4], [5], [3, 0]]
    assert sorted(np.concatenate(classes).tolist()) == list(range(work.size))
    assert [len(c) for c in work_classes(work, 0.0, 3)] == [3, 3, 1]
    assert [list(c) for c in work_classes(work, 0.0)] == [list(np.argsort(work, kind="stable"))]
    assert work_classes(np.zeros(0)) == []


def test_replay_classes_change_no_metric(replay_sweep):
    """Splitting the points into work classes (default) or one lockstep call gives the same rows."""
    _, res, _ = replay_sweep
    plan = res.plan
    ids = np.arange(plan.num_configs)[PointReplays(plan).replayable(np.arange(plan.num_configs))]
    one = PointReplays(plan, work_ratio=0.0, max_items=0).run(ids)
    split = PointReplays(plan, work_ratio=1.5, max_items=2).run(ids)
    for a, b in zip(one, split):
        assert a.keys() == b.keys()
        for k in a:
            x, y = a[k], b[k]
            assert x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)), (k, x, y)


def test_replayed_rows_judge_the_sla_on_their_statistics(tmp_path, replay_sweep):
    _, _, rows = replay_sweep
    ok = [r for r in rows if r["method"] == "replay" and r["status"] == st.COMPLETED]
    lim = float(np.median([r["p90_ttft_ms"] for r in ok]))
    spec = spec_from_dict(spec_dict(sla={"p90_ttft_ms": lim}), source="bench.toml")
    res = run_sweep(spec, tmp_path / "o.parquet", top=3)
    t = pq.read_table(res.output).to_pylist()
    for r in t:
        if r["method"] == "replay":
            assert r["sla_ok"] == (r["status"] == st.COMPLETED and r["p90_ttft_ms"] <= lim)


def test_closed_loop_is_a_hand_built_sequential_replay():
    """One client (C = 1): each request is sent when the previous one completes, and sees exactly what it
    sees alone on an idle engine; two clients (C = 2): the third request goes with the first completion."""
    pool = WorkerPool(padded_tables()["ar_core"], 1024, 8, 16, 4000, 32768)
    rates = pad_rates(np.zeros(0))
    inp, out = np.array([300, 120, 500]), np.array([9, 14, 5])
    closed = make_trace("c", np.zeros(3), inp, out)
    [one] = run_replays([ReplayConfig("c1", 0, rates, aggregated=pool, max_concurrency=1)], closed)
    send = 0.0
    for i in range(3):
        [alone] = run_replays([ReplayConfig("a", 0, rates, aggregated=pool)], make_trace("a", [0.0], inp[i:i + 1], out[i:i + 1]))
        assert one.requests["sent_ms"][i] == send
        assert one.requests["ttft_ms"][i] == pytest.approx(alone.requests["ttft_ms"][0], rel=1e-12)
        assert one.requests["e2e_ms"][i] == pytest.approx(alone.requests["e2e_ms"][0], rel=1e-12)
        send = one.requests["last_token_ms"][i]
    assert one.summary["duration_ms"] == pytest.approx(send, rel=1e-12)  # first send (0) to the last completion
    [two] = run_replays([ReplayConfig("c2", 0, rates, aggregated=pool, max_concurrency=2)], closed)
    assert two.requests["sent_ms"][:2].tolist() == [0.0, 0.0]
    assert two.requests["sent_ms"][2] == min(two.requests["last_token_ms"][:2])


def _verify_case(tmp_path, sla: dict):
    # the calibrated Qwen3-32B profile: multi-prompt prefill passes inside its support (the first wave's)
    d = spec_dict(evaluate="steady", profile=[{"name": "qwen3-32b-bf16-b300-calibrated", "label": "qwen", "tp": [2]}],
                  serving={"mode": ["aggregated"]}, scheduler={"concurrency": [16]},
                  workload=[{"name": "long", "isl": 4096, "osl": 32}], sla=sla, benchmark={})
    return spec_from_dict(d, source="v.toml"), d


def test_verify_replays_the_row_at_its_own_load_not_a_gentle_one(tmp_path):
    """Observed (issue #28): a row checked against a 4 req/s trace said "verified yes" at 104 tok/s/user
    against the row's 50. At its own load (a closed loop of 16 clients x replicas) the first wave queues
    its prompts: a p90 TTFT limit that a gentle open loop meets is missed, and verification says NO."""
    spec, d = _verify_case(tmp_path, {})
    res = run_sweep(spec, tmp_path / "a.parquet", top=1)
    [row] = res.top.to_pylist()
    plan = res.plan
    own = verify_top(plan, res.top, 1).to_pylist()[0]
    load = spec.benchmark.load_model(16, units=row["replicas"])
    assert own["load"] == load.describe() and own["requests"] == 160 * row["replicas"], own
    gentle_load = open_loop(0.5, 20)
    [gentle] = run_replays([point_config(plan, row["config_id"], gentle_load)], [point_trace(plan, row["config_id"], gentle_load)])
    gentle_p90 = gentle.summary["p90_ttft_ms"]
    assert own["p90_ttft_ms"] > 2 * gentle_p90  # the first wave
    lim = (own["p90_ttft_ms"] + gentle_p90) / 2
    spec2 = spec_from_dict({**d, "sla": {"p90_ttft_ms": max(lim, row["p90_ttft_ms"] * 1.01)}}, source="v.toml")
    res2 = run_sweep(spec2, tmp_path / "b.parquet", top=1)
    assert res2.top.num_rows == 1  # the steady state calls it feasible ...
    v = verify_top(res2.plan, res2.top, 1).to_pylist()[0]
    assert v["verified"] is False and "replayed p90 TTFT" in v["why"]  # ... its own load does not
    assert gentle_p90 <= spec2.sla.p90_ttft_ms  # while a gentle load would have said yes
    assert v["dev_p90_ttft_ms"] == pytest.approx((v["p90_ttft_ms"] - row["p90_ttft_ms"]) / row["p90_ttft_ms"])


def test_verify_agreement_uses_the_stated_tolerance(tmp_path, replay_sweep):
    """A replay-evaluated row of fixed lengths verified at its own load (C clients on each of its 2
    replicas) is that replay on each replica: deviations exactly 0; a mix draws its 2 x N lengths anew,
    within the tolerance. A tolerance below a steady row's deviation refuses it, the deviation named."""
    spec, res, _ = replay_sweep
    v = verify_top(res.plan, res.top, 1).to_pylist()
    rep = {r["workload"]: r for r in v if r["method"] == "replay"}
    assert set(rep) == {"a", "m"} and all("x2" in r["replay"] for r in rep.values())
    assert rep["a"]["dev_mean_ttft_ms"] == rep["a"]["dev_mean_tpot_ms"] == rep["a"]["dev_output_tokens_per_s_per_gpu"] == 0.0
    assert all(r["verified"] and r["why"] == "" for r in rep.values())
    assert 0 < abs(rep["m"]["dev_mean_ttft_ms"]) <= 0.2
    spec_s, _ = _verify_case(tmp_path, {})
    res_s = run_sweep(spec_s, tmp_path / "s.parquet", top=1)
    v = verify_top(res_s.plan, res_s.top, 1, tolerance=1e-6).to_pylist()[0]
    assert v["verified"] is False and "differs from the row by more than 0%" in v["why"] and "mean TTFT" in v["why"]


OVERHEAD = {"fixed_ms": 7.0, "per_prompt_token_ms": 0.05, "per_output_token_ms": 0.3}


def test_replayed_rows_carry_the_serving_overhead_per_request(tmp_path, replay_sweep):
    """With a profile's serving overhead, each replayed row's TTFT/TPOT/E2E statistics are those of the
    same replay without it, every request's TTFT + fixed + per prompt token x its prompt and each later
    token + per output token (recomputed per request here, from the point's trace lengths, NumPy's linear
    percentiles); throughput is the engine's, unchanged; disaggregated (steady) rows carry it as the steady
    state does. Verifying a fixed-lengths row at its own load compares like with like: deviations 0."""
    spec, res, rows = replay_sweep
    d = spec_dict()
    d["profile"] = [dict(d["profile"][0], overhead=OVERHEAD)]
    ov_res = run_sweep(spec_from_dict(d, source="bench.toml"), tmp_path / "ov.parquet", top=3)
    ov_rows = {r["config_id"]: r for r in pq.read_table(ov_res.output).to_pylist()}
    base = {r["config_id"]: r for r in rows}
    fixed, pp, po = OVERHEAD["fixed_ms"], OVERHEAD["per_prompt_token_ms"], OVERHEAD["per_output_token_ms"]
    checked = 0
    for cid, r in base.items():
        o = ov_rows[cid]
        assert o["method"] == r["method"] and o["status"] == r["status"]
        for k in ("request_rate_per_s", "output_tokens_per_s_per_gpu"):
            assert o[k] == r[k] or (math.isnan(o[k]) and math.isnan(r[k]))
        if r["status"] != st.COMPLETED:
            continue
        if r["method"] == "steady":
            assert o["mean_tpot_ms"] == pytest.approx(r["mean_tpot_ms"] + po, rel=1e-12)
            continue
        load = spec.benchmark.load_model(r["concurrency_target"])
        trace = point_trace(res.plan, cid, load)
        [alone] = run_replays([point_config(res.plan, cid, load)], [trace], [spec.benchmark.seed])
        req = alone.requests
        done = req["terminal"] == "completed"
        isl, osl = np.asarray(trace.input_tokens, np.float64)[done], np.asarray(trace.output_tokens, np.float64)[done]
        ttft = req["ttft_ms"][done] + fixed + pp * isl
        e2e = req["e2e_ms"][done] + fixed + pp * isl + po * (osl - 1)
        tpot = (req["tpot_ms"][done] + po)[osl > 1]
        for name, v in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
            assert o[f"mean_{name}_ms"] == pytest.approx(v.mean(), rel=1e-12), (cid, name)
            assert o[f"p90_{name}_ms"] == pytest.approx(np.percentile(v, 90), rel=1e-12), (cid, name)
        assert o["mean_ttft_ms"] > r["mean_ttft_ms"] + fixed
        checked += 1
    assert checked >= 2
    v = verify_top(ov_res.plan, ov_res.top, 1).to_pylist()
    rep = {r["workload"]: r for r in v if r["method"] == "replay"}
    assert rep["a"]["dev_mean_ttft_ms"] == pytest.approx(0.0, abs=1e-12)
    assert rep["a"]["dev_mean_tpot_ms"] == pytest.approx(0.0, abs=1e-12)
    assert rep["a"]["dev_mean_e2e_ms"] == pytest.approx(0.0, abs=1e-12)
    assert all(r["verified"] for r in rep.values())


# ---- CLI ----------------------------------------------------------------------------------------


def _spec_file(tmp_path, **over) -> Path:
    p = tmp_path / "spec.toml"
    p.write_text(toml(spec_dict(**over)))
    return p


def test_cli_sweep_evaluate_replay_and_verify_without_a_trace(tmp_path):
    spec = _spec_file(tmp_path, evaluate="steady", serving={"mode": ["aggregated"]})
    out = tmp_path / "o.parquet"
    r = runner.invoke(app, ["sweep", str(spec), "--output", str(out), "--evaluate", "replay", "--verify-top", "1", "--json"])
    assert r.exit_code in (0, 3), r.output
    rep = json.loads(r.stdout)
    assert rep["methods"] == {"replay": 6} and all(row["method"] == "replay" for row in rep["top"])
    assert rep["replay_timings"]["run_s"] > 0
    v = rep["verified"]
    assert len(v) == 2 and all("closed loop" in x["load"] for x in v)
    assert (r.exit_code == 3) == (not any(x["verified"] for x in v))
    assert pq.read_table(out).column("method").to_pylist() == ["replay"] * 6


def test_cli_verify_exits_3_when_nothing_verifies(tmp_path):
    spec = _spec_file(tmp_path, evaluate="steady", serving={"mode": ["aggregated"]})
    out = tmp_path / "o.parquet"
    args = ["sweep", str(spec), "--output", str(out), "--verify-top", "1", "--verify-tolerance", "1e-9", "--quiet"]
    r = runner.invoke(app, args)
    assert r.exit_code == 3, r.output
    assert "none of the 2 replayed rows verified" in r.stderr and out.exists()
    r = runner.invoke(app, args + ["--force", "--allow-unverified"])
    assert r.exit_code == 0 and "warning: --verify-top 1" in r.stderr


@pytest.mark.parametrize("bench, needle", [
    ({"load": "poisson"}, "benchmark: an open loop (poisson) needs its rate"),
    ({"request_rate": 2.0}, "benchmark: a closed loop sends every request at once"),
    ({"range_ratio": 1.0}, "range_ratio=1.0 must be in [0, 1)"),
    ({"prompts_per_client": 0}, "benchmark.prompts_per_client"),
    ({"num_prompts": 0}, "benchmark.num_prompts"),
    ({"load": "uniform"}, "benchmark.load"),
])
def test_cli_sweep_bad_benchmark_is_one_line_exit_2(tmp_path, bench, needle):
    spec = _spec_file(tmp_path, benchmark=bench)
    out = tmp_path / "o.parquet"
    r = runner.invoke(app, ["sweep", str(spec), "--output", str(out)])
    assert r.exit_code == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not out.exists() and not list(tmp_path.glob("*.work"))


def test_cli_sweep_bad_evaluate(tmp_path):
    spec = _spec_file(tmp_path)
    r = runner.invoke(app, ["sweep", str(spec), "--output", str(tmp_path / "o.parquet"), "--evaluate", "exact"])
    assert r.exit_code == 2 and "--evaluate: one of steady, replay" in r.stderr and not (tmp_path / "o.parquet").exists()


def test_cli_sweep_old_sla_keys_still_work_with_a_note(tmp_path):
    spec = _spec_file(tmp_path, evaluate="steady", sla={"max_ttft_ms": 5000, "p50_tpot_ms": 100})
    r = runner.invoke(app, ["sweep", str(spec), "--output", str(tmp_path / "o.parquet"), "--json"])
    assert r.exit_code == 0, r.output
    assert "max_ttft_ms is deprecated, write mean_ttft_ms" in r.stderr and "p50_tpot_ms is deprecated, write median_tpot_ms" in r.stderr
    t = pq.read_table(tmp_path / "o.parquet").to_pylist()
    for row in t:
        assert row["sla_ok"] == (row["status"] < 16 and row["mean_ttft_ms"] <= 5000 and row["median_tpot_ms"] <= 100)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    from test_cli_replay import CASE, _materialize

    return _materialize(CASE, tmp_path_factory.mktemp("dep"))


def test_cli_replay_closed_loop_load_without_a_trace(deployment, tmp_path):
    cfg, _ = deployment
    out = tmp_path / "r.parquet"
    r = runner.invoke(app, ["replay", str(cfg), "--load", "closed:2:6", "--isl", "128", "--osl", "12", "--output", str(out),
                            "--json", "--no-progress", "--allow-incomplete"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout[r.stdout.index("{"):])
    assert rep["load"] == "closed loop: 2 clients, 6 prompts" and rep["requests"] == 6
    t = pq.read_table(out).to_pydict()
    assert t["arrival_ms"] == [0.0] * 6 and t["input_tokens"] == [128] * 6
    sent = np.array(t["sent_ms"])
    assert (sent[:2] == 0).all() and (sent[2:] > 0).all()
    assert "median_ttft_ms" in rep["replays"][0] and "p99_tpot_ms" in rep["replays"][0]


@pytest.mark.parametrize("args, needle", [
    (["--load", "closed"], "a closed loop needs its concurrency"),
    (["--load", "poisson"], "an open loop needs its rate"),
    (["--load", "closed:4:0"], "num_prompts=0 must be an integer >= 1"),
    (["--load", "closed:4", "--range-ratio", "1"], "range_ratio=1.0 must be in [0, 1)"),
    (["--load", "closed:4", "--length-rule", "sharegpt"], "length rule 'sharegpt'"),
    (["--isl", "100"], "--isl goes with --load"),
    ([], "give --trace TRACE or --load LOAD"),
    (["--load", "closed:4", "--max-concurrency", "2"], "--max-concurrency caps a trace's replay"),
])
def test_cli_replay_bad_load_is_one_line_exit_2_nothing_written(deployment, tmp_path, args, needle):
    cfg, _ = deployment
    out = tmp_path / "r.parquet"
    r = runner.invoke(app, ["replay", str(cfg), "--output", str(out), "--no-progress", *args])
    assert r.exit_code == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not out.exists()


def test_benchmark_spec_defaults_to_the_inferencex_protocol():
    s = spec_from_dict(spec_dict(benchmark={}), source="x.toml")
    assert s.benchmark == Benchmark() and s.benchmark.load_model(64).num_prompts == 640
    assert s.digest() != spec_from_dict(spec_dict(benchmark={"seed": 1}), source="x.toml").digest()
    plan = plan_sweep(s)
    assert PointReplays(plan).pad_to == 128  # 10 prompts x 8 clients at most: one bucket for every point
    assert SLA().latency_limits() == {}


def test_a_disaggregated_row_is_verified_under_a_closed_loop_over_its_pipelines(replay_sweep):
    """Under a closed-loop [benchmark] a disaggregated (x:y) row's own load is one closed loop of C per decode worker x y x
    replicas clients over its replicas' pipelines (no longer an open loop at the row's rate); under an open loop, the
    row's rate."""
    from jaxsim.sweep.verify import row_load

    spec, res, rows = replay_sweep
    pd = next(r for r in rows if r["mode"] == "disaggregated" and r["concurrency_target"] == 3)
    row = dict(pd, replicas=2)
    load, text = row_load(res.plan, row)
    clients = 3 * pd["decode_workers"] * 2
    assert load.kind == "closed" and load.max_concurrency == clients and load.num_prompts == 3 * clients
    assert text == f"closed loop of {clients} clients over 2 replica(s) of the pipeline, {3 * clients} prompts"
    cfg = point_config(res.plan, pd["config_id"], load, units=2)
    assert cfg.mode == "disaggregated" and cfg.max_concurrency == clients and cfg.prefill.replicas == 2 * pd["prefill_workers"]
    open_plan = plan_sweep(spec_from_dict(spec_dict(benchmark={"load": "poisson", "request_rate": 4.0, "num_prompts": 12}),
                                          source="bench.toml"))
    load, text = row_load(open_plan, dict(row, request_rate_per_s=1.5))
    assert load.kind == "poisson" and text.startswith("open loop at the row's rate, 3.00 req/s across 2 replica(s)")
