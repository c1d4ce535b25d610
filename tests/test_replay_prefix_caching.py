"""Prefix caching in `jaxsim replay` (issue 26): a Mooncake trace's hash_ids reach the compiled cached engine
through the deployment config (`prefix_caching`, on by default), `--trace-block-size` and the orchestrator; the
request table gains `cache_hit_tokens`, the summary says what the cache did (or why it is not modelled)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pyarrow.parquet as pq
import pytest
from replay_support import golden_table
from typer.testing import CliRunner

from jaxsim.cli.main import app
from jaxsim.deploy.binding import bind
from jaxsim.errors import QueryError
from jaxsim.replay import cache_engine as ce
from jaxsim.replay.deployment import ReplayConfig, WorkerPool, config_from_binding
from jaxsim.replay.engine import COMPLETED, PASS_LIMIT, make_params
from jaxsim.replay.orchestrate import prefix_caching_mode, run_replays
from jaxsim.replay.prefix_cache import HashIds, block_keys, inferred_trace_block_size, read_hash_ids
from jaxsim.replay.traces import load_trace, make_trace
from jaxsim.router import Router
from jaxsim.rules.config import load_config

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
CASES_DIR = Path(__file__).parent / "data" / "prefix_cases"
CASES = sorted(p.name for p in CASES_DIR.iterdir() if p.is_dir())


def _shared_trace(n: int = 12, seed: int = 3, tbs: int = 16, span_ms: float = 40.0):
    """Requests over three shared prefixes (hash ids of ``tbs`` tokens), arriving close together (within ``span_ms``)."""
    g = np.random.default_rng(seed)
    hashes = [[100 * int(g.integers(0, 3)) + j for j in range(3)] + [10_000 + 10 * i + j for j in range(int(g.integers(1, 3)))]
              for i in range(n)]
    prompts = [len(h) * tbs for h in hashes]
    trace = make_trace("shared", np.sort(g.uniform(0, span_ms, n)), prompts, g.integers(3, 20, n), rebase=False)
    return dataclasses.replace(trace, hash_ids=HashIds.from_rows([hashes[r] for r in trace.row.tolist()]), trace_block_size=tbs)


def _pool(**kw) -> WorkerPool:
    args = dict(table=golden_table("ar_core"), max_num_batched_tokens=128, max_num_seqs=4, block_size=8, num_gpu_blocks=40,
                max_model_len=4096)
    return WorkerPool(**{**args, **kw})


def test_the_replay_reads_shared_prefixes_as_the_cached_engine_does():
    """The orchestrated replay of a trace with hash_ids equals the compiled cached engine called directly, and reads
    fewer prompt tokens than the same replay with prefix caching off (which equals a trace without hash_ids)."""
    trace = _shared_trace()
    pool = _pool()
    [on] = run_replays([ReplayConfig("on", 0, np.zeros(5), aggregated=pool)], trace)
    [off] = run_replays([ReplayConfig("off", 0, np.zeros(5), aggregated=dataclasses.replace(pool, prefix_caching=False))], trace)
    [bare] = run_replays([ReplayConfig("bare", 0, np.zeros(5), aggregated=pool)], dataclasses.replace(trace, hash_ids=None))
    keys, num_keys = block_keys(trace.hash_ids, trace.input_tokens, 16, 8)
    params = make_params(pool.table, max_num_batched_tokens=128, max_num_seqs=4, block_size=8, num_gpu_blocks=40, num_draft_tokens=0,
                         accept_rates=np.zeros(5), max_model_len=4096, max_passes=10**6)
    rq = trace.requests(16)
    pk, capacity = ce.prompt_keys(keys, num_keys, 16)
    shapes = ce.shapes_for(trace.input_tokens, trace.output_tokens, max_num_seqs=4, block_size=8,
                           num_gpu_blocks=40, max_model_len=4096, num_keys=capacity)
    direct = ce.cached_replay_jit(params, rq, pk, shapes)
    n = len(trace)
    np.testing.assert_array_equal(on.requests["first_token_ms"], np.asarray(direct.result.first_token_ms)[:n])
    np.testing.assert_array_equal(on.requests["cache_hit_tokens"], np.asarray(direct.first_hit_tokens)[:n])
    assert on.summary["prefix_caching"] == "modelled" and on.summary["cache_hit_tokens"] > 0
    assert 0 < on.summary["prefix_hit_ratio"] < 1
    assert off.summary["prefix_caching"] == "off" and bare.summary["prefix_caching"] == "no hash_ids"
    for other in (off, bare):
        assert not other.requests["cache_hit_tokens"].any()
    np.testing.assert_array_equal(off.requests["ttft_ms"], bare.requests["ttft_ms"])
    assert on.summary["mean_ttft_ms"] < off.summary["mean_ttft_ms"]


def _crowd(n: int = 110, seed: int = 4, tbs: int = 64):
    """``n`` requests over shared prefixes arriving within 5 ms: more than 64 run at once."""
    g = np.random.default_rng(seed)
    hashes = [[1000 * int(g.integers(0, 4)) + j for j in range(2)] + [10_000 + 10 * i + j for j in range(int(g.integers(1, 3)))]
              for i in range(n)]
    trace = make_trace("crowd", np.sort(g.uniform(0, 5, n)), [len(h) * tbs for h in hashes], g.integers(20, 60, n), rebase=False)
    return dataclasses.replace(trace, hash_ids=HashIds.from_rows([hashes[r] for r in trace.row.tolist()]), trace_block_size=tbs)


def test_the_slot_ladder_replays_as_the_full_capacity():
    """max_num_seqs 256 (the calibrated profile, decode measured to batch 128): the replay starts at 64 running-list
    slots and doubles on SLOTS_FULL; it equals the cached engine run at the full 256 slots from the start."""
    trace = _crowd()
    cal = config_from_binding(bind(load_config(ROOT / "configs" / "deployment_calibrated.toml")))
    pool = dataclasses.replace(cal.aggregated, max_num_seqs=256, max_num_batched_tokens=2048, num_gpu_blocks=3000, replicas=1)
    tm: dict = {}
    [on] = run_replays([ReplayConfig("on", 0, np.zeros(5), aggregated=pool)], trace, timings=tm)
    assert on.status_text == "completed" and tm["compilations"] + tm.get("executables_loaded", 0) >= 6  # rungs 64 and 128 at least
    keys, num_keys = block_keys(trace.hash_ids, trace.input_tokens, 64, pool.block_size)
    params = pool.params(0, np.zeros(5), 10**6, 0)
    n = len(trace)
    pk, capacity = ce.prompt_keys(keys, num_keys, 128)
    shapes = ce.shapes_for(trace.input_tokens, trace.output_tokens, max_num_seqs=256, block_size=pool.block_size, num_gpu_blocks=3000,
                           max_model_len=pool.max_model_len, num_keys=capacity)
    assert shapes.slots == 256
    direct = ce.cached_replay_jit(params, trace.requests(128), pk, shapes)
    assert int(direct.result.status) == COMPLETED
    for mine, theirs in (("first_token_ms", direct.result.first_token_ms), ("last_token_ms", direct.result.last_token_ms),
                         ("cache_hit_tokens", direct.first_hit_tokens), ("preemptions", direct.result.preemptions)):
        np.testing.assert_array_equal(on.requests[mine], np.asarray(theirs)[:n], err_msg=mine)
    assert on.summary["cache_hit_tokens"] > 0


STRETCH_SHAPES = ce.Shapes(slots=8, table_blocks=64, pool_blocks=256, num_keys=256)


def _stretch_case(seed: int):
    """A random shared-prefix replay on a small pool (preemptions, evictions, pass limits), at fixed static shapes."""
    g = np.random.default_rng(seed)
    n, tbs, bs = int(g.integers(3, 40)), 16, int(g.choice([8, 16, 32]))
    hashes = [[100 * int(g.integers(0, 3)) + j for j in range(int(g.integers(1, 4)))]
              + [10_000 + 10 * i + j for j in range(int(g.integers(1, 4)))] for i in range(n)]
    prompts = [len(h) * tbs - int(g.integers(0, tbs)) for h in hashes]
    trace = make_trace("t", np.sort(g.uniform(0, float(g.choice([5, 50, 500])), n)), prompts, g.integers(1, 80, n), rebase=False)
    trace = dataclasses.replace(trace, hash_ids=HashIds.from_rows([hashes[r] for r in trace.row.tolist()]), trace_block_size=tbs)
    seqs, blocks = int(g.integers(1, 9)), int(g.integers(8, 200))
    params = make_params(golden_table("ar_core"), max_num_batched_tokens=int(g.choice([16, 64, 128])), max_num_seqs=seqs, block_size=bs,
                         num_gpu_blocks=blocks, num_draft_tokens=0, accept_rates=np.zeros(5), max_model_len=1024,
                         max_passes=int(g.choice([10**6, int(g.integers(5, 200))])), async_scheduling=bool(seed % 3 == 2))
    keys, num_keys = block_keys(trace.hash_ids, trace.input_tokens, tbs, bs)
    pk, _ = ce.prompt_keys(keys, num_keys, 64)
    pk = ce.PromptKeys(keys=jax.device_put(np.concatenate([np.asarray(pk.keys), np.zeros(512 - pk.keys.shape[0], np.int64)])), offset=pk.offset)
    return params, trace.requests(64), pk


def test_decode_stretches_equal_the_cached_engine_pass_by_pass():
    """Decode stretches of up to 8 passes change nothing but the loop steps: every per-request field, hit tokens,
    status, pass count and timeline row equal the pass-by-pass run (random cases with evictions and pass limits;
    every third with async scheduling)."""
    statuses, fewer = set(), 0
    for seed in range(24):
        params, rq, pk = _stretch_case(seed)
        one = jax.tree.map(np.asarray, ce.cached_replay_jit(params, rq, pk, STRETCH_SHAPES, timeline_len=1024, lookahead=0))
        ahead = jax.tree.map(np.asarray, ce.cached_replay_jit(params, rq, pk, STRETCH_SHAPES, timeline_len=1024, lookahead=8))
        for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(one)[0], jax.tree.leaves(ahead)):
            if "num_steps" not in str(path):
                np.testing.assert_array_equal(a, b, err_msg=f"seed {seed} {path}")
        statuses.add(int(one.result.status))
        fewer += int(ahead.result.num_steps) < int(one.result.num_steps)
    assert {COMPLETED, PASS_LIMIT} <= statuses and fewer >= 18


def test_cached_replays_on_several_threads_equal_each_run_alone(monkeypatch):
    """Five configurations' cached replays run on worker threads (one per core) give each configuration's replay run
    alone, field by field."""
    trace = _shared_trace(n=20, seed=11)
    configs = [ReplayConfig(f"c{k}", 0, np.zeros(5), aggregated=_pool(max_num_batched_tokens=64 + 16 * k, num_gpu_blocks=30 + 5 * k))
               for k in range(5)]
    monkeypatch.setenv("JAXSIM_CACHED_THREADS", "4")
    together = run_replays(configs, trace)
    monkeypatch.setenv("JAXSIM_CACHED_THREADS", "1")
    for c, o in zip(configs, together):
        [alone] = run_replays([c], trace)
        for col in ("first_token_ms", "last_token_ms", "cache_hit_tokens", "preemptions", "admissions"):
            np.testing.assert_array_equal(o.requests[col], alone.requests[col], err_msg=f"{c.name} {col}")
    assert len({float(o.summary["mean_ttft_ms"]) for o in together}) > 1


def test_each_round_robin_replica_has_its_own_cache():
    """Two replicas: each equals a one-replica replay of its own (round-robin) share of the trace."""
    trace = _shared_trace(n=14, seed=8)
    [two] = run_replays([ReplayConfig("two", 0, np.zeros(5), aggregated=_pool(replicas=2))], trace)
    for r in (0, 1):
        share = trace._take(np.flatnonzero(np.arange(len(trace)) % 2 == r))
        [one] = run_replays([ReplayConfig("one", 0, np.zeros(5), aggregated=_pool())], share)
        mine = two.requests["replica"] == r
        np.testing.assert_array_equal(two.requests["cache_hit_tokens"][mine], one.requests["cache_hit_tokens"])
        np.testing.assert_allclose(two.requests["e2e_ms"][mine], one.requests["e2e_ms"], rtol=1e-12)


@pytest.mark.parametrize("policy", ["kv", "least_loaded"])
def test_a_routed_pool_caches_per_replica_as_a_replay_of_its_decisions(policy):
    """Routed in the loop, each replica's cache and times equal a one-replica replay of the requests the router sent it
    (open loop: sent at their arrivals); the KV router's predicted overlap is real overlap here."""
    trace = _shared_trace(n=30, seed=5)
    [routed] = run_replays([ReplayConfig("r", 0, np.zeros(5), aggregated=_pool(replicas=3), router=Router(policy=policy))], trace)
    assert routed.summary["prefix_caching"] == "modelled" and routed.status_text == "completed"
    assert routed.summary["cache_hit_tokens"] > 0
    for r in range(3):
        mine = routed.requests["replica"] == r
        share = trace._take(np.flatnonzero(mine))
        [one] = run_replays([ReplayConfig("one", 0, np.zeros(5), aggregated=_pool())], share)
        for col in ("cache_hit_tokens", "first_token_ms", "last_token_ms", "preemptions", "admissions"):
            np.testing.assert_array_equal(routed.requests[col][mine], one.requests[col], err_msg=f"{policy} replica {r} {col}")


def test_loops_without_the_cache_say_so():
    trace = _shared_trace()
    pool = _pool()
    assert prefix_caching_mode(ReplayConfig("a", 0, np.zeros(5), aggregated=pool), trace) == "modelled"
    assert prefix_caching_mode(ReplayConfig("s", 2, np.array([0.5, 0.2, 0, 0, 0]), aggregated=pool), trace) == \
        "not modelled: speculative decoding"
    disagg = ReplayConfig("d", 0, np.zeros(5), prefill=pool, decode=pool, kv_bytes_per_token=1024, kv_transfer_bytes_per_s=1e9)
    assert prefix_caching_mode(disagg, trace) == "not modelled: disaggregated deployment"
    routed = ReplayConfig("r", 0, np.zeros(5), aggregated=_pool(replicas=2), router=Router(policy="kv"))
    assert prefix_caching_mode(routed, trace) == "modelled"
    assert prefix_caching_mode(ReplayConfig("g", 0, np.zeros(5), aggregated=_pool(state_blocks=2)), trace) == "not modelled: grouped KV cache"
    [r] = run_replays([disagg], trace)
    assert r.summary["prefix_caching"] == "not modelled: disaggregated deployment" and not r.requests["cache_hit_tokens"].any()


def test_mooncake_hash_ids_come_with_the_trace(tmp_path):
    t = load_trace("mooncake_conversation_1k", max_requests=50)
    rows = read_hash_ids(Path(ROOT / "jaxsim" / "data" / "traces" / "mooncake_conversation_1k.jsonl"))
    assert t.trace_block_size == 512 and [h.tolist() for h in t.hash_ids] == [rows[r] for r in t.row.tolist()]
    assert [h.tolist() for h in t.hash_ids.take([3, 0])] == [rows[t.row[3]], rows[t.row[0]]]
    assert load_trace("azure_conv_1k", max_requests=5).hash_ids is None
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}\n'
                   '{"timestamp": 1, "input_length": 600, "output_length": 4, "hash_ids": [1]}\n')
    with pytest.raises(QueryError, match=r"bad.jsonl: row 2: 1 hash_ids for 600 input tokens at 512 tokens per hash"):
        load_trace(bad)
    with pytest.raises(QueryError, match=r"row 1: 2 hash_ids for 600 input tokens at 1024 tokens per hash"):
        load_trace(bad, trace_block_size=1024)
    good = tmp_path / "good.jsonl"
    good.write_text('{"timestamp": 5, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}\n'
                    '{"timestamp": 1, "input_length": 100, "output_length": 4, "hash_ids": [1]}\n')
    assert [h.tolist() for h in load_trace(good).hash_ids] == [[1], [1, 2]]  # in arrival order, as the requests


def _case_config(case: str, root: Path) -> tuple[Path, Path, dict]:
    d = CASES_DIR / case
    c = json.loads((d / "case.json").read_text())
    prof = json.loads((d / "profile" / "profile.json").read_text())
    cfg = root / f"{case}.toml"
    cfg.write_text("\n".join([
        f'model = "{prof["model"]}"', 'system = "h200_sxm"', 'backend_version = "0.24.0"', f'profile = "{d / "profile"}"',
        f"block_size = {c['block_size']}", f"context_length = {c['context']}", "", "[roles.aggregated]", "tp = 1", "",
    ]))
    return cfg, d / "trace.jsonl", c


@pytest.mark.parametrize("case", CASES)
def test_cli_replay_with_prefix_caching_reproduces_the_reference(case, tmp_path):
    """`jaxsim replay` of the reference's prefix-caching cases (Mooncake traces with hash_ids, caching on by default):
    every request's TTFT, E2E, admissions, preemptions and first-admission hit tokens are the reference's."""
    cfg, trace, c = _case_config(case, tmp_path)
    out = tmp_path / "out.parquet"
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--trace-block-size", str(c["trace_block_size"]),
                            "--output", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "prefix caching on:" in r.output
    ref = [json.loads(x) for x in (CASES_DIR / case / "reference_requests.jsonl").read_text().splitlines() if x.strip()]
    ref = {int(g["session_id"].removeprefix("request_")) - 1: g for g in ref}
    t = pq.read_table(out).to_pydict()
    for i, row in enumerate(t["row"]):
        g = ref[row]
        assert t["ttft_ms"][i] == pytest.approx(g["ttft_ms"], rel=1e-12, abs=1e-9), (case, row)
        assert t["e2e_ms"][i] == pytest.approx(g["e2e_latency_ms"], rel=1e-12, abs=1e-9), (case, row)
        assert (t["admissions"][i], t["preemptions"][i]) == (g["admission_count"], g["readmission_count"])
        assert t["cache_hit_tokens"][i] == g["first_admission_reused_input_tokens"]
    summary = json.loads(pq.read_schema(out).metadata[b"jaxsim.replay.summary"])[0]
    assert summary["prefix_caching"] == "modelled"


def test_cli_prefix_caching_false_and_bad_block_size(tmp_path):
    """prefix_caching = false computes every prompt; a trace block size the hash_ids do not fit is one line, exit 2;
    a non-boolean prefix_caching is refused naming the key (a real subprocess)."""
    case = "fuzz-prefix-seed-4"
    cfg, trace, c = _case_config(case, tmp_path)
    text = cfg.read_text()
    off = tmp_path / "off.toml"
    off.write_text(text + "prefix_caching = false\n")
    out = tmp_path / "off.parquet"
    r = runner.invoke(app, ["replay", str(off), "--trace", str(trace), "--trace-block-size", str(c["trace_block_size"]),
                            "--output", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "prefix caching off" in r.output
    assert not any(pq.read_table(out).to_pydict()["cache_hit_tokens"])
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--trace-block-size", "7", "--output", str(tmp_path / "x.parquet")])
    assert r.exit_code == 2 and "hash_ids for" in r.output and "row 1" in r.output
    bad = tmp_path / "bad.toml"
    bad.write_text(text + 'prefix_caching = "yes"\n')
    p = subprocess.run([sys.executable, "-m", "jaxsim", "replay", str(bad), "--trace", str(trace), "--output", str(tmp_path / "y.parquet")],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 2 and "prefix_caching" in p.stderr and "Traceback" not in p.stderr


def test_an_unstated_trace_block_size_is_the_power_of_two_the_rows_fit(tmp_path):
    """Without --trace-block-size a trace reads at the power of two most rows fit (512 when it fits as many): every
    reference case's stated size is found, the bundled Mooncake trace reads at 512, and a row that does not fit the
    size the others fit is named at that size."""
    for case in CASES:
        stated = json.loads((CASES_DIR / case / "case.json").read_text())["trace_block_size"]
        assert inferred_trace_block_size(CASES_DIR / case / "trace.jsonl") == stated, case
        assert load_trace(CASES_DIR / case / "trace.jsonl", trace_block_size=None).trace_block_size == stated
    assert inferred_trace_block_size(ROOT / "jaxsim" / "data" / "traces" / "mooncake_conversation_1k.jsonl") == 512
    rows = [(374, 24), (396, 25), (91, 6), (16, 1), (17, 2)]  # hashed per 16 tokens
    path = tmp_path / "t16.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": n, "output_length": 3, "hash_ids": list(range(h))}) + "\n"
                            for i, (n, h) in enumerate(rows)))
    assert load_trace(path, trace_block_size=None).trace_block_size == 16
    with pytest.raises(QueryError, match=r"row 1: 24 hash_ids for 374 input tokens at 512 tokens per hash"):
        load_trace(path)  # the API's default is 512, stated
    rows[2] = (91, 5)
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": n, "output_length": 3, "hash_ids": list(range(h))}) + "\n"
                            for i, (n, h) in enumerate(rows)))
    with pytest.raises(QueryError, match=r"row 3: 5 hash_ids for 91 input tokens at 16 tokens per hash \(expected 6\)"):
        load_trace(path, trace_block_size=None)
    tie = tmp_path / "tie.jsonl"  # one hash for 600 tokens: not 512, every size from 1024 up (the smallest)
    tie.write_text('{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1]}\n')
    assert inferred_trace_block_size(tie) == 1024
    tie.write_text('{"timestamp": 0, "input_length": 400, "output_length": 4, "hash_ids": [1]}\n')  # 512 and up fit
    assert inferred_trace_block_size(tie) == 512


def test_an_unstated_trace_block_size_is_read_with_the_hash_ids_in_one_read(monkeypatch):
    """Inferring the size and reading the hash ids parse the trace once (the same table as at the stated size)."""
    from jaxsim.replay import prefix_cache

    path = CASES_DIR / CASES[0] / "trace.jsonl"
    reads = []
    real = prefix_cache._arrow_hash_columns
    monkeypatch.setattr(prefix_cache, "_arrow_hash_columns", lambda p: reads.append(p) or real(p))
    inferred = load_trace(path, trace_block_size=None)
    assert len(reads) == 1
    stated = load_trace(path, trace_block_size=inferred.trace_block_size)
    assert np.array_equal(inferred.hash_ids.values, stated.hash_ids.values)
    assert np.array_equal(inferred.hash_ids.offsets, stated.hash_ids.offsets)


def test_cli_replay_reads_an_unstated_trace_block_size_and_says_so(tmp_path):
    case = "fuzz-prefix-seed-67"  # hashed per 16 tokens
    cfg, trace, c = _case_config(case, tmp_path)
    stated, unstated = tmp_path / "stated.parquet", tmp_path / "unstated.parquet"
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--trace-block-size", str(c["trace_block_size"]),
                            "--output", str(stated), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "tokens per hash id" not in r.output
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--output", str(unstated), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "hash_ids read at 16 tokens per hash id" in r.output
    assert pq.read_table(unstated).drop(["config"]).equals(pq.read_table(stated).drop(["config"]))


def _unshared_trace(n: int = 24, seed: int = 5, tbs: int = 16):
    """Requests whose prompt blocks are all their own (every hash id once), arriving close together."""
    g = np.random.default_rng(seed)
    hashes = [[1000 * i + j for j in range(int(g.integers(1, 5)))] for i in range(n)]
    trace = make_trace("unshared", np.sort(g.uniform(0, 30, n)), [len(h) * tbs for h in hashes], g.integers(3, 40, n), rebase=False)
    return dataclasses.replace(trace, hash_ids=HashIds.from_rows([hashes[r] for r in trace.row.tolist()]), trace_block_size=tbs)


@pytest.mark.parametrize("blocks", [400, 14])  # a roomy pool (no preemption: the plain engine's run) and a tight one
def test_a_trace_sharing_no_block_replays_as_the_cached_engine(blocks, monkeypatch):
    """A trace whose requests share no prompt block runs the plain engine (no request can read another's blocks) unless a
    replica preempts (then a readmitted request may read its own): either way every field equals the cached engine's."""
    import jaxsim.replay.orchestrate as orch

    trace = _unshared_trace()
    pool = _pool(num_gpu_blocks=blocks)
    tm: dict = {}
    if blocks == 400:  # no preemption: the cached engine is not run at all
        monkeypatch.setattr(orch, "run_cached_items", lambda *a, **k: pytest.fail("ran the cached engine"))
    [on] = run_replays([ReplayConfig("on", 0, np.zeros(5), aggregated=pool)], trace, timings=tm)
    keys, num_keys = block_keys(trace.hash_ids, trace.input_tokens, 16, 8)
    assert sum(k.size for k in keys) == num_keys  # nothing shared
    params = make_params(pool.table, max_num_batched_tokens=128, max_num_seqs=4, block_size=8, num_gpu_blocks=blocks, num_draft_tokens=0,
                         accept_rates=np.zeros(5), max_model_len=4096, max_passes=10**6)
    pk, capacity = ce.prompt_keys(keys, num_keys, 32)
    shapes = ce.shapes_for(trace.input_tokens, trace.output_tokens, max_num_seqs=4, block_size=8, num_gpu_blocks=blocks,
                           max_model_len=4096, num_keys=capacity)
    direct = ce.cached_replay_jit(params, trace.requests(32), pk, shapes)
    n = len(trace)
    preempted = int(np.asarray(direct.result.preemptions).sum())
    assert (preempted > 0) == (blocks == 14)
    for mine, theirs in (("first_token_ms", direct.result.first_token_ms), ("last_token_ms", direct.result.last_token_ms),
                         ("preemptions", direct.result.preemptions), ("admissions", direct.result.admissions),
                         ("cache_hit_tokens", direct.first_hit_tokens)):
        np.testing.assert_array_equal(on.requests[mine], np.asarray(theirs)[:n], err_msg=mine)
    assert on.summary["prefix_caching"] == "modelled"
    assert tm["passes"] == int(direct.result.num_passes)  # the plain run a preempting stage repeats is not counted


@pytest.mark.parametrize("blocks", [400, 24])  # a roomy pool and a tight one (evictions, preemptions)
def test_cached_replays_that_differ_only_in_max_num_seqs_share_where_no_seat_was_reached(blocks):
    """A sweep's max_num_seqs axis with prefix caching on: the replay with the most seats runs first, and the others
    whose max_num_seqs is at least the most requests it ran take its result; every replay equals its run alone, field
    for field, hit tokens included (the seats of the smallest ones matter: their results differ)."""
    trace = _shared_trace(n=16, seed=5, span_ms=800.0)
    seqs = (1, 2, 3, 4, 6, 8, 12, 16)
    table = golden_table("ar_core")  # one table object (as a sweep's bindings share theirs)
    configs = [ReplayConfig(f"m{m}", 0, np.zeros(5), aggregated=_pool(table=table, max_num_seqs=m, num_gpu_blocks=blocks)) for m in seqs]
    tm: dict = {}
    together = run_replays(configs, trace, timings=tm)
    assert 0 < tm["replays_shared"] < len(seqs) - 1
    alone = [run_replays([c], trace)[0] for c in configs]
    for m, a, b in zip(seqs, together, alone):
        assert a.status_text == b.status_text
        for name in ("first_token_ms", "last_token_ms", "preemptions", "admissions", "cache_hit_tokens", "terminal"):
            np.testing.assert_array_equal(a.requests[name], b.requests[name], err_msg=f"max_num_seqs {m}: {name}")
    assert not np.array_equal(alone[0].requests["first_token_ms"], alone[-1].requests["first_token_ms"])
