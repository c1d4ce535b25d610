"""Property tests of the compiled round kernels on synthetic tables."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import jaxsim._jax  # noqa: F401  (enables x64)
from jaxsim.kernels import rounds
from jaxsim.kernels import status as st


def _surface(b, kv):
    return 1.0 + b**2 + (kv / 1000.0) ** 2


def synthetic_cell(batches=(1, 2, 4, 8), kv_per_request=(128, 1024, 4096), prefill_batches=(1, 2)):
    db, dk, dl = [], [], []
    for b in batches:
        for k in kv_per_request:
            db.append(b)
            dk.append(b * k)
            dl.append(_surface(b, b * k))
    pb, pt, pk, pl = [], [], [], []
    for b in prefill_batches:
        for t in (128, 512, 2048):
            for k in (0, 1024, 4096):
                pb.append(b)
                pt.append(b * t)
                pk.append(b * k)
                pl.append(2.0 + 0.004 * b * t + 0.0005 * b * k)
    a = lambda x, d: np.asarray(x, dtype=d)  # noqa: E731
    return SimpleNamespace(
        decode_batch=a(db, np.int64),
        decode_kv=a(dk, np.int64),
        decode_latency_ms=a(dl, np.float64),
        prefill_batch=a(pb, np.int64),
        prefill_tokens=a(pt, np.int64),
        prefill_kv=a(pk, np.int64),
        prefill_latency_ms=a(pl, np.float64),
    )


@pytest.fixture(scope="module")
def table():
    return rounds.compile_round_table(synthetic_cell())


def test_worked_example_from_reference(table):
    # reference spec §2.5: query (3, 3072) = ½·lerp_b2(3072) + ½·lerp_b4(3072) = 24.369344
    lat, code = rounds.decode_batch(table, np.array([3]), np.array([3072]))
    assert int(code[0]) == st.CROSS_BATCH
    assert abs(float(lat[0]) - 24.369344) < 1e-6


def test_table_points_reproduce_exactly(table):
    cell = synthetic_cell()
    lat, code = rounds.decode_batch(table, cell.decode_batch, cell.decode_kv)
    assert np.all(np.asarray(code) == st.EXACT)
    assert np.array_equal(np.asarray(lat), cell.decode_latency_ms)
    lat, code = rounds.prefill_batch(table, cell.prefill_batch, cell.prefill_tokens, cell.prefill_kv)
    assert np.all(np.asarray(code) == st.EXACT)
    assert np.array_equal(np.asarray(lat), cell.prefill_latency_ms)


def test_no_extrapolation(table):
    lat, code = rounds.decode_batch(table, np.array([1, 8, 9, 0, 3]), np.array([127, 8 * 4096 + 1, 9000, 100, 10]))
    assert np.all(np.asarray(code) >= st.FIRST_UNSUPPORTED)
    assert np.all(np.isnan(np.asarray(lat)))
    lat, code = rounds.prefill_batch(table, np.array([3, 1, 1]), np.array([384, 100, 4096]), np.array([0, 0, 0]))
    assert [st.name(c) for c in np.asarray(code)] == [
        "unsupported:prefill_batch_not_measured",
        "unsupported:no_same_batch_two_sided_prefill_support",
        "unsupported:no_same_batch_two_sided_prefill_support",
    ]


def test_speculative_round_is_one_lookup_at_actual_batch():
    cell = synthetic_cell()
    ar = rounds.compile_round_table(cell)
    sd = rounds.compile_round_table(cell, speculative=True, num_draft_tokens=3)
    b, kv = np.array([4, 2]), np.array([4 * 1024, 2 * 2000])
    l_ar, _ = rounds.decode_batch(ar, b, kv)
    l_sd, c_sd = rounds.decode_batch(sd, b, kv)
    # the same table read as a measured round gives the same latency: never batch × (K+1)
    assert np.array_equal(np.asarray(l_ar), np.asarray(l_sd))
    assert np.all(np.asarray(c_sd) < st.FIRST_UNSUPPORTED)
    # mixed speculative iterations are refused; pure work is not
    lat, code = rounds.mixed_batch(sd, np.array([1, 0]), np.array([128, 0]), np.array([0, 0]), np.array([2, 2]), np.array([2048, 2048]))
    assert int(code[0]) == st.SD_MIXED_REFUSED and np.isnan(float(lat[0]))
    l_pure, _ = rounds.decode_batch(sd, np.array([2]), np.array([2048]))
    assert float(lat[1]) == float(l_pure[0])


def test_mixed_composition(table):
    lat, code = rounds.mixed_batch(
        table, np.array([1, 0, 1, 0]), np.array([512, 0, 512, 0]), np.array([0, 0, 0, 0]), np.array([2, 2, 0, 0]), np.array([2048, 2048, 0, 0])
    )
    lp, _ = rounds.prefill_batch(table, np.array([1]), np.array([512]), np.array([0]))
    ld, _ = rounds.decode_batch(table, np.array([2]), np.array([2048]))
    base, _ = rounds.decode_batch(table, np.array([2]), np.array([256]))  # lowest-KV point at batch 2
    lat = np.asarray(lat)
    assert np.asarray(code).tolist() == [st.COMPOSED, st.EXACT, st.EXACT, st.EMPTY]
    assert lat[0] == pytest.approx(float(lp[0] + ld[0] - base[0]), rel=1e-12)
    assert lat[1] == float(ld[0]) and lat[3] == 0.0


@settings(max_examples=30, deadline=None)
@given(hs.lists(hs.tuples(hs.integers(0, 10), hs.integers(0, 40000)), min_size=1, max_size=20))
def test_vmap_equals_loop_and_jit_equals_eager(queries):
    table = _TABLE
    b = np.array([q[0] for q in queries])
    k = np.array([q[1] for q in queries])
    lat_v, code_v = rounds.decode_batch(table, b, k)
    for i in range(len(queries)):
        l_e, c_e = rounds.decode_latency_ms(table, jnp.int64(b[i]), jnp.int64(k[i]))  # eager, unjitted
        assert int(c_e) == int(code_v[i])
        # XLA may fuse a multiply-add differently under jit: equal to the last few ulps
        np.testing.assert_allclose(np.asarray(l_e), np.asarray(lat_v[i]), rtol=1e-13, equal_nan=True)


@settings(max_examples=30, deadline=None)
@given(hs.integers(1, 8), hs.floats(0.0, 1.0), hs.floats(0.0, 1.0))
def test_decode_is_monotone_in_kv_on_a_monotone_surface(b, where, frac):
    # measured batches 1, 2, 4, 8 with 128..4096 KV per request: pick both KV totals inside the range
    # that the measured batches bracketing b both cover, so both queries must be answered
    lo_b = max(m for m in (1, 2, 4, 8) if m <= b)
    hi_b = min(m for m in (1, 2, 4, 8) if m >= b)
    kv_min, kv_max = hi_b * 128, lo_b * 4096 - b * 100
    kv_lo = kv_min + int(where * (kv_max - kv_min))
    kv_hi = kv_lo + int(frac * b * 100)
    lat, code = rounds.decode_batch(_TABLE, np.array([b, b]), np.array([kv_lo, kv_hi]))
    assert np.all(np.asarray(code) < st.FIRST_UNSUPPORTED), (b, kv_lo, kv_hi, np.asarray(code))
    assert np.all(np.isfinite(np.asarray(lat))), np.asarray(lat)
    assert float(lat[1]) >= float(lat[0]) - 1e-12


_TABLE = rounds.compile_round_table(synthetic_cell())


def test_new_values_same_shapes_compile_nothing():
    t1 = rounds.compile_round_table(synthetic_cell())
    cell2 = synthetic_cell()
    cell2.decode_latency_ms = cell2.decode_latency_ms * 1.5
    t2 = rounds.compile_round_table(cell2)
    f = jax.jit(jax.vmap(rounds.decode_latency_ms, in_axes=(None, 0, 0)))
    b, k = np.array([3, 4]), np.array([3072, 4096])
    f(t1, b, k)
    before = f._cache_size()
    out = f(t2, np.array([2, 5]), np.array([2048, 9000]))
    assert f._cache_size() == before
    assert float(out[0][0]) == pytest.approx(1.5 * _surface(2, 2048))
