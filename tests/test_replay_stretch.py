"""Decode stretches (jaxsim.replay.stretch) change nothing: a replay advanced by stretches of decode-only
passes equals the pass-by-pass engine (``lookahead=0``, the oracle) bit for bit — every per-request
time, token count, preemption, status and timeline row — on random traces with sampled speculative
bursts, tight KV pools (preemption), closed loops, context limits, materialized requests and pass
limits; alone and as a vmapped batch."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst
from replay_support import PAD, SLOTS, padded_tables

from jaxsim.acceptance import pad_rates
from jaxsim.replay.engine import COMPLETED, DONE, make_params, replay_jit, replay_stack
from jaxsim.replay.runner import stack_params
from jaxsim.replay.stretch import lookahead_or_default
from jaxsim.replay.traces import make_trace

TIMELINE = 1024
LOOKAHEAD = 3  # short: stretches end at the cap too, not only at events
TABLE_K = {"ar_core": 0, "sd_k2": 2, "sd_k3": 3}


def _requests(trace, materialized):
    rq = trace.requests(PAD)
    flags = np.zeros(PAD, bool)
    flags[: len(materialized)] = materialized
    return eqx.tree_at(lambda r: r.materialized, rq, jnp.asarray(flags & np.asarray(rq.valid)))


def _run(params, rq, seed, lookahead):
    res = replay_jit(params, rq, jax.random.PRNGKey(seed), slots=SLOTS, stochastic=True, timeline_len=TIMELINE, lookahead=lookahead)
    return jax.tree.map(np.asarray, res)


def _assert_same(a, b):
    for name in a.__dataclass_fields__:
        if name == "num_steps":
            continue
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name, strict=True)


@hst.composite
def scenarios(draw):
    table = draw(hst.sampled_from(sorted(TABLE_K)))
    k = TABLE_K[table]
    n = draw(hst.integers(1, 12))
    gaps = draw(hst.lists(hst.sampled_from([0.0, 0.5, 3.0, 12.5, 40.0, 300.0]), min_size=n, max_size=n))
    prompts = draw(hst.lists(hst.integers(8, 400), min_size=n, max_size=n))
    outs = draw(hst.lists(hst.integers(1, 80), min_size=n, max_size=n))
    bs = draw(hst.sampled_from([8, 16, 32]))
    need = max(-(-p // bs) for p in prompts)
    rates = draw(hst.lists(hst.sampled_from([0.0, 0.3, 0.6, 0.9, 1.0]), min_size=k, max_size=k)) if k else []
    kw = dict(
        max_num_batched_tokens=draw(hst.sampled_from([24, 64, 100, 256, 1024])),
        max_num_seqs=draw(hst.integers(1, 8)), block_size=bs,
        num_gpu_blocks=draw(hst.one_of(hst.integers(need, need + 12), hst.just(4000))), num_draft_tokens=k,
        accept_rates=pad_rates(np.array(rates)) if k else None,
        max_model_len=draw(hst.sampled_from([4096, 420, 300])),
        max_concurrency=draw(hst.sampled_from([0, 0, 1, 2, 3])),
        max_passes=draw(hst.sampled_from([TIMELINE, TIMELINE, 37])),  # the whole pass record is compared
        async_scheduling=draw(hst.booleans()),
    )
    materialized = draw(hst.lists(hst.booleans(), min_size=n, max_size=n)) if draw(hst.booleans()) else [False] * n
    trace = make_trace("random", np.cumsum(gaps) - gaps[0], prompts, outs, rebase=False)
    return table, trace, materialized, kw, draw(hst.integers(0, 2**31 - 1))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_stretches_equal_pass_by_pass(scenario):
    table, trace, materialized, kw, seed = scenario
    params = make_params(padded_tables()[table], **kw)
    rq = _requests(trace, materialized)
    oracle = _run(params, rq, seed, 0)
    stretched = _run(params, rq, seed, LOOKAHEAD)
    _assert_same(oracle, stretched)
    assert int(oracle.num_steps) == int(oracle.num_passes)  # lookahead 0: one pass per step
    assert int(stretched.num_steps) <= int(stretched.num_passes)


def test_stretches_cut_loop_steps_and_keep_a_batch_exact():
    """A vmapped batch (the stretch runs when any item can: the others stand still) equals its items
    replayed pass by pass, and the stretches take several passes per loop step."""
    rng = np.random.default_rng(5)
    n = PAD
    trace = make_trace("batch", np.cumsum(rng.choice([0.0, 5.0, 80.0], n)), rng.integers(20, 300, n), rng.integers(10, 120, n), rebase=False)
    settings_ = [
        dict(table="ar_core", k=0, rates=None, blocks=4000, seqs=4),
        dict(table="sd_k3", k=3, rates=pad_rates(np.array([0.8, 0.5, 0.2])), blocks=4000, seqs=8),
        dict(table="sd_k3", k=3, rates=pad_rates(np.array([0.8, 0.5, 0.2])), blocks=30, seqs=8),
        dict(table="ar_core", k=0, rates=None, blocks=25, seqs=3),
    ]
    tables = padded_tables()
    params = [make_params(tables["sd_k3"] if c["k"] else tables["ar_core"], max_num_batched_tokens=256, max_num_seqs=c["seqs"],
                          block_size=16, num_gpu_blocks=c["blocks"], num_draft_tokens=c["k"], accept_rates=c["rates"], max_model_len=4096)
              for c in settings_]
    # one table shape for the stack: the padded golden tables share it
    stacked = stack_params(params)
    rq = jax.tree.map(lambda a: jnp.stack([a] * len(params)), trace.requests(PAD))
    keys = jax.random.split(jax.random.PRNGKey(3), len(params))
    run = jax.jit(replay_stack, static_argnames=("slots", "stochastic", "timeline_len", "shared_table", "lookahead"))
    batch = jax.tree.map(np.asarray, run(stacked, rq, keys, slots=SLOTS, stochastic=True, timeline_len=TIMELINE, lookahead=LOOKAHEAD))
    for i, p in enumerate(params):
        one = jax.tree.map(np.asarray, replay_jit(
            p, trace.requests(PAD), keys[i], slots=SLOTS, stochastic=True, timeline_len=TIMELINE, lookahead=0))
        _assert_same(one, jax.tree.map(lambda a: a[i], batch))
    assert np.all(batch.num_steps < batch.num_passes)


def test_lookahead_is_validated():
    assert lookahead_or_default(0) == 0
    for bad in (-1, True):
        with pytest.raises(ValueError, match="lookahead"):
            lookahead_or_default(bad)


@pytest.mark.parametrize("table", sorted(TABLE_K))
@pytest.mark.parametrize("max_model_len", [156, 420, 4096])
def test_a_materialized_request_with_one_output_token_completes(table, max_model_len):
    """A decode pool's request (materialized: prompt KV and the prefill worker's token present) whose output
    is one token — asked for, or cut to one by a short max_model_len — completes in one priced pass with that
    token. It used to have no token left to emit and ran the engine to its pass limit (10M passes by default)."""
    k = TABLE_K[table]
    kw = dict(max_num_batched_tokens=256, max_num_seqs=4, block_size=16, num_gpu_blocks=4000, num_draft_tokens=k,
              accept_rates=pad_rates(np.full(k, 0.6)) if k else None, max_model_len=max_model_len, max_passes=5000)
    trace = make_trace("one", [0.0, 0.0, 2.0, 3.0], [155, 155, 300, 100], [1, 2 if max_model_len > 156 else 7, 1, 6], rebase=False)
    rq = _requests(trace, [True, True, False, True])
    for lookahead in (0, LOOKAHEAD):
        res = _run(make_params(padded_tables()[table], **kw), rq, 7, lookahead)
        assert int(res.status) == COMPLETED and int(res.num_passes) < 50, (lookahead, int(res.num_passes))
        served = np.asarray(res.terminal)[:4] == DONE
        assert served[0] and served[1] and np.isfinite(res.first_token_ms[:2]).all()
        assert int(res.output_tokens[0]) == 1 and res.first_token_ms[0] == res.last_token_ms[0]
    _assert_same(_run(make_params(padded_tables()[table], **kw), rq, 7, 0), res)
