"""Bundled profiles: registry, validity, labelling (measured / derived), licences, and that they evaluate."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxsim import acceptance
from jaxsim.data import registry
from jaxsim.errors import ProfileError
from jaxsim.kernels import rounds, status
from jaxsim.profile import load_profile_dir, validate_profile_dir

BUNDLED = registry.list_bundled()


def test_expected_profiles_are_bundled():
    names = {p.name: p for p in BUNDLED}
    assert set(names) == {
        "qwen3-32b-bf16-b300", "qwen3-32b-bf16-b300-eagle3-k1", "qwen3-32b-bf16-b300-eagle3-k2",
        "qwen3-32b-bf16-b300-eagle3-k3", "llama-3.1-8b-fp8-h200", "qwen3-32b-bf16-b300-calibrated",
        "llama-3.1-8b-fp8-h200-calibrated",
    }
    assert names["qwen3-32b-bf16-b300-calibrated"].kind == "calibrated" and names["qwen3-32b-bf16-b300-calibrated"].tps == (1, 2, 4)
    assert names["qwen3-32b-bf16-b300"].tps == (1, 2, 4) and names["qwen3-32b-bf16-b300"].kind == "measured"
    assert names["llama-3.1-8b-fp8-h200"].system == "h200_sxm"
    assert {names[f"qwen3-32b-bf16-b300-eagle3-k{k}"].num_draft_tokens for k in (1, 2, 3)} == {1, 2, 3}


@pytest.mark.parametrize("entry", BUNDLED, ids=lambda p: p.name)
def test_bundled_profile_is_valid_and_labelled(entry):
    assert validate_profile_dir(entry.path) == []
    bundle = load_profile_dir(entry.path)
    prof = bundle.profile
    assert prof.model == entry.model
    assert sorted(d.tp for d in prof.deployments) == list(entry.tps)
    assert {d.system for d in prof.deployments} == {entry.system}
    sidecar = json.loads((entry.path / "fpm_forward_perf.metadata.json").read_text())
    support = set(bundle.table.column("model_support_level"))
    if entry.kind == "derived":
        assert prof.provenance.startswith("DERIVED") and "DERIVED" in sidecar["provenance"]
        assert support == {"derived"}
        assert all(d.execution_profile.num_draft_tokens == entry.num_draft_tokens for d in prof.deployments)
    elif entry.kind == "calibrated":
        assert prof.provenance.startswith("CALIBRATED") and sidecar["provenance"].startswith("calibrated")
        assert support == {"calibrated"} and sidecar["data_source"] == "calibrated"
        assert (entry.path / "calibration.json").is_file()
    else:
        assert prof.provenance.startswith("MEASURED") and sidecar["provenance"].startswith("measured")
        assert support == {"measured"}
        assert all(d.execution_profile is None for d in prof.deployments)
    assert entry.licence and (registry.data_root() / "LICENSES").is_dir()


def test_qwen_provenance_states_the_gpu_inference_and_the_revision_placeholder():
    prof = load_profile_dir(registry.resolve_profile("qwen3-32b-bf16-b300")).profile
    assert "inferred as NVIDIA B300" in prof.provenance and "PLACEHOLDER" in prof.provenance
    card_checksum = "8f8de0f7287916536ee3ea3e6cd2cde8216c311bdd524e3a92972405b98b57b3"
    assert prof.model_revision == card_checksum[:40] and card_checksum in prof.provenance
    pools = {d.tp: d.resources.runtime_memory.kv_cache_bytes // d.resources.kv_bytes_per_token for d in prof.deployments}
    assert pools == {1: 723_056, 2: 1_679_520, 4: 3_599_808}  # the data README's measured capacities


def test_resolve_profile_by_name_or_directory(tmp_path):
    p = registry.resolve_profile("qwen3-32b-bf16-b300")
    assert (p / "profile.json").is_file()
    assert registry.resolve_profile(str(tmp_path)) == tmp_path
    with pytest.raises(ProfileError, match="qwen3-32b-bf16-b300-eagle3-k3"):
        registry.resolve_profile("no-such-profile")
    with pytest.raises(ProfileError, match="bundled"):
        registry.get_bundled("nope")


def test_bundled_data_is_small_and_attributed():
    root = registry.data_root()
    files = [p for d in ("profiles", "LICENSES", "acceptance") for p in (root / d).rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 2_000_000
    text = (root / "ATTRIBUTION.md").read_text()
    for lic in (root / "LICENSES").iterdir():
        assert lic.name in text
    assert "645aa4208be2fcf2f8690d0921248f97c5a83724" in text and "ai-dynamo==1.6.1" in text


@pytest.mark.parametrize("name", ["qwen3-32b-bf16-b300", "qwen3-32b-bf16-b300-eagle3-k3", "llama-3.1-8b-fp8-h200"])
def test_bundled_tables_evaluate_at_their_rows(name):
    bundle = load_profile_dir(registry.resolve_profile(name))
    for d in bundle.profile.deployments:
        cell = bundle.cell(d)
        t = rounds.compile_round_table(cell, speculative=d.is_speculative, num_draft_tokens=d.num_draft_tokens)
        lat, code = rounds.decode_batch(t, cell.decode_batch, cell.decode_kv)
        assert np.all(np.asarray(code) == status.EXACT)
        np.testing.assert_array_equal(np.asarray(lat), cell.decode_latency_ms)
        lat, code = rounds.prefill_batch(t, cell.prefill_batch, cell.prefill_tokens, cell.prefill_kv)
        assert np.all(np.asarray(code) == status.EXACT)


def test_acceptance_presets_for_bindings():
    assert "eagle3-mtbench-qwen3-8b" in acceptance.preset_names()
    rates = acceptance.get_preset("eagle3-mtbench-qwen3-8b").conditional_rates
    assert len(rates) == 3 and rates[0] == pytest.approx(0.6541)
