"""A closed loop of benchmark clients over a disaggregated deployment (jaxsim.replay.pd_closed_loop): C requests in flight
over the whole prefill -> KV transfer -> decode pipeline, the next request sent when one completes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from replay_support import padded_tables

from jaxsim.acceptance import pad_rates
from jaxsim.replay import orchestrate, pd_closed_loop
from jaxsim.replay.deployment import ReplayConfig, WorkerPool
from jaxsim.replay.engine import COMPLETED
from jaxsim.replay.orchestrate import closed_loop_refusal, run_replays
from jaxsim.replay.pd_closed_loop import released_send_ms
from jaxsim.replay.traces import make_trace
from jaxsim.router import Router

RATES = pad_rates(np.array([1.0, 1.0, 0.0]))
BYTES_PER_TOKEN, LINK = 147456, 25e9


def _pool(**kw) -> WorkerPool:
    base = dict(max_num_batched_tokens=1024, max_num_seqs=4, block_size=16, num_gpu_blocks=4000, max_model_len=32768)
    base.update(kw)
    return WorkerPool(padded_tables()["sd_k3"], **base)


def _config(clients: int, prefill: int = 2, decode: int = 3, rates=RATES, ahead: bool = False) -> ReplayConfig:
    return ReplayConfig("pd", 3, rates, prefill=_pool(replicas=prefill, async_scheduling=ahead),
                        decode=_pool(replicas=decode, async_scheduling=ahead),
                        kv_bytes_per_token=BYTES_PER_TOKEN, kv_transfer_bytes_per_s=LINK, max_concurrency=clients)


def _benchmark(n: int = 24, seed: int = 3):
    """n prompts all there at t = 0 (a closed-loop benchmark's arrivals)."""
    rng = np.random.default_rng(seed)
    return make_trace("bench", np.zeros(n), rng.integers(40, 300, n), rng.integers(2, 40, n))


def _columns(out) -> dict:
    """Every per-request column but the arrival (the closed loop's requests all arrive at t = 0; replayed as an open loop,
    they arrive when they were sent)."""
    return {k: np.asarray(v) for k, v in out.requests.items() if k != "arrival_ms"}


@pytest.mark.parametrize("clients,prefill,decode,ahead", [(1, 1, 1, False), (2, 2, 1, False), (3, 2, 3, False), (5, 1, 2, False),
                                                        (3, 2, 3, True), (5, 1, 2, True)])
def test_send_times_are_released_by_completions_and_replaying_them_as_arrivals_gives_the_same_replay(clients, prefill, decode, ahead):
    """The closed loop's defining property, checked from outside: the first C requests are sent at t = 0, the k-th
    completion (time order) sends request k + C; and the same deployment replayed as an open loop whose requests
    arrive at those send times makes every request's tokens at the same times (with async scheduling too)."""
    trace = _benchmark()
    cfg = _config(clients, prefill, decode, ahead=ahead)
    out = run_replays([cfg], trace)[0]
    assert out.status == COMPLETED and out.summary["completed_requests"] == len(trace)
    sent = np.asarray(out.requests["sent_ms"])
    assert np.all(sent[:clients] == 0.0) and np.all(sent[clients:] > 0.0) and np.all(np.diff(sent) >= 0)
    last_ms = np.asarray(out.requests["last_token_ms"])
    np.testing.assert_allclose(last_ms, sent + np.asarray(out.requests["e2e_ms"]), rtol=1e-12)
    np.testing.assert_array_equal(released_send_ms(trace.arrival_ms, last_ms, clients), sent)
    opened = make_trace("sent", sent, trace.input_tokens, trace.output_tokens, rebase=False)
    again = run_replays([dataclasses.replace(cfg, max_concurrency=0)], opened)[0]
    for name, a in _columns(out).items():
        np.testing.assert_array_equal(np.asarray(again.requests[name]), a, err_msg=name)
    np.testing.assert_array_equal(np.asarray(again.requests["arrival_ms"]), sent)
    # at most C requests in flight at any time: each is in flight from its send to its last token
    events = sorted([(t, 1) for t in sent] + [(t, -1) for t in last_ms], key=lambda e: (e[0], e[1]))
    assert max(np.cumsum([d for _, d in events])) <= clients


def test_one_client_sends_each_request_when_the_previous_completes():
    trace = _benchmark(10)
    out = run_replays([_config(1)], trace)[0]
    sent, e2e = np.asarray(out.requests["sent_ms"]), np.asarray(out.requests["e2e_ms"])
    np.testing.assert_array_equal(sent[1:], np.asarray(out.requests["last_token_ms"])[:-1])
    # alone in the pipeline, a request's latency does not depend on when it is sent
    alone = [run_replays([dataclasses.replace(_config(1), max_concurrency=0)], make_trace("one", [0.0], [i], [o]))[0]
             for i, o in zip(trace.input_tokens[:3], trace.output_tokens[:3])]
    for k, a in enumerate(alone):
        assert e2e[k] == pytest.approx(float(a.requests["e2e_ms"][0]), rel=1e-12)


def test_as_many_clients_as_requests_is_the_open_loop():
    trace = _benchmark(12)
    closed = run_replays([_config(12)], trace)[0]
    opened = run_replays([_config(0)], trace)[0]
    for name, a in opened.requests.items():  # every request sent at its arrival, as in an open loop
        np.testing.assert_array_equal(np.asarray(closed.requests[name]), np.asarray(a), err_msg=name)


def test_sampled_acceptance_closes_the_loop_too():
    """Stochastic speculative bursts (keyed by pass and engine row): the engines in the loop and the replay of their send
    times draw the same bursts, so the fixed point holds (run_replays checks it and would raise)."""
    rates = pad_rates(np.array([0.8, 0.6, 0.4]))
    for seed in (0, 1):
        out = run_replays([_config(3, rates=rates)], _benchmark(16, seed=5), seeds=[seed])[0]
        assert out.status == COMPLETED


def test_send_times_that_completions_do_not_release_are_caught(monkeypatch):
    """The check after the replay can fail: send times off by a microsecond are not the replay's fixed point."""
    real = orchestrate.closed_loop_send_ms
    monkeypatch.setattr(orchestrate, "closed_loop_send_ms", lambda *a, **k: real(*a, **k) + np.where(np.arange(24) >= 3, 1e-3, 0.0))
    with pytest.raises(RuntimeError, match="not reproduced"):
        run_replays([_config(3)], _benchmark())


def test_refusals_name_the_request():
    trace = make_trace("t", np.zeros(3), [100, 40_000, 50], [5, 5, 5])
    why = closed_loop_refusal(_config(2), trace)
    assert why == ("pd: request row 2 (40000 prompt tokens) never fits the prefill pool; a closed loop over a disaggregated "
                   "deployment needs every request to fit both pools")
    with pytest.raises(ValueError, match="never fits the prefill pool"):
        run_replays([_config(2)], trace)
    with pytest.raises(ValueError, match="with a closed loop"):
        dataclasses.replace(_config(2), router=Router("least_loaded"))
    assert closed_loop_refusal(_config(0), trace) is None


def test_the_send_time_loop_moves_by_events_not_by_passes(monkeypatch):
    """Each pool runs until the other could reach it: a request's remaining tokens at the table's shortest pass
    (jaxsim.kernels.pass_floor) bound when a decode completion can come, so one client's requests, alone in the
    pipeline, cost a few engine calls each (one or two per pool), not one per decode pass (about 7 per request here)."""
    calls = []
    advance = pd_closed_loop._Pool.advance
    monkeypatch.setattr(pd_closed_loop._Pool, "advance", lambda self, stop: calls.append(stop) or advance(self, stop))
    trace = _benchmark(48)
    out = run_replays([_config(1)], trace)[0]
    assert out.status == COMPLETED
    assert int(out.summary["decode_rounds"]) > 6 * len(trace)
    assert len(calls) <= 4 * len(trace)
