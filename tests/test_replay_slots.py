"""Growing slot capacity: a replay run with fewer running-list slots than max_num_seqs stops before the
first pass that could need more (SLOTS_FULL) and, widened, continues exactly as if it had run at the
larger capacity from the start; batched replays go through 16, 32, ... slots and equal full-capacity runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from jaxsim.acceptance import pad_rates
from jaxsim.deploy.binding import bind
from jaxsim.kernels.rounds import compile_round_table
from jaxsim.kernels.status import PREFILL_BATCH_UNMEASURED
from jaxsim.replay import executables, runner
from jaxsim.replay.deployment import config_from_binding
from jaxsim.replay.engine import COMPLETED, PASS_LIMIT, SLOTS_FULL, make_params, replay_jit, slot_bucket, widen_stack
from jaxsim.replay.executables import advance_many, finish_many, start_many
from jaxsim.replay.runner import ReplayItem, replay_batch, unstack
from jaxsim.replay.traces import make_trace
from jaxsim.rules.config import load_config

ROOT = Path(__file__).resolve().parents[1]
N = 128
TIMELINE = 2048


def _crowd(n: int = 100, seed: int = 0):
    """``n`` requests arriving 0.5 ms apart: far more running at once than 16 slots hold."""
    rng = np.random.default_rng(seed)
    return make_trace("crowd", np.arange(n) * 0.5, rng.integers(300, 400, n), rng.integers(20, 90, n))


@cache
def _config(name: str):
    return config_from_binding(bind(load_config(ROOT / "configs" / name)))


def _params(max_num_seqs: int, budget: int = 8192, k: int = 0, rates=None):
    """On the calibrated Qwen3-32B profile (decode to batch 128, prefill batches 1-32), or with k draft
    tokens on the speculative example deployment's profile."""
    c = _config("deployment_speculative.toml" if k else "deployment_calibrated.toml")
    return make_params(
        c.aggregated.params(c.nextn, c.accept_rates, 10).table,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        block_size=16,
        num_gpu_blocks=6000,
        num_draft_tokens=k,
        accept_rates=None if rates is None else pad_rates(np.asarray(rates)),
        max_model_len=32768,
    )


def _full(p, trace, slots: int, seed: int = 0, stochastic: bool = False):
    return jax.tree.map(np.asarray, replay_jit(p, trace.requests(N), jax.random.PRNGKey(seed), slots=slots,
                                               stochastic=stochastic, timeline_len=TIMELINE))


def _stack(x):
    return jax.tree.map(lambda a: np.asarray(a)[None], x)


def test_too_few_slots_stop_with_slots_full_and_widening_continues_exactly():
    trace = _crowd()
    p = _params(64)
    short = _full(p, trace, 16)
    assert short.status == SLOTS_FULL
    full = _full(p, trace, 64)
    assert full.status == COMPLETED and np.nanmax(full.timeline[:, 2]) > 16  # column 2: running requests

    pp, rq, keys = _stack(p), _stack(trace.requests(N)), _stack(jax.random.PRNGKey(0))
    s, consts = jax.tree.map(np.asarray, start_many(pp, rq, slots=16, timeline_len=TIMELINE))
    s = jax.tree.map(np.asarray, advance_many(pp, consts, keys, s, stochastic=False))
    assert int(s.status[0]) == SLOTS_FULL
    stopped_at = int(s.passes[0])
    assert 0 < stopped_at < int(full.num_passes)
    s, consts = widen_stack(s, consts, 64)
    s = advance_many(pp, consts, keys, s, stochastic=False)
    got = unstack(jax.tree.map(np.asarray, finish_many(rq, s, consts)), 0)
    for name, a in vars(full).items():
        if name == "num_steps":  # loop steps: one more where the pass that found its slots full stopped the loop
            continue
        np.testing.assert_array_equal(getattr(got, name), a, err_msg=name)


def _check_batched_equals_full(params, trace, slots, stochastic):
    assert runner.capacities(slots, len(params))[0] == 16
    seeds = list(range(len(params)))
    got = jax.tree.map(np.asarray, replay_batch(params, trace.requests(N), seeds, slots=slots, stochastic=stochastic,
                                                timeline_len=TIMELINE))
    peaks = []
    for i, p in enumerate(params):
        one = _full(p, trace, slots, seed=seeds[i], stochastic=stochastic)
        item = unstack(got, i)
        for name, a in vars(one).items():
            if name == "num_steps":  # loop steps depend on the capacities it went through
                continue
            np.testing.assert_array_equal(getattr(item, name), a, err_msg=f"config {i} field {name}")
        peaks.append(np.nanmax(one.timeline[:, 2]))
    assert np.all(got.status == COMPLETED), got.status
    return peaks


def test_batched_replays_through_growing_capacities_equal_full_capacity_runs():
    params = [_params(m, b) for m in (20, 24, 32, 40, 64, 90, 100, 128) for b in (1024, 8192)]
    assert runner.capacities(128, len(params)) == [16, 32, 64, 128]
    peaks = _check_batched_equals_full(params, _crowd(seed=1), 128, False)
    assert max(peaks) > 64 and min(peaks) <= 32  # some replays went through every capacity, some stopped early


def _synthetic_sd_table():
    """SYNTHETIC smooth tables (made-up latencies, not a measurement) wide enough for a crowd: decode
    batches 1-64, prefill batches 1-32; priced as a measured speculative round with K = 3."""
    db, dk = np.meshgrid(np.arange(1, 65), np.geomspace(16, 400_000, 12).round())
    pb, pt, pk = np.meshgrid(np.arange(1, 33), np.geomspace(1, 8192, 10).round(),
                             np.r_[0, np.geomspace(16, 400_000, 8).round()], indexing="ij")
    ok = pt >= pb
    cell = SimpleNamespace(decode_batch=db.ravel(), decode_kv=dk.ravel(), decode_latency_ms=(5.0 + 0.05 * db + 2e-5 * dk).ravel(),
                           prefill_batch=pb[ok], prefill_tokens=pt[ok], prefill_kv=pk[ok],
                           prefill_latency_ms=(8.0 + 0.02 * pt + 1e-5 * pk + 0.1 * pb)[ok])
    return compile_round_table(cell, speculative=True, num_draft_tokens=3)


def test_sampled_speculative_bursts_continue_across_capacities():
    """Sampled acceptance (the PRNG stream is keyed by pass and request) is unchanged by a capacity step."""
    t = _synthetic_sd_table()
    params = [make_params(t, max_num_batched_tokens=b, max_num_seqs=m, block_size=16, num_gpu_blocks=6000, num_draft_tokens=3,
                          accept_rates=pad_rates(np.array([0.8, 0.6, 0.4])), max_model_len=32768)
              for m in (18, 24, 32, 40, 64) for b in (1024, 8192)]
    peaks = _check_batched_equals_full(params, _crowd(seed=3), 64, True)
    assert max(peaks) > 32


def test_capacities():
    assert runner.capacities(256, 100) == [16, 32, 64, 128, 256]
    assert runner.capacities(16, 100) == [16] and runner.capacities(8, 100) == [8]
    small = runner.ADAPTIVE_MIN_ITEMS - 1
    assert runner.capacities(128, small) == [128] and runner.capacities(64, small) == [64]  # small groups: one executable
    assert runner.capacities(1024, small) == [64, 128, 256, 512, 1024]  # ... unless above 128 slots: a lazy ladder from 64


def test_a_single_replay_above_128_slots_climbs_a_lazily_compiled_ladder_and_equals_the_full_capacity_run():
    p = _params(256)
    trace = _crowd(seed=1)
    got = unstack(jax.tree.map(np.asarray, replay_batch([p], trace.requests(N), [0], slots=256, stochastic=False,
                                                        timeline_len=TIMELINE)), 0)
    one = _full(p, trace, 256)
    assert one.status == COMPLETED and np.nanmax(one.timeline[:, 2]) > 64  # more running than the first rung holds
    for name, a in vars(one).items():
        if name == "num_steps":
            continue
        np.testing.assert_array_equal(getattr(got, name), a, err_msg=name)


@pytest.mark.slow
def test_batches_split_over_devices_run_their_own_loops_and_equal_single_runs():
    """Two host devices (a subprocess): each runs its half of the batch in its own loop (shard_map), with
    autoregressive and speculative items, preemptions (a small KV pool) and growing capacities."""
    code = textwrap.dedent(
        f"""
        import sys, jax, numpy as np
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import test_replay_slots as t
        from jaxsim.replay import executables
        from jaxsim.replay.engine import make_params
        from jaxsim.acceptance import pad_rates
        assert len(jax.devices()) == 2
        sd = t._synthetic_sd_table()
        params = [make_params(sd, max_num_batched_tokens=b, max_num_seqs=m, block_size=16, num_gpu_blocks=g, num_draft_tokens=k,
                              accept_rates=pad_rates(np.array([1.0, 1.0, 0.0])), max_model_len=32768)
                  for m in (20, 64) for b in (1024, 8192) for g in (700, 6000) for k in (0, 2)]
        calls = []
        execute = executables.execute
        executables.execute = lambda c: calls.append(c.executable) or execute(c)
        peaks = t._check_batched_equals_full(params, t._crowd(seed=5), 64, False)
        assert executables.ADVANCE_SPLIT in calls and executables.ADVANCE not in calls, calls
        print(len(params), max(peaks))
        """
    )
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    n, peak = r.stdout.split()
    assert n == "16" and float(peak) > 32


def test_items_of_different_buckets_share_capacity_steps_and_equal_full_runs(monkeypatch):
    """One group holds items of several max_num_seqs buckets: at each capacity the items that reached
    it run together (those at their last capacity apart from those that may grow), and every item
    equals its run at full capacity."""
    trace = _crowd(seed=2)
    ms = (20, 24, 32, 40, 64, 90, 100, 128, 12, 128)
    params = [_params(m, b) for m in ms for b in (1024, 8192)]
    items = [ReplayItem(p, trace.requests(N), jax.random.PRNGKey(i), slot_bucket(int(p.max_num_seqs)), False) for i, p in enumerate(params)]
    calls = []
    execute = executables.execute
    advances = (executables.ADVANCE, executables.ADVANCE_SPLIT)
    monkeypatch.setattr(executables, "execute", lambda c: calls.append(
        (c.executable, c.args[3].running.shape if c.executable in advances else None)) or execute(c))
    monkeypatch.setattr(runner, "CPU_CALL_ITEMS", 32)  # all 20 items in one call per step (CPU default: 16)
    got = runner.run_items(items, timeline_len=TIMELINE, chunk=None)
    for i, p in enumerate(params):
        one = _full(p, trace, slot_bucket(int(p.max_num_seqs)), seed=i)
        for name, a in vars(one).items():
            if name == "num_steps":  # loop steps depend on the capacities it went through
                continue
            np.testing.assert_array_equal(getattr(got[i], name), a, err_msg=f"item {i} field {name}")
    advanced = [c for c in calls if c[0] in advances]
    assert {shape[1] for _, shape in advanced} == {16, 32, 64, 128}
    assert len(advanced) <= 2 * 4  # at most a growing and a last call per capacity
    assert sum(e == executables.START for e, _ in calls) == 1 and sum(e == executables.FINISH for e, _ in calls) == 1


@pytest.mark.slow
def test_a_replay_split_over_devices_runs_in_chunks_without_a_timeline():
    """Two host devices (a subprocess), no timeline (a zero-length leaf XLA hands back replicated): a replay
    run in calls of a few loop steps equals one call (observed: the README's --verify-top refused by its
    second call, the state's sharding no longer the compiled one)."""
    code = textwrap.dedent(
        f"""
        import sys, jax, numpy as np
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import test_replay_slots as t
        from jaxsim.replay import executables, runner
        from jaxsim.replay.runner import ReplayItem
        assert len(jax.devices()) == 2
        trace = t._crowd(seed=3)
        items = [ReplayItem(t._params(m), trace.requests(t.N), jax.random.PRNGKey(i), t.slot_bucket(m), False)
                 for i, m in enumerate((20, 64, 40, 90))]
        whole = runner.run_items(items, timeline_len=0, chunk=None)
        calls = []
        execute = executables.execute
        executables.execute = lambda c: calls.append(c.executable) or execute(c)
        runner.FIRST_CALL_STEPS = 3
        runner._next_budget = lambda budget, seconds: 5
        chunked = runner.run_items(items, timeline_len=0, chunk=None)
        assert executables.ADVANCE_SPLIT in calls, calls
        for a, b in zip(whole, chunked):
            for name, x in vars(a).items():
                np.testing.assert_array_equal(getattr(b, name), x, err_msg=name)
        """
    )
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("many", [False, True])
def test_a_replay_run_in_chunks_of_a_few_loop_steps_equals_one_call(monkeypatch, many):
    """The runner advances in calls of a bounded number of loop steps (progress between them); any split
    gives the results of one uninterrupted loop, bit for bit, with decode stretches (one item) and pass by
    pass (a group of eight growing through capacities), and progress reaches every request."""
    trace = _crowd(seed=3)
    ms = (20, 64, 128, 12, 40, 90, 100, 128) if many else (64,)
    items = [ReplayItem(_params(m), trace.requests(N), jax.random.PRNGKey(i), slot_bucket(m), False) for i, m in enumerate(ms)]
    whole = runner.run_items(items, timeline_len=TIMELINE, chunk=None)
    monkeypatch.setattr(runner, "FIRST_CALL_STEPS", 3)
    monkeypatch.setattr(runner, "_next_budget", lambda budget, seconds: 5)
    seen = []
    chunked = runner.run_items(items, timeline_len=TIMELINE, chunk=None, progress=seen.append)
    assert len(seen) > 10 and seen[-1].fraction == 1.0 and seen[-1].requests_done == seen[-1].requests == len(ms) * len(trace)
    assert all(b.simulated_ms >= a.simulated_ms for a, b in zip(seen, seen[1:]))
    for a, b in zip(whole, chunked):
        for name, x in vars(a).items():
            np.testing.assert_array_equal(getattr(b, name), x, err_msg=name)


def _peak_running(item: ReplayItem) -> int:
    out = [None]
    return runner._run_indices([item], [0], out, TIMELINE, None, None, None)[0]


def test_replays_that_differ_only_in_max_num_seqs_share_the_result_where_no_seat_was_reached():
    """A sweep's max_num_seqs axis: the replay with the most seats runs first, every other replay of its class whose
    max_num_seqs is at least the most requests that one ran gets its result (the same object), the rest run; every
    result equals the replay run alone at its full capacity (the boundary included: at one seat below the peak the
    seats matter and the result differs)."""
    trace = _crowd(seed=4)
    key = jax.random.PRNGKey(7)
    peak = _peak_running(ReplayItem(_params(128), trace.requests(N), key, slot_bucket(128), False))
    assert 8 < peak < 120
    ms = sorted({128, peak + 1, peak, peak - 1, 8, 120})
    items = [ReplayItem(_params(m), trace.requests(N), key, slot_bucket(m), False) for m in ms]
    timings: dict = {}
    got = runner.run_items(items, timeline_len=TIMELINE, chunk=None, timings=timings)
    top = got[ms.index(128)]
    shared = [m for m in ms if m != 128 and got[ms.index(m)] is top]
    assert shared == [m for m in ms if peak <= m < 128] and timings["replays_shared"] == len(shared)
    for m, res in zip(ms, got):
        one = _full(_params(m), trace, slot_bucket(m), seed=7)
        for name, a in vars(one).items():
            if name != "num_steps":
                np.testing.assert_array_equal(getattr(res, name), a, err_msg=f"max_num_seqs {m}: {name}")
    below = got[ms.index(peak - 1)]
    assert not np.array_equal(below.first_token_ms, top.first_token_ms)


def test_a_replay_stopped_by_its_pass_limit_shares_nothing():
    """The replay with the most seats ran out of passes: a replay with fewer seats may have more passes to go, so
    each runs (and equals its run alone)."""
    import equinox as eqx

    trace = _crowd(seed=4)
    key = jax.random.PRNGKey(7)
    limited = lambda m: eqx.tree_at(lambda q: q.max_passes, _params(m), np.int64(40))  # noqa: E731
    items = [ReplayItem(limited(m), trace.requests(N), key, slot_bucket(m), False) for m in (128, 120)]
    timings: dict = {}
    got = runner.run_items(items, timeline_len=TIMELINE, chunk=None, timings=timings)
    assert int(got[0].status) == PASS_LIMIT and timings["replays_shared"] == 0 and got[0] is not got[1]
    for m, res in zip((128, 120), got):
        one = _full(limited(m), trace, slot_bucket(m), seed=7)
        np.testing.assert_array_equal(res.status, one.status)
        np.testing.assert_array_equal(res.first_token_ms, one.first_token_ms)


def test_a_replay_stopped_outside_support_shares_its_result_down_to_the_stopping_pass_batch():
    """A replay that stops at a pass whose lookup leaves support (here a prefill batch of more requests than the
    profile measured) counts that pass's batch in its peak: a replay with at least that many seats makes the same
    passes and stops at the same one (it shares the result), one with a seat fewer schedules another batch (it runs,
    and with fewer seats than the measured prefill batches it goes on). Every result equals its run alone, NaNs of
    the requests a stop left unfinished included."""
    trace = _crowd(200, seed=0)
    key, n = jax.random.PRNGKey(7), 256
    run_alone = lambda p, m: jax.tree.map(np.asarray, replay_jit(p, trace.requests(n), key, slots=slot_bucket(m),  # noqa: E731
                                                                  stochastic=False, timeline_len=TIMELINE))
    top = run_alone(_params(128, 16384), 128)
    peak = 36  # the stopping pass's prefill batch: the calibrated profile measures prefill batches 1-32
    assert int(top.status) == PREFILL_BATCH_UNMEASURED and int(top.num_passes) == 2
    ms = [128, 64, peak, peak - 1, 32]
    items = [ReplayItem(_params(m, 16384), trace.requests(n), key, slot_bucket(m), False) for m in ms]
    timings: dict = {}
    got = runner.run_items(items, timeline_len=TIMELINE, chunk=None, timings=timings)
    assert [got[k] is got[0] for k in range(len(ms))] == [True, True, True, False, False] and timings["replays_shared"] == 2
    assert int(got[ms.index(32)].status) != PREFILL_BATCH_UNMEASURED
    for m, res in zip(ms, got):
        one = run_alone(_params(m, 16384), m)
        for name, a in vars(one).items():
            if name != "num_steps":
                np.testing.assert_array_equal(getattr(res, name), a, err_msg=f"max_num_seqs {m}: {name}")


def test_on_cpu_a_call_advances_at_most_16_replays_and_the_results_do_not_depend_on_it(monkeypatch):
    """XLA:CPU calls advance at most runner.CPU_CALL_ITEMS replays (fewer executables: one per width), whatever
    ``chunk`` allows; the results equal one call for all of them."""
    assert jax.default_backend() == "cpu"
    trace = _crowd(seed=6)
    params = [_params(m, b) for m in (24, 40, 64, 100, 128) for b in (512, 1024, 2048, 8192)]
    items = [ReplayItem(p, trace.requests(N), jax.random.PRNGKey(i), slot_bucket(int(p.max_num_seqs)), False) for i, p in enumerate(params)]
    with monkeypatch.context() as m:
        m.setattr(runner, "CPU_CALL_ITEMS", 32)
        wide = runner.run_items(items, timeline_len=0, chunk=None)
    widths = []
    execute = executables.execute
    advances = (executables.ADVANCE, executables.ADVANCE_SPLIT)
    monkeypatch.setattr(executables, "execute", lambda c: (c.executable in advances and widths.append(c.args[2].shape[0])) or execute(c))
    narrow = runner.run_items(items, timeline_len=0, chunk=256)
    assert max(widths) == runner.CPU_CALL_ITEMS < len(items)
    for a, b in zip(wide, narrow):
        for name, x in vars(a).items():
            if name != "num_steps":
                np.testing.assert_array_equal(getattr(b, name), x, err_msg=name)
