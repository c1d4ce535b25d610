"""Benchmark load models (jaxsim/replay/loads.py) against hand computations of the clients' own rules,
and the one statistics vocabulary (jaxsim/stats.py) against numpy on known arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest

from jaxsim import stats
from jaxsim.errors import InputError
from jaxsim.replay import loads as ld
from jaxsim.replay import metrics
from jaxsim.sla import SLA, canonical_keys

# ---- arrivals ------------------------------------------------------------------------------------


def test_closed_loop_sends_everything_at_zero_and_defaults_to_ten_prompts_per_client():
    load = ld.parse_load("closed:64")
    assert (load.kind, load.max_concurrency, load.num_prompts) == ("closed", 64, 640)
    assert ld.parse_load("closed:4:7").num_prompts == 7
    np.testing.assert_array_equal(ld.arrival_times_ms(load), np.zeros(640))


def test_vllm_open_loop_is_rescaled_gamma_intervals_from_the_global_stream():
    """vllm/benchmarks/serve.py get_request: np.random.seed(seed); N gamma(B, 1/(R B)) intervals,
    cumulated from the first request (which also waits), rescaled so the last lands at N/R."""
    n, rate, b, seed = 50, 4.0, 0.5, 7
    np.random.seed(seed)
    delays = [np.random.gamma(shape=b, scale=1.0 / (rate * b)) for _ in range(n)]
    for i in range(1, n):
        delays[i] += delays[i - 1]
    factor = (n / rate) / delays[-1]
    expect = np.array([d * factor for d in delays]) * 1000.0
    got = ld.arrival_times_ms(ld.parse_load(f"gamma:{rate}:{n}:{b}"), seed)
    np.testing.assert_allclose(got, expect, rtol=1e-12)
    assert got[0] > 0 and got[-1] == pytest.approx(n / rate * 1000.0, rel=1e-12)


def test_inferencex_open_loop_starts_at_zero_without_rescaling():
    """InferenceX benchmark_serving.py get_request: yield, then sleep one gamma interval (old vLLM rule)."""
    n, rate, seed = 20, 2.0, 3
    rs = np.random.RandomState(seed)
    gaps = rs.gamma(shape=1.0, scale=1.0 / rate, size=n)
    expect = np.concatenate([[0.0], np.cumsum(gaps[: n - 1])]) * 1000.0
    got = ld.arrival_times_ms(ld.parse_load(f"poisson:{rate}:{n}", arrival_rule="inferencex"), seed)
    np.testing.assert_allclose(got, expect, rtol=1e-12)


def test_infinite_burstiness_gives_constant_intervals():
    got = ld.arrival_times_ms(ld.LoadModel("gamma", 4, request_rate=2.0, burstiness=math.inf))
    np.testing.assert_allclose(got, [500.0, 1000.0, 1500.0, 2000.0])


def test_open_loop_mean_rate_over_many_requests():
    got = ld.arrival_times_ms(ld.parse_load("poisson:10:20000", arrival_rule="inferencex"), 1)
    assert np.mean(np.diff(got)) == pytest.approx(100.0, rel=0.03)


# ---- lengths -------------------------------------------------------------------------------------


def test_vllm_random_lengths_are_the_datasets_own_draws():
    """RandomDataset.get_sampling_params: default_rng(seed); input U[floor(L(1-r)), ceil(L(1+r))], then output."""
    isl, osl, r, seed, n = 1000, 100, 0.25, 11, 300
    rng = np.random.default_rng(seed)
    inp = rng.integers(math.floor(isl * (1 - r)), math.ceil(isl * (1 + r)) + 1, size=n)
    out = rng.integers(max(math.floor(osl * (1 - r)), 1), max(math.ceil(osl * (1 + r)), 1) + 1, size=n)
    got = ld.Lengths(isl, osl, r).draw(n, seed)
    np.testing.assert_array_equal(got[0], inp)
    np.testing.assert_array_equal(got[1], out)
    assert ld.Lengths(isl, osl, r).bounds() == ((750, 1250), (75, 125))
    fixed = ld.Lengths(isl, osl).draw(5, seed)
    assert (fixed[0] == isl).all() and (fixed[1] == osl).all()


def test_inferencex_random_lengths_are_its_draws():
    """InferenceX sample_random_requests: np.random.seed(seed); randint(int(L r), L + 1) inputs, then outputs."""
    isl, osl, r, seed, n = 8192, 1024, 0.8, 0, 640
    np.random.seed(seed)
    inp = np.random.randint(int(isl * r), isl + 1, size=n)
    out = np.random.randint(int(osl * r), osl + 1, size=n)
    got = ld.Lengths(isl, osl, r, "inferencex").draw(n, seed)
    np.testing.assert_array_equal(got[0], inp)
    np.testing.assert_array_equal(got[1], out)
    assert ld.Lengths(isl, osl, r, "inferencex").bounds() == ((6553, 8192), (819, 1024))
    # the mean is about 0.9 x nominal under this rule
    big = ld.Lengths(1024, 1024, 0.8, "inferencex").draw(100_000, 1)
    assert big[0].mean() == pytest.approx(0.9 * 1024, rel=0.01)


def test_mix_lengths_counts_by_weight_and_shuffles_seeded():
    isl, osl = ld.mix_lengths([100, 200, 300], [10, 20, 30], [0.5, 0.4, 0.1], 10, seed=2)
    assert sorted(isl.tolist()) == [100] * 5 + [200] * 4 + [300]
    assert (osl == isl // 10).all()
    again = ld.mix_lengths([100, 200, 300], [10, 20, 30], [0.5, 0.4, 0.1], 10, seed=2)
    np.testing.assert_array_equal(isl, again[0])
    # largest remainders: 7 requests of a 1/3-1/3-1/3 mix are 3, 2, 2
    isl, _ = ld.mix_lengths([1, 2, 3], [1, 1, 1], [1.0, 1.0, 1.0], 7)
    assert np.bincount(isl)[1:].tolist() == [3, 2, 2]


def test_benchmark_trace_keeps_the_benchmark_clock():
    load = ld.parse_load("poisson:5:8")
    tr = ld.benchmark_trace(load, ld.Lengths(64, 8), seed=4)
    np.testing.assert_array_equal(tr.arrival_ms, ld.arrival_times_ms(load, 4))  # not rebased: t=0 is the start
    assert (tr.input_tokens == 64).all() and "open loop" in tr.source


# ---- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, needle", [
    ("closed", "a closed loop needs its concurrency"),
    ("closed:", "a closed loop needs its concurrency"),
    ("closed:0", "max_concurrency=0 must be an integer >= 1"),
    ("closed:4:0", "num_prompts=0 must be an integer >= 1"),
    ("poisson", "an open loop needs its rate"),
    ("poisson:0", "request_rate=0.0 must be a positive finite number"),
    ("poisson:x", "rate 'x' is not a number"),
    ("gamma:2:10", "gamma:RATE:N:BURSTINESS"),
    ("gamma:2:10:0", "burstiness=0.0 must be a positive number"),
    ("uniform:3", "start with closed:C[:N]"),
])
def test_bad_loads_are_one_line_errors(spec, needle):
    with pytest.raises(ld.LoadError) as e:
        ld.parse_load(spec)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("r, needle", [(1.0, "range_ratio=1.0 must be in [0, 1)"), (-0.1, "must be in [0, 1)"),
                                       (0.9999, "can draw an empty prompt")])
def test_bad_range_ratio(r, needle):
    with pytest.raises(ld.LoadError, match=needle.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        ld.Lengths(4, 4, r)


def test_benchmark_recipe_loads():
    b = ld.Benchmark()
    assert b.load_model(8) == ld.LoadModel("closed", 80, max_concurrency=8)
    assert b.load_model(8, units=3) == ld.LoadModel("closed", 240, max_concurrency=24)
    o = ld.Benchmark(load="poisson", request_rate=2.5, num_prompts=100)
    assert o.load_model(4, units=2) == ld.LoadModel("poisson", 200, max_concurrency=8, request_rate=5.0)
    with pytest.raises(ld.LoadError, match="needs its rate"):
        ld.Benchmark(load="poisson")
    with pytest.raises(ld.LoadError, match="give no request_rate"):
        ld.Benchmark(request_rate=3.0)


# ---- one statistics vocabulary -------------------------------------------------------------------


def test_percentile_is_numpy_linear_on_known_arrays():
    x = np.array([5.0, 1.0, 4.0, 2.0, 3.0, np.nan, np.inf])
    finite = x[np.isfinite(x)]
    for p in (0, 10, 50, 75, 90, 99, 100):
        assert stats.percentile(x, p) == np.percentile(finite, p) == np.percentile(finite, p, method="linear")
    assert stats.percentile(np.arange(1.0, 1001.0), 50) == 500.5  # between index 499 and 500, not either
    assert math.isnan(stats.percentile([], 50))
    s = stats.latency_stats(finite, "ttft")
    assert s["mean_ttft_ms"] == 3.0 and s["median_ttft_ms"] == 3.0 and s["std_ttft_ms"] == np.std(finite)
    assert s["p90_ttft_ms"] == np.percentile(finite, 90) and s["p99_ttft_ms"] == np.percentile(finite, 99)


def _requests(ttft, tpot_span, gen, rounds, gap_sq, sent=None):
    n = len(ttft)
    sent = np.zeros(n) if sent is None else np.asarray(sent, float)
    first = sent + np.asarray(ttft, float)
    last = first + np.asarray(tpot_span, float)
    return {
        "arrival_ms": sent.copy(),
        "sent_ms": sent,
        "input_tokens": np.full(n, 10),
        "output_tokens": np.asarray(gen),
        "generated_tokens": np.asarray(gen),
        "first_token_ms": first,
        "last_token_ms": last,
        "ttft_ms": first - sent,
        "ttst_ms": np.full(n, np.nan),
        "tpot_ms": np.where(np.asarray(gen) > 1, (last - first) / np.maximum(np.asarray(gen) - 1, 1), np.nan),
        "e2e_ms": last - sent,
        "decode_rounds": np.asarray(rounds),
        "preemptions": np.zeros(n, int),
        "admissions": np.ones(n, int),
        "token_gap_sq_ms2": np.asarray(gap_sq, float),
        "terminal": np.array(["completed"] * n, dtype=object),
    }


def test_summary_metrics_are_vllms_definitions():
    """TPOT excludes the first token and requests with one token; ITL pools every gap of every request
    (a burst is one gap); duration from the first send to the last completion; throughputs over it."""
    # request 0: 4 tokens in 3 gaps of 10 ms; request 1: 1 token; request 2: 5 tokens in 2 bursts (gaps 30, 10)
    req = _requests(ttft=[100.0, 50.0, 200.0], tpot_span=[30.0, 0.0, 40.0], gen=[4, 1, 5], rounds=[3, 0, 2],
                    gap_sq=[300.0, 0.0, 1000.0], sent=[0.0, 10.0, 20.0])
    agg = metrics.aggregate(req)
    tpots = np.array([30.0 / 3, 40.0 / 4])
    assert agg["mean_tpot_ms"] == tpots.mean() and agg["median_tpot_ms"] == np.median(tpots)
    assert agg["p99_tpot_ms"] == np.percentile(tpots, 99)
    ttfts = np.array([100.0, 50.0, 200.0])
    assert agg["mean_ttft_ms"] == ttfts.mean() and agg["p90_ttft_ms"] == np.percentile(ttfts, 90)
    gaps = np.array([10.0, 10.0, 10.0, 30.0, 10.0])  # pooled, one per emission after the first
    assert agg["mean_itl_ms"] == pytest.approx(gaps.mean(), rel=1e-12)
    assert agg["std_itl_ms"] == pytest.approx(gaps.std(), rel=1e-12)
    e2e = np.array([130.0, 50.0, 240.0])
    assert agg["mean_e2e_ms"] == pytest.approx(e2e.mean()) and agg["median_e2e_ms"] == pytest.approx(np.median(e2e))
    duration = 20.0 + 240.0 - 0.0
    assert agg["duration_ms"] == duration
    assert agg["request_throughput_rps"] == pytest.approx(3 / (duration / 1000))
    assert agg["output_throughput_tok_s"] == pytest.approx(10 / (duration / 1000))


def test_sla_keys_and_their_deprecated_aliases():
    d, notes = canonical_keys({"max_ttft_ms": 500, "p50_tpot_ms": 20, "p90_ttft_ms": 900}, "s.toml: sla")
    assert d == {"mean_ttft_ms": 500, "median_tpot_ms": 20, "p90_ttft_ms": 900}
    assert len(notes) == 2 and "max_ttft_ms is deprecated, write mean_ttft_ms" in notes[0]
    with pytest.raises(InputError, match="max_e2e_ms and mean_e2e_ms name the same limit"):
        canonical_keys({"max_e2e_ms": 1, "mean_e2e_ms": 1}, "s.toml: sla")
    s = SLA(**d)
    assert s.latency_limits() == d and s.percentile_limits() == {"median_tpot_ms": 20, "p90_ttft_ms": 900}


def test_the_mix_percentile_is_the_limit_of_the_linear_sample_percentile():
    """The steady state's percentiles over a workload mix (inverse CDF of the classes) are what NumPy's
    linear percentile of a large sample drawn from the mix converges to (one definition, two settings)."""
    import jax.numpy as jnp

    from jaxsim.sweep import evaluate as ev

    values, weights = np.array([120.0, 300.0, 800.0]), np.array([0.55, 0.4, 0.05])
    mix = np.asarray(ev.weighted_percentiles(jnp.asarray(values), jnp.asarray(weights)))
    sample, _ = ld.mix_lengths(values.astype(np.int64), values.astype(np.int64), weights, 200_001, seed=5)
    linear = [stats.percentile(sample, p) for p in (50, 90, 99)]
    np.testing.assert_array_equal(mix, linear)
