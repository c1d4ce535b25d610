"""The steady state and the replay agree where docs/sweep.md says they should (issue 27, Deliver 2): the same
sweep evaluated both ways (`evaluate = "steady"` / `"replay"`, one closed-loop benchmark per point), on the
bundled calibrated Qwen3-32B B300 profile, within :data:`jaxsim.sweep.evaluate.AGREEMENT`: closed loops of
>= 16 clients per worker with equal lengths (the prompt waves stay in step), and spread lengths at any
concurrency."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

import jaxsim._jax  # noqa: F401  (turns x64 on)
from jaxsim.kernels import status as st
from jaxsim.sweep import run_sweep
from jaxsim.sweep.evaluate import AGREEMENT
from jaxsim.sweep.spec import spec_from_dict


def _spec(evaluate: str, concurrency: list[int], range_ratio: float, overhead: dict | None = None, ahead: bool = False) -> dict:
    return {
        "name": f"agree-{evaluate}",
        "gpu_budget": 4,
        "evaluate": evaluate,
        "profile": [{"name": "qwen3-32b-bf16-b300-calibrated", "tp": [2, 4], **({"overhead": overhead} if overhead else {}),
                     **({"async_scheduling": True} if ahead else {})}],
        "serving": {"mode": ["aggregated"]},
        "scheduler": {"concurrency": concurrency},
        "workload": [{"name": "chat", "isl": 4096, "osl": 512}],
        "benchmark": {"prompts_per_client": 10, "range_ratio": range_ratio},
    }


OVERHEAD = {"fixed_ms": 40.0, "per_prompt_token_ms": 0.01, "per_output_token_ms": 1.0}
"""A serving overhead of the size issue 27's silicon sample shows (tens of ms on TTFT, ~1 ms per token)."""


@pytest.mark.parametrize("concurrency,range_ratio,overhead,ahead", [
    ([16, 32], 0.0, None, False), ([8, 32], 0.5, None, False), ([16, 32], 0.0, OVERHEAD, False),
    ([16, 32], 0.0, None, True), ([8, 32], 0.5, None, True),
])
def test_steady_state_agrees_with_replay_where_stated(tmp_path, concurrency, range_ratio, overhead, ahead):
    """Both methods agree, with a serving overhead too (both add it to their latencies alike), and with async
    scheduling (both wait the pass scheduled ahead)."""
    rows = {}
    for how in ("steady", "replay"):
        res = run_sweep(spec_from_dict(_spec(how, concurrency, range_ratio, overhead, ahead), source="agree.toml"), tmp_path / f"{how}.parquet",
                        top=3)
        rows[how] = {r["config_id"]: r for r in pq.read_table(res.output).to_pylist()}
    assert len(rows["replay"]) == 2 * len(concurrency)
    for cid, r in rows["replay"].items():
        s = rows["steady"][cid]
        assert r["method"] == "replay" and s["method"] == "steady"
        assert r["status"] == st.COMPLETED and s["status"] < st.FIRST_UNSUPPORTED
        if range_ratio == 0.0:
            assert s["prefill_queue_ms"] > 0  # the prompt waves of a closed loop in step
        for k, tol in AGREEMENT.items():
            assert abs(s[k] - r[k]) <= tol * r[k], (cid, r["tp"], r["concurrency_target"], k, s[k], r[k])


def test_an_open_loop_benchmark_adds_no_prompt_waves(tmp_path):
    d = _spec("steady", [16], 0.0)
    d["benchmark"] = {"load": "poisson", "request_rate": 2.0}
    res = run_sweep(spec_from_dict(d, source="open.toml"), tmp_path / "o.parquet", top=3)
    closed = run_sweep(spec_from_dict(_spec("steady", [16], 0.0), source="c.toml"), tmp_path / "c.parquet", top=3)
    o = {r["config_id"]: r for r in pq.read_table(res.output).to_pylist()}
    c = {r["config_id"]: r for r in pq.read_table(closed.output).to_pylist()}
    for cid, r in o.items():
        assert r["prefill_queue_ms"] == 0.0
        assert c[cid]["mean_ttft_ms"] == pytest.approx(r["mean_ttft_ms"] + c[cid]["prefill_queue_ms"], rel=1e-9)
        assert c[cid]["output_tokens_per_s_per_gpu"] == r["output_tokens_per_s_per_gpu"]


def test_the_steady_state_prices_the_lengths_the_benchmark_sends():
    """InferenceX's random lengths are U{⌊rL⌋ .. L} (mean below L): the steady state takes their mean; vLLM's
    rule is symmetric about L, which stays."""
    import numpy as np

    from jaxsim.sweep.spec import plan_sweep

    d = _spec("steady", [4], 0.8)
    d["benchmark"]["length_rule"] = "inferencex"
    cfg = plan_sweep(spec_from_dict(d, source="ix.toml")).inputs(np.arange(1))
    assert (int(cfg.isl[0, 0]), int(cfg.osl[0, 0])) == ((3276 + 4096 + 1) // 2, (409 + 512 + 1) // 2)
    assert not bool(cfg.equal_lengths[0])
    d["benchmark"]["length_rule"] = "vllm"
    cfg = plan_sweep(spec_from_dict(d, source="v.toml")).inputs(np.arange(1))
    assert (int(cfg.isl[0, 0]), int(cfg.osl[0, 0])) == (4096, 512)


def test_async_scheduling_lengthens_ttft_by_about_a_pass_in_both_methods(tmp_path):
    """The same points with the synchronous and the async scheduler: a closed loop's TTFT grows by one to three passes
    (a later prompt waits the two passes scheduled before its send; the first wave nothing), TPOT and throughput
    stay within 2 %."""
    rows = {}
    for how in ("steady", "replay"):
        for ahead in (False, True):
            res = run_sweep(spec_from_dict(_spec(how, [8, 32], 0.5, None, ahead), source="a.toml"), tmp_path / f"{how}{ahead}.parquet", top=3)
            rows[how, ahead] = {r["config_id"]: r for r in pq.read_table(res.output).to_pylist()}
    for how in ("steady", "replay"):
        for cid, sync in rows[how, False].items():
            asyn = rows[how, True][cid]
            pass_ms = sync["mean_tpot_ms"]
            assert 1.0 * pass_ms <= asyn["mean_ttft_ms"] - sync["mean_ttft_ms"] <= 3.0 * pass_ms, (how, cid)
            for k in ("mean_tpot_ms", "output_tokens_per_s_per_gpu"):
                assert asyn[k] == pytest.approx(sync[k], rel=0.02), (how, cid, k)


def test_async_scheduling_in_a_spec_is_a_boolean():
    from jaxsim.sweep.spec import SpecError, plan_sweep

    d = _spec("steady", [4], 0.0, None, True)
    assert bool(plan_sweep(spec_from_dict(d, source="a.toml")).async_scheduling.all())
    d["profile"][0]["async_scheduling"] = "yes"
    with pytest.raises(SpecError) as e:
        spec_from_dict(d, source="bad.toml")
    assert "async_scheduling" in str(e.value) and "bad.toml" in str(e.value) and "\n" not in str(e.value)


def test_an_open_loop_with_async_scheduling_waits_about_a_pass_and_adds_no_prompt_waves(tmp_path):
    """An open loop's prompts arrive at random within a pass: async scheduling adds one mean pass to TTFT (nothing to
    TPOT), and prefill_queue_ms stays the waves' share, 0."""
    rows = {}
    for ahead in (False, True):
        d = _spec("steady", [16], 0.0, None, ahead)
        d["benchmark"] = {"load": "poisson", "request_rate": 2.0}
        res = run_sweep(spec_from_dict(d, source="open.toml"), tmp_path / f"o{ahead}.parquet", top=3)
        rows[ahead] = {r["config_id"]: r for r in pq.read_table(res.output).to_pylist()}
    for cid, sync in rows[False].items():
        asyn = rows[True][cid]
        assert asyn["prefill_queue_ms"] == 0.0 == sync["prefill_queue_ms"]
        assert asyn["mean_tpot_ms"] == sync["mean_tpot_ms"]
        assert asyn["mean_ttft_ms"] - sync["mean_ttft_ms"] == pytest.approx(sync["pass_ms"], rel=1e-9)
