"""``jaxsim sweep`` through Typer's CliRunner and as a real subprocess on the bundled quickstart spec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_sweep_run import spec_dict, toml
from typer.testing import CliRunner

from jaxsim.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("cli") / "golden.toml"
    p.write_text(toml(spec_dict()))
    return p


def test_sweep_writes_results_and_prints_frontier(spec, tmp_path):
    out = tmp_path / "r.parquet"
    plot = tmp_path / "pareto.png"
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--csv", "--top", "2", "--plot", str(plot), "--quiet"])
    assert r.exit_code == 0, r.output
    assert "Pareto frontier" in r.output and "SLA-feasible" in r.output and "configs/s" in r.output
    assert out.exists() and out.with_suffix(".csv").exists() and plot.read_bytes()[:4] == b"\x89PNG"
    n = pq.read_metadata(out).num_rows
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(out)])
    assert r.exit_code == 2 and "exists; pass --force" in r.output
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--force", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)  # progress lines (every 10 s) go to stderr
    assert rep["configs_evaluated"] == n and rep["configs_total"] == n + rep["configs_invalid"]
    assert rep["pareto"] and all(p["sla_ok"] for p in rep["pareto"]) and rep["chunks_run"] >= 1


def test_default_output_is_refused_like_every_other_output(spec, tmp_path, monkeypatch):
    """Observed (issue 28): the default output auto-numbered (golden.results.1.parquet, ...) while every other
    command refuses an existing file. Now the default name is refused too, and --force overwrites it with the
    same (deterministic) bytes; nothing else is written."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["sweep", str(spec), "--quiet"])
    assert r.exit_code == 0, r.output
    before = (tmp_path / "golden.results.parquet").read_bytes()
    r = runner.invoke(app, ["sweep", str(spec), "--quiet"])
    assert r.exit_code == 2 and r.output.strip() == "error: golden.results.parquet: exists; pass --force to overwrite"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["golden.results.parquet"]
    assert (tmp_path / "golden.results.parquet").read_bytes() == before
    r = runner.invoke(app, ["sweep", str(spec), "--quiet", "--force"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "golden.results.parquet").read_bytes() == before  # deterministic bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["golden.results.parquet"]


def test_no_verification_hint_when_nothing_is_feasible(tmp_path):
    """Observed (issue 28): `next: ... --verify-top 3` was suggested when no configuration met the SLA."""
    spec = tmp_path / "tight.toml"
    spec.write_text(toml(spec_dict(sla={"max_ttft_ms": 0.001}, serving={"mode": ["aggregated"]})))
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(tmp_path / "t.parquet"), "--quiet"])
    assert r.exit_code == 0, r.output
    assert "no configuration meets the SLA" in r.output and "--verify-top" not in r.output
    assert "next: no configuration met the SLA; loosen [sla] in" in r.output


def test_progress_is_a_plain_line_on_stderr_off_a_terminal(spec, tmp_path, monkeypatch):
    """Observed (issue 28): sweep progress only on a terminal, nothing in a piped or CI run. Off a terminal
    it is now a line on stderr (every 10 s; here every chunk); --quiet turns it off."""
    import jaxsim.progress

    monkeypatch.setattr(jaxsim.progress, "PROGRESS_INTERVAL_S", 0.0)
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(tmp_path / "p.parquet"), "--chunk-size", "256"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("sweep: ")]
    n = pq.read_metadata(tmp_path / "p.parquet").num_rows
    assert len(lines) >= 2 and lines[-1].startswith(f"sweep: {n:,} / {n:,} configs (100 %), ") and "configs/s" in lines[-1]
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(tmp_path / "p.parquet"), "--force", "--quiet"])
    assert r.exit_code == 0 and "sweep: " not in r.stderr


def test_progress_lines_print_at_most_every_interval():
    import io

    from jaxsim.progress import ProgressLines

    now = [0.0]
    out = io.StringIO()
    p = ProgressLines("replay", 100, "replicas", interval_s=10.0, stream=out, clock=lambda: now[0])
    for _ in range(10):
        now[0] += 4.0
        p.advance(10)
    assert out.getvalue().splitlines() == ["replay: 30 / 100 replicas (30 %), 12 s", "replay: 60 / 100 replicas (60 %), 24 s",
                                           "replay: 90 / 100 replicas (90 %), 36 s"]


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--plot", "p.txt"], "use a .png file name"),
        (["-o", "r.csv"], "use a .parquet file name"),
        (["--top", "0"], "--top: must be an integer >= 1"),
        (["--chunk-size", "0"], "--chunk-size must be >= 1"),
    ],
)
def test_bad_options_exit_2(spec, tmp_path, args, msg):
    r = runner.invoke(app, ["sweep", str(spec), *[a if a.startswith("-") or a.isdigit() else str(tmp_path / a) for a in args]])
    assert r.exit_code == 2 and msg in r.output


def test_strict_and_bad_specs_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    d = spec_dict(speculation={"nextn": ["profile", 2], "acceptance": [1.0]})
    bad.write_text(toml(d))
    r = runner.invoke(app, ["sweep", str(bad), "-o", str(tmp_path / "x.parquet"), "--strict"])
    assert r.exit_code == 2 and r.output.startswith("error: ") and "--strict" in r.output
    assert "sd-nextn" in r.output or "ar-nextn" in r.output
    bad.write_text(toml(spec_dict()) + "\n[surprise]\nx = 1\n")
    r = runner.invoke(app, ["sweep", str(bad)])
    assert r.exit_code == 2 and "surprise: unknown key" in r.output and r.output.count("\n") == 1
    r = runner.invoke(app, ["sweep", str(tmp_path / "missing.toml")])
    assert r.exit_code == 2 and "no such sweep spec" in r.output


def test_help_has_an_example():
    r = runner.invoke(app, ["sweep", "--help"])
    assert r.exit_code == 0 and "jaxsim sweep configs/quickstart.toml" in r.output


@pytest.mark.slow
def test_quickstart_runs_in_a_real_subprocess(tmp_path):
    """The README's first command, on the bundled profiles."""
    env = dict(os.environ, JAXSIM_CACHE_DIR=str(tmp_path / "xla"))
    cmd = [sys.executable, "-m", "jaxsim", "sweep", str(ROOT / "configs" / "quickstart.toml"), "--top", "1"]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "sweep quickstart" in r.stdout and "Pareto frontier" in r.stdout
    t = pq.read_table(tmp_path / "quickstart.results.parquet", columns=["sla_ok", "on_pareto", "profile", "nextn"])
    assert t.num_rows >= 5000
    assert sum(t.column("sla_ok").to_pylist()) > 0 and sum(t.column("on_pareto").to_pylist()) > 0
    assert set(t.column("nextn").to_pylist()) == {0, 1, 2, 3}


def test_many_workloads_get_one_best_per_workload_table(tmp_path):
    """More than MAX_WORKLOAD_TABLES workloads: one row per workload (its best SLA-feasible row, the
    same as the first row of its top table) instead of two tables each; --all-tables prints them all."""
    from jaxsim.cli.cmd_sweep import MAX_WORKLOAD_TABLES

    d = spec_dict(workload=[{"name": "g", "isl": [128, 256, 512], "osl": [64, 128, 300]}], sla={"mean_ttft_ms": 5000, "mean_tpot_ms": 100})
    p = tmp_path / "many.toml"
    p.write_text(toml(d))
    r = runner.invoke(app, ["sweep", str(p), "-o", str(tmp_path / "r.parquet"), "--quiet", "--top", "3"])
    assert r.exit_code == 0, r.output
    assert 9 > MAX_WORKLOAD_TABLES
    assert "best SLA-feasible configuration per workload" in r.output and "9 workloads" in r.output
    assert "Pareto frontier" not in r.output and "--all-tables" in r.output
    best = r.output[r.output.index("best SLA-feasible"):]
    for wl in ("g-128x64", "g-512x300"):
        assert wl in best
    full = runner.invoke(app, ["sweep", str(p), "-o", str(tmp_path / "r.parquet"), "--force", "--quiet", "--top", "3", "--all-tables"])
    assert full.exit_code == 0, full.output
    assert full.output.count("Pareto frontier") == 9 and "best SLA-feasible configuration per workload" not in full.output
    top_first = json.loads(runner.invoke(app, ["sweep", str(p), "-o", str(tmp_path / "r.parquet"), "--force", "--json"]).stdout)["top"]
    first = {}
    for row in top_first:
        first.setdefault(row["workload"], row)
    for wl, row in first.items():  # the compact table's row per workload is the top table's first row
        line = next(ln for ln in best.splitlines() if f" {wl} " in ln)
        assert f"{row['output_tokens_per_s_per_gpu']:,.1f}" in line


def test_rows_whose_requests_outgrow_the_pool_in_step_are_flagged_and_counted(tmp_path):
    """A pool that holds 8 requests on average (ISL + OSL/2) but not at their peak (ISL + OSL): the steady-state
    rows at 7-8 clients are flagged ``kv_preemption`` (the rows below are not), and the CLI says how many."""
    import shutil

    prof = tmp_path / "small_pool"
    shutil.copytree(ROOT / "tests" / "goldens" / "public" / "tables" / "ar_core", prof)
    doc = json.loads((prof / "profile.json").read_text())
    res = doc["deployments"][0]["resources"]
    pool_blocks = 840  # of 16 tokens; a request of 500 in / 1,500 out holds 79 blocks on average, 125 at its peak
    res["runtime_memory"]["kv_cache_bytes"] = pool_blocks * 16 * res["kv_bytes_per_token"]
    res["runtime_memory"]["max_model_len"] = 4096
    (prof / "profile.json").write_text(json.dumps(doc))
    spec = tmp_path / "pool.toml"
    spec.write_text(toml(spec_dict(profile=[{"name": str(prof), "label": "ar"}], serving={"mode": ["aggregated"]},
                                   speculation={}, scheduler={"concurrency": [1, 2, 4, 6, 7, 8]},
                                   workload=[{"name": "long", "isl": 500, "osl": 1500}], sla={})))
    out = tmp_path / "r.parquet"
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    rows = pq.read_table(out).to_pylist()
    answered = [x for x in rows if not x["status_name"].startswith("unsupported")]
    assert answered, rows
    for x in answered:
        assert x["kv_preemption"] == (x["concurrency"] * 125 > pool_blocks), x
    flagged = sum(x["kv_preemption"] for x in rows)
    assert flagged >= 1 and json.loads(r.stdout)["kv_preemption_steady_rows"] == flagged
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--force"])
    assert r.exit_code == 0 and f"KV preemption not modelled: in {flagged} steady-state rows" in " ".join(r.output.split())
    # --evaluate auto replays exactly the flagged rows, each as --evaluate replay replays it; the others stay steady
    auto, full = tmp_path / "auto.parquet", tmp_path / "replay.parquet"
    for how, path in (("auto", auto), ("replay", full)):
        r = runner.invoke(app, ["sweep", str(spec), "-o", str(path), "--evaluate", how, "--json"])
        assert r.exit_code == 0, r.output
    by_id = lambda p: {x["config_id"]: x for x in pq.read_table(p).to_pylist()}  # noqa: E731
    steady, a, f = by_id(out), by_id(auto), by_id(full)
    assert a.keys() == steady.keys() == f.keys()
    for cid, x in steady.items():
        want = f[cid] if x["kv_preemption"] else x
        assert a[cid]["method"] == ("replay" if x["kv_preemption"] else "steady"), cid
        for k in ("status_name", "mean_ttft_ms", "mean_tpot_ms", "p90_ttft_ms", "output_tokens_per_s_per_gpu", "kv_preemption"):
            assert a[cid][k] == want[k] or (a[cid][k] != a[cid][k] and want[k] != want[k]), (cid, k)
    assert sum(x["method"] == "replay" for x in a.values()) == flagged
