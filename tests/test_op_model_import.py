"""``jaxsim import op-model``: MODELLED profiles priced by aiconfigurator-core's op-level model (extra ``opmodel``).

Kept fast with small envelopes (--max-num-seqs, --max-num-batched-tokens, --max-model-len); every written
profile goes through ``jaxsim profiles validate`` and its rows are compared with the op model itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from jaxsim.cli.main import app
from jaxsim.importers import op_model as om
from jaxsim.kernels import rounds, status
from jaxsim.profile import load_profile_dir

runner = CliRunner()
SMALL = ["--max-num-seqs", "24", "--max-num-batched-tokens", "1024", "--max-model-len", "4096", "--max-prefill-batch", "3"]


def _import(out: Path, model: str, system: str, tp: str, *extra: str):
    r = runner.invoke(app, ["import", "op-model", model, "--system", system, "--tp", tp, "--output", str(out), "--json", *SMALL, *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.output[r.output.index("{"):])


@pytest.mark.parametrize(
    "model,system,tp",
    [("Qwen/Qwen3-32B", "h200_sxm", "1,2"), ("meta-llama/Meta-Llama-3.1-8B", "l40s", "1"), ("meta-llama/Meta-Llama-3.1-8B", "b200_sxm", "1,2")],
)
def test_import_writes_a_valid_modelled_profile(tmp_path, model, system, tp):
    out = tmp_path / "p"
    summary = _import(out, model, system, tp)
    assert summary["data_source"] == "modelled" and [c["tp"] for c in summary["cells"]] == [int(x) for x in tp.split(",")]
    r = runner.invoke(app, ["profiles", "validate", str(out)])
    assert r.exit_code == 0 and r.output.strip().endswith(": ok"), r.output
    bundle = load_profile_dir(out)
    prof = bundle.profile
    assert prof.model == model and "MODELLED" in prof.provenance
    for dep, cell in zip(prof.deployments, summary["cells"]):
        res = dep.resources
        assert dep.system == system and res.runtime_memory is not None and "MODELLED" in res.runtime_memory.provenance
        # the pool is the op model's budget in bytes (GPU x 0.9 - weights, activations, overheads in memory.json)
        assert res.cache_layout == "linear" and res.runtime_memory.kv_cache_bytes == cell["kv_pool_bytes"]
        assert cell["kv_pool_tokens"] == cell["kv_pool_bytes"] // res.kv_bytes_per_token
        mem = next(m for m in json.loads((out / "memory.json").read_text())["deployments"] if m["tp"] == dep.tp)
        assert cell["kv_pool_bytes"] + sum(mem[k] for k in ("weights_bytes", "activations_bytes", "runtime_overhead_bytes",
                                                            "comm_overhead_bytes")) <= 0.9 * mem["gpu_memory_bytes"]
        assert res.max_batch_size == 24 and res.max_num_tokens == 1024
        t = bundle.table_for(dep)
        mine = t.column("tp") == dep.tp
        kind = t.column("workload_kind")[mine]
        b = t.column("batch_size")[mine]
        assert sorted(set(b[kind == "decode"].tolist())) == list(range(1, 25))  # every batch up to max_num_seqs
        assert sorted(set(b[kind == "prefill"].tolist())) == [1, 2, 3]
        tok = t.column("total_prefill_tokens")[mine][kind == "prefill"]
        kv = t.column("total_kv_read_tokens")[mine][kind == "prefill"]
        assert tok.max() >= 1000 and (kv > 0).any() and (kv == 0).any()  # chunked prefill with prefix reads
        assert set(t.column("model_support_level")[mine].tolist()) == {"modelled"}


def test_rows_are_the_op_model_and_lookups_reproduce_them(tmp_path):
    out = tmp_path / "p"
    _import(out, "Qwen/Qwen3-32B", "h200_sxm", "1,2")
    bundle = load_profile_dir(out)
    r = om.resolve_request(om.OpModelRequest("Qwen/Qwen3-32B", "h200_sxm", (1,)))
    lat = {}
    for dep in bundle.profile.deployments:
        eng = om.Engine("Qwen/Qwen3-32B", "h200_sxm", r.backend_version, dep.tp, gemm=None, kv=None, fmha=None)
        table = rounds.compile_round_table(bundle.cell(dep))
        d, c = rounds.decode_batch(table, np.array([8]), np.array([8 * 1024]))
        p, cp = rounds.prefill_batch(table, np.array([2]), np.array([2 * 256]), np.array([0]))
        assert status.is_supported(int(c[0])) and status.is_supported(int(cp[0]))
        lat[dep.tp] = float(d[0])
        # a lookup at a point between grid rows stays within 2 % of the op model priced there
        assert abs(float(d[0]) / eng.decode_ms(8, 1024) - 1) < 0.02
        assert abs(float(p[0]) / eng.prefill_ms(2, 256, 0) - 1) < 0.02
        # every curve reaches its own end: all requests at the full context (max_model_len - 1 = 4095)
        _, c = rounds.decode_batch(table, np.array([1, 7, 24]), np.array([4095, 7 * 4095, 24 * 4095]))
        assert all(status.is_supported(int(x)) for x in c)
        # nothing is extrapolated: beyond the modelled envelope the lookup is refused
        _, c = rounds.decode_batch(table, np.array([25]), np.array([25 * 100]))
        assert not status.is_supported(int(c[0]))
    assert lat[2] < lat[1]  # TP2 splits the weights: a faster decode step


@pytest.mark.parametrize(
    "args,needle",
    [
        (["Qwen/Qwen3-99B", "--system", "h200_sxm"], "unknown model 'Qwen/Qwen3-99B'"),
        (["Qwen/Qwen3-32B", "--system", "h900_sxm"], "unknown system 'h900_sxm'"),
        (["Qwen/Qwen3-32B", "--system", "h200_sxm", "--backend-version", "0.1.0"], "unknown backend version '0.1.0'"),
        (["Qwen/Qwen3-32B", "--system", "h200_sxm", "--tp", "3"], "--tp 3 does not divide"),
        (["Qwen/Qwen3-32B", "--system", "h200_sxm", "--nextn", "2"], "has no multi-token-prediction layers"),
        (["Qwen/Qwen3-32B", "--system", "h200_sxm", "--nextn", "7", "--draft-config", "x.json"], "--nextn must be in 1..5"),
        (["Qwen/Qwen3-32B", "--system", "h200_sxm", "--tp", "1,x"], "comma-separated integers"),
        (["Qwen/Qwen3-32B", "--system", "h200_sxm", "--gemm-quant-mode", "nvfp4"], "the op model cannot price this configuration"),
        (["Qwen/Qwen3-32B", "--system", "h200_sxm", "--gemm-quant-mode", "int3"], "--gemm-quant-mode 'int3'"),
        (["Qwen/Qwen3-32B", "--system", "h200_sxm", "--max-model-len", "99999999"], "--max-model-len must be in [2, 40960]"),
        (["meta-llama/Meta-Llama-3.1-70B", "--system", "l40s", "--tp", "2"], "no KV pool"),
        (["meta-llama/Meta-Llama-3.1-70B", "--system", "h100_sxm", "--tp", "2", "--max-num-seqs", "8", "--max-model-len", "131072"],
         "cannot hold one max_model_len=131072 request"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, needle):
    out = tmp_path / "p"
    r = runner.invoke(app, ["import", "op-model", "--output", str(out), *SMALL, *args])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.output
    assert not out.exists()


def test_existing_output_is_never_overwritten(tmp_path):
    out = tmp_path / "p"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = runner.invoke(app, ["import", "op-model", "Qwen/Qwen3-32B", "--system", "h200_sxm", "--output", str(out), *SMALL])
    assert r.exit_code == 2 and "exists" in r.output
    assert (out / "keep.txt").read_text() == "mine" and not (out / "profile.json").exists()


def test_catalogue_lists():
    r = runner.invoke(app, ["import", "op-model", "--list-systems"])
    assert r.exit_code == 0 and {"h200_sxm", "b200_sxm", "l40s"} <= set(r.output.split())
    r = runner.invoke(app, ["import", "op-model", "--list-models"])
    assert r.exit_code == 0 and "Qwen/Qwen3-32B" in r.output.split()


def test_grids_are_monotone_and_end_on_their_bounds():
    for n in (1, 7, 16, 17, 256, 40_000_000):
        g = om.decode_kv_grid(n)
        assert g[0] == 1 and g[-1] == n and np.all(np.diff(g) > 0)
        assert np.all(g[1:] / g[:-1] <= 2 ** (1 / 8) + 1e-3) or n <= 16 or g[-1] / g[-2] <= 2 ** (1 / 8) + 1e-3
    curve = om.decode_curve_kv(om.decode_kv_grid(10_000), 8, 100, 10_000)
    assert curve[0] >= 8 and curve[-1] <= 800
    # a fractional mean context is the op model's value interpolated between the neighbouring integers
    assert om.at_mean_context(lambda b, s: 10.0 * s, 4, 10) == 25.0 and om.at_mean_context(lambda b, s: float(s), 2, 8) == 4.0
    g = om.prefill_prefix_grid(4095)
    assert g[0] == 0 and g[-1] == 4095 and np.all(np.diff(g) > 0)


def test_decode_curves_are_priced_at_a_context_grid():
    """A decode curve queries the op model at the context grid only (dense to 16, then 1/8 octave) and is linear in
    the mean context between: exactly :func:`at_mean_context` up to 16, every grid context exact, and on the
    real op model within 0.5 % of pricing each row's two integer neighbours."""
    calls = []

    def f(b, s):
        calls.append((b, s))
        return 3.0 + 0.01 * s + 1e-6 * s * s + 0.1 * b

    ks = np.arange(4, 4 * 16 + 1)  # mean contexts 1..16 at batch 4
    got, q = om.decode_curve_ms(f, 4, ks)
    assert np.allclose(got, [om.at_mean_context(f, 4, int(k)) for k in ks], rtol=0, atol=1e-12)
    calls.clear()
    ks = om.decode_curve_kv(om.decode_kv_grid(400_000), 8, 40_000, 400_000)
    got, q = om.decode_curve_ms(f, 8, ks)
    grid = om.decode_context_grid(int(np.ceil(ks.max() / 8)))
    assert q == grid.size == len(calls) < ks.size and {s for _, s in calls} == set(grid.tolist())
    on = np.isin(ks, grid * 8)
    assert np.allclose(got[on], [f(8, int(k) // 8) for k in ks[on]], rtol=1e-12)
    r = om.resolve_request(om.OpModelRequest("Qwen/Qwen3-32B", "h200_sxm", (1,)))
    eng = om.Engine(r.req.model, r.req.system, r.backend_version, 1, gemm=None, kv=None, fmha=None)
    for b in (1, 7, 64):
        ks = om.decode_curve_kv(om.decode_kv_grid(b * 40_000), b, 40_000, b * 40_000)
        got, _ = om.decode_curve_ms(eng.decode_ms, b, ks)
        exact = np.array([om.at_mean_context(eng.decode_ms, b, int(k)) for k in ks[:: max(1, ks.size // 40)]])
        assert np.max(np.abs(got[:: max(1, ks.size // 40)] / exact - 1)) < 0.005


DRAFT = Path(__file__).parent / "data" / "eagle3_draft_qwen3_32b" / "config.json"


def test_eagle3_rounds_are_composed_from_op_model_pieces(tmp_path):
    out = tmp_path / "sd"
    _import(out, "Qwen/Qwen3-32B", "h200_sxm", "1", "--nextn", "2", "--draft-config", str(DRAFT))
    r = runner.invoke(app, ["profiles", "validate", str(out)])
    assert r.exit_code == 0, r.output
    bundle = load_profile_dir(out)
    dep = bundle.profile.deployments[0]
    assert dep.is_speculative and dep.num_draft_tokens == 2 and "EAGLE-3" in bundle.profile.provenance
    assert bundle.table.measurement_policy == "vllm_native_fpm_model_step_cuda_v1"
    res = om.resolve_request(om.OpModelRequest("Qwen/Qwen3-32B", "h200_sxm", (1,), num_draft_tokens=2, draft_config=DRAFT))
    target = om.Engine("Qwen/Qwen3-32B", "h200_sxm", res.backend_version, 1, gemm=None, kv=None, fmha=None)
    draft = om.Engine(str(res.draft_dir), "h200_sxm", res.backend_version, 1, gemm=None, kv=None, fmha=None)
    table = rounds.compile_round_table(bundle.cell(dep), speculative=True, num_draft_tokens=2)
    # one lookup at the actual batch and past KV = verify of 3 query tokens per request + 2 draft steps
    lat, code = rounds.decode_batch(table, np.array([4]), np.array([4 * 2000]))
    want = om.round_latency_ms(target.decode_ms(12, 2000), draft.decode_ms(4, 2000), 2)
    assert status.is_supported(int(code[0])) and abs(float(lat[0]) / want - 1) < 0.01
    assert want > target.decode_ms(4, 2000)  # a round costs more than one plain step
    assert draft.decode_ms(4, 2000) < 0.1 * target.decode_ms(4, 2000)  # one draft layer vs 64 target layers


def test_bad_draft_config_is_refused(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    r = runner.invoke(app, ["import", "op-model", "Qwen/Qwen3-32B", "--system", "h200_sxm", "--nextn", "1",
                            "--draft-config", str(bad), "--output", str(tmp_path / "p"), *SMALL])
    assert r.exit_code == 2 and "not JSON" in r.output and not (tmp_path / "p").exists()


def test_mtp_rounds_are_the_op_models_native_pricing(tmp_path):
    out = tmp_path / "mtp"
    _import(out, "XiaomiMiMo/MiMo-7B-Base", "h200_sxm", "1", "--nextn", "2")
    assert runner.invoke(app, ["profiles", "validate", str(out)]).exit_code == 0
    bundle = load_profile_dir(out)
    dep = bundle.profile.deployments[0]
    assert dep.execution_profile.method == "mtp" and dep.num_draft_tokens == 2
    res = om.resolve_request(om.OpModelRequest("XiaomiMiMo/MiMo-7B-Base", "h200_sxm", (1,)))
    mtp = om.Engine("XiaomiMiMo/MiMo-7B-Base", "h200_sxm", res.backend_version, 1, gemm=None, kv=None, fmha=None, nextn=2)
    ar = om.Engine("XiaomiMiMo/MiMo-7B-Base", "h200_sxm", res.backend_version, 1, gemm=None, kv=None, fmha=None)
    table = rounds.compile_round_table(bundle.cell(dep), speculative=True, num_draft_tokens=2)
    lat, code = rounds.decode_batch(table, np.array([6]), np.array([6 * 1500]))
    assert status.is_supported(int(code[0])) and abs(float(lat[0]) / mtp.decode_ms(6, 1500) - 1) < 0.01
    assert mtp.decode_ms(6, 1500) > ar.decode_ms(6, 1500)  # a round verifies K+1 tokens and runs the MTP layers


def test_missing_extra_is_a_one_line_install_hint(tmp_path, monkeypatch):
    import sys

    for name in [m for m in sys.modules if m.startswith("aiconfigurator_core")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "aiconfigurator_core", None)  # import fails as when the extra is absent
    r = runner.invoke(app, ["import", "op-model", "Qwen/Qwen3-32B", "--system", "h200_sxm", "--output", str(tmp_path / "p")])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "pip install -e '.[opmodel]'" in lines[0] and not (tmp_path / "p").exists()
