"""Streaming sweep runs: every config kept, resume is byte-identical, no overwrite, 4 devices == 1 device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import jaxsim._jax  # noqa: F401  (turns x64 on)
from jaxsim.kernels import status
from jaxsim.sweep import OutputExistsError, SpecError, plan_sweep, run_sweep
from jaxsim.sweep.run import pareto_mask, top_mask, work_dir_for
from jaxsim.sweep.spec import spec_from_dict

TABLES = Path(__file__).parent / "goldens" / "public" / "tables"


def spec_dict(**over) -> dict:
    d = {
        "name": "golden",
        "gpu_budget": 4,
        "kv_transfer_gbps": 40,
        "profile": [{"name": str(TABLES / "ar_core"), "label": "ar"}, {"name": str(TABLES / "sd_k3"), "label": "sd3"}],
        "serving": {"mode": ["aggregated", "disaggregated"], "ratios": ["1:1", "1:3"]},
        "speculation": {"acceptance": [1.5, [0.8, 0.6, 0.4]]},
        "scheduler": {"concurrency": [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]},
        "workload": [{"name": "a", "isl": [128, 700], "osl": [64, 300]}, {"name": "m", "requests": [[256, 100, 1], [1500, 200, 1]]}],
        "sla": {"mean_ttft_ms": 800, "mean_tpot_ms": 25},
    }
    d.update(over)
    return d


def toml(d: dict) -> str:
    out = []
    for k in ("name", "gpu_budget", "kv_transfer_gbps"):
        if k in d:
            out.append(f"{k} = {json.dumps(d[k])}")
    for p in d["profile"]:
        out.append("[[profile]]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in p.items()))
    for sec in ("serving", "speculation", "scheduler", "sla"):
        if sec in d:
            out.append(f"[{sec}]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in d[sec].items()))
    for w in d["workload"]:
        out.append("[[workload]]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in w.items()))
    return "\n\n".join(out) + "\n"


@pytest.fixture(scope="module")
def spec_path(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("spec") / "golden.toml"
    p.write_text(toml(spec_dict()))
    return p


@pytest.fixture(scope="module")
def reference(spec_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "ref.parquet"
    res = run_sweep(spec_path, out, csv=True, top=3, devices=jax.devices()[:1])
    assert res.num_devices == 1
    return res, out


def test_every_valid_config_has_one_row_with_inputs_metrics_status(reference):
    res, out = reference
    t = pq.read_table(out)
    plan = res.plan
    assert t.num_rows == plan.num_configs == res.summary["configs_evaluated"]
    np.testing.assert_array_equal(t.column("config_id").to_numpy(), np.arange(plan.num_configs))
    for c in ("profile", "mode", "tp", "nextn", "acceptance", "concurrency_target", "workload", "isl_mean", "status", "status_name",
              "mean_ttft_ms", "mean_tpot_ms", "output_tokens_per_s_per_gpu", "tokens_per_s_per_user", "sla_ok", "on_pareto"):
        assert c in t.column_names, c
    st = t.column("status").to_numpy()
    assert (st >= 16).any() and (st < 16).any()
    assert np.isnan(t.column("mean_ttft_ms").to_numpy()[st >= 16]).all()
    names = t.column("status_name").to_pylist()
    assert names == [status.name(c) for c in st] and not any(n.startswith("unknown") for n in names)
    assert sum(res.summary["status_counts"].values()) == t.num_rows
    assert not work_dir_for(out).exists()
    csv = pacsv.read_csv(out.with_suffix(".csv"))
    assert csv.num_rows == t.num_rows and csv.column_names == t.column_names
    meta = json.loads(pq.read_schema(out).metadata[b"jaxsim.sweep"])
    assert meta["summary"]["configs_evaluated"] == plan.num_configs


def test_pareto_and_top_are_per_workload_and_sla_feasible(reference):
    res, out = reference
    t = pq.read_table(out)
    ok = t.column("sla_ok").to_numpy(zero_copy_only=False)
    on = t.column("on_pareto").to_numpy(zero_copy_only=False)
    assert on.any() and not (on & ~ok).any()
    x, y = t.column("tokens_per_s_per_user").to_numpy(), t.column("output_tokens_per_s_per_gpu").to_numpy()
    wl = t.column("workload").combine_chunks().indices.to_numpy()
    for g in np.unique(wl[ok]):
        f = ok & (wl == g)
        for i in np.flatnonzero(on & (wl == g)):  # nobody in the workload dominates a frontier point
            assert not ((x[f] >= x[i]) & (y[f] >= y[i]) & ((x[f] > x[i]) | (y[f] > y[i]))).any()
        best = np.flatnonzero(f)[np.argmax(y[f])]
        assert on[best]
    assert res.pareto.num_rows == int(on.sum())
    top = res.top.to_pylist()
    assert max(sum(r["workload"] == w for r in top) for w in {r["workload"] for r in top}) <= 3
    assert all(r["sla_ok"] for r in top)


def test_pareto_and_top_masks():
    x = np.array([1.0, 2.0, 3.0, 2.0, 1.0, 5.0])
    y = np.array([3.0, 2.0, 1.0, 1.0, 3.0, 9.0])
    ids = np.arange(6)
    g = np.array([0, 0, 0, 0, 0, 1])
    np.testing.assert_array_equal(pareto_mask(x, y, ids, g), [True, True, True, False, False, True])
    np.testing.assert_array_equal(top_mask(y, ids, g, 2), [True, False, False, False, True, True])
    np.testing.assert_array_equal(top_mask(y, ids, g, 3), [True, True, False, False, True, True])


def test_killed_run_resumes_to_a_byte_identical_result(reference, spec_path, tmp_path):
    _, ref_out = reference
    out = tmp_path / "ref.parquet"  # same file name: the parquet metadata carries no path of the output

    class Killed(Exception):
        pass

    def kill_after_two(k):
        if k >= 1:
            raise Killed

    with pytest.raises(Killed):
        run_sweep(spec_path, out, csv=True, top=3, on_chunk=kill_after_two, devices=jax.devices()[:1])
    assert not out.exists()
    finished = sorted(p.name for p in work_dir_for(out).glob("chunk-*.arrow"))
    assert len(finished) == 2
    res = run_sweep(spec_path, out, csv=True, top=3, devices=jax.devices()[:1])
    assert res.chunks_reused == 2 and res.chunks_run == res.summary["chunks"] - 2
    assert out.read_bytes() == ref_out.read_bytes()
    assert out.with_suffix(".csv").read_bytes() == ref_out.with_suffix(".csv").read_bytes()


def test_results_are_never_overwritten_without_force(spec_path, tmp_path):
    out = tmp_path / "r.parquet"
    out.write_bytes(b"precious")
    with pytest.raises(OutputExistsError, match="exists; pass --force"):
        run_sweep(spec_path, out)
    assert out.read_bytes() == b"precious"
    (tmp_path / "c.csv").write_text("precious")
    with pytest.raises(OutputExistsError):
        run_sweep(spec_path, tmp_path / "c.parquet", csv=True)
    res = run_sweep(spec_path, out, force=True)
    assert pq.read_table(out).num_rows == res.plan.num_configs


def test_a_foreign_work_directory_is_not_reused(spec_path, tmp_path):
    """Another sweep's work directory (jaxsim's marker, another manifest) is refused, discarded with --force;
    a folder jaxsim did not write is never used nor removed, --force or not."""
    from jaxsim.outputs import MARKER

    out = tmp_path / "r.parquet"
    work = work_dir_for(out)
    work.mkdir()
    (work / "manifest.json").write_text('{"format": "something else"}')
    for force in (False, True):
        with pytest.raises(OutputExistsError, match="not a sweep work directory jaxsim wrote"):
            run_sweep(spec_path, out, force=force)
    assert (work / "manifest.json").read_text() == '{"format": "something else"}'
    (work / MARKER).write_text("")
    with pytest.raises(OutputExistsError, match="different sweep"):
        run_sweep(spec_path, out)
    run_sweep(spec_path, out, force=True)
    assert out.exists() and not work.exists()


def test_strict_refuses_invalid_combinations(tmp_path):
    s = spec_from_dict(spec_dict(speculation={"nextn": ["profile", 2], "acceptance": [1.0]}), source="x.toml")
    assert plan_sweep(s).invalid
    with pytest.raises(SpecError, match="--strict"):
        run_sweep(s, tmp_path / "r.parquet", strict=True)
    assert not (tmp_path / "r.parquet").exists()


@pytest.mark.slow
def test_sharding_over_four_devices_equals_one_device(reference, spec_path, tmp_path):
    """The config axis split over 4 host devices (a subprocess) gives the 1-device file byte for byte."""
    _, ref_out = reference
    code = textwrap.dedent(
        f"""
        import jax, jaxsim
        from jaxsim.sweep import run_sweep
        assert len(jax.devices()) == 4
        r = run_sweep({str(spec_path)!r}, {str(tmp_path / 'four.parquet')!r}, top=3)
        print(r.num_devices)
        """
    )
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["4"]
    assert (tmp_path / "four.parquet").read_bytes() == ref_out.read_bytes()
