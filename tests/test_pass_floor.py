"""The shortest pass a table prices (jaxsim.kernels.pass_floor): below every supported lookup, and no lower than the
smallest measured latency less the clock's rounding (SYNTHETIC fuzz tables, tests/fuzz_tables.py)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from fuzz_tables import random_queries, random_table

from jaxsim.kernels import rounds
from jaxsim.kernels.pass_floor import shortest_pass_ms
from jaxsim.kernels.status import FIRST_UNSUPPORTED

_DECODE = jax.jit(jax.vmap(rounds.decode_latency_ms, in_axes=(None, 0, 0)))
_PREFILL = jax.jit(jax.vmap(rounds.prefill_latency_ms, in_axes=(None, 0, 0, 0)))


def _supported(ms, code):
    ms, code = np.asarray(ms), np.asarray(code)
    return ms[(code < FIRST_UNSUPPORTED) & np.isfinite(ms)]


@pytest.mark.parametrize("seed", range(12))
def test_every_supported_lookup_lasts_at_least_the_shortest_pass(seed):
    rng = np.random.default_rng(seed)
    t = random_table(rng, bad_rate=0.0)
    table = rounds.compile_round_table(t.cell(), speculative=t.speculative, num_draft_tokens=t.num_draft_tokens)
    floor = shortest_pass_ms(table)
    assert 0.0 <= floor
    q = random_queries(rng, t, 4000)
    work = q["batch"] > 0
    d = _supported(*_DECODE(table, q["batch"][work], q["kv_read"][work]))
    with_tokens = work & (q["prefill_tokens"] > 0)
    p = _supported(*_PREFILL(table, q["batch"][with_tokens], q["prefill_tokens"][with_tokens], q["kv_read"][with_tokens]))
    assert d.size + p.size > 100  # the queries reach the support
    assert floor <= min(d.min(initial=np.inf), p.min(initial=np.inf))
    # tight: the smallest measured latency (a measured point is a supported lookup) less one nanosecond at most
    measured = min(float(np.min(t.decode_latency_ms)), float(np.min(t.prefill_latency_ms)))
    assert measured - 1e-6 - 1e-12 <= floor <= measured


def test_a_flat_table_s_shortest_pass_is_its_decode_latency():
    t = random_table(np.random.default_rng(5), bad_rate=0.0)
    cell = t.cell()
    cell.decode_latency_ms = np.full_like(cell.decode_latency_ms, 3.0)
    cell.prefill_latency_ms = np.full_like(cell.prefill_latency_ms, 7.0)
    table = rounds.compile_round_table(cell, speculative=t.speculative, num_draft_tokens=t.num_draft_tokens)
    assert shortest_pass_ms(table) == pytest.approx(3.0 - 1e-6, abs=1e-12)
