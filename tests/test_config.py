"""Deployment config parsing: strict TOML → frozen dataclasses, one-line errors naming file and key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxsim.data import registry
from jaxsim.errors import BindingError
from jaxsim.rules.config import (
    DEFAULT_BLOCK_SIZE,
    DeploymentConfig,
    RoleConfig,
    check_config,
    config_from_dict,
    load_config,
    parse_config_text,
)
from jaxsim.rules.validate import validate_config

CONFIGS = Path(__file__).parent.parent / "configs"

MINIMAL = 'model = "m"\nsystem = "h200_sxm"\n'


def test_minimal_defaults():
    cfg = parse_config_text(MINIMAL, source="x.toml")
    assert cfg.mode == "aggregated" and cfg.role_names == ("aggregated",)
    assert cfg.block_size == DEFAULT_BLOCK_SIZE == 64
    assert (cfg.backend, cfg.method, cfg.database_mode, cfg.fallback) == ("vllm", "direct", "SILICON", "deny")
    assert cfg.nextn == 0 and cfg.accept_rates is None and not cfg.kv_offload
    r = cfg.role("aggregated")
    assert r.parallel_tuple == (1, 1, 1, 1, 1, 1) and r.replicas == 1 and r.dcp is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.nextn = 3  # type: ignore[misc]


def test_disaggregated_defaults_to_both_roles():
    cfg = parse_config_text(MINIMAL + 'mode = "disaggregated"\n')
    assert cfg.role_names == ("prefill", "decode")


def test_full_config(tmp_path):
    text = MINIMAL + """
backend_version = "0.24.0"
profile = "prof"
mode = "disaggregated"
nextn = 3
accept_rates = [0.9, 0.5, 1]
block_size = 32
context_length = 4096
gpu_memory_bytes = 141000000000
kv_transfer_gbps = 25
tolerance_fraction = 0.1
[speculation]
kind = "eagle3"
[overrides]
fmha_quant_mode = "fp8"
enable_eplb = false
[roles.prefill]
tp = 2
moe_tp = 2
replicas = 3
profile = "other"
[roles.decode]
tp = 4
dcp = 2
max_num_batched_tokens = 8192
max_num_seqs = 64
gpu_memory_utilization = 0.9
"""
    p = tmp_path / "c.toml"
    p.write_text(text)
    cfg = load_config(p)
    assert cfg.source == str(p) and cfg.base_dir == tmp_path
    assert cfg.accept_rates == (0.9, 0.5, 1.0) and cfg.kv_transfer_gbps == 25.0
    assert cfg.speculation == {"kind": "eagle3"}
    assert cfg.overrides.fmha_quant_mode == "fp8" and cfg.overrides.enable_eplb is False
    pre, dec = cfg.role("prefill"), cfg.role("decode")
    assert pre == RoleConfig(name="prefill", tp=2, moe_tp=2, replicas=3, profile="other")
    assert dec.parallel_tuple == (4, 1, 1, 1, 1, 1) and dec.dcp == 2 and dec.gpu_memory_utilization == 0.9
    assert dec.max_num_batched_tokens == 8192 and dec.max_num_seqs == 64


@pytest.mark.parametrize(
    "extra, path",
    [
        ("colour = 1\n", "colour"),
        ("nextn = '3'\n", "nextn"),
        ("nextn = true\n", "nextn"),
        ("nextn = -1\n", "nextn"),
        ("block_size = 1.5\n", "block_size"),
        ("accept_rates = 0.5\n", "accept_rates"),
        ("accept_rates = [0.5, 'x']\n", "accept_rates[1]"),
        ("kv_offload = 'no'\n", "kv_offload"),
        ("accepted_tokens = 'two'\n", "accepted_tokens"),
        ("speculation = 3\n", "speculation"),
        ("[roles.aggregated]\ntp = 0\n", "roles.aggregated.tp"),
        ("[roles.aggregated]\ntp = 1\nfoo = 2\n", "roles.aggregated.foo"),
        ("[roles.aggregated]\ngpu_memory_utilization = '0.9'\n", "roles.aggregated.gpu_memory_utilization"),
        ("[roles.mixed]\ntp = 1\n", "roles.mixed"),
        ("[overrides]\nmoe_backend = 3\n", "overrides.moe_backend"),
        ("[overrides]\nsomething = 3\n", "overrides.something"),
    ],
)
def test_bad_key_or_type_names_file_and_path(extra, path):
    with pytest.raises(BindingError) as ei:
        parse_config_text(MINIMAL + extra, source="dep.toml")
    msg = str(ei.value)
    assert msg.startswith(f"dep.toml: {path}: ") and "\n" not in msg


def test_required_keys_and_bad_toml(tmp_path):
    with pytest.raises(BindingError, match=r"^c\.toml: system: required key missing"):
        parse_config_text('model = "m"\n', source="c.toml")
    with pytest.raises(BindingError, match=r"^c\.toml: invalid TOML"):
        parse_config_text("model = \n", source="c.toml")
    with pytest.raises(BindingError, match="cannot read config"):
        load_config(tmp_path / "absent.toml")
    (tmp_path / "bin.toml").write_bytes(b"model = \"\xff\"\n")
    with pytest.raises(BindingError, match="not UTF-8"):
        load_config(tmp_path / "bin.toml")


@settings(max_examples=40, deadline=None)
@given(
    tp=st.integers(1, 64), replicas=st.integers(1, 16), nextn=st.integers(0, 5), block=st.integers(1, 1024),
    rates=st.lists(st.floats(0, 1), max_size=5),
)
def test_toml_round_trip(tp, replicas, nextn, block, rates):
    text = MINIMAL + f"nextn = {nextn}\nblock_size = {block}\naccept_rates = [{', '.join(repr(r) for r in rates)}]\n"
    text += f"[roles.aggregated]\ntp = {tp}\nreplicas = {replicas}\n"
    cfg = parse_config_text(text)
    assert cfg.nextn == nextn and cfg.block_size == block and cfg.accept_rates == tuple(rates)
    assert cfg.role("aggregated").tp == tp and cfg.role("aggregated").replicas == replicas
    assert config_from_dict(
        {"model": "m", "system": "h200_sxm", "nextn": nextn, "block_size": block, "accept_rates": rates,
         "roles": {"aggregated": {"tp": tp, "replicas": replicas}}}
    ) == cfg


EXAMPLES = sorted(CONFIGS.glob("deployment_*.toml"))


def test_examples_exist():
    names = {p.stem for p in EXAMPLES}
    assert {"deployment_aggregated", "deployment_speculative", "deployment_disaggregated"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_configs_parse_and_validate(path):
    cfg = load_config(path)
    assert cfg.model and cfg.backend_version
    problems = validate_config(cfg)
    bundled = set(registry.bundled_names())
    names = {r.profile or cfg.profile for r in cfg.roles}
    if names <= bundled:
        assert problems == []
    else:  # until the bundled profiles land, the profile name is the only thing that may be wrong
        assert problems and all(p.startswith("profile-not-found") for p in problems), problems


@pytest.mark.parametrize(
    "roles",
    [
        {"aggregated": {"tp": 2, "max_num_seqs": 64}},
        {"prefill": {"tp": 2048, "replicas": 1}, "decode": {"tp": 1}},  # tp over the documented limit
        {"prefill": {"tp": 64, "replicas": 1024}, "decode": {"tp": 64, "replicas": 1024}},  # GPUs over the limit
        {"aggregated": {"tp": 1, "dcp": 5000}},
        {"decode": {"tp": 1, "max_num_batched_tokens": 10**9}},
    ],
)
def test_configs_built_in_code_get_the_readers_checks(roles):
    """check_config holds a config built from dataclasses to the reader's role checks, with its words."""
    obj = {"model": "m", "system": "h200_sxm", "roles": roles}
    built = DeploymentConfig(model="m", system="h200_sxm", source="x.toml",
                                roles=tuple(RoleConfig(name, **kw) for name, kw in roles.items()))
    try:
        read = config_from_dict(obj, source="x.toml")
    except BindingError as e:
        with pytest.raises(BindingError) as got:
            check_config(built)
        assert str(got.value) == str(e)
    else:
        assert check_config(built) == read
