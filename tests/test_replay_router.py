"""Routing across replicas (issue 26, Deliver 2): round-robin, least-loaded and Dynamo's KV router, the router
in the loop. The online replay must equal an ordinary replay of each replica's requests (the decisions
fixed beforehand), bit for bit; the policies decide as documented; bad settings are one line, exit 2."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import jaxsim._jax  # noqa: F401  (x64)
from jaxsim.cli.main import app
from jaxsim.deploy.binding import bind
from jaxsim.errors import BindingError
from jaxsim.replay import orchestrate as O
from jaxsim.replay.deployment import config_from_binding
from jaxsim.replay.engine import DONE, TERMINAL_NAMES
from jaxsim.replay.loads import Lengths, benchmark_trace, parse_load
from jaxsim.replay.routing import ReplicaView, choose
from jaxsim.router import Router, RouterError, read_router
from jaxsim.rules.config import config_from_dict, load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "deployment_calibrated.toml"


def _config(replicas: int = 3, router: str = "round_robin"):
    cfg = config_from_dict(tomllib.loads(CONFIG.read_text().replace("replicas = 1", f"replicas = {replicas}")), source="dep.toml",
                           base_dir=CONFIG.parent)
    return dataclasses.replace(config_from_binding(bind(cfg), name="dep"), router=Router(router))


@pytest.fixture(scope="module")
def busy():
    """An open loop that keeps three TP2 replicas busy (queues, batches of several prompts)."""
    return benchmark_trace(parse_load("poisson:14:160"), Lengths(2048, 192, 0.6, "vllm"), seed=3)


def _offline(c, trace, replica):
    """The same requests replayed the ordinary way with the replicas fixed beforehand."""
    st = dataclasses.replace(O._first_stage(c, 0, trace, O._max_passes(trace)), assignment=np.asarray(replica))
    run = O.StageRun(st)
    O._run_stages([run], timeline_len=0, chunk=256)
    return run.columns(len(trace))


@pytest.mark.parametrize("policy", ["least_loaded", "kv"])
def test_the_router_in_the_loop_equals_a_replay_of_its_decisions(busy, policy):
    (o,) = O.run_replays([_config(router=policy)], busy, [0])
    assert o.status_text == "completed"
    cols = _offline(_config(), busy, o.requests["replica"])
    for mine, theirs in (("first_token_ms", "first_token_ms"), ("last_token_ms", "last_token_ms"), ("preemptions", "preemptions"),
                         ("admissions", "admissions"), ("generated_tokens", "output_tokens")):
        np.testing.assert_array_equal(np.asarray(o.requests[mine]), np.asarray(cols[theirs]), err_msg=mine)
    np.testing.assert_array_equal(o.requests["ttst_ms"], cols["second_token_ms"] - cols["first_token_ms"])
    assert o.routing["policy"] == policy and sum(o.routing["requests_per_replica"]) == len(busy)
    assert set(np.unique(o.requests["replica"])) == {0, 1, 2}


def test_round_robin_is_the_default_and_unchanged(busy):
    (o,) = O.run_replays([_config()], busy, [0])
    np.testing.assert_array_equal(o.requests["replica"], np.arange(len(busy)) % 3)
    assert o.routing is None


def test_least_loaded_never_sends_to_a_busier_replica(busy):
    """At each arrival the chosen replica had no more requests in flight than any other (recomputed from
    the replay's own first-token and completion times)."""
    (o,) = O.run_replays([_config(router="least_loaded")], busy, [0])
    r = o.requests
    done_ms = np.where(r["terminal"] == TERMINAL_NAMES[DONE], r["last_token_ms"], np.nan)
    assert np.isfinite(done_ms).all()
    for q in range(len(busy)):
        t = r["arrival_ms"][q]
        earlier = np.arange(q)
        flying = earlier[~(done_ms[earlier] <= t)]
        load = np.bincount(r["replica"][flying], minlength=3)
        assert load[r["replica"][q]] == load.min(), q
        assert r["replica"][q] == int(np.argmin(load))  # ties to the lowest index


def _view(t_ms=0.0, keys=(), in_flight=0, blocks=4):
    v = ReplicaView()
    for i in range(in_flight):
        v.take(100 + i, t_ms, np.asarray(keys, np.int64), blocks, 0, True)
    return v


def test_kv_prefers_the_replica_holding_the_prefix_unless_its_load_outweighs_it():
    keys = np.arange(8, dtype=np.int64)
    holder, idle = _view(keys=keys, in_flight=0), _view()
    holder.take(1, 0.0, keys, 8, 0, False)  # sent there once (rejected: holds no load), so its blocks are predicted cached
    assert choose(Router("kv"), [idle, holder], 2, 10.0, keys, 8) == (1, 8)
    assert choose(Router("kv", overlap_score_weight=0.0), [idle, holder], 2, 10.0, keys, 8)[0] == 0  # load only: a tie, lowest index
    busy = _view(keys=keys + 100, in_flight=3, blocks=8)  # 24 blocks of other requests in flight, 24 prefilling
    busy.take(1, 0.0, keys, 8, 0, False)
    assert choose(Router("kv"), [idle, busy], 2, 10.0, keys, 8)[0] == 0
    assert choose(Router("kv", ttl_s=1.0), [idle, holder], 2, 5_000.0, keys, 8) == (0, 0)  # forgotten after the TTL


def test_a_replica_forgets_finished_work():
    v = _view(keys=np.arange(4), in_flight=2)
    assert v.in_flight == 2 and v.prefill_blocks == 8
    v.update(50.0, np.array([40.0, np.nan]), np.array([np.nan, np.nan]))
    assert v.prefill_blocks == 4 and v.in_flight == 2
    v.update(60.0, np.array([40.0, 55.0]), np.array([58.0, np.nan]))
    assert v.prefill_blocks == 0 and v.in_flight == 1 and len(v.active_keys) == 4  # the other still holds the shared blocks


@pytest.mark.parametrize("value,message", [
    ("random", "router.policy='random': expected one of round_robin, least_loaded, kv"),
    ({"policy": "kv", "overlap_score_weight": -1}, "router.overlap_score_weight=-1: must be a number in [0, 1000]"),
    ({"policy": "kv", "ttl_s": 0}, "router.ttl_s=0: must be a number of seconds in (0,"),
    ({"policy": "kv", "weight": 1}, "router.weight: unknown key"),
])
def test_a_bad_router_is_one_line_naming_the_key(value, message):
    with pytest.raises(BindingError) as e:
        config_from_dict({"model": "m", "system": "s", "router": value}, source="d.toml")
    assert str(e.value).startswith("d.toml: ") and message in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(RouterError):
        read_router(value)


def test_a_router_needs_an_open_loop():
    with pytest.raises(ValueError, match="closed loop"):
        dataclasses.replace(_config(router="kv"), max_concurrency=4)


def test_the_deployment_states_its_router(tmp_path):
    p = tmp_path / "dep.toml"
    text = CONFIG.read_text().replace("replicas = 1", "replicas = 2")
    p.write_text(text.replace('mode = "aggregated"', 'mode = "aggregated"\nrouter = { policy = "kv", overlap_score_weight = 2.0 }'))
    cfg = load_config(p)
    assert cfg.router == Router("kv", overlap_score_weight=2.0)
    assert config_from_binding(bind(cfg)).router == cfg.router


def test_cli_routes_and_reports(tmp_path):
    dep = tmp_path / "dep.toml"
    dep.write_text(CONFIG.read_text().replace("replicas = 1", "replicas = 2"))
    out = tmp_path / "r.parquet"
    r = CliRunner().invoke(app, ["replay", str(dep), "--load", "poisson:8:40", "--isl", "1024", "--osl", "64", "--router", "least_loaded",
                                 "--output", str(out), "--json", "--no-progress"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout[r.stdout.index("{"):])["replays"][0]
    assert summary["router"]["policy"] == "least_loaded" and sum(summary["router"]["requests_per_replica"]) == 40
    table = pq.read_table(out)
    assert set(table.column("replica").to_pylist()) <= {0, 1}


@pytest.mark.parametrize("args,message", [
    (["--router", "fastest"], "error: --router.policy='fastest': expected one of round_robin, least_loaded, kv"),
    (["--router", "kv", "--load", "closed:4"], "closed loop"),
])
def test_cli_bad_router_is_one_line_exit_2(tmp_path, args, message):
    base = [sys.executable, "-m", "jaxsim", "replay", str(CONFIG), "--output", str(tmp_path / "x.parquet")]
    if "--load" not in args:
        base += ["--load", "poisson:4:8"]
    r = subprocess.run(base + args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert not (tmp_path / "x.parquet").exists()
