"""Sweep specs: strict parsing, bindings validated once with reasons, lazy mixed-radix expansion."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

import jaxsim._jax  # noqa: F401  (turns x64 on)
from jaxsim.sweep import spec as sp

TABLES = Path(__file__).parent / "goldens" / "public" / "tables"


def _spec(**over) -> dict:
    d = {
        "name": "t",
        "block_size": 16,
        "gpu_budget": 8,
        "profile": [{"name": str(TABLES / "ar_core"), "label": "ar"}, {"name": str(TABLES / "sd_k3"), "label": "sd3"}],
        "serving": {"mode": ["aggregated", "disaggregated"], "ratios": ["1:1", "1:2"]},
        "speculation": {"nextn": ["profile", 2], "acceptance": [1.5, [0.8, 0.6, 0.4]]},
        "scheduler": {"concurrency": [1, 4, 16]},
        "workload": [{"name": "w", "isl": [256, 1024], "osl": 128}, {"name": "mix", "requests": [[512, 64, 1], [2048, 256, 3]]}],
        "sla": {"mean_ttft_ms": 1000, "mean_tpot_ms": 40},
    }
    d.update(over)
    return d


@pytest.fixture(scope="module")
def plan():
    return sp.plan_sweep(sp.spec_from_dict(_spec(), source="t.toml"))


def test_parse_axes_and_defaults():
    s = sp.spec_from_dict(_spec(), source="t.toml")
    assert [p.label for p in s.profiles] == ["ar", "sd3"]
    assert s.ratios == ((1, 1), (1, 2))
    assert s.nextn == ("profile", 2)
    assert [a.kind for a in s.acceptance] == ["accepted", "rates"]
    assert [w.name for w in s.workloads] == ["w-256x128", "w-1024x128", "mix"]
    assert s.workloads[2].weight == (1.0, 3.0) and s.workloads[2].mean_isl == pytest.approx(0.25 * 512 + 0.75 * 2048)
    assert s.max_num_seqs == (None,) and s.max_num_batched_tokens == (None,)  # "recorded"
    assert s.sla.mean_tpot_ms == 40.0 and s.sla.min_tokens_per_s_per_user is None
    assert s.digest() == sp.spec_from_dict(_spec(), source="elsewhere.toml").digest()
    assert s.digest() != sp.spec_from_dict(_spec(block_size=32), source="t.toml").digest()


@pytest.mark.parametrize(
    "over, where",
    [
        ({"bogus": 1}, "bogus: unknown key"),
        ({"serving": {"ratios": ["1-2"]}}, "serving.ratios[0]"),
        ({"serving": {"mode": ["both"]}}, "serving.mode[0]"),
        ({"speculation": {"acceptance": [[0.5, 1.5]]}}, "speculation.acceptance[0][1]"),
        ({"speculation": {"nextn": [7]}}, "speculation.nextn[0]"),
        ({"scheduler": {}}, "scheduler.concurrency"),
        ({"scheduler": {"concurrency": [0]}}, "scheduler.concurrency[0]"),
        ({"scheduler": {"concurrency": [1], "max_num_seqs": ["auto"]}}, "scheduler.max_num_seqs[0]"),
        ({"workload": [{"name": "a", "isl": 5, "osl": 5}, {"name": "a", "isl": 6, "osl": 6}]}, "workload: workload names must be unique"),
        ({"workload": [{"isl": 5}]}, "workload[0]"),
        ({"workload": [{"requests": [[5, 5]]}]}, "workload[0].requests[0]"),
        ({"sla": {"mean_ttft_ms": -1}}, "sla.mean_ttft_ms"),
        ({"sla": {"max_ttft_ms": 5, "mean_ttft_ms": 5}}, "sla: max_ttft_ms and mean_ttft_ms name the same limit"),
        ({"profile": []}, "profile:"),
        ({"profile": [{"name": "x", "concurrency": [2]}]}, "profile[0].concurrency: [2] not in [scheduler] concurrency"),
        ({"profile": [{"name": "x", "workloads": ["nope"]}]}, "profile[0].workloads: unknown workload 'nope'"),
    ],
)
def test_spec_mistakes_are_one_line_errors_naming_the_key(over, where):
    with pytest.raises(sp.SpecError) as e:
        sp.spec_from_dict(_spec(**over), source="t.toml")
    msg = str(e.value)
    assert msg.startswith("t.toml: ") and where in msg and "\n" not in msg


def test_load_spec_reads_toml(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text(f'[[profile]]\nname = "{TABLES / "ar_core"}"\n[scheduler]\nconcurrency = [2]\n[[workload]]\nisl = 100\nosl = 10\n')
    s = sp.load_spec(p)
    assert s.name == "s" and s.concurrency == (2,) and s.base_dir == tmp_path
    p.write_text("[scheduler\n")
    with pytest.raises(sp.SpecError, match="invalid TOML"):
        sp.load_spec(p)


def test_invalid_bindings_are_counted_with_reasons(plan):
    s = plan.spec
    inner = len(s.concurrency) * len(s.workloads)
    # per profile: 3 serving choices × nextn {profile, 2}; AR: nextn=profile→0 (1 binding, no acceptance),
    # nextn=2 → 2 acceptance settings, all refused; SD K=3: profile→3 (2 valid), 2 → refused (2)
    serve = 3
    valid = serve * 1 + serve * 2
    assert plan.num_bindings == valid
    rules = {i.rule: i for i in plan.invalid}
    assert set(rules) == {"ar-nextn", "sd-nextn"}
    assert rules["ar-nextn"].bindings == serve * 2 and rules["sd-nextn"].bindings == serve * 2
    assert rules["ar-nextn"].configs == serve * 2 * inner
    assert "nextn=2" in rules["sd-nextn"].example and "num_draft_tokens=3" in rules["sd-nextn"].example
    assert plan.num_configs == valid * inner
    assert plan.summary()["configs_total"] == plan.num_configs + plan.num_invalid_configs


def test_lazy_decoding_matches_the_cartesian_product(plan):
    s = plan.spec
    combos = list(itertools.product(range(plan.num_bindings), s.concurrency, range(len(s.workloads))))
    assert len(combos) == plan.num_configs
    idx = np.random.default_rng(0).choice(plan.num_configs, 40, replace=False)
    ci = plan.inputs(idx)
    for j, i in enumerate(idx):
        b, conc, w = combos[i]
        assert ci.concurrency[j] == conc
        assert ci.nextn[j] == plan.bindings.nextn[b]
        np.testing.assert_array_equal(ci.isl[j], plan.wl_isl[w])
        assert plan.labels["workload"][plan.input_columns(np.array([i]))["workload"][0]] == s.workloads[w].name


def test_profiles_restricting_their_axes_keep_only_their_points(plan):
    """A [[profile]]'s own concurrencies and workloads: its bindings are evaluated only there (a sample of
    benchmark rows in one sweep); decoding and groups stay consistent, refusals count its own points."""
    prof = _spec()["profile"]
    restricted = [dict(prof[0], concurrency=[4, 16], workloads=["mix"]), dict(prof[1], concurrency=[1])]
    sub = sp.plan_sweep(sp.spec_from_dict(_spec(profile=restricted), source="t.toml"))
    s = plan.spec
    want = []  # (binding profile label, concurrency, workload name) of the full plan that the restriction keeps
    full = plan.decode_index(np.arange(plan.num_configs))
    for b, c, w in zip(*full):
        lab = plan.labels["profile"][plan.bindings.profile[b]]
        conc, wl = s.concurrency[c], s.workloads[w].name
        if (lab == "ar" and conc in (4, 16) and wl == "mix") or (lab == "sd3" and conc == 1):
            want.append((int(b), conc, wl))
    got = [(int(b), sub.spec.concurrency[c], sub.spec.workloads[w].name) for b, c, w in zip(*sub.decode_index(np.arange(sub.num_configs)))]
    assert got == want and sub.num_configs == len(want) > 0
    assert sub.groups[0].start == 0 and sub.groups[-1].stop == sub.num_configs
    for lo, hi, p, d, disagg in sub.groups:
        b = np.unique(sub.decode_index(np.arange(lo, hi))[0])
        assert (sub.bindings.decode_table[b] == d).all() and (sub.bindings.mode[b] == int(disagg)).all()
    cols = sub.input_columns(np.arange(sub.num_configs))
    assert cols["config_id"].tolist() == list(range(sub.num_configs))
    rules = {i.rule: i for i in sub.invalid}
    assert rules["ar-nextn"].configs == rules["ar-nextn"].bindings * 2 * 1  # ar: 2 concurrencies x 1 workload
    assert rules["sd-nextn"].configs == rules["sd-nextn"].bindings * 1 * len(s.workloads)


def test_restricted_sweep_runs_its_points(tmp_path):
    import pyarrow.parquet as pq

    from jaxsim.sweep import run_sweep

    prof = [{"name": str(TABLES / "ar_core"), "label": "ar", "concurrency": [4], "workloads": ["w-256x128"]},
            {"name": str(TABLES / "ar_core"), "label": "ar2", "concurrency": [1, 16]}]
    d = _spec(profile=prof, serving={"mode": ["aggregated"]}, speculation={})
    res = run_sweep(sp.spec_from_dict(d, source="t.toml"), tmp_path / "r.parquet")
    rows = pq.read_table(tmp_path / "r.parquet").to_pylist()
    got = sorted((r["profile"], r["concurrency_target"], r["workload"]) for r in rows)
    want = sorted([("ar", 4, "w-256x128")] + [("ar2", c, w) for c in (1, 16) for w in ("w-256x128", "w-1024x128", "mix")])
    assert got == want and res.summary["configs_evaluated"] == 7
    assert all(r["goodput_req_per_s"] == r["goodput_req_per_s"] or not r["sla_ok"] for r in rows)


def test_groups_share_tables_and_mode_and_chunks_stay_inside(plan):
    assert plan.groups[0][0] == 0 and plan.groups[-1][1] == plan.num_configs
    for lo, hi, p, d, disagg in plan.groups:
        b = np.unique(plan.decode_index(np.arange(lo, hi))[0])
        assert (plan.bindings.prefill_table[b] == p).all() and (plan.bindings.decode_table[b] == d).all()
        assert (plan.bindings.mode[b] == int(disagg)).all()
    chunks = plan.chunks(7)
    assert sum(e - s for _, s, e in chunks) == plan.num_configs
    for g, s, e in chunks:
        assert plan.groups[g][0] <= s < e <= plan.groups[g][1] and e - s <= 7


def test_sd_acceptance_lowering_and_ar_collapse(plan):
    # AR bindings carry no acceptance; SD bindings hold the lowered rates [1, 0.5, 0] (a = 1.5) and the list
    b = plan.bindings
    assert set(plan.labels["acceptance"][i] for i in b.acceptance[b.nextn == 0]) == {"none"}
    sd_rates = {tuple(plan.rates[a]) for a in b.acceptance_id[b.nextn == 3]}
    assert sd_rates == {(1.0, 0.5, 0.0, 0.0, 0.0), (0.8, 0.6, 0.4, 0.0, 0.0)}
    np.testing.assert_allclose(sorted(plan.accepted_mean[np.unique(b.acceptance_id)]), [0.0, 0.8 + 0.48 + 0.192, 1.5])


def test_budget_and_recorded_envelope_are_validated():
    s = sp.spec_from_dict(
        _spec(gpu_budget=1, scheduler={"concurrency": [1], "max_num_seqs": ["recorded", 7]}, speculation={"nextn": ["profile"], "acceptance": [1.0]}),
        source="t.toml",
    )
    p = sp.plan_sweep(s)
    rules = {i.rule: i for i in p.invalid}
    assert "gpu-budget" in rules and "scheduler-envelope" in rules
    assert (p.bindings.mode == 0).all() and (p.bindings.max_num_seqs != 7).all()
    assert (p.bindings.replicas == 1).all()


def test_unknown_profile_is_reported_not_raised():
    p = sp.plan_sweep(sp.spec_from_dict(_spec(profile=[{"name": "no-such-profile-xyz"}, {"name": str(TABLES / "ar_core")}]), source="t.toml"))
    assert p.invalid[0].rule == "profile-not-found" and p.num_bindings == 3


def test_trace_workload_uses_the_empirical_distribution():
    isl = np.array([10, 20, 30, 1000, 2000, 3000, 10, 2000])
    osl = np.array([5, 5, 5, 500, 500, 500, 400, 6])
    i, o, w = sp.trace_classes(isl, osl, 2)
    assert sum(w) == pytest.approx(1.0) and len(i) == len(o) == len(w) <= 4
    assert np.dot(w, i) == pytest.approx(np.mean(isl), rel=0.35)
    s = sp.spec_from_dict(_spec(workload=[{"name": "mc", "trace": "mooncake_tiny", "bins": 2}]), source="t.toml")
    wl = s.workloads[0]
    assert wl.name == "mc" and 1 <= len(wl.isl) <= 4 and sum(wl.weight) == pytest.approx(1.0)


def _toml_shaped(spec, root, profile, key) -> dict:
    """The config of a binding point as the TOML a user would write for it (the layout stated in full)."""
    layout = {"tp": key.tp, "moe_tp": key.moe_tp, "moe_ep": key.moe_ep}
    sched = dict(layout)
    if key.max_num_seqs is not None:
        sched["max_num_seqs"] = key.max_num_seqs
    if key.max_num_batched_tokens is not None:
        sched["max_num_batched_tokens"] = key.max_num_batched_tokens
    if key.mode == "aggregated":
        roles = {"aggregated": sched}
    else:
        pre = {**layout, "replicas": key.prefill_workers}
        if key.max_num_batched_tokens is not None:
            pre["max_num_batched_tokens"] = key.max_num_batched_tokens
        roles = {"prefill": pre, "decode": {**sched, "replicas": key.decode_workers}}
    obj = {"model": profile.model, "system": key.system, "profile": str(root), "mode": key.mode, "nextn": key.nextn,
           "block_size": spec.block_size, "roles": roles}
    if key.version is not None:
        obj["backend_version"] = key.version
    if key.acceptance is not None:
        a = key.acceptance.config_fields()
        obj.update({k: list(v) if isinstance(v, tuple) else v for k, v in a.items()})
    if spec.kv_transfer_gbps is not None and key.mode == "disaggregated":
        obj["kv_transfer_gbps"] = spec.kv_transfer_gbps
    return obj


def test_binding_configs_are_what_the_config_reader_reads():
    from jaxsim.profile.resolve import load_bundle, resolve_profile_dir
    from jaxsim.rules.config import config_from_dict

    s = sp.spec_from_dict(_spec(kv_transfer_gbps=25.0, scheduler={"concurrency": [1], "max_num_seqs": ["recorded", 8],
                                                                  "max_num_batched_tokens": [2048, "recorded"]}),
                          source="t.toml")
    n = 0
    for axis in s.profiles:
        root = resolve_profile_dir(axis.ref, s.base_dir)
        profile = load_bundle(root).profile
        for key in sp.binding_grid(s, axis, profile):
            if key.nextn > 0 and key.acceptance is None:
                continue
            built = sp.deployment_config(s, root, profile, key)
            read = config_from_dict(_toml_shaped(s, root, profile, key), source=built.source)
            assert built == read and built.source == read.source
            n += 1
    # 3 serving choices x nextn (AR: profile → 0, 2 → 2 acceptances; SD K=3: 2 + 2 acceptances) x 2 x 2 envelopes
    assert n == 3 * ((1 + 2) + (2 + 2)) * 2 * 2


def test_gpus_over_the_documented_limit_are_refused_with_the_readers_words():
    d = _spec(profile=[{"name": str(TABLES / "ar_core"), "tp": [64]}], serving={"mode": ["disaggregated"], "ratios": ["1024:1024"]},
              speculation={})
    del d["gpu_budget"]
    p = sp.plan_sweep(sp.spec_from_dict(d, source="t.toml"))
    assert p.num_bindings == 0 and p.groups == [] and p.num_configs == 0
    (inv,) = p.invalid
    assert inv.rule == "binding" and inv.bindings == 1 and inv.configs == 3 * 3
    assert inv.example == ("ar_core tp=64 disaggregated 1024:1024 nextn=0: t.toml [ar_core tp=64 disaggregated 1024:1024 nextn=0]: "
                           "roles: the deployment's GPUs (tp x pp x dp x cp x replicas, summed over roles) must be an integer "
                           ">= 1 and <= 65,536 (got 131,072) (docs/limits.md)")
