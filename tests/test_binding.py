"""Binding validation: every rule refuses with a one-line message; every reference rejection is refused."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from jaxsim.deploy.binding import bind
from jaxsim.errors import BindingError
from jaxsim.kernels import rounds
from jaxsim.kernels import status as kst
from jaxsim.profile import resolve
from jaxsim.rules.config import config_from_dict
from jaxsim.rules.validate import validate_config

GOLDENS = Path(__file__).parent / "goldens" / "public"
TABLES = GOLDENS / "tables"
REJECTIONS = json.loads((GOLDENS / "rejections.json").read_text())["cases"]
LOOKUPS = json.loads((GOLDENS / "lookups.json").read_text())["tables"]
MODEL = "golden-ckpt/pub-dense-8b"


def engine_to_jaxsim(engine: dict, profile_dir: Path) -> dict:
    """Translate the reference's ForwardPassPerfModelConfig (binding.json / lookups) to a jaxsim config."""
    known = {
        "model", "system", "backend", "backend_version", "worker_type", "tp", "pp", "attention_dp", "cp_size",
        "moe_tp_size", "moe_ep_size", "dcp", "estimation_mode", "fallback_policy", "database_mode",
        "estimator_config", "nextn", "fpm_profile", "speculation", "fpm_fmha_quant_mode",
    }
    assert set(engine) <= known, set(engine) - known
    role: dict = {"tp": engine.get("tp", 1), "pp": engine.get("pp", 1), "dp": engine.get("attention_dp", 1)}
    for src, dst in (("cp_size", "cp"), ("moe_tp_size", "moe_tp"), ("moe_ep_size", "moe_ep"), ("dcp", "dcp")):
        if engine.get(src) is not None:
            role[dst] = engine[src]
    worker = engine.get("worker_type", "aggregated")
    cfg: dict = {
        "model": engine["model"],
        "system": engine["system"],
        "backend": engine["backend"],
        "profile": str(profile_dir),
        "mode": "aggregated" if worker == "aggregated" else "disaggregated",
        "roles": {worker: role},
        "estimation_mode": engine["estimation_mode"],
        "method": engine["estimator_config"]["fpm_interpolation"]["method"],
        "database_mode": engine["database_mode"],
        "fallback": engine["fallback_policy"],
    }
    if engine.get("backend_version") is not None:
        cfg["backend_version"] = engine["backend_version"]
    nextn = engine.get("nextn", 0)
    if nextn:
        cfg["nextn"] = nextn
        cfg["accepted_tokens"] = 1.0
    if engine.get("speculation") is not None:
        cfg["speculation"] = engine["speculation"]
    if engine.get("fpm_fmha_quant_mode") is not None:
        cfg["overrides"] = {"fmha_quant_mode": engine["fpm_fmha_quant_mode"]}
    return cfg


def _is_config_op(case) -> bool:
    return all(ch["op"].startswith("config_") for ch in case["changes"])


# Config-only variants: the rule each must be refused by (first problem).
CONFIG_RULES = {
    "sd-nextn-mismatch": "sd-nextn",
    "sd-nextn-missing": "sd-nextn",
    "sd-fallback-allow": "estimator-policy",
    "sd-method-sol": "estimator-policy",
    "sd-estimation-auto": "estimator-policy",
    "sd-database-hybrid": "estimator-policy",
    "sd-dcp-key": "sd-parallel",
    "ar-with-nextn": "ar-nextn",
    "config-model-mismatch": "model-mismatch",
}


def test_rejection_goldens_present():
    assert len(REJECTIONS) == 71
    assert {c["id"] for c in REJECTIONS if _is_config_op(c)} == set(CONFIG_RULES)


@pytest.mark.parametrize("case", REJECTIONS, ids=[c["id"] for c in REJECTIONS])
def test_reference_rejection_is_refused(case):
    folder = GOLDENS / "rejections" / case["id"]
    engine = json.loads((folder / "binding.json").read_text())["engine_config"]
    cfg = config_from_dict(engine_to_jaxsim(engine, folder), source=f"{case['id']}.toml")
    problems = validate_config(cfg)
    assert all("\n" not in p for p in problems)
    if case["stage"] == "query":
        # The binding is valid; the query itself is refused by the compiled kernels.
        assert problems == []
        b = bind(cfg)
        assert b.aggregated.is_speculative and b.aggregated.table.speculative
        q = case["changes"][-1]
        if q["kind"] == "mixed":
            lat, code = rounds.mixed_batch(b.aggregated.table, *(np.array([x], np.int64) for x in q["args"]))
            assert int(code[0]) == kst.SD_MIXED_REFUSED and np.isnan(lat[0])
        return
    assert problems, f"reference refused ({case['error'][:120]}) but jaxsim accepted"
    rules = {p.split(":", 1)[0] for p in problems}
    if _is_config_op(case):
        assert CONFIG_RULES[case["id"]] in rules, problems
    else:
        # profile/rows/sidecar variants: the profile directory does not load, or its cell does not match
        assert rules & {"profile-invalid", "no-cell", "no-deployment", "nextn-range"}, problems
    with pytest.raises(BindingError) as ei:
        bind(cfg)
    msg = str(ei.value)
    assert msg.startswith(f"{case['id']}.toml: ") and "\n" not in msg


@pytest.mark.parametrize("table", sorted(LOOKUPS))
def test_valid_golden_profiles_bind(table):
    cfg = config_from_dict(engine_to_jaxsim(LOOKUPS[table]["aisimulate_config"] | {"fpm_profile": None}, TABLES / table))
    assert validate_config(cfg) == []
    b = bind(cfg)
    role = b.aggregated
    k = LOOKUPS[table]["num_draft_tokens"] or 0
    assert role.num_draft_tokens == k and role.table.speculative == (k > 0) and role.table.num_draft_tokens == k
    assert b.nextn == k and b.accept_rates.shape == (5,)
    rc = LOOKUPS[table]["row_counts"]
    assert role.cell.num_decode_rows == rc["selected_identity_decode"]
    assert role.cell.num_prefill_rows == rc["selected_identity_prefill"]
    rm = role.deployment.resources.runtime_memory
    assert role.kv.total_kv_size_bytes == rm.kv_cache_bytes
    assert role.kv.total_kv_size_tokens == rm.kv_cache_bytes // role.kv_bytes_per_token
    assert role.kv.num_gpu_blocks == role.kv.total_kv_size_tokens // 64
    assert role.gpu_memory_utilization == rm.gpu_memory_utilization
    assert b.kv_transfer_bytes_per_s is None


# ----------------------------------------------------------------------------------------------------
# individual rules


def _cfg(table="sd_k3", **over):
    k = {"sd_k3": 3, "sd_k2": 2}.get(table, 0)
    d = {"model": MODEL, "system": "h200_sxm", "backend_version": "0.24.0", "profile": str(TABLES / table)}
    if k:
        d |= {"nextn": k, "accepted_tokens": 1.5}
    d |= over
    return config_from_dict({k: v for k, v in d.items() if v is not None}, source="t.toml")


def _rules(cfg) -> list[str]:
    return [p.split(":", 1)[0] for p in validate_config(cfg)]


def _only(cfg, rule) -> str:
    problems = validate_config(cfg)
    assert [p.split(":", 1)[0] for p in problems] == [rule], problems
    return problems[0]


def test_sd_nextn_must_equal_depth():
    msg = _only(_cfg(nextn=2), "sd-nextn")
    assert "nextn=2" in msg and "num_draft_tokens=3" in msg
    assert "sd-nextn" in _rules(_cfg(nextn=None, accepted_tokens=None))


def test_sd_refuses_generic_speculation():
    msg = _only(_cfg(speculation={"kind": "eagle3", "num_draft_tokens": 3}), "sd-nextn")
    assert "generic speculation" in msg


def test_ar_refuses_generic_speculation():
    _only(_cfg("ar_core", speculation={"kind": "ngram"}), "speculation")


@pytest.mark.parametrize("key, value", [("method", "sol"), ("database_mode", "HYBRID"), ("fallback", "allow"), ("estimation_mode", "auto")])
def test_estimator_policy(key, value):
    msg = _only(_cfg(**{key: value}), "estimator-policy")
    assert f"{key}={value!r}" in msg and "speculative-round" in msg
    assert _rules(_cfg("ar_core", **{key: value})) == ["estimator-policy"]


@pytest.mark.parametrize("role", [{"dcp": 1}, {"dp": 2}, {"pp": 2}, {"cp": 2}])
def test_sd_pure_tp_only(role):
    assert "sd-parallel" in _rules(_cfg(roles={"aggregated": role}))


def test_kv_offload_refused():
    _only(_cfg(kv_offload=True), "kv-offload")


def test_ar_profile_with_nextn_refused():
    msg = _only(_cfg("ar_core", nextn=1, accepted_tokens=1.0), "ar-nextn")
    assert "nextn=1" in msg


def test_nextn_range():
    assert "nextn-range" in _rules(_cfg(nextn=6, accepted_tokens=1.0))


def test_model_must_match_profile():
    msg = _only(_cfg(model=MODEL + "-x"), "model-mismatch")
    assert repr(MODEL + "-x") in msg


def test_backend_version_literal_and_backend():
    assert "backend-version" in _rules(_cfg(backend_version=None))
    assert "backend-version" in _rules(_cfg(backend_version="latest"))
    assert "backend" in _rules(_cfg(backend="sglang"))


def test_overrides():
    _only(_cfg(overrides={"fmha_quant_mode": "float16"}), "fmha-override")
    _only(_cfg(overrides={"fmha_quant_mode": "fp8"}), "override-mismatch")
    assert validate_config(_cfg(overrides={"fmha_quant_mode": "bfloat16", "kv_cache_dtype": "bfloat16"})) == []
    for key, value in [("moe_backend", "triton"), ("enable_eplb", True), ("wideep_num_slots", 8), ("moe_kernel_source", "x")]:
        msg = _only(_cfg(overrides={key: value}), "unsupported-override")
        assert f"overrides.{key}" in msg


@pytest.mark.parametrize(
    "over, rule",
    [
        ({"accept_rates": [0.5, 1.5]}, "accept-rates-range"),
        ({"accept_rates": [float("nan")]}, "accept-rates-range"),
        ({"accepted_tokens": 3.5}, "accepted-range"),
        ({"accepted_tokens": -0.5}, "accepted-range"),
        ({"accept_rates": [0.5]}, "acceptance-exclusive"),
        ({"accepted_tokens": None}, "acceptance-missing"),
        ({"accepted_tokens": None, "acceptance_preset": "no-such-preset"}, "acceptance-preset"),
    ],
)
def test_acceptance_rules(over, rule):
    assert rule in _rules(_cfg(**over))


def test_acceptance_requires_nextn():
    _only(_cfg("ar_core", accept_rates=[0.5]), "acceptance-requires-nextn")


def test_acceptance_lowering_and_padding():
    b = bind(_cfg(accepted_tokens=1.5))
    np.testing.assert_array_equal(b.accept_rates, [1.0, 0.5, 0.0, 0.0, 0.0])
    b = bind(_cfg(accepted_tokens=None, accept_rates=[0.9, 0.6]))
    np.testing.assert_array_equal(b.accept_rates, [0.9, 0.6, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(bind(_cfg("ar_core")).accept_rates, np.zeros(5))


def test_capacity_rules_through_config():
    assert "gpu-memory-utilization" in _rules(_cfg(roles={"aggregated": {"gpu_memory_utilization": 0.9}}))
    assert "scheduler-envelope" in _rules(_cfg(roles={"aggregated": {"max_num_seqs": 64}}))
    assert "scheduler-envelope" in _rules(_cfg(roles={"aggregated": {"max_num_batched_tokens": 4096}}))
    assert "context-length" in _rules(_cfg(context_length=32769))
    assert "gpu-memory-fit" in _rules(_cfg(gpu_memory_bytes=30_000_000_000))
    assert "cuda-graph-reserved" in _rules(_cfg(cuda_graph_reserved_bytes=1))
    assert "block-size" in _rules(_cfg(block_size=0))
    assert "tolerance" in _rules(_cfg(tolerance_fraction=1.0))
    ok = _cfg(roles={"aggregated": {"gpu_memory_utilization": 0.88, "max_num_seqs": 32, "max_num_batched_tokens": 8192}})
    assert validate_config(ok) == []


def test_unknown_system_needs_gpu_memory_and_link():
    assert "gpu-memory" in _rules(_cfg(system="mi300x"))
    pd = _cfg(system="mi300x", mode="disaggregated", gpu_memory_bytes=10**11)
    assert "kv-transfer" in _rules(pd) and "gpu-memory" not in _rules(pd)
    assert "kv-transfer" not in _rules(dataclasses.replace(pd, kv_transfer_gbps=10.0))
    assert "kv-transfer" in _rules(_cfg(kv_transfer_gbps=float("inf")))


def test_all_problems_listed():
    problems = validate_config(_cfg(nextn=2, method="sol", kv_offload=True, block_size=0))
    rules = [p.split(":", 1)[0] for p in problems]
    assert {"sd-nextn", "estimator-policy", "kv-offload", "block-size"} <= set(rules)
    assert len(rules) == len(set(problems))


def test_profile_not_found_and_missing():
    assert _rules(_cfg(profile="/no/such/profile-dir")) == ["profile-not-found"]
    cfg = config_from_dict({"model": MODEL, "system": "h200_sxm", "backend_version": "0.24.0"})
    assert _rules(cfg) == ["profile-missing"]


def test_relative_profile_resolves_against_config_dir(tmp_path):
    shutil.copytree(TABLES / "ar_core", tmp_path / "prof")
    (tmp_path / "d.toml").write_text(
        f'model = "{MODEL}"\nsystem = "h200_sxm"\nbackend_version = "0.24.0"\nprofile = "prof"\n'
    )
    from jaxsim.rules.config import load_config

    b = bind(load_config(tmp_path / "d.toml"))
    assert b.aggregated.profile_dir == (tmp_path / "prof").resolve()


# ----------------------------------------------------------------------------------------------------
# roles: selection by identity and role, P/D identity


def _role_profile(tmp_path: Path, table: str) -> Path:
    """A copy of a golden table whose profile holds prefill- and decode-specific deployments."""
    root = tmp_path / f"{table}-roles"
    shutil.copytree(TABLES / table, root)
    obj = json.loads((root / "profile.json").read_text())
    dep = obj["deployments"][0]
    pre = json.loads(json.dumps(dep)) | {"worker_type": "prefill"}
    dec = json.loads(json.dumps(dep)) | {"worker_type": "decode"}
    pre["resources"]["max_batch_size"] = 8
    obj["deployments"] = [pre, dec]
    (root / "profile.json").write_text(json.dumps(obj, indent=1))
    return root


def test_selection_by_role(tmp_path):
    root = _role_profile(tmp_path, "sd_k3")
    pd = _cfg(profile=str(root), mode="disaggregated", roles={"prefill": {}, "decode": {}})
    b = bind(pd)
    assert b.prefill.deployment.worker_type == "prefill" and b.prefill.max_num_seqs == 8
    assert b.decode.deployment.worker_type == "decode" and b.decode.max_num_seqs == 32
    assert b.kv_transfer_bytes_per_s == 50e9  # h200_sxm inter-node bandwidth from the spec sheet
    assert bind(dataclasses.replace(pd, kv_transfer_gbps=25.0)).kv_transfer_bytes_per_s == 25e9
    agg = _cfg(profile=str(root))
    msg = _only(agg, "no-deployment")
    assert "worker_type=aggregated" in msg


def test_selection_by_parallelism():
    msg = _only(_cfg("ar_core", roles={"aggregated": {"tp": 2}}), "no-deployment")
    assert "tp=2" in msg


def test_roles_must_match_mode():
    assert "roles" in _rules(_cfg(mode="disaggregated", roles={"aggregated": {}}))
    assert "roles" in _rules(_cfg(roles={"prefill": {}, "decode": {}}))
    assert "mode" in _rules(_cfg(mode="pd"))


def test_pd_identity_must_agree():
    pd = _cfg(mode="disaggregated", roles={"prefill": {"profile": str(TABLES / "sd_k2")}, "decode": {}})
    rules = _rules(pd)
    assert "role-identity" in rules and "sd-nextn" in rules


def test_pd_role_without_execution_binding():
    pd = _cfg(mode="disaggregated", roles={"prefill": {"profile": str(TABLES / "ar_core")}, "decode": {}})
    rules = _rules(pd)
    assert "execution-binding" in rules and "ar-nextn" not in rules
    msg = next(p for p in validate_config(pd) if p.startswith("execution-binding"))
    assert "roles.prefill" in msg


def test_pd_same_profile_binds_both_roles():
    b = bind(_cfg(mode="disaggregated", roles={"prefill": {"replicas": 2}, "decode": {}}))
    assert b.prefill.replicas == 2 and b.decode.table is b.prefill.table


# ----------------------------------------------------------------------------------------------------
# caching


def test_cache_loads_each_directory_once(tmp_path, monkeypatch):
    root = tmp_path / "p"
    shutil.copytree(TABLES / "ar_core", root)
    calls = []
    real = resolve.load_profile_dir
    monkeypatch.setattr(resolve, "load_profile_dir", lambda p: calls.append(p) or real(p))
    monkeypatch.setattr(resolve, "STAMP_TTL_S", 0.0)
    cfg = _cfg("ar_core", profile=str(root))
    for _ in range(20):
        assert validate_config(cfg) == []
    t1 = bind(cfg).aggregated.table
    assert len(calls) == 1
    assert bind(cfg).aggregated.table is t1
    obj = json.loads((root / "profile.json").read_text())
    obj["deployments"][0]["resources"]["max_batch_size"] = 63
    (root / "profile.json").write_text(json.dumps(obj))
    assert _rules(cfg) == [] and bind(cfg).aggregated.max_num_seqs == 63
    assert len(calls) == 2
