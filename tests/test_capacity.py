"""KV capacity: parity with every case of the reference's capacity goldens, plus kernel properties."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxsim.deploy.kv_estimate import estimate_kv_cache
from jaxsim.kernels import capacity as cap
from jaxsim.profile import ModelProfile, Resources
from jaxsim.rules.capacity import CapacityRequest, block_size_problem, capacity_problems

GOLDENS = Path(__file__).parent / "goldens" / "public"
CASES = json.loads((GOLDENS / "capacity.json").read_text())["cases"]


def _profile_for(case) -> ModelProfile:
    obj = json.loads((GOLDENS / "tables" / case["table"] / "profile.json").read_text())
    pr = case["profile_resources"]
    res = obj["deployments"][0]["resources"]
    res["kv_bytes_per_token"] = pr["kv_bytes_per_token"]
    res["max_num_tokens"] = pr["max_num_tokens"]
    res["max_batch_size"] = pr["max_batch_size"]
    rm = res["runtime_memory"]
    rm["kv_cache_bytes"] = pr["kv_cache_bytes"]
    rm["gpu_memory_utilization"] = pr["gpu_memory_utilization"]
    rm["max_model_len"] = pr["max_model_len"]
    return ModelProfile.from_dict(obj, source=f"capacity:{case['id']}")


def _request(case) -> CapacityRequest:
    q = case["request"]
    return CapacityRequest(
        total_gpu_bytes=q["total_gpu_bytes"],
        memory_fraction_kind=q["memory_fraction_kind"],
        memory_fraction_value=q["memory_fraction_value"],
        max_num_tokens=q["max_num_tokens"],
        max_batch_size=q["max_batch_size"],
        context_length=q["context_length"],
        block_size=q["block_size"],
        nextn=q["nextn"],
        cuda_graph_reserved_bytes=q["cuda_graph_reserved_bytes"],
        tolerance_fraction=q["tolerance_fraction"],
    )


def test_golden_counts():
    assert len(CASES) == 33
    assert sum(c["result"]["status"].startswith("refused") for c in CASES) == 14


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_capacity_golden(case):
    prof = _profile_for(case)
    dep = prof.deployments[0]
    req = _request(case)
    problems = capacity_problems(dep.resources, prof.context_length, req, num_draft_tokens=dep.num_draft_tokens)
    want = case["result"]
    if want["status"] == "refused":
        assert problems, f"reference refused: {want['error']}"
        return
    assert problems == [], problems
    est = estimate_kv_cache(dep.resources, prof.context_length, req)
    assert est.total_gpu_capacity_bytes == want["total_gpu_capacity_bytes"]
    assert est.total_kv_size_bytes == want["total_kv_size_bytes"]
    assert est.kv_size_per_token_bytes == want["kv_size_per_token_bytes"]
    assert est.total_kv_size_tokens == want["total_kv_size_tokens"]
    assert est.request_peak_cache_bytes == want["request_peak_cache_bytes"]
    tol = want["tolerance_adjusted"]
    if tol is None:
        assert est.tolerance_kv_size_bytes is None and est.tolerance_kv_size_tokens is None
    else:
        assert est.tolerance_fraction == tol["tolerance_fraction"]
        assert est.tolerance_kv_size_bytes == tol["total_kv_size_bytes"]
        assert est.tolerance_kv_size_tokens == tol["total_kv_size_tokens"]
    if want["status"] == "refused_blocks_only":
        assert est.num_gpu_blocks is None and est.blocks_problem and "block_size" in est.blocks_problem
        assert block_size_problem(req.block_size)
    else:
        assert est.num_gpu_blocks == want["num_gpu_blocks"]
        assert block_size_problem(req.block_size) is None


def _refusal_rule(case) -> str:
    prof = _profile_for(case)
    dep = prof.deployments[0]
    problems = capacity_problems(dep.resources, prof.context_length, _request(case), num_draft_tokens=dep.num_draft_tokens)
    return problems[0].split(":", 1)[0]


@pytest.mark.parametrize(
    "cid, rule",
    [
        ("refuse-fraction-mismatch", "gpu-memory-utilization"),
        ("refuse-scheduler-tokens-changed", "scheduler-envelope"),
        ("refuse-scheduler-seqs-changed", "scheduler-envelope"),
        ("refuse-context-above-max-model-len", "context-length"),
        ("refuse-context-above-profile-context", "context-length"),
        ("refuse-budget-below-pool", "gpu-memory-fit"),
        ("refuse-budget-below-pool-sd", "gpu-memory-fit"),
        ("refuse-cuda-graph-reserved", "cuda-graph-reserved"),
        ("refuse-fraction-of-free", "memory-fraction-kind"),
        ("refuse-sd-nextn-mismatch", "sd-nextn"),
        ("refuse-sd-nextn-zero", "sd-nextn"),
        ("refuse-ar-with-nextn", "ar-nextn"),
        ("refuse-tolerance-one", "tolerance"),
    ],
)
def test_refusals_name_the_rule(cid, rule):
    case = next(c for c in CASES if c["id"] == cid)
    assert _refusal_rule(case) == rule


def test_budget_boundary_is_exact():
    """GPU budget × fraction must hold the pool: equality passes, one byte more is refused."""
    case = next(c for c in CASES if c["id"] == "budget-exactly-equals-pool")
    prof = _profile_for(case)
    res = prof.deployments[0].resources
    req = _request(case)
    assert capacity_problems(res, prof.context_length, req) == []
    smaller = CapacityRequest(**{**req.__dict__, "total_gpu_bytes": req.total_gpu_bytes - 1})
    assert any(p.startswith("gpu-memory-fit") for p in capacity_problems(res, prof.context_length, smaller))


def _declared_resources(**over) -> Resources:
    d = {
        "cache_layout": "linear",
        "max_num_tokens": 8192,
        "max_batch_size": 64,
        "provenance": "test",
        "kv_bytes_per_token": 147456,
        "weights_bytes": 17179869184,
        "activations_bytes": 2147483648,
        "runtime_overhead_bytes": 1073741824,
        "comm_overhead_bytes": 0,
    }
    d.update(over)
    return Resources._parse(d, "test", "resources")


def test_declared_memory_path_reference_example():
    """141e9 · 0.9 − 19 GiB = 106,498,905,344 B → 722,241 tokens (reference §4.2)."""
    res = _declared_resources()
    req = CapacityRequest(total_gpu_bytes=141_000_000_000, memory_fraction_value=0.9, max_num_tokens=4096, max_batch_size=64)
    assert capacity_problems(res, 32768, req) == []
    est = estimate_kv_cache(res, 32768, req)
    assert est.total_kv_size_bytes == 106_498_905_344
    assert est.total_kv_size_tokens == 722_241
    assert est.source == "declared"
    over = CapacityRequest(total_gpu_bytes=141_000_000_000, memory_fraction_value=0.9, max_num_tokens=8193, max_batch_size=64)
    assert any(p.startswith("scheduler-envelope") for p in capacity_problems(res, 32768, over))
    starved = CapacityRequest(total_gpu_bytes=20 * 2**30, memory_fraction_value=0.9, max_num_tokens=8192, max_batch_size=64)
    assert any(p.startswith("no-kv-budget") for p in capacity_problems(res, 32768, starved))


def test_declared_budget_rounds_before_subtracting():
    """capacity × fraction is rounded to float64 before the subtraction (no fused multiply-add)."""
    gpu, frac = 13_140_250_750, 0.176
    budget = gpu * frac
    assert budget == 2_312_684_132.0  # exact product is slightly below; a fused FMA would floor to 999
    res = _declared_resources(weights_bytes=2_312_683_132, activations_bytes=0, runtime_overhead_bytes=0)
    req = CapacityRequest(total_gpu_bytes=gpu, memory_fraction_value=frac, max_num_tokens=8192, max_batch_size=64)
    assert estimate_kv_cache(res, 32768, req).total_kv_size_bytes == math.floor(budget - 2_312_683_132) == 1000
    many = jax.jit(jax.vmap(cap.declared_kv_bytes))(
        cap.gpu_budget_bytes(np.full(3, gpu), np.full(3, frac)), np.full(3, 2_312_683_132), np.zeros(3, np.int64)
    )
    assert many.tolist() == [1000, 1000, 1000]


def test_pending_memory_refused():
    res = Resources._parse(
        {"cache_layout": "linear", "max_num_tokens": 8, "max_batch_size": 8, "provenance": "t", "kv_bytes_per_token": 8},
        "test", "resources",
    )
    req = CapacityRequest(total_gpu_bytes=10**9, memory_fraction_value=0.9, max_num_tokens=8, max_batch_size=8)
    assert capacity_problems(res, 1024, req)[0].startswith("memory-pending")


def test_grouped_window_pages_reference_example():
    """B=16, W=4096, T=8192, L=32768: 2048 full pages + 769 window pages (reference §4.3)."""
    b = jnp.array([16, 16, 1, 1], jnp.int64)
    page = jnp.array([1, 1, 0, 0], jnp.int64)
    win = jnp.array([0, 4096, 0, 0], jnp.int64)
    pages = cap.grouped_request_bytes(b, page, win, jnp.int64(32768), jnp.int64(8192))
    assert int(pages) == 2048 + 769
    res = Resources._parse(
        {
            "cache_layout": "grouped", "max_num_tokens": 8192, "max_batch_size": 64, "provenance": "t",
            "runtime_memory": {"kv_cache_bytes": 10**10, "gpu_memory_utilization": 0.9, "max_model_len": 32768, "provenance": "t"},
            "cache_groups": [
                {"name": "full", "kind": "attention", "num_layers": 18, "block_size_tokens": 16, "page_size_bytes": 1000},
                {"name": "swa", "kind": "attention", "num_layers": 18, "block_size_tokens": 16, "page_size_bytes": 10, "sliding_window": 4096},
            ],
        },
        "test", "resources",
    )
    req = CapacityRequest(total_gpu_bytes=10**11, memory_fraction_value=0.9, max_num_tokens=8192, max_batch_size=64)
    est = estimate_kv_cache(res, 32768, req)
    assert est.request_peak_cache_bytes == 2048 * 1000 + 769 * 10
    assert est.total_kv_size_tokens is None and est.num_gpu_blocks is None
    sd = capacity_problems(res, 32768, CapacityRequest(**{**req.__dict__, "nextn": 2}), num_draft_tokens=2)
    assert any(p.startswith("grouped-cache") for p in sd)
    pool = cap.make_pool(res, 10**10, block_size=16)
    out = cap.pool_capacity_jit(pool, np.int64(1000), np.int64(24))
    # L = 1024: 64 full pages + min(64, ceil(4096/16)+1) window pages
    assert int(out.request_bytes) == 64 * 1000 + 64 * 10
    assert int(out.max_concurrency) == min(64, 10**10 // (64 * 1000 + 64 * 10))


def _pool(kv_bytes, kvbpt, block, mbs, k):
    res = Resources._parse(
        {"cache_layout": "linear", "max_num_tokens": 8, "max_batch_size": mbs, "provenance": "t", "kv_bytes_per_token": kvbpt,
         "runtime_memory": {"kv_cache_bytes": kv_bytes, "gpu_memory_utilization": 0.9, "max_model_len": 8, "provenance": "t"}},
        "test", "resources",
    )
    return cap.make_pool(res, kv_bytes, block_size=block, num_draft_tokens=k)


def test_linear_concurrency_and_lookahead():
    # 40 blocks of 64 tokens, 147456 B/token (reference replay example: exactly 40 blocks)
    pool = _pool(147456 * 64 * 40, 147456, 64, 32, 3)
    out = cap.pool_capacity_jit(pool, np.int64(1024), np.int64(32))
    assert int(out.kv_tokens) == 64 * 40 and int(out.kv_blocks) == 40
    assert int(out.request_blocks) == math.ceil((1024 + 32 + 4) / 64) == 17
    assert int(out.max_concurrency) == 40 // 17 == 2
    ar = cap.pool_capacity_jit(_pool(147456 * 64 * 40, 147456, 64, 32, 0), np.int64(1024), np.int64(32))
    assert int(ar.request_blocks) == math.ceil(1056 / 64) == 17
    capped = cap.pool_capacity_jit(_pool(147456 * 64 * 4000, 147456, 64, 32, 0), np.int64(10), np.int64(10))
    assert int(capped.max_concurrency) == 32 and int(capped.status) == cap.OK
    huge = cap.pool_capacity_jit(pool, np.int64(10**6), np.int64(1))
    assert int(huge.max_concurrency) == 0 and int(huge.status) == cap.DOES_NOT_FIT
    bad = cap.pool_capacity_jit(_pool(147456 * 64, 147456, 0, 32, 0), np.int64(10), np.int64(10))
    assert int(bad.status) == cap.BLOCK_SIZE_INVALID and int(bad.max_concurrency) == -1
    neg = cap.pool_capacity_jit(pool, np.int64(-1), np.int64(10))
    assert int(neg.status) == cap.INVALID_REQUEST


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 2**45), st.integers(1, 2**20), st.sampled_from([1, 16, 32, 64, 128]), st.integers(1, 1024),
            st.integers(0, 5), st.integers(0, 100_000), st.integers(1, 100_000),
        ),
        min_size=1, max_size=6,
    )
)
def test_vmap_matches_python_integer_math(rows):
    pools = [_pool(b, t, blk, mbs, k) for b, t, blk, mbs, k, _, _ in rows]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *pools)
    isl = np.array([r[5] for r in rows], np.int64)
    osl = np.array([r[6] for r in rows], np.int64)
    out = cap.pool_capacity_batch(stacked, isl, osl)
    for i, (b, t, blk, mbs, k, il, ol) in enumerate(rows):
        tokens = b // t
        blocks = tokens // blk
        per = -(-(il + ol + (k + 1 if k else 0)) // blk)
        conc = min(mbs, blocks // per)
        assert int(out.kv_tokens[i]) == tokens
        assert int(out.kv_blocks[i]) == blocks
        assert int(out.request_blocks[i]) == per
        assert int(out.max_concurrency[i]) == conc
        single = cap.pool_capacity(pools[i], np.int64(il), np.int64(ol))
        assert int(single.max_concurrency) == conc
