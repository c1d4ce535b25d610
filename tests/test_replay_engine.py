"""Replay engine behaviour: vectorized engine == per-request oracle on random traces, stochastic
acceptance statistics, batched == one by one, and a closed-loop steady state."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst
from replay_support import PAD, SLOTS, oracle_replay, padded_tables, pass_lookups, replay_cases

from jaxsim.acceptance import pad_rates
from jaxsim.kernels.acceptance import expected_tokens_per_round
from jaxsim.kernels.rounds import decode_batch, prefill_batch
from jaxsim.replay import metrics
from jaxsim.replay.deployment import ReplayConfig, WorkerPool
from jaxsim.replay.engine import COMPLETED, DONE, REJECTED, STALLED, make_params, replay_jit
from jaxsim.replay.orchestrate import run_replays
from jaxsim.replay.runner import replay_batch, unstack
from jaxsim.replay.traces import make_trace

TIMELINE = 1024  # the parity tests' static arguments: one compilation serves both files
TABLE_K = {"ar_core": 0, "sd_k2": 2, "sd_k3": 3}


def _run(params, trace, seed=0, stochastic=False):
    res = replay_jit(params, trace.requests(PAD), jax.random.PRNGKey(seed), slots=SLOTS, stochastic=stochastic, timeline_len=TIMELINE)
    return jax.tree.map(np.asarray, res)


@hst.composite
def scenarios(draw):
    table = draw(hst.sampled_from(sorted(TABLE_K)))
    k = TABLE_K[table]
    n = draw(hst.integers(1, 9))
    gaps = draw(hst.lists(hst.sampled_from([0.0, 0.5, 3.0, 12.5, 40.0]), min_size=n, max_size=n))
    prompts = draw(hst.lists(hst.integers(8, 400), min_size=n, max_size=n))
    outs = draw(hst.lists(hst.integers(1, 24), min_size=n, max_size=n))
    bs = draw(hst.sampled_from([8, 16, 32]))
    need = max(-(-p // bs) for p in prompts)
    blocks = draw(hst.one_of(hst.integers(need, need + 12), hst.just(4000)))
    accepted = draw(hst.integers(0, k)) if k else 0
    settings_ = dict(
        max_num_batched_tokens=draw(hst.sampled_from([24, 64, 100, 256, 1024])),
        max_num_seqs=draw(hst.integers(1, 6)), block_size=bs, num_gpu_blocks=blocks, num_draft_tokens=k,
        accept_rates=pad_rates(np.array([1.0] * accepted + [0.0] * (k - accepted))),
        max_model_len=draw(hst.sampled_from([4096, 300])),
        max_concurrency=draw(hst.sampled_from([0, 0, 1, 2, 3])),
    )
    trace = make_trace("random", np.cumsum(gaps) - gaps[0], prompts, outs, rebase=False)
    return table, trace, settings_


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_engine_matches_per_request_oracle(scenario):
    """Preemption, chunking, admission limits, rejections, unsupported lookups: same as the oracle."""
    _assert_matches_oracle(scenario)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_engine_matches_the_oracle_with_async_scheduling(scenario):
    """vLLM's async scheduling (a pass admits the requests sent by the previous pass's start while others run):
    the same as the oracle, in open and closed loops, with preemptions and pool limits."""
    table, trace, kw = scenario
    _assert_matches_oracle((table, trace, dict(kw, async_scheduling=True)))


def _assert_matches_oracle(scenario):
    table, trace, kw = scenario
    t = padded_tables()[table]
    res = _run(make_params(t, **kw), trace)
    reqs, lookups, status = oracle_replay(t, trace, **kw)
    assert int(res.num_passes) <= TIMELINE  # the whole pass record is compared
    mine = pass_lookups(res)
    if status == "completed":
        assert int(res.status) == COMPLETED
        assert mine == lookups
        for r in reqs:
            if r.first is None:  # rejected at admission: prompt too long for the pool or the context
                assert res.terminal[r.i] == REJECTED
                continue
            assert res.terminal[r.i] == DONE
            assert res.first_token_ms[r.i] == r.first and res.last_token_ms[r.i] == r.last
            assert (np.isnan(res.second_token_ms[r.i]) and r.second is None) or res.second_token_ms[r.i] == r.second
            assert (res.output_tokens[r.i], res.decode_rounds[r.i]) == (r.gen, r.rounds)
            assert (res.preemptions[r.i], res.admissions[r.i]) == (r.preempt, r.admits)
        assert [res.sent_ms[r.i] for r in reqs] == [r.sent for r in reqs]
    elif status == "stalled":  # a request that can never fit in the pool stops the replay explicitly
        assert int(res.status) == STALLED
        assert mine[: len(lookups)] == lookups
    else:  # a lookup outside measured support stops both at the same pass, with the same code
        assert int(res.status) == status
        assert mine[: len(lookups) - 1] == lookups[:-1] and lookups[-1] in mine[len(lookups) - 1:]


def _closed_loop_trace():
    rng = np.random.default_rng(11)
    n = 9
    return make_trace("cl", np.cumsum(rng.choice([0.0, 2.0, 30.0, 400.0], n)), rng.integers(40, 300, n), rng.integers(2, 20, n))


def _closed_loop_params(**kw):
    base = dict(max_num_batched_tokens=256, max_num_seqs=4, block_size=16, num_gpu_blocks=4000, num_draft_tokens=3,
                accept_rates=pad_rates(np.array([1.0, 1.0, 0.0])), max_model_len=32768)
    base.update(kw)
    return make_params(padded_tables()["sd_k3"], **base)


def test_closed_loop_of_one_is_a_sequential_replay():
    """max_concurrency=1: each request is sent when the previous one completes (or at its arrival, if
    later), and runs alone: the same times as replaying each request by itself from that send time."""
    trace = _closed_loop_trace()
    res = _run(_closed_loop_params(max_concurrency=1), trace)
    assert int(res.status) == COMPLETED
    previous_done = -np.inf
    for i in range(len(trace)):
        sent = max(float(trace.arrival_ms[i]), previous_done)
        alone = _run(_closed_loop_params(), make_trace("one", [sent], trace.input_tokens[i: i + 1], trace.output_tokens[i: i + 1], rebase=False))
        assert res.sent_ms[i] == sent
        for name in ("first_token_ms", "second_token_ms", "last_token_ms", "output_tokens", "decode_rounds"):
            np.testing.assert_array_equal(getattr(res, name)[i], getattr(alone, name)[0], err_msg=f"request {i}: {name}")
        previous_done = float(alone.last_token_ms[0])
    req = metrics.per_request(res, trace.arrival_ms, trace.input_tokens, trace.output_tokens, n=len(trace))
    np.testing.assert_array_equal(req["ttft_ms"], res.first_token_ms[: len(trace)] - res.sent_ms[: len(trace)])
    assert np.any(req["sent_ms"] > trace.arrival_ms)  # some request waited for a slot


def test_closed_loop_wider_than_the_trace_is_the_open_loop():
    """max_concurrency >= N never makes a request wait: identical to the open loop, field by field; with
    every arrival at 0 too (the whole trace sent at once)."""
    trace = _closed_loop_trace()
    at_zero = make_trace("zero", np.zeros(len(trace)), trace.input_tokens, trace.output_tokens)
    for tr in (trace, at_zero):
        open_loop = _run(_closed_loop_params(), tr)
        np.testing.assert_array_equal(open_loop.sent_ms[: len(tr)], tr.arrival_ms)
        for c in (len(tr), len(tr) + 5):
            closed = _run(_closed_loop_params(max_concurrency=c), tr)
            for name, a in vars(open_loop).items():
                np.testing.assert_array_equal(getattr(closed, name), a, err_msg=f"C={c}: {name}")


def test_closed_loop_is_per_replica():
    """Each replica of an aggregated pool holds its own semaphore of C over the requests routed to it (a disaggregated
    deployment's C spans the whole pipeline: tests/test_replay_pd_closed_loop.py)."""
    trace = _closed_loop_trace()
    rates = pad_rates(np.array([1.0, 1.0, 0.0]))
    pool = _pool("sd_k3", replicas=2, max_num_batched_tokens=256)
    two = run_replays([ReplayConfig("two", 3, rates, aggregated=pool, max_concurrency=2)], trace)[0]
    assert two.status == COMPLETED
    for r, idx in enumerate((np.arange(0, len(trace), 2), np.arange(1, len(trace), 2))):
        sub = make_trace("s", trace.arrival_ms[idx], trace.input_tokens[idx], trace.output_tokens[idx], rebase=False)
        alone = _run(pool.params(3, rates, 100_000, max_concurrency=2), sub)
        np.testing.assert_array_equal(two.requests["sent_ms"][idx], alone.sent_ms[: idx.size])
        np.testing.assert_array_equal(two.requests["first_token_ms"][idx], alone.first_token_ms[: idx.size])
        np.testing.assert_array_equal(two.requests["ttft_ms"][idx], alone.first_token_ms[: idx.size] - alone.sent_ms[: idx.size])


def test_preemption_is_exercised_by_the_goldens():
    case = next(c for c in replay_cases() if c["id"] == "sd_k3_a2_kv_bound")
    assert sum(r["readmission_count"] for r in case["result"]["per_request"]) == 2


def _stochastic_setup():
    t = padded_tables()["sd_k3"]
    rates = [np.array([0.8, 0.6, 0.4]), np.array([1.0, 0.5, 0.0])]
    params = [
        make_params(t, max_num_batched_tokens=512, max_num_seqs=4, block_size=16, num_gpu_blocks=4000,
                    num_draft_tokens=3, accept_rates=pad_rates(r), max_model_len=32768)
        for r in rates
    ]
    trace = make_trace("s", [0.0, 1.0, 2.0, 3.0], [100, 120, 90, 110], [161, 161, 161, 161])
    return rates, params, trace


def test_stochastic_acceptance_matches_expected_tokens_per_round():
    rates, params, trace = _stochastic_setup()
    seeds = list(range(24))
    res = replay_batch([p for p in params for _ in seeds], trace.requests(PAD), seeds * len(params), slots=SLOTS,
                       stochastic=True, timeline_len=TIMELINE, chunk=8)
    res = jax.tree.map(np.asarray, res)
    assert np.all(res.status == COMPLETED)
    for j, r in enumerate(rates):
        sl = slice(j * len(seeds), (j + 1) * len(seeds))
        tokens = (res.output_tokens[sl, : len(trace)] - 1).sum()
        rounds = res.decode_rounds[sl, : len(trace)].sum()
        mean = tokens / rounds
        expect = float(expected_tokens_per_round(pad_rates(r), 3, 1e9))
        p = np.concatenate([[1.0], np.cumprod(r)])  # P(T >= j+1)
        var = float(np.sum((2 * np.arange(1, 5) - 1) * p) - expect**2)
        # the capped last round of each request lowers the mean by < (E[T]-1) tokens per request
        bias = (expect - 1) * len(seeds) * len(trace) / rounds
        assert abs(mean - expect) <= 4 * math.sqrt(var / rounds) + bias, (j, mean, expect)
        # per-seed streams differ; certain positions never vary
        assert len(set(res.decode_rounds[sl, 0].tolist())) > 1


def test_batched_equals_one_by_one():
    rates, params, trace = _stochastic_setup()
    case_params = []
    for table, k in TABLE_K.items():
        for budget, seqs, blocks in ((64, 2, 40), (1024, 4, 4000)):
            rr = pad_rates(np.array([0.9, 0.5, 0.2][:k]))
            case_params.append(make_params(padded_tables()[table], max_num_batched_tokens=budget, max_num_seqs=seqs,
                                           block_size=16, num_gpu_blocks=blocks, num_draft_tokens=k, accept_rates=rr,
                                           max_model_len=32768))
    all_params = params + case_params
    seeds = [3, 5] + list(range(len(case_params)))
    batched = jax.tree.map(np.asarray, replay_batch(all_params, trace.requests(PAD), seeds, slots=SLOTS, stochastic=True, timeline_len=TIMELINE))
    for i, (p, s) in enumerate(zip(all_params, seeds)):
        one = _run(p, trace, seed=s, stochastic=True)
        got = unstack(batched, i)
        for name, a in vars(one).items():
            if name == "num_steps":  # a batch's stretches stop where any of its replays must (runner.stretch_lookahead)
                continue
            np.testing.assert_array_equal(getattr(got, name), a, err_msg=f"config {i} field {name}")
    assert not np.array_equal(batched.last_token_ms[0], batched.last_token_ms[1])


@pytest.mark.parametrize("table,accepted", [("ar_core", 0), ("sd_k3", 2)])
def test_closed_loop_steady_state(table, accepted):
    """All requests queued at t=0 with max_num_seqs=C: the engine keeps C running (closed loop). Cohorts
    of C identical requests alternate one prefill pass with decode rounds; TPOT and throughput agree
    with the steady state built from the same kernels within 5 %."""
    t = padded_tables()[table]
    k, c, isl, osl, n = TABLE_K[table], 4, 200, 61, 12
    rates = pad_rates(np.array([1.0] * accepted + [0.0] * (k - accepted)))
    p = make_params(t, max_num_batched_tokens=4096, max_num_seqs=c, block_size=16, num_gpu_blocks=4000,
                    num_draft_tokens=k, accept_rates=rates, max_model_len=32768)
    trace = make_trace("closed", np.zeros(n), np.full(n, isl), np.full(n, osl))
    res = _run(p, trace)
    req = metrics.per_request(res, trace.arrival_ms, trace.input_tokens, trace.output_tokens, n=n)
    agg = metrics.aggregate(req)
    burst = accepted + 1
    rounds = math.ceil((osl - 1) / burst)
    mid_kv = c * (isl + (osl - 1) // 2)
    decode_ms = float(decode_batch(t, np.array([c]), np.array([mid_kv]))[0][0])
    prefill_ms = float(prefill_batch(t, np.array([c]), np.array([c * isl]), np.array([0]))[0][0])
    tpot = decode_ms * rounds / (osl - 1)
    throughput = c * osl / ((prefill_ms + rounds * decode_ms) / 1000.0)
    assert agg["completed_requests"] == n
    assert abs(agg["mean_tpot_ms"] - tpot) <= 0.05 * tpot
    assert abs(agg["output_throughput_tok_s"] - throughput) <= 0.05 * throughput
    assert metrics.timeline_table(res)["running"].max() == c


def _pool(table, **kw):
    base = dict(max_num_batched_tokens=1024, max_num_seqs=4, block_size=16, num_gpu_blocks=4000, max_model_len=32768)
    base.update(kw)
    return WorkerPool(padded_tables()[table], **base)


def test_replicas_route_round_robin():
    trace = make_trace("r", [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], [100, 120, 90, 110, 80, 60], [9, 7, 12, 5, 8, 6])
    rates = pad_rates(np.array([1.0, 1.0, 0.0]))
    pool = _pool("sd_k3", replicas=2)
    two = run_replays([ReplayConfig("two", 3, rates, aggregated=pool)], trace)[0]
    for r, idx in enumerate((np.arange(0, 6, 2), np.arange(1, 6, 2))):
        sub = make_trace("s", trace.arrival_ms[idx], trace.input_tokens[idx], trace.output_tokens[idx], rebase=False)
        alone = _run(pool.params(3, rates, 100_000), sub)
        np.testing.assert_array_equal(two.requests["first_token_ms"][idx], alone.first_token_ms[: idx.size])
        np.testing.assert_array_equal(two.requests["last_token_ms"][idx], alone.last_token_ms[: idx.size])
    assert two.status == COMPLETED and two.summary["completed_requests"] == 6


def test_disaggregated_ttft_is_prefill_plus_transfer_plus_first_round():
    rates = pad_rates(np.array([1.0, 1.0, 0.0]))
    bpt, link = 147456, 25e9
    # two replicas per pool (one idle): the same compiled batch shape as the replica test
    cfg = ReplayConfig("pd", 3, rates, prefill=_pool("sd_k3", replicas=2), decode=_pool("sd_k3", replicas=2),
                       kv_bytes_per_token=bpt, kv_transfer_bytes_per_s=link)
    isl, osl = 300, 10
    out = run_replays([cfg], make_trace("one", [0.0], [isl], [osl]))[0]
    assert out.status == COMPLETED
    t = padded_tables()["sd_k3"]
    dur = lambda ms: round(ms / 1000.0 * 1e9) / 1e9 * 1000.0  # noqa: E731
    p = dur(float(prefill_batch(t, np.array([1]), np.array([isl]), np.array([0]))[0][0]))
    d = dur(float(decode_batch(t, np.array([1]), np.array([isl]))[0][0]))
    xfer = isl * bpt / link * 1000.0
    assert out.requests["ttft_ms"][0] == pytest.approx(p + xfer + d, rel=1e-12)
    assert out.requests["generated_tokens"][0] == osl
    # the prefill token rides with the first round's burst: ceil((osl - 1) / 3) rounds on the decode worker
    assert out.requests["decode_rounds"][0] == math.ceil((osl - 1) / 3)
    agg = run_replays([ReplayConfig("agg", 3, rates, aggregated=_pool("sd_k3", replicas=2))], make_trace("one", [0.0], [isl], [osl]))[0]
    assert agg.requests["ttft_ms"][0] == pytest.approx(p, rel=1e-12)


@pytest.mark.parametrize("table,accepted", [("ar_core", 0), ("sd_k3", 2)])
def test_closed_loop_agrees_with_sweep_steady_state(table, accepted):
    """A closed loop at fixed concurrency C (all requests queued, max_num_seqs = C, the first cohort's
    outputs staggered so completions interleave) against the sweep's steady-state model: TPOT and
    output throughput within 5 % (SD rounds agree to ~0.1 %; AR differs by the sweep's mixed-pass
    baseline subtraction, which the reference's replay does not apply)."""
    from jaxsim.sweep import evaluate as ev

    k, c, isl, osl, n = TABLE_K[table], 4, 200, 121, 16
    rates = pad_rates(np.array([1.0] * accepted + [0.0] * (k - accepted)))
    i64 = np.int64
    cfg = ev.ConfigInputs(
        prefill_workers=i64(0), decode_workers=i64(1), prefill_gpus=i64(1), decode_gpus=i64(1), nextn=i64(k),
        acceptance_id=i64(0), max_num_seqs=i64(c), max_num_batched_tokens=i64(4096), prefill_max_num_batched_tokens=i64(4096),
        kv_blocks=i64(4000), prefill_kv_blocks=i64(4000), block_size=i64(16), max_model_len=i64(32768), kv_bytes_per_token=i64(0),
        kv_transfer_bytes_per_s=np.float64(1.0), concurrency=i64(c), isl=np.array([isl]), osl=np.array([osl]), weight=np.array([1.0]),
    )
    t = padded_tables()[table]  # one shape for both tables: one compilation of the sweep model
    rounds = ev.expected_rounds_table(np.asarray(rates[None]), np.array([k]), 256)
    m = jax.jit(ev.evaluate_config)(t, t, np.bool_(False), rounds, ev.SLABounds.of(), cfg)
    outs = np.full(n, osl)
    outs[:c] = [osl * (j + 1) // c for j in range(c)]
    trace = make_trace("closed", np.zeros(n), np.full(n, isl), outs)
    p = make_params(padded_tables()[table], max_num_batched_tokens=4096, max_num_seqs=c, block_size=16, num_gpu_blocks=4000,
                    num_draft_tokens=k, accept_rates=rates, max_model_len=32768)
    res = _run(p, trace)
    req = metrics.per_request(res, trace.arrival_ms, trace.input_tokens, trace.output_tokens, n=n)
    last = req["last_token_ms"]
    window = np.sort(last)
    t0, t1 = window[2 * c], window[n - c]
    done = (last > t0) & (last <= t1)
    throughput = req["generated_tokens"][done].sum() / ((t1 - t0) / 1000.0)
    tpot = np.mean(req["tpot_ms"][2 * c: n - c])
    assert int(res.status) == COMPLETED and int(m.status) < 16
    assert abs(tpot - float(m.mean_tpot_ms)) <= 0.05 * float(m.mean_tpot_ms)
    assert abs(throughput - float(m.output_tokens_per_s_per_gpu)) <= 0.05 * float(m.output_tokens_per_s_per_gpu)


def test_run_replays_same_results_with_shared_or_per_config_tables():
    """A group whose configurations share one table object passes it once; equal tables held as separate
    objects are stacked per configuration. Both give the same per-request results."""
    import dataclasses

    rng = np.random.default_rng(3)
    n = 24
    trace = make_trace("t", np.cumsum(rng.exponential(25.0, n)), rng.integers(64, 512, n), rng.integers(4, 24, n))
    table = padded_tables()["ar_core"]
    shared = [ReplayConfig(f"s{i}", 0, np.zeros(5), aggregated=_pool("ar_core", max_num_seqs=2 + i)) for i in range(3)]
    copies = [dataclasses.replace(c, aggregated=dataclasses.replace(c.aggregated, table=jax.tree.map(lambda x: x.copy(), table)))
              for c in shared]
    assert len({id(c.aggregated.table) for c in copies}) == 3 and len({id(c.aggregated.table) for c in shared}) == 1
    for a, b in zip(run_replays(copies, trace), run_replays(shared, trace)):
        assert a.status == b.status == COMPLETED
        for k in ("first_token_ms", "last_token_ms", "preemptions"):
            np.testing.assert_array_equal(a.requests[k], b.requests[k])


def test_released_executables_are_compiled_again_on_the_next_call():
    """executables.release_all forgets the process's replay executables (a long-lived process frees their JIT code
    mappings); the next replay compiles what it needs again and gives the same results."""
    from jaxsim.replay import executables

    trace = make_trace("r", [0.0, 1.0, 2.0], [100, 120, 90], [9, 7, 12])
    cfg = ReplayConfig("one", 3, pad_rates(np.array([1.0, 1.0, 0.0])), aggregated=_pool("sd_k3"))
    first = run_replays([cfg], trace)[0]
    assert executables.release_all() > 0 and not executables._LOADED
    timings: dict = {}
    again = run_replays([cfg], trace, timings=timings)[0]
    assert timings["compilations"] > 0 and executables._LOADED
    for name, a in first.requests.items():
        np.testing.assert_array_equal(np.asarray(again.requests[name]), np.asarray(a), err_msg=name)


def test_async_scheduling_admits_a_request_sent_during_a_pass_one_pass_later():
    """A request sent while another decodes: the synchronous scheduler admits it in the first pass starting after
    its send; with async scheduling that pass was scheduled when the pass before it started, so it is admitted in
    the pass after. Everything before is identical; an idle engine admits at once either way."""
    trace = make_trace("two", [0.0, 5.0], [100, 120], [60, 3], rebase=False)
    kw = dict(max_num_batched_tokens=256, max_num_seqs=4, block_size=16, num_gpu_blocks=4000, num_draft_tokens=0,
              accept_rates=pad_rates(np.zeros(0)), max_model_len=32768)
    t = padded_tables()["ar_core"]
    sync, asyn = (_run(make_params(t, **kw, async_scheduling=a), trace) for a in (False, True))
    tl_sync, tl_async = metrics.timeline_table(sync), metrics.timeline_table(asyn)
    j = int(np.flatnonzero(tl_sync["start_ms"] >= 5.0)[0])  # the first pass starting after the send
    assert tl_sync["prefill_requests"][j] == 1 and tl_async["prefill_requests"][j] == 0
    assert tl_async["prefill_requests"][j + 1] == 1 and tl_async["decode_requests"][j] == 1  # pass j: the other's decode alone
    for name in ("start_ms", "end_ms", "decode_requests", "decode_kv_tokens"):
        np.testing.assert_array_equal(tl_async[name][:j], tl_sync[name][:j], err_msg=name)
    assert tl_async["start_ms"][j] == tl_sync["start_ms"][j]
    assert sync.first_token_ms[0] == asyn.first_token_ms[0]  # the first request found the engine idle
    assert asyn.first_token_ms[1] > sync.first_token_ms[1]
    for a in (False, True):  # the oracle agrees
        reqs, _, status = oracle_replay(t, trace, **kw, async_scheduling=a)
        res = asyn if a else sync
        assert status == "completed" and [r.first for r in reqs] == list(res.first_token_ms[:2])
