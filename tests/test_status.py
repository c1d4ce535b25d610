"""The one status registry: disjoint codes per family, unique names, an explicit severity order."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsim._jax  # noqa: F401  (turns x64 on)
from jaxsim.kernels import capacity
from jaxsim.kernels import status as st
from jaxsim.replay import engine
from jaxsim.sweep import evaluate as ev

ROOT = Path(__file__).resolve().parents[1]


def test_codes_are_disjoint_and_in_their_family_range():
    assert len({s.name for s in st.REGISTRY.values()}) == len(st.REGISTRY)
    for code, s in st.REGISTRY.items():
        assert code == s.code and code in st.FAMILY_RANGES[s.family] and code < st.NUM_CODES
        assert s.explain and s.name
    ranges = sorted(st.FAMILY_RANGES.values(), key=lambda r: r.start)
    assert all(a.stop <= b.start for a, b in zip(ranges, ranges[1:]))
    # every family module uses the registry's codes (no private numbering left)
    assert {capacity.OK, capacity.DOES_NOT_FIT, capacity.BLOCK_SIZE_INVALID, capacity.NO_KV_BUDGET,
            capacity.INVALID_REQUEST} <= {c for c, s in st.REGISTRY.items() if s.family == "capacity"}
    assert {ev.REQUEST_EXCEEDS_KV_POOL, ev.REQUEST_EXCEEDS_CONTEXT, ev.PROMPT_EXCEEDS_PREFILL_POOL,
            ev.TOKEN_BUDGET_TOO_SMALL} == {c for c, s in st.REGISTRY.items() if s.family == "sweep"}
    assert {engine.RUNNING, engine.COMPLETED, engine.SLOTS_FULL, engine.STALLED, engine.PASS_LIMIT} == {
        c for c, s in st.REGISTRY.items() if s.family == "replay"}


def test_lookup_codes_keep_their_numbers():
    # goldens and parity tests compare these numbers: they never move
    assert (st.EXACT, st.NO_PREFILL_WORK, st.FIRST_UNSUPPORTED, st.BATCH_OUT_OF_RANGE, st.PREFILL_TOKENS_BELOW_BATCH) == (0, 7, 16, 16, 29)
    assert all(st.REGISTRY[c].answer == (c < st.FIRST_UNSUPPORTED) for c in st.REGISTRY if st.REGISTRY[c].family == "lookup")


def test_worst_follows_the_severity_order_not_the_numbers():
    assert sorted(st.SEVERITY) == sorted(st.REGISTRY) and len(set(st.SEVERITY)) == len(st.SEVERITY)
    assert st.worst(st.STALLED, st.PASS_LIMIT) == st.STALLED  # 72 is worse than 73
    assert st.worst(st.CAPACITY_OK, st.BATCH_OUT_OF_RANGE) == st.BATCH_OUT_OF_RANGE  # 16 is worse than 32
    assert st.worst(st.REQUEST_EXCEEDS_KV_POOL, st.KV_OUT_OF_RANGE, st.EXACT) == st.REQUEST_EXCEEDS_KV_POOL
    codes = np.array(sorted(st.REGISTRY), np.int32)
    rng = np.random.default_rng(0)
    a, b = rng.choice(codes, 200), rng.choice(codes, 200)
    want = [st.worst(x, y) for x, y in zip(a, b)]
    np.testing.assert_array_equal(np.asarray(st.worse(jnp.asarray(a), jnp.asarray(b), jnp)), want)
    np.testing.assert_array_equal(st.worse(a, b), want)  # the same function on the host (NumPy)
    used = rng.uniform(size=(20, 7)) > 0.3
    sets = rng.choice(codes, (20, 7))
    for row, u in zip(sets, used):
        want = st.worst(*row[u]) if u.any() else st.EXACT
        assert int(st.worst_of(jnp.asarray(row), jnp.asarray(u), jnp)) == want
        assert int(st.worst_of(row, u)) == want
    assert int(jax.jit(lambda c: st.worst_of(c, xp=jnp))(jnp.asarray(sets[0]))) == st.worst(*sets[0])


def test_names_and_replay_texts():
    assert list(st.names(np.array([0, 16, 48, 72]))) == [
        "exact_lookup", "unsupported:batch_outside_measured_range", "unsupported:request_exceeds_kv_pool",
        "stalled: a request can never fit in the KV pool"]
    assert engine.status_name(st.KV_OUT_OF_RANGE) == "stopped: pass lookup unsupported:kv_outside_measured_range"
    assert engine.status_name(st.COMPLETED) == "completed" and engine.status_name(st.PASS_LIMIT) == "stopped: pass limit reached"
    assert st.name(99) == "unknown:99" and len(st.name_table()) == st.NUM_CODES


def test_concepts_doc_lists_every_code():
    doc = (ROOT / "docs" / "concepts.md").read_text()
    rows = {int(m[1]): m[2] for m in re.finditer(r"^\| (\d+) \| `([^`]+)` \|", doc, re.M)}
    assert rows == st.NAMES


@pytest.mark.slow
def test_registry_imports_no_jax():
    code = "import sys, jaxsim.kernels.status; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
