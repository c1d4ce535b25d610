"""The compiled replay engine with prefix caching (jaxsim/replay/cache_engine.py) == its specification, the
plain-Python ``oracle_replay(..., block_keys=...)``, on random traces with shared prefixes and tight pools
(hits, evictions, preemptions, recomputes reading their own blocks back), and == the reference's replays
with ``kv_cache.prefix_caching: true`` (tests/data/prefix_cases)."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst
from replay_support import PAD, golden_table, oracle_replay, pass_lookups, prefix_case

from jaxsim.replay import cache_engine as ce
from jaxsim.replay.engine import COMPLETED, DONE, REJECTED, STALLED, make_params
from jaxsim.replay.prefix_cache import block_keys
from jaxsim.replay.runner import stack_params
from jaxsim.replay.traces import make_trace

TIMELINE = 512
ONE_COMPILATION = ce.Shapes(slots=8, table_blocks=64, pool_blocks=4096, num_keys=1024)  # covers the random cases
CASES_DIR = Path(__file__).parent / "data" / "prefix_cases"


def run_cached(table, trace, keys, num_keys, *, timeline_len=TIMELINE, **kw):
    params = make_params(table, **kw)
    pk, key_capacity = ce.prompt_keys(keys, num_keys, PAD)
    shapes = ce.widest(ONE_COMPILATION, ce.shapes_for(trace.input_tokens, trace.output_tokens, num_keys=key_capacity, **{
        k: kw[k] for k in ("max_num_seqs", "block_size", "num_gpu_blocks", "max_model_len")}))
    out = ce.cached_replay_jit(params, trace.requests(PAD), pk, shapes, timeline_len=timeline_len)
    return jax.tree.map(np.asarray, out)


def assert_same_as_oracle(table, trace, keys, num_keys, kw):
    out = run_cached(table, trace, keys, num_keys, **kw)
    res = out.result
    reqs, lookups, status = oracle_replay(table, trace, **kw, block_keys=keys)
    mine = pass_lookups(res)
    if status == "completed":
        assert int(res.status) == COMPLETED
        assert mine == lookups
        for r in reqs:
            if r.first is None:
                assert res.terminal[r.i] == REJECTED
                continue
            assert res.terminal[r.i] == DONE
            assert (res.first_token_ms[r.i], res.last_token_ms[r.i]) == (r.first, r.last)
            assert (res.output_tokens[r.i], res.decode_rounds[r.i]) == (r.gen, r.rounds)
            assert (res.preemptions[r.i], res.admissions[r.i]) == (r.preempt, r.admits)
            assert (out.first_hit_tokens[r.i], out.hit_tokens[r.i]) == (r.first_hit, r.hit)
        assert [res.sent_ms[r.i] for r in reqs] == [r.sent for r in reqs]
    elif status == "stalled":
        assert int(res.status) == STALLED
        assert mine[: len(lookups)] == lookups
    else:
        assert int(res.status) == status
        assert mine[: len(lookups) - 1] == lookups[:-1] and lookups[-1] in mine[len(lookups) - 1:]
    return out, reqs


@hst.composite
def shared_prefix_scenarios(draw):
    """Requests drawing one of a few shared prefixes (trace hash blocks of 8..32 tokens), pools from a few blocks
    above the longest prompt (evictions, preemptions) to roomy."""
    n = draw(hst.integers(1, 10))
    tbs = draw(hst.sampled_from([8, 16, 32]))
    bs = draw(hst.sampled_from([8, 16]))
    prefixes = [draw(hst.integers(0, 8)) for _ in range(draw(hst.integers(1, 3)))]
    gaps = draw(hst.lists(hst.sampled_from([0.0, 0.5, 3.0, 12.5, 40.0]), min_size=n, max_size=n))
    hashes, prompts = [], []
    for i in range(n):
        shared = prefixes[draw(hst.integers(0, len(prefixes) - 1))]
        own = draw(hst.integers(0, 6))
        tail = draw(hst.integers(1, tbs))
        ids = list(range(shared)) + [1000 * (i + 1) + j for j in range(own)]
        prompts.append(len(ids) * tbs + tail)
        hashes.append(ids + [10**6 + i])
    outs = draw(hst.lists(hst.integers(1, 24), min_size=n, max_size=n))
    need = max(-(-p // bs) for p in prompts)
    kw = dict(
        max_num_batched_tokens=draw(hst.sampled_from([24, 64, 100, 256, 1024])), max_num_seqs=draw(hst.integers(1, 6)),
        block_size=bs, num_gpu_blocks=draw(hst.one_of(hst.integers(need, need + 12), hst.just(4000))), num_draft_tokens=0,
        accept_rates=np.zeros(5), max_model_len=draw(hst.sampled_from([4096, 300])),
        max_concurrency=draw(hst.sampled_from([0, 0, 1, 2])), async_scheduling=draw(hst.booleans()),
    )
    return (np.cumsum(gaps) - gaps[0], prompts, outs, hashes, tbs), kw


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_prefix_scenarios())
def test_cached_engine_matches_the_oracle(scenario):
    (arrival_ms, prompts, outs, hashes, tbs), kw = scenario
    trace = make_trace("shared", arrival_ms, prompts, outs, rebase=False)
    keys, num_keys = block_keys(hashes, trace.input_tokens, tbs, kw["block_size"])
    assert_same_as_oracle(golden_table("ar_core"), trace, keys, num_keys, kw)


def test_a_tight_pool_evicts_preempts_and_still_hits():
    """One scenario that exercises every path: cache hits, evictions and preemptions with recomputes."""
    g = np.random.default_rng(3)
    n, tbs, bs = 12, 16, 8
    hashes = [[0, 1, 2] + [100 * (i + 1) + j for j in range(int(g.integers(1, 4)))] for i in range(n)]
    prompts = [len(h) * tbs for h in hashes]
    trace = make_trace("tight", np.sort(g.uniform(0, 30, n)), prompts, g.integers(4, 30, n), rebase=False)
    keys, num_keys = block_keys(hashes, trace.input_tokens, tbs, bs)
    kw = dict(max_num_batched_tokens=128, max_num_seqs=4, block_size=bs, num_gpu_blocks=max(prompts) // bs + 6,
              num_draft_tokens=0, accept_rates=np.zeros(5), max_model_len=4096)
    out, reqs = assert_same_as_oracle(golden_table("ar_core"), trace, keys, num_keys, kw)
    assert sum(r.preempt for r in reqs) > 0 and sum(r.first_hit or 0 for r in reqs) > 0
    assert int(out.result.status) == COMPLETED


CASES = sorted(p.name for p in CASES_DIR.iterdir() if p.is_dir())


@pytest.mark.parametrize("case", CASES)
def test_cached_engine_reproduces_the_reference(case):
    pc = prefix_case(case)
    ref, trace, order = pc.ref, pc.trace, pc.order
    table, keys, num_keys, kw = pc.table, pc.keys, pc.num_keys, pc.kw
    out = run_cached(table, trace, keys, num_keys, timeline_len=0, **kw)
    res = out.result
    assert int(res.status) == COMPLETED
    for i in range(len(trace)):
        g, a = ref[order[i]], trace.arrival_ms[i]
        assert (res.first_token_ms[i] - a, res.last_token_ms[i] - a) == (g["ttft_ms"], g["e2e_latency_ms"])
        assert (res.admissions[i], res.preemptions[i], res.output_tokens[i]) == (
            g["admission_count"], g["readmission_count"], g["output_length"])
        assert (out.first_hit_tokens[i], out.hit_tokens[i]) == (g["first_admission_reused_input_tokens"], g["reused_input_tokens"])


def test_a_stack_of_configurations_equals_one_by_one():
    """vmapped over configurations: each item equals its own replay."""
    import jax.numpy as jnp

    g = np.random.default_rng(5)
    n, tbs, bs = 10, 16, 8
    hashes = [[0, 1] + [100 * (i + 1) + j for j in range(int(g.integers(0, 3)))] for i in range(n)]
    prompts = [len(h) * tbs - int(g.integers(0, tbs)) for h in hashes]
    trace = make_trace("stack", np.sort(g.uniform(0, 30, n)), prompts, g.integers(2, 20, n), rebase=False)
    keys, num_keys = block_keys(hashes, trace.input_tokens, tbs, bs)
    table = golden_table("ar_core")
    settings_ = [dict(max_num_batched_tokens=b, max_num_seqs=s, block_size=bs, num_gpu_blocks=nb, num_draft_tokens=0,
                      accept_rates=np.zeros(5), max_model_len=4096) for b, s, nb in [(64, 2, 14), (256, 4, 4000), (100, 3, 20)]]
    alone = [run_cached(table, trace, keys, num_keys, timeline_len=0, **kw) for kw in settings_]
    stacked_params = stack_params([make_params(table, **kw) for kw in settings_])
    pk, capacity = ce.prompt_keys(keys, num_keys, PAD)
    shapes = ce.widest(ONE_COMPILATION, *[ce.shapes_for(trace.input_tokens, trace.output_tokens, num_keys=capacity, **{
        k: kw[k] for k in ("max_num_seqs", "block_size", "num_gpu_blocks", "max_model_len")})
        for kw in settings_])
    rq = trace.requests(PAD)
    items = len(settings_)
    stack = lambda tree: jax.tree.map(lambda a: jnp.stack([a] * items), tree)  # noqa: E731
    out = jax.tree.map(np.asarray, ce.cached_replay_stack_jit(stacked_params, stack(rq), stack(pk), shapes))
    for i, one in enumerate(alone):
        mine = jax.tree.map(lambda a: a[i], out)
        for name in ("first_token_ms", "last_token_ms", "admissions", "preemptions", "output_tokens", "terminal"):
            np.testing.assert_array_equal(getattr(mine.result, name), getattr(one.result, name))
        np.testing.assert_array_equal(mine.hit_tokens, one.hit_tokens)
        np.testing.assert_array_equal(mine.first_hit_tokens, one.first_hit_tokens)
    assert sum(int(a.hit_tokens.sum()) for a in alone) > 0 and len({int(a.result.preemptions.sum()) for a in alone}) > 1
