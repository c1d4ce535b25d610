"""Profile model: golden round trips, identity strings, and strict refusals with field paths."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from jaxsim.errors import JaxsimError, ProfileError
from jaxsim.profile import ModelProfile, load_profile, parse_profile_text, save_profile

GOLDENS = Path(__file__).parent / "goldens" / "public"
TABLES = ("ar_core", "ar_decoy", "sd_k3", "sd_k2")
LOOKUPS = json.loads((GOLDENS / "lookups.json").read_text())
REV = "5f3c9a1e0b7d4c2a8e6f1b3d5c7a9e0f2b4d6c8a"


def golden_dict(table: str) -> dict:
    return json.loads((GOLDENS / "tables" / table / "profile.json").read_text())


# ----------------------------------------------------------------------------------------------------
# goldens


@pytest.mark.parametrize("table", TABLES)
def test_golden_profile_canonical_bytes(table, tmp_path):
    src = GOLDENS / "tables" / table / "profile.json"
    prof = load_profile(src)
    assert prof.to_json() == src.read_text(encoding="utf-8")
    save_profile(prof, tmp_path / "a.json")
    save_profile(load_profile(tmp_path / "a.json"), tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes() == src.read_bytes()


@pytest.mark.parametrize("table", TABLES)
def test_golden_select_and_identity(table):
    prof = load_profile(GOLDENS / "tables" / table / "profile.json")
    info = LOOKUPS["tables"][table]
    dep = prof.select("h200_sxm", "vllm", "0.24.0", tp=1, pp=1, dp=1, model="golden-ckpt/pub-dense-8b")
    assert dep is prof.deployments[0]
    assert dep.parallel_tuple == (1, 1, 1, 1, 1, 1)
    assert dep.kv_cache_dtype == info["kv_cache_dtype"]
    assert dep.match_identity()[5:] == ["1"] * 6 + ["auto", "auto", "False", "False"]
    assert dep.execution_identity(prof.model_revision) == info["execution_identity"]
    assert dep.num_draft_tokens == (info["num_draft_tokens"] or 0)
    assert dep.is_speculative == (info["kind"] == "speculative_round")
    assert dep.resources.memory_source == "runtime"
    # the selector is byte-equal to what the parquet rows carry
    col = pq.read_table(GOLDENS / "tables" / table / "fpm_forward_perf.parquet", columns=["execution_profile"])
    assert set(col.column(0).to_pylist()) == {dep.execution_identity(prof.model_revision)[1]}


def test_select_miss_lists_what_exists():
    prof = ModelProfile.from_dict(golden_dict("ar_core"))
    with pytest.raises(ProfileError, match=r"no matching FPM deployment profile .* tp=2 .*have: h200_sxm/vllm/0.24.0 tp=1"):
        prof.select("h200_sxm", "vllm", "0.24.0", tp=2)
    with pytest.raises(ProfileError, match="no matching FPM deployment profile"):
        prof.select("h200_sxm", "vllm", None)
    with pytest.raises(ProfileError, match="worker_type"):
        prof.select("h200_sxm", "vllm", "0.24.0", worker_type="both")
    with pytest.raises(ProfileError, match="parallel dimensions must be integers"):
        prof.select("h200_sxm", "vllm", "0.24.0", tp=True)
    with pytest.raises(ProfileError, match="model identity mismatch"):
        prof.select("h200_sxm", "vllm", "0.24.0", model="golden-ckpt/pub-dense-8b-x")
    # role-less entries serve every role
    for role in ("prefill", "decode", "aggregated"):
        assert prof.select("h200_sxm", "vllm", "0.24.0", worker_type=role) is prof.deployments[0]


def test_select_by_role():
    d = golden_dict("ar_core")
    pre = copy.deepcopy(d["deployments"][0]) | {"worker_type": "prefill"}
    dec = copy.deepcopy(d["deployments"][0]) | {"worker_type": "decode"}
    dec["resources"]["max_batch_size"] = 128
    d["deployments"] = [pre, dec]
    prof = ModelProfile.from_dict(d)
    assert prof.select("h200_sxm", "vllm", "0.24.0", worker_type="decode").resources.max_batch_size == 128
    assert prof.select("h200_sxm", "vllm", "0.24.0", worker_type="prefill").worker_type == "prefill"
    with pytest.raises(ProfileError, match="no matching"):
        prof.select("h200_sxm", "vllm", "0.24.0")  # aggregated
    again = ModelProfile.from_dict(json.loads(prof.to_json()))
    assert again == prof


def test_selector_format():
    prof = ModelProfile.from_dict(golden_dict("sd_k3"))
    sel = prof.deployments[0].execution_identity(REV)[1]
    assert sel.startswith('speculative_round_v1:{"model_revision":"' + REV + '","execution_profile":{"kind":')
    body = json.loads(sel.split(":", 1)[1])
    assert list(body["execution_profile"]) == [
        "kind", "method", "num_draft_tokens", "draft_model", "draft_revision", "timing_scope"
    ]
    assert " " not in sel


def test_non_ascii_and_defaults_round_trip(tmp_path):
    d = golden_dict("sd_k3")
    d["provenance"] = "mesuré à Zürich"
    d["deployments"][0]["execution_profile"]["draft_model"] = "org/draft-ü"
    d["deployments"][0]["moe_backend"] = "triton"
    d["deployments"][0]["pp"] = 1
    d["deployments"][0]["worker_type"] = "aggregated"
    d["deployments"][0]["resources"]["runtime_memory"]["gpu_memory_utilization"] = 1  # int accepted as float
    prof = ModelProfile.from_dict(d)
    assert prof.deployments[0].resources.runtime_memory.gpu_memory_utilization == 1.0
    assert '"draft_model":"org/draft-ü"' in prof.deployments[0].execution_identity(REV)[1]
    save_profile(prof, tmp_path / "a.json")
    save_profile(load_profile(tmp_path / "a.json"), tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    out = json.loads((tmp_path / "a.json").read_text(encoding="utf-8"))["deployments"][0]
    assert out["moe_backend"] == "triton" and out["worker_type"] == "aggregated" and "pp" not in out
    assert "mesuré" in (tmp_path / "a.json").read_text(encoding="utf-8")


def test_declared_and_grouped_resources():
    d = golden_dict("ar_core")
    r = d["deployments"][0]["resources"]
    del r["runtime_memory"]
    r.update(weights_bytes=16 * 2**30, activations_bytes=2**30, runtime_overhead_bytes=0, comm_overhead_bytes=0)
    assert ModelProfile.from_dict(d).deployments[0].resources.memory_source == "declared"
    del r["comm_overhead_bytes"]
    assert ModelProfile.from_dict(d).deployments[0].resources.memory_source == "pending"
    r["cache_layout"] = "grouped"
    del r["kv_bytes_per_token"]
    r["cache_groups"] = [
        {"name": "full", "kind": "attention", "num_layers": 24, "block_size_tokens": 16, "page_size_bytes": 2**20},
        {"name": "conv", "kind": "convolution", "num_layers": 12, "block_size_tokens": 16, "page_size_bytes": 4096,
         "sliding_window": 4},
    ]
    prof = ModelProfile.from_dict(d)
    assert [g.name for g in prof.deployments[0].resources.cache_groups] == ["full", "conv"]
    assert ModelProfile.from_dict(json.loads(prof.to_json())) == prof


@pytest.mark.parametrize(
    "num_experts,dims",
    [
        (0, dict(tp=4, moe_tp=4)),
        (0, dict(tp=4, moe_tp=1)),
        (8, dict(tp=4, moe_tp=4)),  # MoE TP
        (8, dict(tp=1, dp=4, moe_ep=4)),  # DEP
        (8, dict(tp=4, moe_ep=4)),  # TEP
        (8, dict(tp=2, moe_ep=2)),
    ],
)
def test_valid_topologies(num_experts, dims):
    d = golden_dict("ar_core")
    d["num_experts"] = num_experts
    dep = d["deployments"][0]
    dep.update(tp=1, dp=1, moe_tp=1, moe_ep=1)
    dep.update(dims)
    ModelProfile.from_dict(d)


# ----------------------------------------------------------------------------------------------------
# refusals: (base table, [(path, value | DELETE)], expected field path, message fragment)

DELETE = object()
D = ["deployments", 0]
R = D + ["resources"]
RM = R + ["runtime_memory"]
EP = D + ["execution_profile"]
GROUP = {"name": "full", "kind": "attention", "num_layers": 36, "block_size_tokens": 16, "page_size_bytes": 2359296}
GROUPED = [(R + ["cache_layout"], "grouped"), (R + ["kv_bytes_per_token"], DELETE), (R + ["cache_groups"], [GROUP])]
DECLARED = [(RM, DELETE), (R + ["weights_bytes"], 1), (R + ["activations_bytes"], 1),
            (R + ["runtime_overhead_bytes"], 1), (R + ["comm_overhead_bytes"], 1)]

CASES = [
    # root
    ("root-extra", "ar_core", [(["notes"], "x")], "notes", "unknown field"),
    ("schema-2", "ar_core", [(["schema_version"], 2)], "schema_version", "must be 1"),
    ("schema-bool", "ar_core", [(["schema_version"], True)], "schema_version", "must be 1"),
    ("schema-float", "ar_core", [(["schema_version"], 1.0)], "schema_version", "must be 1"),
    ("schema-missing", "ar_core", [(["schema_version"], DELETE)], "schema_version", "field required"),
    ("model-empty", "ar_core", [(["model"], "")], "model", "non-empty"),
    ("model-blank", "ar_core", [(["model"], "   ")], "model", "non-empty"),
    ("model-int", "ar_core", [(["model"], 5)], "model", "expected a string"),
    ("rev-main", "ar_core", [(["model_revision"], "main")], "model_revision", "pinned model_revision"),
    ("rev-HEAD", "ar_core", [(["model_revision"], "HEAD")], "model_revision", "pinned model_revision"),
    ("rev-unpinned", "ar_core", [(["model_revision"], "Unpinned")], "model_revision", "pinned model_revision"),
    ("rev-null", "ar_core", [(["model_revision"], None)], "model_revision", "expected a string"),
    ("arch-missing", "ar_core", [(["architecture"], DELETE)], "architecture", "field required"),
    ("ctx-0", "ar_core", [(["context_length"], 0)], "context_length", ">= 1"),
    ("ctx-bool", "ar_core", [(["context_length"], True)], "context_length", "expected an integer, got boolean"),
    ("ctx-float", "ar_core", [(["context_length"], 32768.0)], "context_length", "expected an integer, got float"),
    ("ctx-str", "ar_core", [(["context_length"], "32768")], "context_length", "expected an integer, got string"),
    ("experts-neg", "ar_core", [(["num_experts"], -1)], "num_experts", ">= 0"),
    ("prov-empty", "ar_core", [(["provenance"], "")], "provenance", "non-empty"),
    ("deps-empty", "ar_core", [(["deployments"], [])], "deployments", "at least one"),
    ("deps-object", "ar_core", [(["deployments"], {})], "deployments", "expected an array"),
    # deployment scalars
    ("dep-extra", "ar_core", [(D + ["notes"], "x")], "deployments[0].notes", "unknown field"),
    ("system-empty", "ar_core", [(D + ["system"], "")], "deployments[0].system", "non-empty"),
    ("backend-sglang", "ar_core", [(D + ["backend"], "sglang")], "deployments[0].backend", "must be 'vllm'"),
    ("bv-missing", "ar_core", [(D + ["backend_version"], DELETE)], "deployments[0].backend_version", "field required"),
    ("bv-int", "ar_core", [(D + ["backend_version"], 24)], "deployments[0].backend_version", "expected a string"),
    *[
        (f"bv-{i}", "ar_core", [(D + ["backend_version"], v)], "deployments[0].backend_version", "path-safe")
        for i, v in enumerate(["latest", "Current", "previous", "next", ".", "..", "", "0.24 .0", "0.24\t", "a/b", "a\\b", "a\0b", " 0.24.0"])
    ],
    ("tp-0", "ar_core", [(D + ["tp"], 0)], "deployments[0].tp", ">= 1"),
    ("tp-bool", "ar_core", [(D + ["tp"], True)], "deployments[0].tp", "expected an integer"),
    ("tp-str", "ar_core", [(D + ["tp"], "1")], "deployments[0].tp", "expected an integer"),
    ("dp-float", "ar_core", [(D + ["dp"], 1.0)], "deployments[0].dp", "expected an integer"),
    ("moe-tp-missing", "ar_core", [(D + ["moe_tp"], DELETE)], "deployments[0].moe_tp", "field required"),
    ("pp-2", "ar_core", [(D + ["pp"], 2)], "deployments[0].pp", "must be 1"),
    ("pp-bool", "ar_core", [(D + ["pp"], True)], "deployments[0].pp", "must be 1"),
    ("cp-2", "ar_core", [(D + ["cp"], 2)], "deployments[0].cp", "must be 1"),
    ("cp-float", "ar_core", [(D + ["cp"], 1.0)], "deployments[0].cp", "must be 1"),
    ("gemm-unknown", "ar_core", [(D + ["gemm_quant_mode"], "fp16")], "deployments[0].gemm_quant_mode", "unknown FPM gemm_quant_mode"),
    ("moe-q-unknown", "ar_core", [(D + ["moe_quant_mode"], "int8")], "deployments[0].moe_quant_mode", "unknown FPM"),
    ("fmha-unknown", "ar_core", [(D + ["fmha_quant_mode"], "int8")], "deployments[0].fmha_quant_mode", "unknown FPM"),
    ("comm-unknown", "ar_core", [(D + ["comm_quant_mode"], "bfloat16")], "deployments[0].comm_quant_mode", "unknown FPM"),
    ("kv-unknown", "ar_core", [(D + ["kv_cache_dtype"], "fp4")], "deployments[0].kv_cache_dtype", "unknown FPM"),
    ("kv-case", "ar_core", [(D + ["kv_cache_dtype"], "FP8")], "deployments[0].kv_cache_dtype", "unknown FPM"),
    ("moe-backend-empty", "ar_core", [(D + ["moe_backend"], "")], "deployments[0].moe_backend", "non-empty"),
    ("attn-backend-blank", "ar_core", [(D + ["attention_backend"], " ")], "deployments[0].attention_backend", "non-empty"),
    ("wideep-true", "ar_core", [(D + ["enable_wideep"], True)], "deployments[0].enable_wideep", "must be False"),
    ("eplb-str", "ar_core", [(D + ["enable_eplb"], "False")], "deployments[0].enable_eplb", "must be False"),
    ("eplb-zero", "ar_core", [(D + ["enable_eplb"], 0)], "deployments[0].enable_eplb", "must be False"),
    ("role-bad", "ar_core", [(D + ["worker_type"], "both")], "deployments[0].worker_type", "must be"),
    # resources
    ("res-missing", "ar_core", [(R, DELETE)], "deployments[0].resources", "field required"),
    ("res-extra", "ar_core", [(R + ["kv_blocks"], 5)], "deployments[0].resources.kv_blocks", "unknown field"),
    ("layout-paged", "ar_core", [(R + ["cache_layout"], "paged")], "deployments[0].resources.cache_layout", "must be"),
    ("max-tokens-0", "ar_core", [(R + ["max_num_tokens"], 0)], "deployments[0].resources.max_num_tokens", ">= 1"),
    ("max-batch-bool", "ar_core", [(R + ["max_batch_size"], True)], "deployments[0].resources.max_batch_size", "expected an integer"),
    ("res-prov-empty", "ar_core", [(R + ["provenance"], "")], "deployments[0].resources.provenance", "non-empty"),
    ("kvbpt-0", "ar_core", [(R + ["kv_bytes_per_token"], 0)], "deployments[0].resources.kv_bytes_per_token", "[1, 9007199254740992]"),
    ("kvbpt-big", "ar_core", [(R + ["kv_bytes_per_token"], 2**53 + 1)], "deployments[0].resources.kv_bytes_per_token", "[1,"),
    (
        "linear-no-kvbpt",
        "ar_core",
        [(R + ["kv_bytes_per_token"], DELETE)],
        "deployments[0].resources.kv_bytes_per_token",
        "linear cache requires kv_bytes_per_token and no cache_groups",
    ),
    (
        "linear-with-groups",
        "ar_core",
        [(R + ["cache_groups"], [GROUP])],
        "deployments[0].resources.cache_groups",
        "linear cache requires kv_bytes_per_token and no cache_groups",
    ),
    (
        "grouped-no-groups",
        "ar_core",
        [(R + ["cache_layout"], "grouped"), (R + ["kv_bytes_per_token"], DELETE)],
        "deployments[0].resources.cache_groups",
        "grouped cache requires cache_groups",
    ),
    (
        "grouped-with-kvbpt",
        "ar_core",
        [(R + ["cache_layout"], "grouped"), (R + ["cache_groups"], [GROUP])],
        "deployments[0].resources.kv_bytes_per_token",
        "grouped cache requires cache_groups without a scalar",
    ),
    ("groups-dup", "ar_core", GROUPED[:2] + [(R + ["cache_groups"], [GROUP, GROUP])], "deployments[0].resources.cache_groups", "unique"),
    (
        "group-conv-no-window",
        "ar_core",
        GROUPED[:2] + [(R + ["cache_groups"], [GROUP | {"kind": "convolution"}])],
        "deployments[0].resources.cache_groups[0].sliding_window",
        "requires sliding_window",
    ),
    (
        "group-window-0",
        "ar_core",
        GROUPED[:2] + [(R + ["cache_groups"], [GROUP | {"sliding_window": 0}])],
        "deployments[0].resources.cache_groups[0].sliding_window",
        "[1, 4294967295]",
    ),
    (
        "group-kind",
        "ar_core",
        GROUPED[:2] + [(R + ["cache_groups"], [GROUP | {"kind": "mamba"}])],
        "deployments[0].resources.cache_groups[0].kind",
        "must be",
    ),
    (
        "group-extra",
        "ar_core",
        GROUPED[:2] + [(R + ["cache_groups"], [GROUP | {"x": 1}])],
        "deployments[0].resources.cache_groups[0].x",
        "unknown field",
    ),
    (
        "group-page-0",
        "ar_core",
        GROUPED[:2] + [(R + ["cache_groups"], [GROUP | {"page_size_bytes": 0}])],
        "deployments[0].resources.cache_groups[0].page_size_bytes",
        "[1,",
    ),
    (
        "runtime-and-declared",
        "ar_core",
        [(R + ["weights_bytes"], 1)],
        "deployments[0].resources",
        "runtime_memory cannot be combined with declared non-KV resource bytes",
    ),
    ("declared-negative", "ar_core", [(RM, DELETE), (R + ["weights_bytes"], -1)], "deployments[0].resources.weights_bytes", "[0,"),
    (
        "declared-sum",
        "ar_core",
        [(RM, DELETE), (R + ["weights_bytes"], 2**53), (R + ["activations_bytes"], 1)],
        "deployments[0].resources",
        "sum to <= 2**53",
    ),
    ("kv-bytes-0", "ar_core", [(RM + ["kv_cache_bytes"], 0)], "deployments[0].resources.runtime_memory.kv_cache_bytes", "[1,"),
    ("kv-bytes-big", "ar_core", [(RM + ["kv_cache_bytes"], 2**53 + 1)], "deployments[0].resources.runtime_memory.kv_cache_bytes", "[1,"),
    ("gmu-1.2", "ar_core", [(RM + ["gpu_memory_utilization"], 1.2)], "deployments[0].resources.runtime_memory.gpu_memory_utilization", "(0, 1]"),
    ("gmu-0", "ar_core", [(RM + ["gpu_memory_utilization"], 0)], "deployments[0].resources.runtime_memory.gpu_memory_utilization", "(0, 1]"),
    (
        "gmu-bool",
        "ar_core",
        [(RM + ["gpu_memory_utilization"], True)],
        "deployments[0].resources.runtime_memory.gpu_memory_utilization",
        "expected a number",
    ),
    (
        "gmu-str",
        "ar_core",
        [(RM + ["gpu_memory_utilization"], "0.9")],
        "deployments[0].resources.runtime_memory.gpu_memory_utilization",
        "expected a number",
    ),
    ("max-model-len-0", "ar_core", [(RM + ["max_model_len"], 0)], "deployments[0].resources.runtime_memory.max_model_len", ">= 1"),
    ("rm-extra", "ar_core", [(RM + ["num_gpu_blocks"], 5)], "deployments[0].resources.runtime_memory.num_gpu_blocks", "unknown field"),
    ("rm-prov-missing", "ar_core", [(RM + ["provenance"], DELETE)], "deployments[0].resources.runtime_memory.provenance", "field required"),
    # topology
    ("dense-dp2", "ar_core", [(D + ["dp"], 2)], "deployments[0]", "dense TP or an MoE TP, DEP, or TEP topology"),
    ("dense-moe-ep2", "ar_core", [(D + ["moe_ep"], 2)], "deployments[0]", "dense TP or an MoE TP, DEP, or TEP topology"),
    ("dense-moe-tp2-tp1", "ar_core", [(D + ["moe_tp"], 2)], "deployments[0]", "dense TP or an MoE TP, DEP, or TEP topology"),
    (
        "moe-mixed",
        "ar_core",
        [(["num_experts"], 8), (D + ["tp"], 2), (D + ["moe_ep"], 2), (D + ["moe_tp"], 2)],
        "deployments[0]",
        "dense TP or an MoE TP, DEP, or TEP topology",
    ),
    ("moe-tp-mismatch", "ar_core", [(["num_experts"], 8), (D + ["tp"], 2)], "deployments[0]", "TEP topology"),
    ("moe-ep-divisible", "ar_core", [(["num_experts"], 8), (D + ["tp"], 3), (D + ["moe_ep"], 3)], "deployments[0].moe_ep", "divisible"),
    # uniqueness
    ("duplicate", "ar_core", [(["deployments", 1], "COPY0")], "deployments[1]", "duplicate FPM deployment identity"),
    (
        "ambiguous",
        "ar_core",
        [(["deployments", 1], "COPY0"), (["deployments", 1, "worker_type"], "decode")],
        "deployments[1]",
        "ambiguous FPM deployment identity",
    ),
    (
        "duplicate-role",
        "ar_core",
        [(D + ["worker_type"], "decode"), (["deployments", 1], "COPY0")],
        "deployments[1]",
        "duplicate FPM deployment identity",
    ),
    # speculative execution profile
    ("ep-extra", "sd_k3", [(EP + ["nextn"], 3)], "deployments[0].execution_profile.nextn", "unknown field"),
    ("ep-kind", "sd_k3", [(EP + ["kind"], "full_forward")], "deployments[0].execution_profile.kind", "speculative_round"),
    ("ep-method", "sd_k3", [(EP + ["method"], "medusa")], "deployments[0].execution_profile.method", "eagle3"),
    ("ep-k0", "sd_k3", [(EP + ["num_draft_tokens"], 0)], "deployments[0].execution_profile.num_draft_tokens", "[1, 5]"),
    ("ep-k6", "sd_k3", [(EP + ["num_draft_tokens"], 6)], "deployments[0].execution_profile.num_draft_tokens", "[1, 5]"),
    ("ep-k-bool", "sd_k3", [(EP + ["num_draft_tokens"], True)], "deployments[0].execution_profile.num_draft_tokens", "expected an integer"),
    ("ep-scope", "sd_k3", [(EP + ["timing_scope"], "wall_clock")], "deployments[0].execution_profile.timing_scope", "model_step_cuda"),
    ("ep-scope-missing", "sd_k3", [(EP + ["timing_scope"], DELETE)], "deployments[0].execution_profile.timing_scope", "field required"),
    ("ep-draft-newline", "sd_k3", [(EP + ["draft_model"], "org/draft\n")], "deployments[0].execution_profile.draft_model", "trimmed"),
    ("ep-draft-space", "sd_k3", [(EP + ["draft_model"], " org/draft")], "deployments[0].execution_profile.draft_model", "trimmed"),
    ("ep-draft-c1", "sd_k3", [(EP + ["draft_model"], "org/dr\x85aft")], "deployments[0].execution_profile.draft_model", "control"),
    ("ep-draft-del", "sd_k3", [(EP + ["draft_model"], "org/dr\x7faft")], "deployments[0].execution_profile.draft_model", "control"),
    ("ep-draft-empty", "sd_k3", [(EP + ["draft_model"], "")], "deployments[0].execution_profile.draft_model", "non-empty"),
    (
        "ep-rev-upper",
        "sd_k3",
        [(EP + ["draft_revision"], "0C1D2E3F40516273849A5B6C7D8E9F0A1B2C3D4E")],
        "deployments[0].execution_profile.draft_revision",
        "lowercase 40-hex",
    ),
    (
        "ep-rev-39",
        "sd_k3",
        [(EP + ["draft_revision"], "0c1d2e3f40516273849a5b6c7d8e9f0a1b2c3d4")],
        "deployments[0].execution_profile.draft_revision",
        "lowercase 40-hex",
    ),
    ("sd-dp2", "sd_k3", [(D + ["dp"], 2)], "deployments[0]", "pure TP with DP1/PP1/CP1"),
    ("sd-moe-ep2", "sd_k3", [(["num_experts"], 8), (D + ["tp"], 2), (D + ["moe_ep"], 2)], "deployments[0]", "pure TP with DP1/PP1/CP1"),
    ("sd-moe-tp3", "sd_k3", [(D + ["tp"], 2), (D + ["moe_tp"], 3)], "deployments[0]", "pure TP with DP1/PP1/CP1"),
    ("sd-grouped", "sd_k3", GROUPED, "deployments[0].resources", "require observed runtime memory and a linear cache"),
    ("sd-declared", "sd_k3", DECLARED, "deployments[0].resources", "require observed runtime memory and a linear cache"),
    ("sd-pending", "sd_k3", [(RM, DELETE)], "deployments[0].resources", "require observed runtime memory"),
    ("sd-rev-nonhex", "sd_k3", [(["model_revision"], "v1.2-release")], "model_revision", "lowercase 40-hex"),
    ("sd-rev-upper", "sd_k3", [(["model_revision"], REV.upper())], "model_revision", "lowercase 40-hex"),
    ("sd-rev-mutable", "sd_k3", [(["model_revision"], "main")], "model_revision", "pinned model_revision"),
]


def apply(d: dict, changes) -> dict:
    d = copy.deepcopy(d)
    for path, value in changes:
        parent = d
        for k in path[:-1]:
            parent = parent[k]
        last = path[-1]
        if value is DELETE:
            del parent[last]
        elif value == "COPY0":
            parent.append(copy.deepcopy(d["deployments"][0]))
        elif isinstance(parent, list) and last == len(parent):
            parent.append(copy.deepcopy(value))
        else:
            parent[last] = copy.deepcopy(value)
    return d


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_refused_with_field_path(case):
    _, base, changes, where, fragment = case
    bad = apply(golden_dict(base), changes)
    with pytest.raises(ProfileError) as ei:
        ModelProfile.from_dict(bad, source="profile.json")
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(f"profile.json: {where}: "), msg
    assert fragment in msg, msg
    assert isinstance(ei.value, JaxsimError) and isinstance(ei.value, ValueError)


def test_same_key_different_roles_allowed():
    d = apply(golden_dict("ar_core"), [(D + ["worker_type"], "prefill"), (["deployments", 1], "COPY0"),
                                       (["deployments", 1, "worker_type"], "decode")])
    assert [x.worker_type for x in ModelProfile.from_dict(d).deployments] == ["prefill", "decode"]


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("{", "invalid JSON"),
        ('{"schema_version": 1, "schema_version": 1}', "duplicate JSON key 'schema_version'"),
        ('{"schema_version": NaN}', "invalid JSON"),
        ("[]", "expected an object"),
    ],
)
def test_bad_json_text(text, fragment):
    with pytest.raises(ProfileError, match="^x.json: .*" + fragment.replace("(", r"\(")):
        parse_profile_text(text, source="x.json")


def test_load_profile_file_errors(tmp_path):
    with pytest.raises(ProfileError, match="cannot read profile"):
        load_profile(tmp_path / "missing.json")
    (tmp_path / "latin1.json").write_bytes(b'{"model": "\xe9"}')
    with pytest.raises(ProfileError, match="not UTF-8"):
        load_profile(tmp_path / "latin1.json")
    (tmp_path / "bad.json").write_text(json.dumps(apply(golden_dict("ar_core"), [(D + ["pp"], 2)])))
    with pytest.raises(ProfileError, match=r"bad\.json: deployments\[0\]\.pp: must be 1"):
        load_profile(tmp_path / "bad.json")
