"""``jaxsim replay`` end to end: a golden replay case written as a deployment config + trace file,
replayed through the CLI, reproduces the reference per request; plus errors, overwrite and JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
from replay_support import GOLDENS, case_trace, replay_cases
from typer.testing import CliRunner

from jaxsim.cli.main import app
from jaxsim.replay.traces import write_trace_csv

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
CASE = next(c for c in replay_cases() if c["id"] == "sd_k3_a2_kv_bound")


def _materialize(case: dict, root):
    """The reference's replay setup: the table's profile with the case's scheduler envelope and pool."""
    es = case["engine_settings"]
    src = GOLDENS / "tables" / case["table"]
    prof = json.loads((src / "profile.json").read_text())
    res = prof["deployments"][0]["resources"]
    res["max_num_tokens"] = es["max_num_batched_tokens"]
    res["max_batch_size"] = es["max_num_seqs"]
    res["runtime_memory"]["kv_cache_bytes"] = es["kv_cache_bytes"]
    pdir = root / "profile"
    pdir.mkdir()
    (pdir / "profile.json").write_text(json.dumps(prof))
    for f in ("fpm_forward_perf.parquet", "fpm_forward_perf.metadata.json"):
        shutil.copy(src / f, pdir / f)
    lines = [
        f'model = "{prof["model"]}"', 'system = "h200_sxm"', 'backend_version = "0.24.0"', 'profile = "profile"',
        f"block_size = {es['block_size']}", f"context_length = {es['context_length']}",
    ]
    if es["nextn"]:
        lines += [f"nextn = {es['nextn']}", f"accepted_tokens = {float(es['nextn_accepted'])}"]
    lines += ["", "[roles.aggregated]", "tp = 1"]
    cfg = root / "golden.toml"
    cfg.write_text("\n".join(lines) + "\n")
    trace = root / "trace.csv"
    write_trace_csv(case_trace(case), trace)
    return cfg, trace


@pytest.fixture(scope="module")
def golden_setup(tmp_path_factory):
    return _materialize(CASE, tmp_path_factory.mktemp("cli"))


def test_cli_replays_a_golden_case(golden_setup, tmp_path):
    cfg, trace = golden_setup
    out = tmp_path / "out.parquet"
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--output", str(out), "--timeline", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "replay of trace (8 requests)" in r.output and "wrote" in r.output
    t = pq.read_table(out).to_pydict()
    gold = CASE["result"]["per_request"]
    assert t["request"] == list(range(len(gold)))
    for i, g in enumerate(gold):
        assert abs(t["ttft_ms"][i] - g["ttft_ms"]) <= 1e-9 * g["ttft_ms"]
        assert abs(t["e2e_ms"][i] - g["e2e_latency_ms"]) <= 1e-9 * g["e2e_latency_ms"]
        assert t["preemptions"][i] == g["readmission_count"]
    summary = json.loads(pq.read_schema(out).metadata[b"jaxsim.replay.summary"])
    assert summary[0]["status"] == "completed"
    assert abs(summary[0]["mean_e2e_ms"] - CASE["result"]["aggregate"]["mean_e2e_latency_ms"]) < 1e-9
    tl = pq.read_table(out.with_name("out.timeline.parquet")).to_pydict()
    assert len(tl["pass"]) > 0 and max(tl["kv_blocks_used"]) <= CASE["engine_settings"]["kv_blocks"]
    # each worker's KV pool travels with its timeline (the timeline plot draws it)
    assert set(tl["kv_pool_blocks"]) == {CASE["engine_settings"]["kv_blocks"]} and set(tl["role"]) == {"aggregated"}


def test_library_writes_what_the_cli_writes(golden_setup, tmp_path):
    """Issue 22: the library writes the replay parquet (jaxsim.replay.write_results); the CLI only calls it. The
    same deployment and trace through both give equal request tables, summaries and timelines."""
    from jaxsim.deploy.binding import bind
    from jaxsim.replay import config_from_binding, load_trace, run_replays, write_results
    from jaxsim.replay.results import REQUEST_COLUMNS, SUMMARY_METADATA_KEY
    from jaxsim.rules.config import load_config

    cfg, trace = golden_setup
    cli_out = tmp_path / "cli.parquet"
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--output", str(cli_out), "--timeline", "--no-progress"])
    assert r.exit_code == 0, r.output
    outcomes = run_replays([config_from_binding(bind(load_config(cfg)))], load_trace(str(trace)), [0], timeline=True)
    lib_out = tmp_path / "lib.parquet"
    rows = write_results(outcomes, lib_out, tmp_path / "lib.timeline.parquet")
    cli, lib = pq.read_table(cli_out), pq.read_table(lib_out)
    assert tuple(lib.column_names) == REQUEST_COLUMNS and cli.to_pydict() == lib.to_pydict()
    assert json.loads(lib.schema.metadata[SUMMARY_METADATA_KEY]) == rows == json.loads(cli.schema.metadata[SUMMARY_METADATA_KEY])
    assert pq.read_table(tmp_path / "lib.timeline.parquet").to_pydict() == pq.read_table(tmp_path / "cli.timeline.parquet").to_pydict()


def test_cli_closed_loop(golden_setup, tmp_path):
    """--max-concurrency 1: one request in flight; each is sent when the previous one completes (or at
    its arrival), TTFT and E2E count from the send; a bad value is refused before any work."""
    cfg, trace = golden_setup
    out = tmp_path / "closed.parquet"
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--output", str(out), "--no-progress", "--max-concurrency", "1"])
    assert r.exit_code == 0, r.output
    t = pq.read_table(out).to_pydict()
    order = np.argsort(t["arrival_ms"], kind="stable")
    for prev, cur in zip(order[:-1], order[1:]):
        assert t["sent_ms"][cur] == max(t["arrival_ms"][cur], t["last_token_ms"][prev])
        assert t["first_token_ms"][cur] > t["last_token_ms"][prev]
    for i in range(len(t["request"])):
        assert t["ttft_ms"][i] == t["first_token_ms"][i] - t["sent_ms"][i]
        assert t["e2e_ms"][i] == t["last_token_ms"][i] - t["sent_ms"][i]
    assert max(s - a for s, a in zip(t["sent_ms"], t["arrival_ms"])) > 0
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--output", str(tmp_path / "x.parquet"), "--max-concurrency", "-1"])
    assert r.exit_code == 2 and "--max-concurrency" in r.output


def test_cli_refuses_overwrite_and_bad_inputs(golden_setup, tmp_path):
    cfg, trace = golden_setup
    out = tmp_path / "out.parquet"
    out.write_text("keep me")
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--output", str(out)])
    assert r.exit_code == 2 and "exists; pass --force" in r.output
    assert out.read_text() == "keep me"
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(tmp_path / "missing.csv"), "--output", str(tmp_path / "o.parquet")])
    assert r.exit_code == 2 and "missing.csv" in r.output and "Traceback" not in r.output
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_ms,input_length,output_length\n0,10,5\n1,abc,5\n")
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(bad), "--output", str(tmp_path / "o.parquet")])
    assert r.exit_code == 2 and "row 2" in r.output and "input_length" in r.output
    r = runner.invoke(app, ["replay", "--trace", "mooncake_tiny", "--output", str(tmp_path / "o.parquet")])
    assert r.exit_code == 2 and "exactly one" in r.output


def test_cli_help_has_an_example():
    r = runner.invoke(app, ["replay", "--help"])
    assert r.exit_code == 0 and "jaxsim replay configs/" in r.output and "--sweep" in r.output


@pytest.mark.slow
def test_cli_subprocess_json_and_seeds(golden_setup, tmp_path):
    cfg, trace = golden_setup
    out = tmp_path / "o.parquet"
    proc = subprocess.run(
        [sys.executable, "-m", "jaxsim", "replay", str(cfg), "--trace", str(trace), "--output", str(out), "--seeds", "2",
         "--sla-ttft-ms", "100", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert [r["seed"] for r in rep["replays"]] == [0, 1]
    gold = CASE["result"]["per_request"]
    ok = sum(g["ttft_ms"] <= 100 for g in gold)
    assert all(r["goodput_requests"] == ok for r in rep["replays"])
    t = pq.read_table(out).to_pydict()
    assert len(t["request"]) == 2 * len(gold)
    np.testing.assert_array_equal(t["e2e_ms"][: len(gold)], t["e2e_ms"][len(gold):])  # certain acceptance


def test_cli_sweep_spec_replays_every_binding(golden_setup, tmp_path):
    cfg, trace = golden_setup
    spec = tmp_path / "spec.toml"
    spec.write_text(f"""
name = "golden"
block_size = {CASE['engine_settings']['block_size']}
[[profile]]
name = "{cfg.parent / 'profile'}"
label = "g"
[serving]
mode = ["aggregated"]
[speculation]
nextn = ["profile"]
acceptance = [2.0, 1.0]
[scheduler]
concurrency = [1]
max_num_seqs = ["recorded"]
max_num_batched_tokens = ["recorded"]
[[workload]]
name = "w"
isl = 100
osl = 10
""")
    out = tmp_path / "s.parquet"
    r = runner.invoke(app, ["replay", "--sweep", str(spec), "--trace", str(trace), "--output", str(out), "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert len(rep["replays"]) == 2 and all(x["status"] == "completed" for x in rep["replays"])
    t = pq.read_table(out).to_pydict()
    assert len(set(t["config"])) == 2
    a2 = [i for i, c in enumerate(t["config"]) if "accepted=2 " in c]
    assert len(a2) == len(CASE["requests"])
    gold = CASE["result"]["per_request"]
    got = sorted(t["e2e_ms"][i] for i in a2)
    assert got == pytest.approx(sorted(g["e2e_latency_ms"] for g in gold), rel=1e-12)


def test_cli_reports_a_replay_stopped_outside_support(golden_setup, tmp_path):
    """A decode round below the smallest measured KV stops the replay with an explicit status (no guess)."""
    cfg, _ = golden_setup
    trace = tmp_path / "short.csv"
    trace.write_text("arrival_ms,input_length,output_length\n0,10,4\n")
    out = tmp_path / "o.parquet"
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--output", str(out), "--json"])
    assert r.exit_code == 3, r.output  # incomplete: a distinct exit code, results still written
    rep = json.loads(r.stdout)["replays"][0]
    assert rep["status"] == "stopped: pass lookup unsupported:kv_outside_measured_range"
    assert rep["stopped_at"] == "decode(batch=1, kv=10)"
    assert "incomplete: 1 of 1 replays did not complete" in r.stderr and "exit 3" in r.stderr
    t = pq.read_table(out).to_pydict()
    assert set(t["terminal"]) == {"unfinished"}
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--output", str(out), "--force", "--allow-incomplete"])
    assert r.exit_code == 0 and "warning: 1 of 1 replays did not complete" in r.stderr


def test_cli_names_rejected_requests_and_exits_3_when_nothing_completes(golden_setup, tmp_path):
    """Observed: a rejected request printed 'status completed, done 0/1' with no reason, exit 0."""
    cfg, _ = golden_setup
    ctx = CASE["engine_settings"]["context_length"]
    trace = tmp_path / "long.csv"
    trace.write_text(f"arrival_ms,input_length,output_length\n0,{ctx + 5},4\n")
    out = tmp_path / "o.parquet"
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--output", str(out), "--no-progress"])
    assert r.exit_code == 3, r.output
    assert f"1 request(s) rejected: row 1: prompt of {ctx + 5:,} tokens >= max_model_len" in r.stderr
    assert "rejected 1 of 1 requests" in r.stderr
    t = pq.read_table(out).to_pydict()
    assert t["terminal"] == ["rejected"] and "max_model_len" in t["reason"][0]


def test_a_replay_with_rejected_requests_says_so_and_exits_3(golden_setup, tmp_path, monkeypatch):
    """Observed (issue 28): a replay with 91 of 1,000 requests rejected said `completed` and exited 0. Now its
    status says how many were rejected, it exits 3 like any incomplete replay (--allow-incomplete: 0), and
    off a terminal the progress is a plain line on stderr."""
    import jaxsim.progress

    monkeypatch.setattr(jaxsim.progress, "PROGRESS_INTERVAL_S", 0.0)  # a line at every step
    cfg, good = golden_setup
    ctx = CASE["engine_settings"]["context_length"]
    rows = good.read_text().splitlines()
    trace = tmp_path / "mixed.csv"
    last = float(rows[-1].split(",")[0])
    trace.write_text("\n".join(rows + [f"{last + 1},{ctx + 5},4"]) + "\n")
    n = len(rows)  # header + requests: the appended one is request n
    out = tmp_path / "o.parquet"
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--output", str(out), "--json"])
    assert r.exit_code == 3, r.output
    rep = json.loads(r.stdout)["replays"][0]
    assert rep["status"] == f"rejected: 1 of {n} requests" and rep["completed_requests"] == n - 1
    assert f"incomplete: 1 of 1 replays did not complete the trace (first: golden seed 0: rejected 1 of {n} requests)" in r.stderr
    assert "replaying " in r.stderr and ": 100 %, " in r.stderr and "requests completed" in r.stderr  # progress lines, not a bar
    t = pq.read_table(out).to_pydict()
    assert set(t["status"]) == {f"rejected: 1 of {n} requests"} and t["terminal"].count("rejected") == 1
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--output", str(out), "--force", "--allow-incomplete", "--no-progress"])
    assert r.exit_code == 0 and "warning: 1 of 1 replays did not complete" in r.stderr and "replaying " not in r.stderr


@pytest.mark.parametrize("args, msg", [
    (["--seeds", "0"], "--seeds: must be an integer >= 1"),
    (["--seeds", "100000"], "--seeds: must be an integer >= 1 and <= 1,024"),
    (["--time-scale", "0"], "--time-scale: must be a finite number > 0"),
    (["--time-scale", "nan"], "--time-scale"),
    (["--max-requests", "0"], "--max-requests"),
    (["--sla-ttft-ms", "-1"], "--sla-ttft-ms"),
])
def test_cli_replay_bounds_checked_before_work(golden_setup, tmp_path, args, msg):
    cfg, trace = golden_setup
    out = tmp_path / "o.parquet"
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--output", str(out), *args])
    assert r.exit_code == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output
    assert not out.exists()


def test_sweep_replay_gives_the_prefill_pool_its_own_max_num_seqs(tmp_path):
    """replay --sweep builds a disaggregated deployment like a replay of its config: the prefill pool
    keeps the prefill role's max_num_seqs (the sweep's max_num_seqs axis sets the decode role's)."""
    from jaxsim.cli.cmd_replay import configs_from_sweep
    from jaxsim.data.registry import profiles_root
    from jaxsim.deploy.binding import bind
    from jaxsim.replay.deployment import config_from_binding
    from jaxsim.rules.config import config_from_dict

    # a declared-memory copy of the bundled AR profile, so max_num_seqs may differ from the recorded one
    prof = tmp_path / "prof"
    shutil.copytree(profiles_root() / "qwen3-32b-bf16-b300", prof)
    doc = json.loads((prof / "profile.json").read_text())
    res = doc["deployments"][0]["resources"]
    res.pop("runtime_memory")
    res.update(weights_bytes=64 * 2**30, activations_bytes=4 * 2**30, runtime_overhead_bytes=2 * 2**30, comm_overhead_bytes=0)
    (prof / "profile.json").write_text(json.dumps(doc))
    spec = tmp_path / "spec.toml"
    spec.write_text(f"""
name = "pd"
block_size = 16
kv_transfer_gbps = 50
[[profile]]
name = "{prof}"
tp = [1]
[serving]
mode = ["disaggregated"]
ratios = ["1:1"]
[scheduler]
concurrency = [4]
max_num_seqs = [8]
max_num_batched_tokens = ["recorded"]
[[workload]]
name = "w"
isl = 100
osl = 10
""")
    [got] = configs_from_sweep(spec)
    cfg = config_from_dict({
        "model": doc["model"], "system": "b300_sxm", "profile": str(prof), "mode": "disaggregated", "nextn": 0,
        "block_size": 16, "kv_transfer_gbps": 50, "backend_version": "0.20.1",
        "roles": {"prefill": {"tp": 1, "replicas": 1}, "decode": {"tp": 1, "replicas": 1, "max_num_seqs": 8}},
    }, source="test")
    want = config_from_binding(bind(cfg))
    assert (got.decode.max_num_seqs, want.decode.max_num_seqs) == (8, 8)
    assert got.prefill.max_num_seqs == want.prefill.max_num_seqs == 1024  # the prefill role's recorded envelope
    from jaxsim.replay.loads import open_loop
    from jaxsim.sweep.replayed import point_config
    from jaxsim.sweep.spec import load_spec, plan_sweep

    verified = point_config(plan_sweep(load_spec(spec)), 0, open_loop(2.0, 40))  # --verify-top: an open loop at its rate
    assert (verified.prefill.max_num_seqs, verified.decode.max_num_seqs) == (1024, 8)  # the envelope, not capped
    for pool in ("prefill", "decode"):
        g, w = getattr(got, pool), getattr(want, pool)
        assert (g.max_num_batched_tokens, g.block_size, g.num_gpu_blocks, g.replicas) == (
            w.max_num_batched_tokens, w.block_size, w.num_gpu_blocks, w.replicas)


def test_replay_json_reports_compile_and_run_time_separately(tmp_path):
    """--json carries the wall-time split; the parts are non-negative and add up to at most the total."""
    from pathlib import Path

    cfg = Path(__file__).resolve().parents[1] / "configs" / "deployment_calibrated.toml"
    res = runner.invoke(app, ["replay", str(cfg), "--trace", "mooncake_tiny", "--output", str(tmp_path / "r.parquet"), "--json",
                              "--no-progress"])
    assert res.exit_code in (0, 3), res.output
    t = json.loads(res.stdout[res.stdout.index("{"):])["timings"]
    assert set(t) == {"prepare_s", "compile_s", "compilations", "executables_loaded", "run_s", "results_s", "total_s", "passes", "loop_steps",
                      "replays_shared"}
    assert 0 < t["loop_steps"] <= t["passes"]
    assert all(t[k] >= 0 for k in t)
    assert t["run_s"] > 0 and t["compilations"] >= 0
    assert t["prepare_s"] + t["compile_s"] + t["run_s"] + t["results_s"] <= t["total_s"] + 1e-3


def test_a_replay_too_large_for_the_memory_is_refused_up_front_with_its_cost(tmp_path, monkeypatch):
    """A replay whose estimated memory exceeds what the machine has left is refused before anything is
    read, compiled or written: one line with the estimated passes, time and memory, exit 2."""
    from jaxsim.replay import budget

    monkeypatch.setattr(budget, "available_bytes", lambda: 500 * 2**20)
    out = tmp_path / "o.parquet"
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_ms,input_tokens,output_tokens\n" + "".join(f"{i},100,10\n" for i in range(50)))
    for given in (str(trace), "azure_conv_1k"):  # a file (refused unparsed, by its rows) and a bundled trace
        r = runner.invoke(app, ["replay", str(ROOT / "configs" / "deployment_calibrated.toml"), "--trace", given, "--output", str(out)])
        assert r.exit_code == 2, r.output
        line = r.stderr.strip()
        assert "\n" not in line and "scheduler passes" in line and "GB of memory" in line and "available" in line, line
        assert not out.exists()
    est = budget.estimate([SimpleNamespace(pools=[SimpleNamespace(replicas=2, max_num_seqs=4)])], np.full(10, 8), seeds=3)
    assert est.request_replays == 30 and est.passes == 3 * 2 * max(10 // 2, 80 // 2 // 4) and est.bytes > budget.BASE_BYTES
    monkeypatch.setenv("JAXSIM_REPLAY_NO_MEMORY_CHECK", "1")
    assert budget.check_environment_override()


def test_cli_replays_a_closed_loop_over_a_disaggregated_deployment(golden_setup, tmp_path):
    """--load closed:C on a disaggregated deployment: C clients over the whole pipeline (the first C sent at t = 0, each
    next one when a request completes); a request that fits no pool is refused in one line, exit 2, nothing written."""
    cfg, _ = golden_setup
    text = cfg.read_text().replace("[roles.aggregated]\ntp = 1", "[roles.prefill]\ntp = 1\nreplicas = 2\n\n[roles.decode]\ntp = 1")
    pd = cfg.with_name("pd.toml")
    pd.write_text('mode = "disaggregated"\nkv_transfer_gbps = 50.0\n' + text)
    out = tmp_path / "pd.parquet"
    r = runner.invoke(app, ["replay", str(pd), "--load", "closed:3", "--isl", "200", "--osl", "12", "--output", str(out), "--json",
                            "--no-progress"])
    assert r.exit_code == 0, r.output
    t = pq.read_table(out).to_pydict()
    sent, last = np.asarray(t["sent_ms"]), np.asarray(t["last_token_ms"])
    assert len(sent) == 30 and set(t["terminal"]) == {"completed"}
    np.testing.assert_array_equal(sent[:3], 0.0)
    np.testing.assert_array_equal(sent[3:], np.sort(last)[:27])  # each completion frees the next client
    big = tmp_path / "big.csv"
    from jaxsim.replay.traces import make_trace

    write_trace_csv(make_trace("big", [0.0, 0.0], [100, 200_000], [5, 5]), big)
    bad = tmp_path / "bad.parquet"
    r = runner.invoke(app, ["replay", str(pd), "--trace", str(big), "--max-concurrency", "2", "--output", str(bad), "--no-progress"])
    assert r.exit_code == 2 and "request row 2" in r.stderr and "never fits the prefill pool" in r.stderr, r.output
    assert len(r.stderr.strip().splitlines()) == 1 and not bad.exists()


def test_cli_async_scheduling_delays_a_busy_engines_admissions(golden_setup, tmp_path):
    """async_scheduling = true in a role: a closed loop's TTFT grows (with spread lengths each next request is sent while
    others run, and waits the passes scheduled before its send), the summary says so, the first wave (sent to an idle
    engine) is unchanged; a non-boolean value is one line naming the key, exit 2, nothing written (a real subprocess)."""
    cfg, _ = golden_setup
    text = cfg.read_text()
    on = cfg.with_name("async.toml")
    on.write_text(text.replace("[roles.aggregated]\n", "[roles.aggregated]\nasync_scheduling = true\n"))
    out = {}
    for name, path in (("sync", cfg), ("async", on)):
        out[name] = tmp_path / f"{name}.parquet"
        r = runner.invoke(app, ["replay", str(path), "--load", "closed:4", "--isl", "200", "--osl", "12", "--range-ratio", "0.5",
                                "--output", str(out[name]), "--no-progress"])
        assert r.exit_code == 0, r.output
        assert ("async scheduling (vLLM's --async-scheduling)" in r.output) == (name == "async")
    sync, asyn = (pq.read_table(out[k]).to_pydict() for k in ("sync", "async"))
    summaries = [json.loads(pq.read_schema(out[k]).metadata[b"jaxsim.replay.summary"])[0] for k in ("sync", "async")]
    assert [s["async_scheduling"] for s in summaries] == [False, True]
    assert summaries[1]["mean_ttft_ms"] > summaries[0]["mean_ttft_ms"]
    assert sync["ttft_ms"][:4] == asyn["ttft_ms"][:4]  # the first wave: sent at t = 0 to an idle engine
    bad = cfg.with_name("bad-async.toml")
    bad.write_text(text.replace("[roles.aggregated]\n", '[roles.aggregated]\nasync_scheduling = "yes"\n'))
    dest = tmp_path / "bad.parquet"
    p = subprocess.run([sys.executable, "-m", "jaxsim", "replay", str(bad), "--load", "closed:4", "--isl", "200", "--osl", "12",
                        "--output", str(dest)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 2 and "async_scheduling" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not dest.exists()
