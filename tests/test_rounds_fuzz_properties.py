"""Hypothesis properties of the round kernels on random tables (tests/fuzz_tables.py).

jaxsim-only invariants that must hold on every table, not only on the goldens: no lookup is ever
negative, lookups are monotone where the data is, a mixed row without prefill work is the decode
lookup, mixed work is never cheaper than its prefill part, speculative-round tables refuse mixed work,
and tables the reference refuses to build are refused at load. Every table is padded to one fixed
shape so the whole module shares one compilation per kernel.
"""

from __future__ import annotations

import tempfile

import fuzz_tables as ft
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import jaxsim._jax  # noqa: F401  (enables x64)
from jaxsim.errors import JaxsimError
from jaxsim.kernels import rounds
from jaxsim.kernels import status as st
from jaxsim.kernels.tables import load_round_table

N = 512
# elementwise-largest shapes over 300 generated tables; a larger table just compiles once more
FIXED = {
    "kv_grid": (64,), "n_kv": (), "row_of_batch": (128,), "packed": (32, 127), "curve_batch": (16,), "seg": (16, 64, 2),
    "curve_base_ms": (16,), "pre_batch_index": (64,), "pre_tok_grid": (4, 8), "pre_n_tok": (4,), "pre_kv_grid": (4, 4),
    "pre_n_kv": (4,), "pre_coef": (4, 15, 7, 4), "pre_code": (4, 15, 7),
}
FAST = settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
seeds = hs.integers(0, 2**32 - 1)


def _compiled(t: ft.FuzzTable) -> rounds.RoundTable:
    table = rounds.compile_round_table(t.cell(), speculative=t.speculative, num_draft_tokens=t.num_draft_tokens)
    shapes = rounds.table_shapes(table)
    target = {k: tuple(max(a, b) for a, b in zip(FIXED[k], shapes[k])) for k in FIXED}
    return rounds.pad_round_table(table, target)


def _queries(rng, t):
    q = ft.random_queries(rng, t, N)
    return q["batch"], q["prefill_tokens"], q["kv_read"], q["decode_requests"], q["decode_kv"]


def _answered(lat, code):
    lat, code = np.asarray(lat), np.asarray(code)
    ok = code < st.FIRST_UNSUPPORTED
    assert np.all(np.isfinite(lat[ok])) and np.all(np.isnan(lat[~ok]))
    return lat, ok


@FAST
@given(seeds)
def test_no_lookup_is_ever_negative(seed):
    rng = np.random.default_rng(seed)
    t = ft.random_table(rng, bad_rate=0.0)
    table = _compiled(t)
    b, p, k, nd, dk = _queries(rng, t)
    for lat, code in (
        rounds.decode_batch(table, b, k),
        rounds.prefill_batch(table, b, p, k),
        rounds.mixed_batch(table, b, p, k, nd, dk),
        rounds.mixed_batch(table, b, p, k, b, k),
    ):
        lat, ok = _answered(lat, code)
        assert np.all(lat[ok] >= 0.0)


@FAST
@given(seeds)
def test_mixed_is_never_cheaper_than_its_prefill_part(seed):
    rng = np.random.default_rng(seed)
    t = ft.random_table(rng, speculative=False, bad_rate=0.0, style="dips")
    table = _compiled(t)
    b, p, k, nd, dk = _queries(rng, t)
    p = np.maximum(p, 1)
    b = np.maximum(b, 1)
    nd = np.maximum(nd, 1)
    lm, okm = _answered(*rounds.mixed_batch(table, b, p, k, nd, dk))
    lp, okp = _answered(*rounds.prefill_lookup_batch(table, b, p, k))
    ld, okd = _answered(*rounds.decode_batch(table, nd, dk))
    assert np.array_equal(okm, okp & okd)
    assert np.all(lm[okm] >= lp[okm])
    # and never dearer than prefill + decode (the baseline is a decode latency, so never negative)
    assert np.all(lm[okm] <= lp[okm] + ld[okm])


@FAST
@given(seeds)
def test_decode_equals_mixed_without_prefill_work(seed):
    rng = np.random.default_rng(seed)
    t = ft.random_table(rng, bad_rate=0.0)
    table = _compiled(t)
    _, _, _, nd, dk = _queries(rng, t)
    ld, cd = rounds.decode_batch(table, nd, dk)
    zero = np.zeros_like(nd)
    for np_, pk in ((zero, zero), (np.maximum(nd, 1), dk % 97)):  # no prefill requests / requests with 0 new tokens
        lm, cm = rounds.mixed_batch(table, np_, zero, pk, nd, dk)
        assert np.array_equal(np.asarray(cm), np.asarray(cd))
        # the same lookup; XLA may fuse the lerp differently in the two kernels (1 ulp)
        assert np.allclose(np.asarray(lm), np.asarray(ld), rtol=1e-12, atol=0.0, equal_nan=True)


@FAST
@given(seeds)
def test_speculative_tables_refuse_mixed_work(seed):
    rng = np.random.default_rng(seed)
    t = ft.random_table(rng, speculative=True, bad_rate=0.0)
    table = _compiled(t)
    b, p, k, nd, dk = _queries(rng, t)
    b, p, nd = np.maximum(b, 1), np.maximum(p, 1), np.maximum(nd, 1)
    lat, code = rounds.mixed_batch(table, b, p, k, nd, dk)
    assert np.all(np.asarray(code) == st.SD_MIXED_REFUSED) and np.all(np.isnan(np.asarray(lat)))
    # prefill-only and decode-only work are still the measured lookups
    zero = np.zeros_like(b)
    assert np.array_equal(np.asarray(rounds.mixed_batch(table, zero, zero, zero, nd, dk)[1]), np.asarray(rounds.decode_batch(table, nd, dk)[1]))
    assert np.array_equal(np.asarray(rounds.mixed_batch(table, b, p, k, zero, zero)[1]), np.asarray(rounds.prefill_lookup_batch(table, b, p, k)[1]))


@FAST
@given(seeds)
def test_monotone_where_the_data_is(seed):
    # smooth tables rise with KV (and tokens) on every curve: so must every answered lookup
    rng = np.random.default_rng(seed)
    t = ft.random_table(rng, bad_rate=0.0, style="smooth")
    table = _compiled(t)
    for b in np.unique(t.decode_batch):
        # along each measured curve, inside its own KV range (outside it a measured batch may still be
        # answered from a batch bracket, as the reference does, and brackets change with KV)
        own = t.decode_kv[t.decode_batch == b]
        kv = np.linspace(own.min(), own.max(), N).astype(np.int64)
        lat, ok = _answered(*rounds.decode_batch(table, np.full(N, b), kv))
        assert ok.all()
        assert np.all(np.diff(lat) >= -1e-9 * np.abs(lat[1:]))
    for b in np.unique(t.prefill_batch):
        m = t.prefill_batch == b
        for k in np.unique(t.prefill_kv[m]):
            tok = np.linspace(1, int(t.prefill_tokens[m].max()) + 1, N).astype(np.int64)
            lat, ok = _answered(*rounds.prefill_lookup_batch(table, np.full(N, b), tok, np.full(N, k)))
            assert np.all(np.diff(lat[ok]) >= -1e-9 * np.abs(lat[ok][1:]))


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seeds)
def test_tables_the_reference_refuses_are_refused_at_load(seed):
    t = ft.random_table(np.random.default_rng(seed), bad_rate=1.0)
    assert t.bad in ft.BAD_KINDS
    with tempfile.TemporaryDirectory() as d:
        ft.write_profile_dir(t, d)
        needle = "prefill point with no prefill tokens" if t.bad == "zero_token_prefill_row" else "no genuine"
        with pytest.raises(JaxsimError, match=needle):
            load_round_table(d)


def test_generated_tables_load_when_valid(tmp_path):
    for seed in range(3):
        t = ft.random_table(np.random.default_rng(seed), bad_rate=0.0)
        d = ft.write_profile_dir(t, tmp_path / str(seed))
        table, dep = load_round_table(d)
        assert table.speculative == t.speculative == dep.is_speculative
        # the decoys never reach the table: every genuine decode row is reproduced exactly
        lat, code = rounds.decode_batch(table, t.decode_batch, t.decode_kv)
        assert np.all(np.asarray(code) == st.EXACT)
        assert np.array_equal(np.asarray(lat), t.decode_latency_ms)
