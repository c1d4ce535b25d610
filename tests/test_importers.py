"""Importers: FPM logs (CSV and Dynamo JSONL), binning rules, identity, planner sweeps, derived rounds."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from jaxsim.acceptance import conditional_rates, get_preset, list_presets, preset_rates
from jaxsim.data.registry import resolve_profile
from jaxsim.errors import JaxsimError, ProfileError, QueryError, TableError
from jaxsim.importers import derived_sd, dynamo_planner
from jaxsim.importers.fpm_log import (
    BinningConfig,
    FpmLog,
    bin_rows,
    classify_rows,
    import_fpm_log,
    kv_bytes_per_token_from_config,
    read_fpm_log,
    resolve_identity,
    write_import,
)
from jaxsim.profile import load_profile_dir, validate_profile_dir

EXCERPT = Path(__file__).parent / "data" / "fpm_qwen3_32b_tp1_excerpt"
LOG = EXCERPT / "fpm_metrics_detail.csv"
CARD = EXCERPT / "dynamo_model_card_runtime.json"
META = EXCERPT / "vllm_metadata.json"
REV = "0123456789abcdef0123456789abcdef01234567"


def _identity(**kw):
    args = dict(model_card=CARD, vllm_metadata=META, model_revision=REV, architecture="Qwen3ForCausalLM",
                system="b300_sxm", kv_bytes_per_token=262144)
    args.update(kw)
    return resolve_identity(**args)


@pytest.fixture(scope="module")
def excerpt_import():
    return import_fpm_log(LOG, _identity())


# ----------------------------------------------------------------------------------------------------
# reading


def test_csv_log_is_time_ordered_and_kinds_match_the_phase_column():
    log = read_fpm_log(LOG)
    rows = list(csv.DictReader(LOG.open()))
    assert len(log) == len(rows) == 1200
    assert np.all(np.diff(log.counter_id) > 0)
    phase = {int(r["counter_id"]): r["phase"] for r in rows}
    want = {"context": "prefill", "decode": "decode", "mixed": "mixed"}
    assert [want[phase[int(c)]] for c in log.counter_id] == list(log.kind)
    by_id = {int(r["counter_id"]): float(r["latency_ms"]) for r in rows}
    assert np.array_equal(log.latency_ms, [by_id[int(c)] for c in log.counter_id])


def _write_jsonl(path: Path, rows: list[dict], *, shuffle: bool = True) -> None:
    order = list(reversed(rows)) if shuffle else rows
    with path.open("w") as f:
        for r in order:
            f.write(json.dumps({
                "version": 1, "worker_id": r["worker_id"], "dp_rank": int(r["dp_rank"]),
                "counter_id": int(r["counter_id"]), "wall_time": float(r["latency_ms"]) / 1000.0,
                "scheduled_requests": {k: int(r[k]) for k in (
                    "num_prefill_requests", "sum_prefill_tokens", "sum_prefill_kv_tokens", "num_decode_requests",
                    "sum_decode_kv_tokens")} | {"var_prefill_length": 0.0, "var_decode_kv_tokens": 0.0},
                "queued_requests": {},
            }) + "\n")


def test_jsonl_wire_format_imports_like_the_csv(tmp_path, excerpt_import):
    rows = list(csv.DictReader(LOG.open()))[:600]
    jl = tmp_path / "fpm.jsonl"
    _write_jsonl(jl, rows)
    heartbeat = {"version": 1, "worker_id": rows[0]["worker_id"], "dp_rank": 0, "counter_id": 10**6, "wall_time": 0.0,
                 "scheduled_requests": {k: 0 for k in ("num_prefill_requests", "sum_prefill_tokens", "sum_prefill_kv_tokens",
                                                       "num_decode_requests", "sum_decode_kv_tokens")}}
    with jl.open("a") as f:
        f.write(json.dumps(heartbeat) + "\n\n")
    log = read_fpm_log(jl)
    assert log.kind[-1] == "empty" and classify_rows(log).reason[-1] == "empty_iteration"
    log = log.take(np.arange(len(log) - 1))
    csv_log = read_fpm_log(LOG).take(np.arange(600))
    assert np.array_equal(log.counter_id, csv_log.counter_id)
    np.testing.assert_allclose(log.latency_ms, csv_log.latency_ms, rtol=1e-12)
    a, b = bin_rows(log, classify_rows(log)), bin_rows(csv_log, classify_rows(csv_log))
    for f in ("decode_batch", "decode_kv", "decode_count", "prefill_batch", "prefill_tokens", "prefill_kv"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    np.testing.assert_allclose(a.decode_latency_ms, b.decode_latency_ms, rtol=1e-12)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda h, rs: ([c for c in h if c != "sum_decode_kv_tokens"], rs), "sum_decode_kv_tokens"),
        (lambda h, rs: (h, [dict(rs[0], phase="decode", num_prefill_requests="1", sum_prefill_tokens="5")] + rs[1:]), "row 1: phase"),
        (lambda h, rs: (h, [rs[0], dict(rs[1], counter_id=rs[0]["counter_id"])] + rs[2:]), "counter_id"),
        (lambda h, rs: (h, [rs[0], dict(rs[1], worker_id="other")] + rs[2:]), "streams"),
        (lambda h, rs: (h, [dict(rs[0], latency_ms="nan")] + rs[1:]), "row 1: latency_ms"),
        (lambda h, rs: (h, [dict(rs[0], num_decode_requests="-1")] + rs[1:]), "must be >= 0"),
    ],
)
def test_malformed_logs_are_refused_with_the_row(tmp_path, mutate, match):
    rows = list(csv.DictReader(LOG.open()))[:50]
    header, rows = mutate(list(rows[0].keys()), rows)
    p = tmp_path / "bad.csv"
    with p.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with pytest.raises(TableError, match=match):
        read_fpm_log(p)


# ----------------------------------------------------------------------------------------------------
# binning rules on synthetic logs


def _synthetic_log(batch, kv, lat, *, prefill=None) -> FpmLog:
    n = len(batch)
    z = np.zeros(n, np.int64)
    cols = dict(num_prefill_requests=z.copy(), prefill_tokens=z.copy(), prefill_kv_tokens=z.copy(),
                num_decode_requests=np.asarray(batch, np.int64), decode_kv_tokens=np.asarray(kv, np.int64))
    if prefill is not None:
        for i, (np_, pt) in prefill.items():
            cols["num_prefill_requests"][i], cols["prefill_tokens"][i] = np_, pt
            cols["num_decode_requests"][i], cols["decode_kv_tokens"][i] = 0, 0
    return FpmLog(source="synthetic", sha256="0" * 64, stream="w/0", counter_id=np.arange(n, dtype=np.int64),
                  latency_ms=np.asarray(lat, np.float64), **cols)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=hs.integers(0, 2**31 - 1),
    width=hs.sampled_from([64, 256, 512]),
    batches=hs.lists(hs.integers(1, 8), min_size=1, max_size=4, unique=True),
)
def test_decode_rows_are_upper_medians_on_a_shared_grid(seed, width, batches):
    rng = np.random.default_rng(seed)
    b = np.repeat(batches, 60)
    kv = b * rng.integers(100, 3000, size=b.size)
    lat = 5.0 + 0.3 * b + kv / 1e4 + rng.normal(0, 0.01, size=b.size)
    log = _synthetic_log(b, kv, lat)
    cfg = BinningConfig(kv_bin_tokens=width)
    classes = classify_rows(log, cfg)
    rows = bin_rows(log, classes, cfg)
    used = classes.used
    assert rows.decode_count.sum() == used.sum()
    for bb in np.unique(rows.decode_batch):
        m = rows.decode_batch == bb
        members = used & (b == bb)
        ks = rows.decode_kv[m]
        assert np.all(np.diff(ks) > 0)
        # the curve spans exactly the measured KV range of its kept samples
        assert ks[0] >= kv[members].min() and ks[-1] <= kv[members].max()
        if m.sum() > 1:
            assert ks[0] == kv[members].min() and ks[-1] == kv[members].max()
            assert np.all((ks[1:-1] - width // 2) % width == 0)  # interior rows on the shared bin centres
        for k, latency, count in zip(ks, rows.decode_latency_ms[m], rows.decode_count[m]):
            in_bin = members & (kv // width == k // width)
            vals = np.sort(lat[in_bin])
            assert count == vals.size
            assert latency == vals[vals.size // 2]  # the upper median, an actual sample


def test_gross_outliers_are_dropped_and_reported():
    rng = np.random.default_rng(0)
    b = np.full(400, 4)
    kv = np.sort(rng.integers(10_000, 20_000, 400))
    lat = 9.0 + kv / 1e5 + rng.normal(0, 0.02, 400)
    lat[[50, 200, 333]] = [800.0, 9.0 * 60, 0.5]
    log = _synthetic_log(b, kv, lat)
    classes = classify_rows(log)
    assert set(np.flatnonzero(classes.reason == "outlier_mad")) == {50, 200, 333}
    rows = bin_rows(log, classes)
    assert rows.decode_latency_ms.max() < 10.0 and rows.decode_latency_ms.min() > 9.0


@pytest.mark.parametrize("slowdown, dropped", [(1.45, True), (1.0, False)])
def test_slow_admission_steps_are_dropped_as_mis_split_only_when_systematic(slowdown, dropped):
    rng = np.random.default_rng(1)
    n = 600
    b = np.full(n, 8)
    kv = 8 * (4000 + np.arange(n))
    lat = 12.0 + rng.normal(0, 0.02, n)
    prefill = {}
    for i in range(20, n - 1, 25):  # a prefill-only iteration every 25 passes
        prefill[i + 1] = (1, 1024)
        lat[i] *= slowdown
        lat[i + 1] = 50.0
    log = _synthetic_log(b, kv, lat, prefill=prefill)
    classes = classify_rows(log)
    adm = np.array(sorted(i - 1 for i in prefill))
    assert classes.admission_dropped is dropped
    assert np.all(classes.mis_split[adm] == dropped)
    assert abs(classes.admission_ratio - slowdown) < 0.02


# ----------------------------------------------------------------------------------------------------
# identity and the written profile


def test_identity_from_model_card_and_metadata():
    ident = _identity()
    assert (ident.model, ident.backend_version, ident.tp, ident.context_length) == ("Qwen/Qwen3-32B", "0.20.1", 1, 40960)
    # the identity takes the vLLM metadata's envelope first and keeps the card's; the import checks both against the log
    assert (ident.max_num_tokens, ident.max_batch_size) == (2048, 128)
    assert [e[1:] for e in ident.envelope_sources] == [(2048, 128), (8192, 1024)]
    card = json.loads(CARD.read_text())["card_json"]
    blocks = card["runtime_config"]["total_kv_blocks"]
    assert ident.kv_cache_bytes == blocks * card["kv_cache_block_size"] * 262144
    assert ident.gpu_memory_utilization == 0.9 and ident.kv_cache_dtype == "bfloat16" and ident.gemm_quant_mode == "bfloat16"


def test_model_revision_is_never_invented():
    with pytest.raises(ProfileError, match="--model-revision") as e:
        resolve_identity(model_card=CARD, vllm_metadata=META, architecture="A", system="s", kv_bytes_per_token=1)
    assert "blake3:" in str(e.value)  # the user learns what the card does pin
    with pytest.raises(ProfileError, match="mutable"):
        _identity(model_revision="main")
    with pytest.raises(ProfileError, match="--system"):
        _identity(system=None)


@pytest.mark.parametrize("tp, want", [(1, 262144), (2, 131072), (4, 65536), (16, 32768)])
def test_kv_bytes_per_token_from_hf_config(tmp_path, tp, want):
    cfg = {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 64, "num_attention_heads": 64,
           "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120}
    assert kv_bytes_per_token_from_config(cfg, tp, "bfloat16") == want
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    ident = resolve_identity(model_card=CARD, vllm_metadata=META, hf_config=p, model_revision=REV, system="b300_sxm", tp=tp)
    assert ident.architecture == "Qwen3ForCausalLM" and ident.kv_bytes_per_token == want


def test_import_writes_a_valid_profile_whose_cell_is_the_binned_rows(tmp_path, excerpt_import):
    out = write_import(tmp_path / "p", excerpt_import)
    assert validate_profile_dir(out) == []
    bundle = load_profile_dir(out)
    d = bundle.profile.deployments[0]
    cell = bundle.cell(d)
    rows = excerpt_import.binned
    assert np.array_equal(cell.decode_batch, rows.decode_batch) and np.array_equal(cell.decode_kv, rows.decode_kv)
    np.testing.assert_array_equal(cell.decode_latency_ms, rows.decode_latency_ms)
    s = excerpt_import.summary
    assert s.rows_read == 1200 and s.rows_used + sum(s.dropped.values()) + s.mixed_kept_out == s.rows_read
    assert s.mixed_kept_out == int((read_fpm_log(LOG).kind == "mixed").sum())
    assert s.admission_dropped and s.dropped["mis_split_admission"] > 0  # TP1's mis-split boundary
    assert 0.9 < s.coverage["decode"] <= 1.0
    red = bundle.table.column("measurement_reduction")
    cnt = bundle.table.column("source_sample_count")
    assert np.all((red == "single_sample") == (cnt == 1)) and np.all((red == "actual_upper_median") == (cnt >= 2))
    with pytest.raises(JaxsimError, match="exists"):
        write_import(out, excerpt_import)


# ----------------------------------------------------------------------------------------------------
# derived speculative rounds


@pytest.fixture(scope="module")
def derived_k2():
    return derived_sd.derive_speculative(resolve_profile("qwen3-32b-bf16-b300"), num_draft_tokens=2)


def test_derived_rounds_follow_the_stated_model_at_every_measured_row(derived_k2):
    profile, columns, params = derived_k2
    ar = load_profile_dir(resolve_profile("qwen3-32b-bf16-b300"))
    kind = np.asarray(columns["workload_kind"])
    tp_col = np.asarray(columns["tp"])
    for d, p in zip(ar.profile.deployments, params):
        cell = ar.cell(d)
        # mu recomputed from the measured rows themselves (no kernel)
        pre = (cell.prefill_batch == 1) & (cell.prefill_kv == 0) & (cell.prefill_tokens >= 128)
        t0 = cell.prefill_tokens[pre].min()
        lp = cell.prefill_latency_ms[pre & (cell.prefill_tokens == t0)][0]
        b1 = cell.decode_batch == 1
        ld = cell.decode_latency_ms[b1][np.argmin(cell.decode_kv[b1])]
        mu = (lp - ld) / (t0 - 1)
        assert p.marginal_token_ms == pytest.approx(mu, rel=1e-12)
        m = (kind == "decode") & (tp_col == d.tp)
        want = cell.decode_latency_ms * (1 + 0.05 * 2) + 2 * cell.decode_batch * mu
        np.testing.assert_allclose(np.asarray(columns["latency_ms"])[m], want, rtol=1e-12)
        mp = (kind == "prefill") & (tp_col == d.tp)
        np.testing.assert_allclose(np.asarray(columns["latency_ms"])[mp], cell.prefill_latency_ms * 1.05, rtol=1e-12)
    assert profile.provenance.startswith("DERIVED, NOT MEASURED")
    assert all(d.execution_profile.num_draft_tokens == 2 and "DERIVED" in d.resources.provenance for d in profile.deployments)
    assert set(columns["model_support_level"]) == {"derived"}


def test_derived_round_latency_grows_with_k():
    ar = resolve_profile("qwen3-32b-bf16-b300")
    cols = [derived_sd.derive_speculative(ar, num_draft_tokens=k)[1] for k in (1, 2, 3)]
    dec = np.asarray(cols[0]["workload_kind"]) == "decode"
    lat = [np.asarray(c["latency_ms"]) for c in cols]
    assert np.all(lat[1][dec] > lat[0][dec]) and np.all(lat[2][dec] > lat[1][dec])
    assert np.array_equal(lat[0][~dec], lat[2][~dec])  # prefill rows do not depend on K
    with pytest.raises(ProfileError, match="1..5"):
        derived_sd.derive_speculative(ar, num_draft_tokens=6)


def test_deriving_from_a_speculative_profile_is_refused():
    with pytest.raises(ProfileError, match="already speculative"):
        derived_sd.derive_speculative(resolve_profile("qwen3-32b-bf16-b300-eagle3-k1"), num_draft_tokens=2)


# ----------------------------------------------------------------------------------------------------
# Dynamo planner


def _planner_dir(tmp_path: Path, *, max_kv=200_000) -> Path:
    d = tmp_path / "planner"
    d.mkdir()
    (d / "prefill.csv").write_text("isl_tokens,ttft_ms,prefill_tokens_per_s_per_gpu\n100,10,1\n1000,20,1\n4000,80,1\n")
    lines = ["kv_usage_fraction,context_length_tokens,itl_ms,decode_tokens_per_s_per_gpu,max_kv_tokens"]
    for c in (500, 2000):
        for b in (1, 10, 40, 90):
            lines.append(f"{b * c / max_kv},{c},{5 + 0.1 * b + c / 1000},1,{max_kv}")
    (d / "decode.csv").write_text("\n".join(lines) + "\n")
    (d / "disagg.yaml").write_text('args:\n  - "python3 -m dynamo.vllm --model org/Model-X  2>&1"\n')
    return d


def test_planner_rows_interpolate_each_context_on_power_of_two_batches(tmp_path):
    d = _planner_dir(tmp_path)
    res = dynamo_planner.import_planner_dir(
        d, model_revision="r1", architecture="LlamaForCausalLM", system="h200_sxm", backend_version="0.11.0",
        kv_bytes_per_token=131072, context_length=8192, max_batch_size=64,
    )
    assert res.profile.model == "org/Model-X"
    assert res.dropped_above_max_num_seqs == 2  # batch 90 at both contexts
    r = res.rows
    assert set(r.decode_batch.tolist()) == {1, 2, 4, 8, 16, 32}
    for b, k, lat in zip(r.decode_batch, r.decode_kv, r.decode_latency_ms):
        c = k // b
        assert c in (500, 2000)
        assert lat == pytest.approx(5 + 0.1 * b + c / 1000, rel=1e-12)  # linear truth is reproduced exactly
    assert np.array_equal(r.prefill_tokens, [100, 1000, 4000]) and np.all(r.prefill_batch == 1)
    out = tmp_path / "out"
    from jaxsim.importers.fpm_log import write_profile_dir

    write_profile_dir(out, res.profile, res.columns)
    assert validate_profile_dir(out) == []
    assert "round(u x max_kv_tokens / c)" in res.profile.provenance


def test_planner_import_needs_the_identity_it_cannot_read(tmp_path):
    d = _planner_dir(tmp_path)
    with pytest.raises(JaxsimError, match="--model-revision"):
        dynamo_planner.import_planner_dir(d, model_revision="", architecture="A", system="s", backend_version="v",
                                          kv_bytes_per_token=1, context_length=1)
    (d / "decode.csv").write_text("kv_usage_fraction,context_length_tokens\n0.1,100\n")
    with pytest.raises(TableError, match="itl_ms"):
        dynamo_planner.read_planner_dir(d)


# ----------------------------------------------------------------------------------------------------
# acceptance presets


def test_presets_reproduce_the_measured_acceptance():
    presets = list_presets()
    assert {p.name for p in presets} >= {"eagle3-mtbench-llama-3.1-8b-instruct", "eagle3-mtbench-qwen3-8b"}
    for p in presets:
        r = np.asarray(p.conditional_rates)
        assert np.all((r >= 0) & (r <= 1))
        if p.rates_from == "accepted_per_position":
            np.testing.assert_allclose(np.cumprod(r), p.accepted_per_position, rtol=1e-12)
            assert 1 + np.cumprod(r).sum() == pytest.approx(p.mean_acceptance_length, abs=0.015)
        else:
            assert not p.verified
            assert 1 + np.cumprod(r).sum() == pytest.approx(p.mean_acceptance_length, abs=1e-12)
    assert get_preset("eagle3-mtbench-llama-3.1-8b-instruct").verified


def test_preset_rates_truncate_and_zero_pad():
    full = preset_rates("eagle3-mtbench-llama-3.1-8b-instruct", 3)
    assert np.array_equal(preset_rates("eagle3-mtbench-llama-3.1-8b-instruct", 2), full[:2])
    assert np.array_equal(preset_rates("eagle3-mtbench-llama-3.1-8b-instruct", 5), np.r_[full, 0.0, 0.0])
    assert conditional_rates([0.5, 0.0, 0.3]) == (0.5, 0.0, 0.0)
    with pytest.raises(QueryError, match="known:"):
        preset_rates("nope", 3)
    with pytest.raises(QueryError, match="1..5"):
        preset_rates("eagle3-mtbench-qwen3-8b", 0)


# ----------------------------------------------------------------------------------------------------
# the identity checked against the log's own passes (envelope, KV pool)


def test_envelope_is_the_first_recorded_one_the_log_respects_and_is_named(excerpt_import):
    # the metadata says 2048 / 128, but the log schedules 8192-token passes: the card's 8192 / 1024 is used, said so
    d = excerpt_import.deployment
    assert (d.resources.max_num_tokens, d.resources.max_batch_size) == (8192, 1024)
    note = next(n for n in excerpt_import.summary.identity_notes if n.startswith("scheduler envelope"))
    assert "from the Dynamo model card" in note and "vLLM metadata (effective_config scheduler_config) says 2048 / 128" in note
    assert "Dynamo model card" in d.resources.provenance and note in excerpt_import.profile.provenance


def test_metadata_envelope_wins_when_the_log_respects_it(tmp_path):
    meta = json.loads(META.read_text())
    meta["effective_config"].update({"scheduler_config.max_num_batched_tokens": 8192, "scheduler_config.max_num_seqs": 64})
    (tmp_path / "m.json").write_text(json.dumps(meta))
    r = import_fpm_log(LOG, _identity(vllm_metadata=tmp_path / "m.json"))
    assert (r.deployment.resources.max_num_tokens, r.deployment.resources.max_batch_size) == (8192, 64)
    assert any("from the vLLM metadata" in n for n in r.summary.identity_notes)


def test_an_envelope_the_log_contradicts_is_refused_with_the_pass():
    with pytest.raises(TableError, match=r"schedules 8192 tokens > max_num_batched_tokens 4096 \(as given\)"):
        import_fpm_log(LOG, _identity(max_num_tokens=4096))


def test_a_pool_smaller_than_the_passes_hold_is_refused_or_widened(tmp_path):
    held = int((lambda g: (g.decode_kv_tokens + g.num_decode_requests + g.prefill_kv_tokens + g.prefill_tokens).max())(read_fpm_log(LOG)))
    with pytest.raises(TableError, match=rf"holds {held} KV tokens at once .* > the recorded KV pool of 100000 tokens"):
        import_fpm_log(LOG, _identity(kv_cache_tokens=100000))
    r = import_fpm_log(LOG, _identity(kv_cache_tokens=100000), widen_kv_pool=True)
    rm = r.deployment.resources.runtime_memory
    assert rm.kv_cache_bytes == held * 262144
    assert f"KV pool widened from the recorded 100000 tokens to {held}" in r.profile.provenance
    # the CLI: one line, exit 2, nothing written; --widen-kv-pool writes and says so
    from typer.testing import CliRunner

    from jaxsim.cli.main import app

    args = ["import", "fpm-log", str(LOG), "--model-card", str(CARD), "--vllm-metadata", str(META), "--model-revision", REV,
            "--architecture", "Qwen3ForCausalLM", "--system", "b300_sxm", "--kv-bytes-per-token", "262144",
            "--kv-cache-tokens", "100000", "--output", str(tmp_path / "p")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "contradicts its pool" in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "p").exists()
    res = CliRunner().invoke(app, args + ["--widen-kv-pool", "--json"])
    assert res.exit_code == 0, res.output
    assert any("KV pool widened" in n for n in json.loads(res.output)["identity_notes"])


def test_a_pool_that_cannot_fit_the_gpu_is_refused_at_import():
    # 2,000,000 tokens x 262,144 B = 524 GB on a 288 GB B300 at 0.9
    with pytest.raises(ProfileError, match=r"gpu-memory-fit: KV pool 524288000000 B .* > GPU memory \d+ B x gpu_memory_utilization 0.9"):
        import_fpm_log(LOG, _identity(kv_cache_tokens=2_000_000))
    # a pool that holds the log's passes but not one max_model_len request (200,000 tokens > 150,000)
    with pytest.raises(ProfileError, match="kv-pool-holds-request: .* cannot hold one max_model_len=200000 request"):
        import_fpm_log(LOG, _identity(kv_cache_tokens=150_000, max_model_len=200_000))
