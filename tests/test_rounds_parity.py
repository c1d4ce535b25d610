"""Parity of the compiled round kernels with every reference golden lookup and mixed query."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import jaxsim._jax  # noqa: F401  (turns x64 on)
from jaxsim.kernels import rounds
from jaxsim.kernels import status as st
from jaxsim.profile import load_profile_dir

GOLDENS = Path(__file__).parent / "goldens" / "public"
LOOKUPS = json.loads((GOLDENS / "lookups.json").read_text())
MIXED = json.loads((GOLDENS / "mixed.json").read_text())
TABLES = sorted(LOOKUPS["tables"])
REL = 1e-9


@pytest.fixture(scope="module", params=TABLES)
def golden(request):
    name = request.param
    bundle = load_profile_dir(GOLDENS / "tables" / name)
    dep = bundle.profile.deployments[0]
    table = rounds.compile_round_table(bundle.cell(dep), speculative=dep.is_speculative, num_draft_tokens=dep.num_draft_tokens)
    return name, table


def _check(queries, lat, code):
    problems = []
    for q, l, c in zip(queries, np.asarray(lat), np.asarray(code)):
        r = q["result"]
        if r["status"] == "ok":
            want = r["latency_ms"]
            if not (c < st.FIRST_UNSUPPORTED and abs(l - want) <= REL * max(abs(want), 1e-300)):
                problems.append((q["id"], want, float(l), st.name(c)))
            elif "resolution" in r and st.name(c) != r["resolution"]:
                problems.append((q["id"], r["resolution"], st.name(c)))
        elif c < st.FIRST_UNSUPPORTED or not np.isnan(l):
            problems.append((q["id"], "should be unsupported", float(l), st.name(c)))
    return problems


def test_decode_lookups(golden):
    name, table = golden
    qs = LOOKUPS["tables"][name]["decode"]
    lat, code = rounds.decode_batch(table, np.array([q["batch_size"] for q in qs]), np.array([q["total_kv_read_tokens"] for q in qs]))
    assert len(qs) > 300
    assert _check(qs, lat, code) == []


def test_prefill_lookups(golden):
    name, table = golden
    qs = LOOKUPS["tables"][name]["prefill"]
    cols = [np.array([q[k] for q in qs]) for k in ("batch_size", "total_prefill_tokens", "total_kv_read_tokens")]
    lat, code = rounds.prefill_batch(table, *cols)
    assert len(qs) > 150
    assert _check(qs, lat, code) == []


def test_mixed_queries(golden):
    name, table = golden
    if name not in MIXED["tables"]:
        pytest.skip(f"{name}: the reference has no mixed goldens for speculative tables")
    qs = MIXED["tables"][name]["queries"]
    keys = ("num_prefill_requests", "sum_prefill_tokens", "sum_prefill_kv_tokens", "num_decode_requests", "sum_decode_kv_tokens")
    lat, code = rounds.mixed_batch(table, *[np.array([q[k] for q in qs]) for k in keys])
    assert _check(qs, lat, code) == []


def test_speculative_tables_refuse_mixed_iterations(golden):
    name, table = golden
    if not table.speculative:
        pytest.skip("autoregressive table")
    qs = MIXED["tables"]["ar_core"]["queries"]
    keys = ("num_prefill_requests", "sum_prefill_tokens", "sum_prefill_kv_tokens", "num_decode_requests", "sum_decode_kv_tokens")
    cols = [np.array([q[k] for q in qs]) for k in keys]
    lat, code = rounds.mixed_batch(table, *cols)
    both = (cols[0] > 0) & (cols[3] > 0)
    assert np.all(np.asarray(code)[both] == st.SD_MIXED_REFUSED)
    assert np.all(np.isnan(np.asarray(lat)[both]))


def test_support_counts_match_reference(golden):
    name, table = golden
    qs = LOOKUPS["tables"][name]["decode"]
    _, code = rounds.decode_batch(table, np.array([q["batch_size"] for q in qs]), np.array([q["total_kv_read_tokens"] for q in qs]))
    want = sum(q["result"]["status"] != "ok" for q in qs)
    assert int(np.sum(np.asarray(code) >= st.FIRST_UNSUPPORTED)) == want
