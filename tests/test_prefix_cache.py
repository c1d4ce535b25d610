"""Prefix caching (issue 26): trace ``hash_ids`` -> KV block keys, their validation, and the
plain-Python specification ``oracle_replay(..., block_keys=...)`` against the reference's replay with
``kv_cache.prefix_caching: true`` (tests/data/prefix_cases: seeds of
``scripts/diff_replay_vs_reference.py --prefix``, reproduced bit for bit, cache-hit tokens included)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as hs
from replay_support import case_params, golden_table, oracle_replay, prefix_case, replay_cases, spec_block_keys

from jaxsim.errors import QueryError
from jaxsim.replay.prefix_cache import block_keys, check_hash_ids, read_hash_ids
from jaxsim.replay.traces import bundled_trace_path, make_trace

CASES_DIR = Path(__file__).parent / "data" / "prefix_cases"
CASES = sorted(p.name for p in CASES_DIR.iterdir() if p.is_dir())


# ----------------------------------------------------------------------------------------------------
# hash ids -> block keys


@settings(max_examples=150, deadline=None)
@given(hs.data())
def test_vectorised_block_keys_equal_the_specification(data):
    """The numpy block keys are the dict-trie specification's, key for key (same numbering)."""
    tbs = data.draw(hs.sampled_from([8, 16, 32, 64]))
    bs = data.draw(hs.sampled_from([8, 16, 32, 64, 128]))
    rows = data.draw(hs.lists(hs.lists(hs.integers(0, 4), min_size=1, max_size=8), max_size=25))
    tokens = [len(r) * tbs - data.draw(hs.integers(0, tbs - 1)) for r in rows]
    mine, count = block_keys(rows, tokens, tbs, bs)
    spec, spec_count = spec_block_keys(rows, tokens, tbs, bs)
    assert count == spec_count and len(mine) == len(spec)
    for a, b in zip(mine, spec):
        np.testing.assert_array_equal(a, b)


def test_keys_share_exactly_the_blocks_whose_covering_hash_ids_agree():
    # trace blocks of 4 tokens, engine blocks of 2: engine block j is covered by trace block j // 2
    keys, n = block_keys([[1, 2, 3], [1, 2, 9], [1, 7]], [12, 11, 5], trace_block_size=4, block_size=2)
    assert [len(k) for k in keys] == [6, 5, 2]  # full engine blocks only
    a, b, c = (list(k) for k in keys)
    assert a[:4] == b[:4] and a[4] != b[4]  # trace blocks 0-1 agree, block 2 differs
    assert a[:2] == c[:2]  # request 2 shares trace block 0 only
    assert n == len(set(a) | set(b) | set(c))


def test_engine_blocks_larger_than_trace_blocks_need_every_covering_hash():
    keys, _ = block_keys([[1, 2, 3, 4], [1, 2, 3, 5], [1, 9, 3, 4]], [16, 16, 16], trace_block_size=4, block_size=8)
    a, b, c = (list(k) for k in keys)
    assert a[0] == b[0] and a[1] != b[1]
    assert a[0] != c[0]  # one differing hash inside the block: no sharing, and none after it
    assert a[1] != c[1]


def test_a_partial_last_trace_block_still_shares_its_full_engine_blocks():
    # 600 and 1000 tokens with the same two 512-token hashes: the first 600 tokens are the same tokens
    keys, _ = block_keys([[1, 2], [1, 2]], [600, 1000], trace_block_size=512, block_size=16)
    assert list(keys[0]) == list(keys[1][: 600 // 16])


@pytest.mark.parametrize("name", ["mooncake_tiny", "mooncake_conversation_1k"])
def test_bundled_mooncake_traces_carry_one_hash_per_512_tokens(name):
    hashes = read_hash_ids(bundled_trace_path(name), 512)
    rows = [json.loads(x) for x in bundled_trace_path(name).read_text().splitlines() if x.strip()]
    assert len(hashes) == len(rows)
    keys, n = block_keys(hashes, [r["input_length"] for r in rows], 512, 16)
    assert n < sum(len(k) for k in keys)  # the trace shares prefixes


@pytest.mark.parametrize(("row", "fragment"), [
    ({"timestamp": 0, "input_length": 1000, "output_length": 3, "hash_ids": [1]}, "1 hash_ids for 1000 input tokens at 512"),
    ({"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [1, 2]}, "(expected 1)"),
    ({"timestamp": 0, "input_length": 10, "output_length": 3}, "hash_ids must be a non-empty list"),
    ({"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [1.5]}, "hash_ids must be integers"),
])
def test_bad_hash_ids_are_one_line_naming_the_row(tmp_path, row, fragment):
    p = tmp_path / "t.jsonl"
    good = {"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [0]}
    p.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(QueryError) as e:
        read_hash_ids(p, 512)
    msg = str(e.value)
    assert "\n" not in msg and f"{p}: row 2:" in msg and fragment in msg


def test_check_hash_ids_counts_started_trace_blocks():
    assert check_hash_ids([1, 2], 513, 512) is None
    assert check_hash_ids([1], 512, 512) is None
    assert check_hash_ids([1], 513, 512) is not None


# ----------------------------------------------------------------------------------------------------
# the specification: oracle_replay with block keys


def _kw(case):
    p = case_params(case, padded=False)
    return dict(max_num_batched_tokens=int(p.max_num_batched_tokens), max_num_seqs=int(p.max_num_seqs),
                block_size=int(p.block_size), num_gpu_blocks=int(p.num_gpu_blocks), num_draft_tokens=0,
                accept_rates=np.zeros(5), max_model_len=int(p.max_model_len))


def _ar_case():
    return next(c for c in replay_cases() if c["table"] == "ar_core")


@settings(max_examples=15, deadline=None)
@given(seed=hs.integers(0, 10_000), blocks=hs.integers(6, 40))
def test_unique_keys_replay_exactly_as_without_caching(seed, blocks):
    """Nothing shared: no first admission hits, and without preemptions the cache changes nothing (a
    request preempted for recompute may read its own prompt blocks back while they are still cached)."""
    case = _ar_case()
    g = np.random.default_rng(seed)
    n = int(g.integers(2, 10))
    kw = _kw(case) | dict(num_gpu_blocks=blocks, max_num_seqs=4, max_model_len=256)
    trace = make_trace("u", np.sort(g.uniform(0, 50, n)), g.integers(1, 90, n), g.integers(1, 20, n), rebase=False)
    keys, _ = block_keys([[1000 * i + j for j in range(-(-int(x) // 8))] for i, x in enumerate(trace.input_tokens)],
                         trace.input_tokens, 8, kw["block_size"])
    table = golden_table("ar_core")
    cold, _, s0 = oracle_replay(table, trace, **kw)
    warm, _, s1 = oracle_replay(table, trace, **kw, block_keys=keys)
    assert all(not r.first_hit for r in warm)
    if any(r.preempt for r in cold):
        return
    assert s0 == s1
    for a, b in zip(cold, warm):
        assert (a.first, a.last, a.admits, a.preempt, a.gen) == (b.first, b.last, b.admits, b.preempt, b.gen)
        assert b.hit == 0


@settings(max_examples=15, deadline=None)
@given(seed=hs.integers(0, 10_000))
@example(seed=542)
def test_shared_prefixes_hit_whole_blocks_and_never_the_whole_prompt(seed):
    case = _ar_case()
    g = np.random.default_rng(seed)
    n = int(g.integers(2, 10))
    kw = _kw(case) | dict(max_model_len=512)
    bs = kw["block_size"]
    inputs = g.integers(1, 200, n)
    trace = make_trace("s", np.sort(g.uniform(0, 400, n)), inputs, g.integers(1, 10, n), rebase=False)
    hashes = [list(range(-(-int(x) // 16))) for x in trace.input_tokens]  # each prompt extends or prefixes the others
    keys, _ = block_keys(hashes, trace.input_tokens, 16, bs)
    table = golden_table("ar_core")
    cold, lk0, status0 = oracle_replay(table, trace, **kw)
    warm, lk1, status1 = oracle_replay(table, trace, **kw, block_keys=keys)
    for r in warm:
        assert r.hit % bs == 0 and r.hit <= (r.prompt - 1) // bs * bs
    computed = lambda lookups: sum(q[2] for q in lookups if q[0] == "prefill")  # noqa: E731
    # both ran to the end: a replay stopped by a lookup outside the table's support (seed 542: a prefill reading
    # 96 cached tokens) computes less than the other only because it stopped
    if status0 == status1 == "completed" and not any(r.preempt for r in cold + warm):
        assert computed(lk1) == computed(lk0) - sum(r.hit for r in warm)


@pytest.mark.parametrize("case", CASES)
def test_oracle_reproduces_the_reference_with_prefix_caching(case):
    pc = prefix_case(case)
    ref, trace, order = pc.ref, pc.trace, pc.order
    cfg = json.loads((pc.dir / "reference.yaml").read_text())
    assert cfg["engine"]["workers"]["aggregated"]["kv_cache"]["prefix_caching"] is True
    out, _, status = oracle_replay(pc.table, trace, **pc.kw, block_keys=pc.keys)
    assert status == "completed"
    assert sum(g["reused_input_tokens"] for g in ref.values()) > 0
    for r in out:
        g, a = ref[order[r.i]], trace.arrival_ms[r.i]
        assert (r.first - a, r.last - a) == (g["ttft_ms"], g["e2e_latency_ms"])
        assert (r.admits, r.preempt, r.gen) == (g["admission_count"], g["readmission_count"], g["output_length"])
        assert (r.first_hit, r.hit) == (g["first_admission_reused_input_tokens"], g["reused_input_tokens"])


# ----------------------------------------------------------------------------------------------------
# sweep: a workload's expected prefix-hit ratio lowers its prefill work


def _sweep_spec(profile_keys: dict | None = None, **wl):
    from jaxsim.sweep import spec as sp

    tables = Path(__file__).parent / "goldens" / "public" / "tables"
    d = {"name": "t", "block_size": 16, "gpu_budget": 2, "profile": [{"name": str(tables / "ar_core"), "label": "ar", **(profile_keys or {})}],
         "serving": {"mode": ["aggregated"]}, "scheduler": {"concurrency": [1, 8]},
         "workload": [{"name": "w", "isl": [1024], "osl": 64, **wl}]}
    return sp.spec_from_dict(d, source="t.toml")


def test_measured_hit_ratio_of_the_bundled_conversation_trace():
    from jaxsim.replay.prefix_cache import measured_hit_ratio

    p = bundled_trace_path("mooncake_conversation_1k")
    rows = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    ratio = measured_hit_ratio(read_hash_ids(p), [r["input_length"] for r in rows])
    assert 0.1 < ratio < 0.5
    # by hand on a tiny trace: the second prompt reads the first's two full 4-token blocks of three
    assert measured_hit_ratio([[1, 2, 3], [1, 2, 3]], [12, 12], 4) == pytest.approx(8 / 24)


def test_sweep_workload_prefix_hit_ratio_lowers_ttft():
    import jax
    import jax.numpy as jnp

    from jaxsim.sla import SLA
    from jaxsim.sweep import evaluate as ev
    from jaxsim.sweep import spec as sp

    out = {}
    for ratio, keys in ((0.0, {}), (0.5, {}), ("off", {"prefix_caching": False})):
        plan = sp.plan_sweep(_sweep_spec(keys, prefix_hit_ratio=0.5 if ratio == "off" else ratio))
        cfgs = jax_tree_asarray(plan.inputs(np.arange(plan.num_configs)))
        g = plan.groups[0]
        fn = jax.vmap(ev.evaluate_config, in_axes=(None, None, None, None, None, 0))
        m = fn(plan.tables[g.prefill_table], plan.tables[g.decode_table], jnp.asarray(g.disaggregated), plan.rounds_table(),
               ev.SLABounds.of(SLA()), cfgs)
        out[ratio] = np.asarray(m.mean_ttft_ms)
    both = np.isfinite(out[0.5]) & np.isfinite(out[0.0])  # NaN: a lookup outside the table's support (the closed loop's prompt wave)
    assert both.any() and np.all(out[0.5][both] < out[0.0][both])
    # a profile with prefix_caching = false computes every prompt whatever the workload's ratio
    np.testing.assert_array_equal(out["off"], out[0.0])
    with pytest.raises(sp.SpecError, match=r"profile\[0\].prefix_caching: expected a boolean"):
        _sweep_spec({"prefix_caching": "yes"})
    assert np.all(np.isfinite(out[0.5]) >= np.isfinite(out[0.0]))  # a cached prefix never leaves support where computing it all stays inside


def jax_tree_asarray(tree):
    import jax

    return jax.tree.map(lambda a: a if a is None else np.asarray(a), tree)


@pytest.mark.parametrize(("wl", "fragment"), [
    ({"prefix_hit_ratio": 1.0}, "workload[0].prefix_hit_ratio"),
    ({"prefix_hit_ratio": "all"}, "expected a number in [0, 1)"),
    ({"prefix_hit_ratio": "measured"}, "'measured' needs trace"),
])
def test_bad_prefix_hit_ratio_names_the_key(wl, fragment):
    from jaxsim.errors import JaxsimError

    with pytest.raises(JaxsimError) as e:
        _sweep_spec(**wl)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_measured_prefix_hit_ratio_from_a_trace_workload():
    from jaxsim.sweep import spec as sp

    tables = Path(__file__).parent / "goldens" / "public" / "tables"
    d = {"name": "t", "block_size": 16, "gpu_budget": 2, "profile": [{"name": str(tables / "ar_core"), "label": "ar"}],
         "serving": {"mode": ["aggregated"]}, "scheduler": {"concurrency": [1]},
         "workload": [{"name": "mc", "trace": "mooncake_tiny", "bins": 1, "prefix_hit_ratio": "measured"}]}
    s = sp.spec_from_dict(d, source="t.toml")
    assert 0.0 < s.workloads[0].prefix_hit_ratio < 1.0
