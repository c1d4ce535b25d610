"""``jaxsim import op-model`` beyond dense models: MoE at every TP and expert-parallel layouts, KV geometry by
attention kind (sliding window, linear attention), physical memory checks, and what the sweep, capacity and
replay make of them.

Every import here prices the op model over a small envelope (a few seconds a layout on two cores); the imports
are shared per module.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from jaxsim.cli.main import app
from jaxsim.profile import load_profile_dir
from jaxsim.rules.capacity import request_cache_bytes
from jaxsim.rules.config import config_from_dict
from jaxsim.rules.validate import validate_config

pytest.importorskip("aiconfigurator_core")
runner = CliRunner()
SMALL = ["--max-num-seqs", "16", "--max-num-batched-tokens", "1024", "--max-model-len", "4096", "--max-prefill-batch", "2"]


def _import(out: Path, model: str, system: str, *args: str) -> dict:
    r = runner.invoke(app, ["import", "op-model", model, "--system", system, "--output", str(out), "--json", *SMALL, *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.output[r.output.index("{"):])


def _sweep(tmp_path: Path, body: str, name: str = "s") -> dict:
    spec = tmp_path / f"{name}.toml"
    spec.write_text(body + '\n[scheduler]\nconcurrency = [2, 8]\n\n[[workload]]\nisl = 1024\nosl = 128\n')
    r = runner.invoke(app, ["sweep", str(spec), "--output", str(tmp_path / f"{name}.parquet"), "--json", "--quiet"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output[r.output.index("{"):])


# ----------------------------------------------------------------------------------------------------
# MoE: TP 1/2/4/8 and expert parallelism, imported and swept with no extra keys


MOE_CASES = {
    # model, system, --tp, --layout: the layouts whose weights fit the GPU
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", "h200_sxm", "1,2,4,8", "tp4:ep4,tp8:ep8"),
    "gpt-oss-120b": ("openai/gpt-oss-120b", "h200_sxm", "1,2,4,8", "tp8:ep8"),
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3", "b300_sxm", "4,8", "tp8:ep8"),
    "qwen3-235b-a22b": ("Qwen/Qwen3-235B-A22B", "h200_sxm", "4,8", "tp8:ep8"),
}


@pytest.fixture(scope="module", params=sorted(MOE_CASES))
def moe_profile(request, tmp_path_factory):
    model, system, tp, layout = MOE_CASES[request.param]
    out = tmp_path_factory.mktemp(request.param) / "p"
    return out, _import(out, model, system, "--tp", tp, "--layout", layout), MOE_CASES[request.param]


def test_moe_layouts_import_valid_and_sweep_with_no_extra_keys(moe_profile, tmp_path):
    out, summary, (model, system, tp, layout) = moe_profile
    want = [(t, t, 1) for t in map(int, tp.split(","))] + [(int(x.split(":")[0][2:]), 1, int(x.split(":")[1][2:])) for x in layout.split(",")]
    assert [(c["tp"], c["moe_tp"], c["moe_ep"]) for c in summary["cells"]] == want
    r = runner.invoke(app, ["profiles", "validate", str(out)])
    assert r.exit_code == 0 and r.output.strip().endswith(": ok"), r.output
    prof = load_profile_dir(out).profile
    assert [(d.tp, d.moe_tp, d.moe_ep) for d in prof.deployments] == want
    # precisions as the checkpoint has them (gpt-oss: MoE w4a16_mxfp4, attention bfloat16; DeepSeek: fp8 blocks)
    modes = summary["checkpoint_modes"]
    assert {d.moe_quant_mode for d in prof.deployments} == {modes["moe_quant_mode"]}
    assert {d.gemm_quant_mode for d in prof.deployments} == {modes["gemm_quant_mode"]}
    if "gpt-oss" in model:
        assert modes["moe_quant_mode"] == "w4a16_mxfp4" and modes["gemm_quant_mode"] == "bfloat16"
    if "DeepSeek" in model:
        assert modes["moe_quant_mode"] == "fp8_block" and modes["kv_cache_dtype"] == "fp8"
    # the sweep binds every recorded layout with no extra keys
    s = _sweep(tmp_path, f'[[profile]]\nname = "{out}"\n')
    assert s["bindings_valid"] == len(want) and s["configs_evaluated"] == 2 * len(want) and not s["invalid"]
    assert s["workloads"]["workload0"]["supported"] == 2 * len(want)
    t = pq.read_table(tmp_path / "s.parquet")
    assert sorted(set(zip(t.column("tp").to_pylist(), t.column("moe_tp").to_pylist(), t.column("moe_ep").to_pylist()))) == sorted(want)
    # ... or the ones a spec names: moe_ep = [E] keeps the expert-parallel layouts only
    ep = max(e for _, _, e in want)
    s = _sweep(tmp_path, f'[[profile]]\nname = "{out}"\nmoe_ep = [{ep}]\n', "ep")
    assert s["bindings_valid"] == sum(e == ep for _, _, e in want)
    # a deployment config stating only tp takes the profile's MoE layout at that TP (TP2 records moe_tp 2)
    tp_only = [t for t, m, e in want if sum(x[0] == t for x in want) == 1][-1]
    cfg = config_from_dict({"model": model, "system": system, "backend_version": prof.deployments[0].backend_version,
                            "profile": str(out), "roles": {"aggregated": {"tp": tp_only}}})
    assert validate_config(cfg) == []


# ----------------------------------------------------------------------------------------------------
# KV geometry by attention kind


@pytest.fixture(scope="module")
def hybrids(tmp_path_factory):
    d = tmp_path_factory.mktemp("hybrid")
    out = {}
    for name, model, system in (("q35_27", "Qwen/Qwen3.5-27B", "h100_sxm"), ("q35_35", "Qwen/Qwen3.5-35B-A3B", "h100_sxm"),
                                ("goss", "openai/gpt-oss-120b", "h100_sxm")):
        out[name] = (d / name, _import(d / name, model, system, "--tp", "1", "--max-num-seqs", "64"))
    return out


def test_linear_attention_state_is_per_sequence_and_the_pool_is_physical(hybrids):
    out, summary = hybrids["q35_27"]
    c = summary["cells"][0]
    dep = load_profile_dir(out).profile.deployments[0]
    res = dep.resources
    assert res.cache_layout == "grouped" and res.kv_bytes_per_token is None
    groups = {g.name: g for g in res.cache_groups}
    # 16 full-attention layers x 2 x 4 KV heads x 256 x 2 B per token; 48 Gated DeltaNet layers' state per sequence:
    # 48 x (48 x 128 x 128 x 4 B + 10,240 x 3 x 2 B)
    assert groups["full_attention"].page_size_bytes == 16 * 65_536 and groups["full_attention"].num_layers == 16
    state = groups["recurrent_state"]
    assert state.page_size_bytes == 48 * (48 * 128 * 128 * 4 + 10_240 * 3 * 2) and state.block_size_tokens == 4096
    assert request_cache_bytes(res, 4096, 1) == 153_944_064 + 4096 * 65_536
    # the pool is the op model's budget, not a one-token sequence's bytes times a token count (43.7 TB before)
    pool = res.runtime_memory.kv_cache_bytes
    mem = json.loads((out / "memory.json").read_text())["deployments"][0]
    assert pool == c["kv_pool_bytes"] and pool + mem["weights_bytes"] + mem["activations_bytes"] + mem["runtime_overhead_bytes"] \
        + mem["comm_overhead_bytes"] <= 0.9 * mem["gpu_memory_bytes"]
    assert 17e9 < pool < 20e9 and c["max_sequences_at_max_model_len"] == pool // (153_944_064 + 4096 * 65_536)
    assert runner.invoke(app, ["profiles", "validate", str(out)]).exit_code == 0
    # 35B-A3B: 10 full layers, 30 GDN layers
    res35 = load_profile_dir(hybrids["q35_35"][0]).profile.deployments[0].resources
    assert {g.name: g.page_size_bytes for g in res35.cache_groups} == {"full_attention": 16 * 20_480, "recurrent_state": 64_389_120}


def test_sliding_window_layers_are_capped_at_their_window(hybrids):
    out, summary = hybrids["goss"]
    res = load_profile_dir(out).profile.deployments[0].resources
    groups = {g.name: g for g in res.cache_groups}
    # 18 full + 18 sliding layers of 2 x 8 x 64 x 2 B per token; the sliding ones over the last 128 tokens
    assert groups["full_attention"].page_size_bytes == 16 * 36_864
    assert groups["sliding_attention"].sliding_window == 128 and groups["sliding_attention"].page_size_bytes == 16 * 36_864
    assert summary["cells"][0]["kv_geometry"].startswith("full attention 36,864 B/token (18 layers); sliding window 36,864")
    # H100 TP1: 60.4 GB of weights leave ~12 GB (not the 23.3 GB of 315,849 tokens x 73,728 B that overfilled the card)
    mem = json.loads((out / "memory.json").read_text())["deployments"][0]
    assert mem["weights_bytes"] == 60_426_731_520 and 10e9 < res.runtime_memory.kv_cache_bytes < 13e9
    assert res.runtime_memory.kv_cache_bytes == int(0.9 * mem["gpu_memory_bytes"]) - sum(
        mem[k] for k in ("weights_bytes", "activations_bytes", "runtime_overhead_bytes", "comm_overhead_bytes"))


def test_capacity_sweep_and_replay_use_the_grouped_geometry(hybrids, tmp_path):
    out, summary = hybrids["q35_27"]
    cfg = tmp_path / "d.toml"
    cfg.write_text(f'model = "Qwen/Qwen3.5-27B"\nsystem = "h100_sxm"\nbackend_version = "0.24.0"\nprofile = "{out}"\n'
                   'block_size = 16\n[roles.aggregated]\ntp = 1\n')
    r = runner.invoke(app, ["capacity", str(cfg), "--isl", "2048", "--osl", "2000", "--json"])
    assert r.exit_code == 0, r.output
    cap = json.loads(r.output[r.output.index("{"):])["roles"]["aggregated"]
    per_request = 153_944_064 + 4048 * 65_536  # one recurrent state + 4,048 tokens of full attention
    pool = summary["cells"][0]["kv_pool_bytes"]
    assert cap["request_bytes"] == per_request and cap["max_concurrency"] == pool // per_request < 64
    # the sweep counts the same pool in 16-token blocks of the full-attention layers (1 MiB) and the state as
    # 147 fixed blocks per request: the same concurrency, up to the rounding of the state to whole blocks
    spec = tmp_path / "s.toml"
    spec.write_text(f'[[profile]]\nname = "{out}"\n[scheduler]\nconcurrency = [64]\n[[workload]]\nisl = 2048\nosl = 2000\n')
    r = runner.invoke(app, ["sweep", str(spec), "--output", str(tmp_path / "s.parquet"), "--json", "--quiet"])
    assert r.exit_code == 0, r.output
    t = pq.read_table(tmp_path / "s.parquet")
    blocks, state = pool // (16 * 65_536), -(-153_944_064 // (16 * 65_536))
    # vLLM allocates blocks as tokens arrive: a request in flight holds ISL + OSL/2 tokens on average (evaluate.effective_concurrency)
    held = -(-(2048 + 2000 // 2) // 16) + state
    assert state == 147 and t.column("concurrency").to_pylist() == [blocks // held]
    # the same geometry as capacity's whole-request count (up to the state's rounding to blocks); the sweep admits more
    assert abs(blocks // (4048 // 16 + state) - cap["max_concurrency"]) <= 1 and t.column("limit")[0].as_py() == "kv_pool"
    assert t.column("concurrency")[0].as_py() > cap["max_concurrency"]
    # the replay allocates the same blocks: a grouped pool replays (no "no KV block count" refusal)
    r = runner.invoke(app, ["replay", str(cfg), "--trace", "mooncake_tiny", "--max-requests", "12", "--output",
                            str(tmp_path / "r.parquet"), "--json", "--no-progress"])
    assert r.exit_code in (0, 3), r.output
    assert "block count" not in r.output and (tmp_path / "r.parquet").is_file()


# ----------------------------------------------------------------------------------------------------
# bad input: one line naming the numbers, exit 2, nothing written


@pytest.mark.parametrize(
    "args,needle",
    [
        # a layout the op model cannot price: MiniMax-M2.5's fp8 blocks do not split over moe_tp 8
        (["MiniMaxAI/MiniMax-M2.5", "--system", "h200_sxm", "--tp", "8"], "(moe_intermediate_size=1536 / moe_tp_size=8) % weight_block_size=128"),
        (["MiniMaxAI/MiniMax-M2.5", "--system", "h200_sxm", "--tp", "8"], "; --precision-fallback prices the fp8_block MoE weights with the "
         "op model's per-tensor fp8 data instead"),
        # the fallback is for block-quantised MoE weights the op model cannot price, nothing else
        (["deepseek-ai/DeepSeek-V3", "--system", "h200_sxm", "--tp", "4", "--precision-fallback"], "no KV pool"),
        # ... nor mixed moe_tp x moe_ep layouts (FPM profiles hold TP or TEP)
        (["Qwen/Qwen3-30B-A3B", "--system", "h200_sxm", "--layout", "tp4:ep2"], "FPM profiles record MoE layouts TP"),
        (["Qwen/Qwen3-30B-A3B", "--system", "h200_sxm", "--layout", "tp2:ep4"], "moe_ep 4 does not divide the MoE width tp x dp = 2"),
        # attention DP: experts over every rank only, MoE models only, no speculative rounds
        (["Qwen/Qwen3-30B-A3B", "--system", "h200_sxm", "--layout", "tp2:dp2:ep2:moetp2"], "attention-DP layouts are imported with the "
         "experts spread over every rank (moe_tp 1, moe_ep = tp x dp = 4), e.g. tp2:dp2:ep4"),
        (["Qwen/Qwen3-32B", "--system", "h200_sxm", "--layout", "tp2:dp2"], "attention data parallelism (dp=2) applies to MoE models"),
        (["Qwen/Qwen3-32B", "--system", "h200_sxm", "--layout", "tp2:ep2"], "is dense (no experts)"),
        (["Qwen/Qwen3-30B-A3B", "--system", "h200_sxm", "--layout", "ep2"], "give the attention tensor-parallel size"),
        # a quant mode the checkpoint does not have
        (["MiniMaxAI/MiniMax-M2.5", "--system", "b200_sxm", "--tp", "4", "--moe-quant-mode", "nvfp4"],
         "checkpoint is quantised fp8_block (moe weights); it has no nvfp4 weights (use its own mode, the default; quantised "
         "checkpoints the op model ships: nvidia/MiniMax-M2.5-NVFP4"),
        (["openai/gpt-oss-120b", "--system", "h200_sxm", "--moe-quant-mode", "nvfp4"], "quantised w4a16_mxfp4 (moe weights)"),
        (["Qwen/Qwen3-32B", "--system", "h200_sxm", "--moe-quant-mode", "fp8"], "--moe-quant-mode fp8: Qwen/Qwen3-32B is dense"),
        (["Qwen/Qwen3-30B-A3B", "--system", "h200_sxm", "--moe-quant-mode", "fp9"], "--moe-quant-mode 'fp9': expected one of"),
        # a pool that cannot fit
        (["deepseek-ai/DeepSeek-V3", "--system", "h200_sxm", "--tp", "4"], "no KV pool"),
        (["Qwen/Qwen3.5-35B-A3B", "--system", "h100_sxm", "--max-model-len", "262144", "--max-num-seqs", "4"],
         "cannot hold one max_model_len=262144 request"),
        # the envelope is bounded before any work
        (["Qwen/Qwen3-32B", "--system", "h200_sxm", "--max-num-seqs", "100000"], "--max-num-seqs must be an integer >= 1 and <= 1,024"),
        (["Qwen/Qwen3-32B", "--system", "h200_sxm", "--max-prefill-batch", "65"], "--max-prefill-batch must be an integer >= 1 and <= 64"),
    ],
)
def test_bad_layouts_quants_and_pools_are_one_line_exit_2_and_write_nothing(tmp_path, args, needle):
    out = tmp_path / "p"
    r = runner.invoke(app, ["import", "op-model", "--output", str(out), *SMALL, *args])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.output
    assert not out.exists()


def test_an_older_import_whose_pool_overfills_the_gpu_fails_validate(hybrids, tmp_path):
    """A profile written before the fix (gpt-oss H100 TP1: the pool recorded as 315,849 x 73,728 B) fails
    ``profiles validate`` with the numbers its own provenance states."""
    import shutil

    src, _ = hybrids["goss"]
    old = tmp_path / "old"
    shutil.copytree(src, old)
    (old / "memory.json").unlink()
    doc = json.loads((old / "profile.json").read_text())
    rm = doc["deployments"][0]["resources"]["runtime_memory"]
    rm["kv_cache_bytes"] = 315_849 * 73_728
    (old / "profile.json").write_text(json.dumps(doc, indent=1))
    r = runner.invoke(app, ["profiles", "validate", str(old)])
    assert r.exit_code == 2
    line = next(x for x in r.output.splitlines() if "gpu-memory-fit" in x)
    assert "KV pool 23286915072 B + weights 60426731520 B" in line and "> GPU memory 85899345920 B x gpu_memory_utilization 0.9" in line
    assert np.isfinite(1.0)


# ----------------------------------------------------------------------------------------------------
# attention data parallelism: a worker of dp ranks x tp GPUs, each rank an engine at 1/dp of the concurrency


@pytest.fixture(scope="module")
def dp_profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp") / "p"
    return out, _import(out, "Qwen/Qwen3-30B-A3B", "h200_sxm", "--layout", "tp2:dp2:ep4")


def test_attention_dp_layout_is_priced_by_the_op_model_at_that_layout(dp_profile):
    from jaxsim.importers import op_model as om

    out, summary = dp_profile
    (cell,) = summary["cells"]
    assert (cell["tp"], cell["dp"], cell["moe_tp"], cell["moe_ep"]) == (2, 2, 1, 4)
    r = runner.invoke(app, ["profiles", "validate", str(out)])
    assert r.exit_code == 0 and r.output.strip().endswith(": ok"), r.output
    prof = load_profile_dir(out).profile
    (dep,) = prof.deployments
    assert (dep.tp, dep.dp, dep.moe_tp, dep.moe_ep) == (2, 2, 1, 4) and prof.source == "modelled"
    assert "Attention-DP layouts (dp > 1)" in prof.provenance and "tp x dp GPUs" in prof.provenance
    # a decode row is the op model's step at attention_dp_size 2 (its MoE layers see dp x b tokens)
    t = pq.read_table(out / "fpm_forward_perf.parquet").to_pandas()
    assert set(t["dp"]) == {2} and set(t["parallel_strategy"]) == {"dp_attention_ep_moe"}
    row = t[(t.workload_kind == "decode") & (t.batch_size == 8) & (t.total_kv_read_tokens == 8 * 1024)].iloc[0]
    r_ = om.resolve_request(om.OpModelRequest("Qwen/Qwen3-30B-A3B", "h200_sxm", (), layouts=(om.ParallelLayout(2, 4, None, 2),)))
    eng = om.Engine(r_.req.model, "h200_sxm", r_.backend_version, 2, gemm=None, kv=None, fmha=None, moe_tp=1, moe_ep=4, dp=2)
    assert float(row.latency_ms) == pytest.approx(eng.decode_ms(8, 1024), rel=1e-9)


def test_the_schema_accepts_attention_dp_at_tp_above_1_in_modelled_profiles_only(dp_profile):
    from jaxsim.errors import JaxsimError
    from jaxsim.profile.model import ModelProfile

    out, _ = dp_profile
    d = json.loads((out / "profile.json").read_text())
    assert ModelProfile.from_dict(d, source="x").deployments[0].dp == 2
    measured = dict(d, data_source="measured", provenance="measured on a real cluster")
    with pytest.raises(JaxsimError, match="accepted in modelled profiles only"):
        ModelProfile.from_dict(measured, source="x")
    bad = json.loads(json.dumps(d))
    bad["deployments"][0]["moe_ep"] = 2  # the experts not over every rank
    bad["deployments"][0]["moe_tp"] = 2
    with pytest.raises(JaxsimError, match="TP, DEP, or TEP topology"):
        ModelProfile.from_dict(bad, source="x")


def test_attention_dp_worker_sweeps_each_rank_at_its_share(dp_profile, tmp_path):
    from jaxsim.sweep.replayed import binding_config
    from jaxsim.sweep.spec import load_spec, plan_sweep

    out, _ = dp_profile
    s = _sweep(tmp_path, f'[[profile]]\nname = "{out}"\n')
    assert s["bindings_valid"] == 1 and s["configs_evaluated"] == 2 and not s["invalid"]
    t = pq.read_table(tmp_path / "s.parquet").to_pandas().sort_values("concurrency_target")
    assert list(t.dp) == [2, 2] and list(t.gpus) == [4, 4] and list(t.concurrency) == [2, 8]
    assert np.all(t.decode_batch <= t.concurrency_target / 2 + 1e-9)  # a rank's batch: its share of the clients
    # the worker's throughput: per GPU the rank's (rate / tp), in total x tp x dp GPUs; its request rate x dp ranks
    assert np.allclose(t.total_output_tokens_per_s, t.output_tokens_per_s_per_gpu * 4)
    assert np.allclose(t.request_rate_per_s * t.osl_mean, t.total_output_tokens_per_s, rtol=1e-9)
    # each rank is evaluated as an engine at ceil(C / dp) clients; a replay runs dp ranks round-robin
    spec = tmp_path / "s.toml"
    plan = plan_sweep(load_spec(spec))
    assert list(plan.inputs(np.arange(2)).concurrency) == [1, 4] and list(plan.inputs(np.arange(2)).decode_gpus) == [2, 2]
    assert binding_config(plan, 0, "x").aggregated.replicas == 2
    # disaggregated attention-DP workers are not modelled: one line, the rule named
    spec.write_text(f'[[profile]]\nname = "{out}"\n[serving]\nmode = ["disaggregated"]\nratios = ["1:1"]\n'
                    '[scheduler]\nconcurrency = [2]\n[[workload]]\nisl = 1024\nosl = 128\n')
    r = runner.invoke(app, ["sweep", str(spec), "--output", str(tmp_path / "dis.parquet"), "--quiet"])
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "attention-dp: tp=2 dp=2 moe_tp=1 moe_ep=4 is served aggregated only" in lines[0]


# ----------------------------------------------------------------------------------------------------
# precision fallback: a checkpoint precision the op model cannot price at a layout, never silently


def test_precision_fallback_prices_unpriceable_block_moe_weights_per_tensor_and_says_so(tmp_path):
    out = tmp_path / "p"
    r = runner.invoke(app, ["import", "op-model", "MiniMaxAI/MiniMax-M2.5", "--system", "h200_sxm", "--tp", "4,8", "--output", str(out),
                            "--json", "--precision-fallback", *SMALL])
    assert r.exit_code == 0, r.output
    warnings = [x for x in r.output.splitlines() if x.startswith("warning: precision fallback:")]
    assert len(warnings) == 1 and "tp=8 moe_tp=8 moe_ep=1: the checkpoint's fp8_block MoE weights cannot be priced" in warnings[0]
    summary = json.loads(r.output[r.output.index("{"):])
    tp4, tp8 = summary["cells"]
    assert (tp4["moe_quant_mode"], tp4["gemm_quant_mode"]) == ("fp8_block", "fp8_block") and "precision_fallback" not in tp4
    assert (tp8["moe_quant_mode"], tp8["gemm_quant_mode"]) == ("fp8", "fp8_block") and "per-tensor fp8" in tp8["precision_fallback"]
    prof = load_profile_dir(out).profile
    assert [(d.tp, d.moe_quant_mode) for d in prof.deployments] == [(4, "fp8_block"), (8, "fp8")]
    assert prof.provenance.count("PRECISION FALLBACK: tp=8 moe_tp=8 moe_ep=1") == 1
    assert runner.invoke(app, ["profiles", "validate", str(out)]).exit_code == 0
    # the TP4 layout is priced exactly as without the option
    plain = tmp_path / "plain"
    _import(plain, "MiniMaxAI/MiniMax-M2.5", "h200_sxm", "--tp", "4")
    a = pq.read_table(out / "fpm_forward_perf.parquet").to_pandas()
    b = pq.read_table(plain / "fpm_forward_perf.parquet").to_pandas()
    assert np.array_equal(a[a.tp == 4].latency_ms.to_numpy(), b.latency_ms.to_numpy())


# ----------------------------------------------------------------------------------------------------
# --block-gemm-data: which GEMM table prices a block-scaled FP8 checkpoint's dense GEMMs


def test_block_gemm_data_per_tensor_reprices_only_the_dense_fp8_block_gemms_and_says_so(tmp_path):
    """MiniMax-M2.5 (fp8_block GEMMs and MoE) on b200_sxm TP2: per-tensor data (the default) changes the dense GEMM ops
    only, lowers the small-batch decode rows (the collected block table is host-bound there), keeps the identity and
    states it; --block-gemm-data collected prices them as aiconfigurator does."""
    from jaxsim.importers import op_model as om

    collected, per_tensor = tmp_path / "c", tmp_path / "p"
    s_c = _import(collected, "MiniMaxAI/MiniMax-M2.5", "b200_sxm", "--tp", "2", "--block-gemm-data", "collected")
    r = runner.invoke(app, ["import", "op-model", "MiniMaxAI/MiniMax-M2.5", "--system", "b200_sxm", "--tp", "2", "--output",
                            str(per_tensor), "--json", *SMALL])
    assert r.exit_code == 0, r.output
    notes = [x for x in r.output.splitlines() if x.startswith("note: GEMM data:")]
    assert len(notes) == 1 and "fp8_block dense GEMMs (4 op kinds) are priced with the op model's per-tensor fp8" in notes[0]
    s_p = json.loads(r.output[r.output.index("{"):])
    (c,), (p,) = s_c["cells"], s_p["cells"]
    assert (p["gemm_quant_mode"], p["moe_quant_mode"]) == (c["gemm_quant_mode"], c["moe_quant_mode"]) == ("fp8_block", "fp8_block")
    assert "block_gemm_data" in p and "block_gemm_data" not in c
    assert p["kv_pool_bytes"] == c["kv_pool_bytes"]  # memory is not the GEMM table's
    prof = load_profile_dir(per_tensor).profile
    assert prof.provenance.count("GEMM DATA: tp=2") == 1 and "GEMM DATA" not in load_profile_dir(collected).profile.provenance
    assert runner.invoke(app, ["profiles", "validate", str(per_tensor)]).exit_code == 0
    table = runner.invoke(app, ["import", "op-model", "MiniMaxAI/MiniMax-M2.5", "--system", "b200_sxm", "--tp", "2", "--output",
                                str(tmp_path / "t"), *SMALL])
    assert table.exit_code == 0, table.output
    assert "gemm fp8_block (priced with per-tensor fp8 GEMM data) / moe fp8_block" in " ".join(table.output.replace("│", " ").split())
    a = pq.read_table(collected / "fpm_forward_perf.parquet").to_pandas()
    b = pq.read_table(per_tensor / "fpm_forward_perf.parquet").to_pandas()
    keys = ["workload_kind", "batch_size", "total_prefill_tokens", "total_kv_read_tokens"]
    m = a.merge(b, on=keys, suffixes=("_c", "_p"))
    assert len(m) == len(a) == len(b)
    dec = m[(m.workload_kind == "decode") & (m.batch_size <= 8)]
    assert len(dec) > 100
    # 124 host-bound GEMMs a step at 0.15-0.2 ms each: the collected rows are at least 2x the per-tensor ones
    assert (dec.latency_ms_c > 2.0 * dec.latency_ms_p).all()
    # the op-level change: only Gemm ops, only fp8_block ones, in both phases
    spec = {"context_ops": [{"Gemm": {"quant_mode": "fp8_block"}}, {"Moe": {"quant_mode": "fp8_block"}}],
            "generation_ops": [{"Gemm": {"quant_mode": "bfloat16"}}, {"Gemm": {"quant_mode": "fp8_block"}}]}
    out, n = om.price_block_gemms_per_tensor(json.dumps(spec))
    assert n == 2 and json.loads(out) == {
        "context_ops": [{"Gemm": {"quant_mode": "fp8"}}, {"Moe": {"quant_mode": "fp8_block"}}],
        "generation_ops": [{"Gemm": {"quant_mode": "bfloat16"}}, {"Gemm": {"quant_mode": "fp8"}}]}


def test_block_gemm_data_leaves_other_checkpoints_unchanged_and_refuses_unknown_values(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _import(a, "Qwen/Qwen3-32B", "h200_sxm", "--tp", "1", "--block-gemm-data", "collected")
    s = _import(b, "Qwen/Qwen3-32B", "h200_sxm", "--tp", "1")
    assert "block_gemm_data" not in s["cells"][0]
    assert np.array_equal(pq.read_table(a / "fpm_forward_perf.parquet").column("latency_ms").to_numpy(),
                          pq.read_table(b / "fpm_forward_perf.parquet").column("latency_ms").to_numpy())
    out = tmp_path / "bad"
    r = runner.invoke(app, ["import", "op-model", "Qwen/Qwen3-32B", "--system", "h200_sxm", "--output", str(out), "--block-gemm-data",
                            "fastest", *SMALL])
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "--block-gemm-data 'fastest': expected one of per-tensor, collected" in lines[0]
    assert not out.exists()
