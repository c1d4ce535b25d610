"""Profile directories: golden tables load clean; the reference's rejection variants are refused."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from jaxsim.errors import JaxsimError
from jaxsim.profile import load_profile_dir, validate_profile_dir
from jaxsim.profile.table import PARQUET_NAME, SIDECAR_NAME

GOLDENS = Path(__file__).parent / "goldens" / "public"
TABLES = ("ar_core", "ar_decoy", "sd_k3", "sd_k2")
REJECTIONS = json.loads((GOLDENS / "rejections.json").read_text())
CASES = {c["id"]: c for c in REJECTIONS["cases"]}
# ops whose refusal needs the engine config or a query: the folder itself stays valid
LATER_OPS = {"config_set", "config_delete", "config_set_fn", "query"}

# rule category each folder-detectable variant must be refused for (a fragment of our message)
EXPECTED = {
    "sd-dp2": "pure TP with DP1/PP1/CP1",
    "sd-dp2-attention-dp2": "pure TP with DP1/PP1/CP1",
    "sd-tp2-moe-tp1": "No FPM cell matches",  # profile tp=2 is valid; the table only holds tp=1
    "sd-grouped-cache": "require observed runtime memory and a linear cache",
    "sd-declared-memory": "require observed runtime memory and a linear cache",
    "sd-draft-revision-upper": "draft_revision must be a lowercase 40-hex",
    "sd-draft-revision-39": "draft_revision must be a lowercase 40-hex",
    "sd-num-draft-6": "execution_profile.num_draft_tokens",
    "sd-num-draft-0": "execution_profile.num_draft_tokens",
    "sd-method-medusa": "must be 'eagle3'",
    "sd-timing-scope": "must be 'model_step_cuda'",
    "sd-kind": "must be 'speculative_round'",
    "sd-draft-model-ctrl": "no control characters",
    "sd-draft-model-mismatch": "No FPM cell matches",
    "sd-model-revision-mutable": "pinned model_revision",
    "sd-model-revision-nonhex": "lowercase 40-hex",
    "profile-extra-key": "deployments[0].notes: unknown field",
    "profile-pp2": "deployments[0].pp: must be 1",
    "profile-backend-sglang": "deployments[0].backend: must be 'vllm'",
    "profile-gmu-1.2": "gpu_memory_utilization: must be in (0, 1]",
    "profile-runtime-and-declared": "runtime_memory cannot be combined with declared",
    "profile-linear-no-kvbpt": "linear cache requires kv_bytes_per_token",
    "profile-eplb": "deployments[0].enable_eplb: must be False",
    "profile-dense-moe-ep2": "dense TP or an MoE TP, DEP, or TEP topology",
    "rows-selector-noncanonical": "must use canonical serialization",
    "rows-selector-version": "unsupported speculative_round selector version",
    "sidecar-sha-mismatch": "parquet digest mismatch",
    "sidecar-row-count": "row_count mismatch: sidecar=1843 actual=1842",
    "sidecar-coordinate-system": "unsupported FPM coordinate_system",
    "sidecar-system-mismatch": "does not match the sidecar/database system 'h100_sxm'",
    "sidecar-missing-timing-scope": "requires timing_scope=model_step_cuda",
    "sidecar-missing-file": "missing its metadata sidecar",
    "sidecar-policy-unsupported": "unsupported FPM measurement_policy",
    "rows-sd-fake-fallback-decode": "row 0: kv_seed_regime: config-bound cached prefill/decode requires real_kv",
    "rows-sd-fake-fallback-cached-prefill": "row 122: kv_seed_regime: config-bound cached prefill/decode requires real_kv",
    "rows-ar-fake-fallback-only": "only fake_fallback rows match",
    "rows-duplicate-coordinate": "row 1842: batch_size/total_prefill_tokens/total_kv_read_tokens: FPM row 1842 collides",
    "rows-duplicate-coordinate-sd": "row 1773: batch_size/total_prefill_tokens/total_kv_read_tokens: FPM row 1773 collides",
    "rows-latency-zero": "row 3: latency_ms: non-finite/non-positive latency_ms=0.0",
    "rows-latency-negative": "row 153: latency_ms: non-finite/non-positive latency_ms=-1.5",
    "rows-latency-nan": "row 2: latency_ms: non-finite/non-positive latency_ms=nan",
    "rows-latency-inf": "row 9: latency_ms: non-finite/non-positive latency_ms=inf",
    "rows-decode-with-prefill-tokens": "row 4: total_prefill_tokens: decode point carrying prefill tokens",
    "rows-decode-with-prefill-tokens-ar": "row 0: total_prefill_tokens: decode point carrying prefill tokens",
    "rows-workload-mixed": "row 1: workload_kind: unknown workload_kind='mixed'",
    "rows-partition-policy": "row 0: partition_policy: unsupported partition_policy='round_robin_v1'",
    "rows-sd-row-policy-mismatch": "row 0: measurement_policy: ",
    "rows-sd-reduction-count": "row 0: measurement_reduction: native CUDA timing/reduction/count contract mismatch",
    "rows-sd-reduction-count-2": "row 0: measurement_reduction: native CUDA timing/reduction/count contract mismatch",
    "rows-sd-dp2": "row 0: execution_profile: speculative-round data requires vLLM pure TP, DP1/PP1/CP1 and text execution",
    "rows-sd-dcp2": "row 0: dcp: speculative-round data requires DCP1",
    "rows-sd-engram": "row 0: execution_profile: speculative-round data requires vLLM pure TP, DP1/PP1/CP1 and text execution",
    "rows-sd-ar-policy": "row 0: execution_profile: speculative-round identity requires the native CUDA measurement policy, and vice versa",
    "rows-ar-selector-with-sd-policy": (
        "row 0: execution_profile: speculative-round identity requires the native CUDA measurement policy, and vice versa"
    ),
    "rows-batch-size-double": "column 'batch_size': must be int64, got double",
    "rows-enable-wideep-string": "column 'enable_wideep': must be boolean, got string",
    "rows-empty-attention-backend": "row 0: attention_backend: attention_backend must be a non-empty string",
    "rows-drop-latency-column": "column 'latency_ms' missing",
    "rows-model-path-other": "No FPM cell matches model_path='golden-ckpt/pub-dense-8b'",
}


def later_only(case: dict) -> bool:
    return {ch["op"] for ch in case["changes"]} <= LATER_OPS


def test_every_variant_is_materialized_and_classified():
    assert len(CASES) == 71
    for cid, case in CASES.items():
        assert (GOLDENS / "rejections" / cid / "profile.json").is_file()
        assert later_only(case) != (cid in EXPECTED), cid


@pytest.mark.parametrize("table", TABLES)
def test_golden_dirs_valid(table):
    root = GOLDENS / "tables" / table
    assert validate_profile_dir(root) == []
    bundle = load_profile_dir(root)
    assert bundle.root == root
    dep = bundle.profile.select("h200_sxm", "vllm", "0.24.0")
    cell = bundle.cell(dep)
    assert cell.num_decode_rows > 0 and cell.num_prefill_rows > 0
    assert bundle.table is bundle.table_for(dep)
    assert load_profile_dir(root / "profile.json").profile == bundle.profile


REFUSED = sorted(EXPECTED)


@pytest.mark.parametrize("cid", REFUSED)
def test_rejection_variant_refused(cid):
    root = GOLDENS / "rejections" / cid
    problems = validate_profile_dir(root)
    assert problems, f"{cid} ({CASES[cid]['description']}) was accepted; reference: {CASES[cid]['error'][:200]}"
    assert all(isinstance(p, str) and p and "\n" not in p for p in problems)
    assert any(EXPECTED[cid] in p for p in problems), problems
    with pytest.raises(JaxsimError):
        bundle = load_profile_dir(root)
        for dep in bundle.profile.deployments:
            bundle.cell(dep)


LATER = sorted(cid for cid, c in CASES.items() if later_only(c))


@pytest.mark.parametrize("cid", LATER)
def test_config_and_query_variants_leave_folder_valid(cid):
    """Refused by the binding (config_*) or by the query in the reference; the folder itself is fine."""
    assert CASES[cid]["stage"] in ("build", "query")
    assert validate_profile_dir(GOLDENS / "rejections" / cid) == []


def test_accepted_variant_schema_6(tmp_path):
    (accepted,) = REJECTIONS["accepted_variants_not_goldens"]
    root = tmp_path / accepted["id"]
    shutil.copytree(GOLDENS / "tables" / accepted["base_table"], root)
    meta = json.loads((root / SIDECAR_NAME).read_text())
    for ch in accepted["changes"]:
        assert ch["op"] == "sidecar_set"
        meta[ch["key"]] = ch["value"]
    (root / SIDECAR_NAME).chmod(0o644)
    (root / SIDECAR_NAME).write_text(json.dumps(meta, indent=1))
    assert validate_profile_dir(root) == []


def _materialize(tmp_path: Path, table: str, profile_name: str = "pub-dense-8b.json") -> Path:
    root = tmp_path / "cache"
    data = root / "data" / "h200_sxm" / "vllm" / "0.24.0"
    data.mkdir(parents=True)
    for name in (PARQUET_NAME, SIDECAR_NAME):
        shutil.copyfile(GOLDENS / "tables" / table / name, data / name)
    shutil.copyfile(GOLDENS / "tables" / table / "profile.json", root / profile_name)
    (root / "h200_sxm.yaml").write_text("gpu: {}\n")
    (root / "provenance").mkdir()
    return root


@pytest.mark.parametrize("table", ["ar_core", "sd_k2"])
def test_materialized_layout(tmp_path, table):
    root = _materialize(tmp_path, table)
    assert validate_profile_dir(root) == []
    bundle = load_profile_dir(root)
    dep = bundle.profile.deployments[0]
    assert bundle.table.path == root / "data" / "h200_sxm" / "vllm" / "0.24.0" / PARQUET_NAME
    assert bundle.cell(dep).num_decode_rows > 0


def test_materialized_missing_table(tmp_path):
    root = _materialize(tmp_path, "ar_core", profile_name="profile.json")
    prof = json.loads((root / "profile.json").read_text())
    extra = json.loads(json.dumps(prof["deployments"][0]))
    extra["backend_version"] = "0.25.0"
    prof["deployments"].append(extra)
    (root / "profile.json").write_text(json.dumps(prof, indent=1))
    problems = validate_profile_dir(root)
    assert len(problems) == 1 and "no FPM table for deployments on h200_sxm/vllm/0.25.0" in problems[0]
    with pytest.raises(JaxsimError, match="missing"):
        load_profile_dir(root)


def test_flat_layout_identity_and_missing_parts(tmp_path):
    root = tmp_path / "t"
    shutil.copytree(GOLDENS / "tables" / "ar_core", root)
    (root / "profile.json").chmod(0o644)
    prof = json.loads((root / "profile.json").read_text())
    prof["deployments"][0]["system"] = "h100_sxm"
    (root / "profile.json").write_text(json.dumps(prof, indent=1))
    problems = validate_profile_dir(root)
    assert any("does not match the database system 'h100_sxm'" in p for p in problems), problems
    with pytest.raises(JaxsimError):
        load_profile_dir(root)
    (root / "profile.json").unlink()
    assert any("expected profile.json or exactly one profile" in p for p in validate_profile_dir(root))
    assert validate_profile_dir(tmp_path / "nowhere")[0].endswith("no such profile directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copyfile(GOLDENS / "tables" / "ar_core" / "profile.json", empty / "profile.json")
    assert any("no FPM table" in p for p in validate_profile_dir(empty))


def test_phase_without_genuine_rows(tmp_path):
    """A cell whose decode rows are all fake_fallback serves prefill-only workers, nothing else."""
    root = tmp_path / "t"
    root.mkdir()
    t = pq.read_table(GOLDENS / "tables" / "ar_core" / PARQUET_NAME)
    regime = pc.if_else(pc.equal(t.column("workload_kind"), "decode"), "fake_fallback", t.column("kv_seed_regime"))
    t = t.set_column(t.column_names.index("kv_seed_regime"), "kv_seed_regime", regime.cast(pa.string()))
    pq.write_table(t, root / PARQUET_NAME, compression="zstd")
    meta = json.loads((GOLDENS / "tables" / "ar_core" / SIDECAR_NAME).read_text())
    meta["parquet_sha256"] = hashlib.sha256((root / PARQUET_NAME).read_bytes()).hexdigest()
    (root / SIDECAR_NAME).write_text(json.dumps(meta))
    prof = json.loads((GOLDENS / "tables" / "ar_core" / "profile.json").read_text())
    (root / "profile.json").write_text(json.dumps(prof))
    problems = validate_profile_dir(root)
    assert len(problems) == 1 and "no genuine decode measurements" in problems[0], problems
    assert problems[0].startswith(f"{root / 'profile.json'}: deployments[0]: ")
    prof["deployments"][0]["worker_type"] = "prefill"
    (root / "profile.json").write_text(json.dumps(prof))
    assert validate_profile_dir(root) == []
