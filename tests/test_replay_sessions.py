"""Multi-turn sessions (issue 26, Deliver 3): a later turn is sent when its previous turn completes plus its think
time, on the replica that served the session. The session replay must equal an ordinary replay of the same
requests sent at the times it decided (bit for bit); the trace format, the generator and the CLI refuse bad
input in one line."""

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
from jaxsim.errors import QueryError
from jaxsim.replay import orchestrate as O
from jaxsim.replay.deployment import config_from_binding
from jaxsim.replay.engine import DONE, REJECTED, TERMINAL_NAMES, UNFINISHED
from jaxsim.replay.prefix_cache import HashIds, read_hash_ids
from jaxsim.replay.session_traces import SessionShape, session_trace, write_session_jsonl
from jaxsim.replay.sessions import run_sessions
from jaxsim.replay.traces import Trace, load_trace, read_sessions
from jaxsim.router import Router
from jaxsim.rules.config import config_from_dict

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "deployment_calibrated.toml"


def _config(replicas: int = 1, router: str = "round_robin", **replace):
    text = CONFIG.read_text().replace("replicas = 1", f"replicas = {replicas}")
    cfg = config_from_dict(tomllib.loads(text), source="dep.toml", base_dir=CONFIG.parent)
    return dataclasses.replace(config_from_binding(bind(cfg), name="dep"), router=Router(router), **replace)


@pytest.fixture(scope="module")
def chat():
    """Sessions that overlap: turns queue behind other sessions' prompts, so send times matter."""
    shape = SessionShape(turns=3, new_input="uniform:300:2500", output="uniform:20:240", shared_prefix_ratio=0.25, prefix_groups=3,
                         think_time_ms=350.0)
    return session_trace(24, 6.0, shape, seed=5)


def _session_run(c, trace):
    stage = O._first_stage(c, 0, trace, O._max_passes(trace))
    routed, results, _, decided = run_sessions(stage, trace.sessions, c.router, None, 0)
    return O.StageRun(routed, results, [decided.cache_hit_tokens[idx] for idx in routed.parts]).columns(len(trace)), decided


def _replay_of_send_times(c, trace, decided):
    """The entered requests replayed the ordinary way, each sent at the time the session replay sent it, on the
    replica it went to (ties in the order they entered their replica's engine)."""
    q = np.flatnonzero(decided.entered)
    q = q[np.lexsort((decided.engine_row[q], decided.sent_ms[q]))]
    plain = Trace("sent", decided.sent_ms[q], trace.input_tokens[q], trace.output_tokens[q], np.arange(q.size),
                  hash_ids=None if trace.hash_ids is None else trace.hash_ids.take(q), trace_block_size=trace.trace_block_size)
    stage = dataclasses.replace(O._first_stage(c, 0, plain, O._max_passes(trace)), assignment=decided.replica[q])
    run = O.StageRun(stage)
    O._run_stages([run], timeline_len=0, chunk=256)
    return q, run.columns(q.size)


@pytest.mark.parametrize("replicas,router", [(1, "round_robin"), (2, "round_robin"), (2, "least_loaded")])
def test_a_session_replay_equals_a_replay_of_the_times_it_sent_each_turn(chat, replicas, router):
    trace, _ = chat
    c = _config(replicas, router)
    cols, decided = _session_run(c, trace)
    assert np.all(cols["terminal"] == DONE)
    q, plain = _replay_of_send_times(c, trace, decided)
    assert q.size == len(trace)
    for name in ("first_token_ms", "second_token_ms", "last_token_ms", "sent_ms", "output_tokens", "preemptions", "admissions",
                 "decode_rounds", "terminal"):
        np.testing.assert_array_equal(cols[name][q], plain[name], err_msg=name)


@pytest.mark.parametrize("replicas,router", [(1, "round_robin"), (2, "kv")])
def test_sessions_with_prefix_caching_equal_a_cached_replay_of_their_send_times(chat, replicas, router):
    """With the trace's hash_ids, each replica caches prefixes in the loop: a later turn reads its conversation's
    previous prompt (and the system prompt its group shares) from the cache; the replay equals an ordinary cached
    replay of the same requests sent at the times it decided, hit tokens included."""
    trace, hashes = chat
    trace = dataclasses.replace(trace, hash_ids=HashIds.from_rows(hashes), trace_block_size=512)
    c = _config(replicas, router)
    (o,) = O.run_replays([c], trace, [0])
    assert o.summary["prefix_caching"] == "modelled" and o.status_text == "completed"
    r = o.requests
    prev = trace.sessions.previous
    later = np.flatnonzero(prev >= 0)
    full = later[trace.input_tokens[prev[later]] >= 512]  # the previous prompt holds a whole 512-token hash block
    assert full.size > 10 and np.all(r["cache_hit_tokens"][full] >= 512)  # read back on the session's replica (roomy pool)
    assert np.all(r["cache_hit_tokens"] < r["input_tokens"])
    sent = r["sent_ms"]
    q = np.lexsort((np.arange(len(trace)), sent))  # ties: rows in stage order, as they entered their engines
    plain = Trace("sent", sent[q], trace.input_tokens[q], trace.output_tokens[q], np.arange(q.size),
                  hash_ids=trace.hash_ids.take(q), trace_block_size=512)
    stage = dataclasses.replace(O._first_stage(c, 0, plain, O._max_passes(trace)), assignment=np.asarray(r["replica"])[q])
    run = O.StageRun(stage)
    O._run_stages([run], timeline_len=0, chunk=256)
    cols = run.columns(q.size)
    for name in ("cache_hit_tokens", "first_token_ms", "last_token_ms", "preemptions", "admissions"):
        np.testing.assert_array_equal(np.asarray(r[name])[q], cols[name], err_msg=name)


@pytest.mark.parametrize("cached", [False, True])
def test_sessions_beyond_the_first_slot_capacity_replay_as_the_ordinary_engine(cached):
    """100 sessions start at once on one replica: more requests in flight than the loop's first 64 slots, so the
    engines widen their running lists mid-replay (SLOTS_FULL) and must still equal the ordinary replay (with the
    prefix cache too: its block tables widen with the slots)."""
    shape = SessionShape(turns=2, new_input="uniform:100:600", output="uniform:30:90", think_time_ms=5.0, trace_block_size=64)
    trace, hashes = session_trace(100, 1e6, shape, seed=2)
    if cached:
        trace = dataclasses.replace(trace, hash_ids=HashIds.from_rows(hashes), trace_block_size=64)
    c = _config()
    cols, decided = _session_run(c, trace)
    assert np.all(cols["terminal"] == DONE)
    q, plain = _replay_of_send_times(c, trace, decided)
    for name in ("first_token_ms", "last_token_ms", "sent_ms", "preemptions", "admissions", "cache_hit_tokens"):
        np.testing.assert_array_equal(cols[name][q], plain[name], err_msg=name)
    assert np.any(cols["cache_hit_tokens"] > 0) == cached


def test_a_later_turn_is_sent_its_think_time_after_the_previous_completes_on_the_same_replica(chat):
    trace, _ = chat
    (o,) = O.run_replays([_config(2)], trace, [0])
    r, prev = o.requests, trace.sessions.previous
    later = np.flatnonzero(prev >= 0)
    np.testing.assert_array_equal(r["sent_ms"][later], r["last_token_ms"][prev[later]] + trace.sessions.delay_ms[later])
    np.testing.assert_array_equal(r["replica"][later], r["replica"][prev[later]])
    assert set(r["replica"][prev < 0]) == {0, 1}  # first turns: round-robin over sessions
    assert o.summary["sessions"] == 24 and o.summary["unsent_turns"] == 0
    assert list(r["turn"][:3]) == [1, 2, 3] and r["session"][0] == "s0"
    # a longer think time only delays later turns
    slower = dataclasses.replace(trace, sessions=dataclasses.replace(trace.sessions, delay_ms=trace.sessions.delay_ms * 4))
    (o2,) = O.run_replays([_config(2)], slower, [0])
    assert np.all(o2.requests["sent_ms"][later] > r["sent_ms"][later])
    np.testing.assert_array_equal(o2.requests["sent_ms"][prev < 0], r["sent_ms"][prev < 0])


def test_a_session_replay_reports_its_progress_by_simulated_time(chat, monkeypatch):
    import jaxsim.replay.inloop as L

    monkeypatch.setattr(L, "REPORT_S", 0.0)
    trace, _ = chat
    seen = []
    O.run_replays([_config()], trace, [0], progress=seen.append)
    assert len(seen) > 3
    simulated = [p.simulated_ms for p in seen]
    assert simulated == sorted(simulated) and seen[0].replays_done == 0
    assert seen[-1].fraction == 1.0 and seen[-1].replays_done == 1 and seen[-1].requests_done == len(trace)


def test_a_rejected_turn_ends_its_session(tmp_path):
    c = _config()
    too_long = int(c.aggregated.max_model_len) + 10
    rows = [
        {"timestamp": 0, "input_length": 500, "output_length": 20, "session_id": "a"},
        {"timestamp": 0, "input_length": too_long, "output_length": 20, "session_id": "a", "delay_ms": 10},
        {"timestamp": 0, "input_length": too_long + 600, "output_length": 20, "session_id": "a", "delay_ms": 10},
        {"timestamp": 5, "input_length": 700, "output_length": 30, "session_id": "b"},
        {"timestamp": 5, "input_length": 900, "output_length": 30, "session_id": "b", "delay_ms": 0},
    ]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (o,) = O.run_replays([c], load_trace(path), [0])
    term = list(o.requests["terminal"])
    assert term == [TERMINAL_NAMES[x] for x in (DONE, REJECTED, UNFINISHED, DONE, DONE)]
    assert np.isnan(o.requests["sent_ms"][2]) and o.summary["unsent_turns"] == 1
    assert o.requests["sent_ms"][1] == o.requests["last_token_ms"][0] + 10
    assert o.requests["sent_ms"][4] == o.requests["last_token_ms"][3]


def test_the_generator_grows_each_prompt_by_the_conversation_and_shares_system_prompts(chat, tmp_path):
    trace, hashes = chat
    ses = trace.sessions
    later = np.flatnonzero(ses.previous >= 0)
    prev = ses.previous[later]
    grown = trace.input_tokens[later] - trace.input_tokens[prev] - trace.output_tokens[prev]
    assert np.all((grown >= 300) & (grown <= 2500))
    for q, p in zip(later, prev):  # turn k repeats turn k-1's full prompt blocks
        full = int(trace.input_tokens[p]) // 512
        assert hashes[q][:full] == hashes[p][:full] and len(hashes[q]) == -(-int(trace.input_tokens[q]) // 512)
    path = tmp_path / "chat.jsonl"
    write_session_jsonl(trace, hashes, path)
    assert len(read_hash_ids(path, 512)) == len(trace)  # one id per started 512-token block, every row
    back = load_trace(path)
    np.testing.assert_array_equal(back.sessions.previous, ses.previous)
    np.testing.assert_array_equal(back.sessions.delay_ms, ses.delay_ms)
    np.testing.assert_array_equal(back.input_tokens, trace.input_tokens)
    # a system prompt shared within a group: mean new input ~1400 x 0.25 = ~350 tokens < one 512-token block here;
    # with a longer one, first turns of a group share their leading ids
    shape = SessionShape(turns=2, new_input="fixed:4096", output="fixed:16", shared_prefix_ratio=0.5, prefix_groups=2)
    t2, h2 = session_trace(8, 1.0, shape, seed=0)
    firsts = np.flatnonzero(t2.sessions.previous < 0)
    heads = {tuple(h2[q][:4]) for q in firsts}
    assert len(heads) == 2 and all(len(h) == 4 for h in heads)


def test_a_later_turn_may_omit_its_timestamp(tmp_path):
    """As the reference's and Dynamo's session rows: later turns carry a think time, not a timestamp."""
    rows = [
        {"timestamp": 10, "input_length": 300, "output_length": 20, "session_id": "a"},
        {"timestamp": 20, "input_length": 400, "output_length": 20, "session_id": "b"},
        {"input_length": 800, "output_length": 20, "session_id": "a", "delay_ms": 100},
        {"input_length": 900, "output_length": 20, "session_id": "b", "delay": 50},
    ]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = load_trace(path)
    assert list(t.sessions.session) == ["a", "a", "b", "b"] and list(t.sessions.previous) == [-1, 0, -1, 2]
    np.testing.assert_array_equal(t.sessions.delay_ms, [0, 100, 0, 50])
    (o,) = O.run_replays([_config()], t, [0])
    assert o.requests["sent_ms"][1] == o.requests["last_token_ms"][0] + 100
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"input_length": 5, "output_length": 5, "session_id": "c"}) + "\n")
    with pytest.raises(QueryError, match="row 2: missing field 'timestamp' \\(the first turn of session 'c'"):
        load_trace(path)


def test_trace_cuts_keep_whole_conversations_so_far(chat):
    trace, _ = chat
    head = trace.head(10)
    assert np.all(head.sessions.previous < np.arange(10))
    np.testing.assert_array_equal(head.sessions.previous, trace.sessions.previous[:10])
    scaled = trace.scaled(2.0)
    np.testing.assert_array_equal(scaled.sessions.delay_ms, trace.sessions.delay_ms * 2.0)


@pytest.mark.parametrize("rows,needle", [
    ([{"session_id": "a", "turn": 1}, {"session_id": "a", "turn": 3}], "row 2: session 'a' turn 3 refers to turn 2"),
    ([{"session_id": "a", "turn": 2}], "row 1: session 'a' turn 2 refers to turn 1, but no earlier row has it"),
    ([{"session_id": "a", "delay_ms": 5}], "row 1: delay_ms=5 on the first turn of session 'a'"),
    ([{"session_id": "a"}, {"session_id": "a", "delay": -1}], "row 2: delay=-1 must be a number of ms >= 0"),
    ([{"session_id": 7}], "row 1: session_id=7 must be a non-empty string"),
    ([{"delay_ms": 3}], "row 1: 'delay_ms' without a 'session_id'"),
    ([{"session_id": "a"}, {"session_id": "a", "delay": 1, "delay_ms": 1}], "row 2: both 'delay' and 'delay_ms'"),
    ([{"session_id": "a", "timestamp": 9}, {"session_id": "a", "timestamp": 3}], "row 2: session 'a' turn 2 has timestamp 3, before"),
])
def test_bad_session_rows_are_refused_naming_the_row(tmp_path, rows, needle):
    path = tmp_path / "bad.jsonl"
    base = {"timestamp": 0, "input_length": 100, "output_length": 10}
    path.write_text("".join(json.dumps(base | r) + "\n" for r in rows))
    with pytest.raises(QueryError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        read_sessions(path)
    r = CliRunner().invoke(app, ["replay", str(CONFIG), "--trace", str(path), "--output", str(tmp_path / "o.parquet"), "--no-progress"])
    assert r.exit_code == 2 and needle in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_cli_writes_sessions_and_replays_them(tmp_path):
    chat = tmp_path / "chat.jsonl"
    r = CliRunner().invoke(app, ["trace", "sessions", "--sessions", "6", "--rate", "2", "--turns", "3", "--new-input", "uniform:200:900",
                                 "--osl", "uniform:20:80", "--think-time-ms", "250", "--output", str(chat)])
    assert r.exit_code == 0, r.output
    assert "6 sessions x 3 turns = 18 requests" in r.output
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(app, ["replay", str(CONFIG), "--trace", str(chat), "--output", str(out), "--no-progress", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output[r.output.index("{"):])["replays"][0]
    shown = CliRunner().invoke(app, ["replay", str(CONFIG), "--trace", str(chat), "--output", str(out), "--no-progress", "--force"])
    assert "6 multi-turn sessions: each later turn sent when its previous turn completed" in shown.output
    assert summary["sessions"] == 6 and summary["unsent_turns"] == 0
    t = pq.read_table(out)
    assert t.column("turn").to_pylist()[:3] == [1, 2, 3] and set(t.column("session").to_pylist()) == {f"s{i}" for i in range(6)}
    # the same file again is not overwritten without --force
    r = CliRunner().invoke(app, ["trace", "sessions", "--output", str(chat)])
    assert r.exit_code == 2
    # sessions with a closed loop, or a bad shape: one line, exit 2
    r = CliRunner().invoke(app, ["replay", str(CONFIG), "--trace", str(chat), "--output", str(tmp_path / "c.parquet"), "--no-progress",
                                 "--max-concurrency", "4"])
    assert r.exit_code == 2 and "multi-turn sessions with a closed loop" in r.output and len(r.output.strip().splitlines()) == 1
    dis = ROOT / "configs" / "deployment_disaggregated.toml"
    r = CliRunner().invoke(app, ["replay", str(dis), "--trace", str(chat), "--output", str(tmp_path / "d.parquet"), "--no-progress"])
    assert r.exit_code == 2 and "replayed on aggregated deployments only" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "d.parquet").exists()
    r = CliRunner().invoke(app, ["trace", "sessions", "--shared-prefix-ratio", "0.3", "--output", str(tmp_path / "x.jsonl")])
    assert r.exit_code == 2 and "needs prefix_groups >= 1" in r.output


@pytest.mark.slow
def test_cli_sessions_in_a_real_process(tmp_path):
    chat = tmp_path / "chat.jsonl"
    p = subprocess.run([sys.executable, "-m", "jaxsim", "trace", "sessions", "--sessions", "3", "--turns", "2", "--output", str(chat)],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([sys.executable, "-m", "jaxsim", "replay", str(CONFIG), "--trace", str(chat), "--output", str(tmp_path / "o.parquet"),
                        "--no-progress"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "completed" in p.stdout
