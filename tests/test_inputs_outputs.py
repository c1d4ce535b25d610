"""Outputs: one policy for every writer (jaxsim/outputs.py) — atomic (temp + rename, nothing under the
final name on failure), missing folders created, the extension decides the format or is refused,
files 0644 — plus the bad inputs observed in issue 12 for plot and round."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from jaxsim import outputs
from jaxsim.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
QUERIES = "workload_kind,batch_size,total_prefill_tokens,total_kv_read_tokens\ndecode,4,0,20000\n"


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture(autouse=True)
def _umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_atomic_writer_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "deep" / "er" / "x.csv"
    with pytest.raises(RuntimeError):
        with outputs.atomic_file(target, "w") as f:
            f.write("half")
            f.flush()
            raise RuntimeError("killed")
    assert not target.exists() and list(target.parent.iterdir()) == []
    outputs.write_text(target, "a,b\n")
    assert target.read_text() == "a,b\n" and _mode(target) == 0o644


def test_atomic_dir_replaces_only_when_complete(tmp_path):
    d = tmp_path / "prof"
    with outputs.atomic_dir(d) as tmp:
        (tmp / "a.json").write_text("{}")
    assert (d / "a.json").exists() and _mode(d / "a.json") == 0o644
    with pytest.raises(RuntimeError):
        with outputs.atomic_dir(d) as tmp:
            (tmp / "b.json").write_text("{}")
            raise RuntimeError
    assert sorted(p.name for p in d.iterdir()) == [outputs.MARKER, "a.json"] and sorted(p.name for p in tmp_path.iterdir()) == ["prof"]


@pytest.mark.parametrize("name, ok", [("x.csv", True), ("x.parquet", True), ("x.txt", False), ("x", False), ("x.png", False)])
def test_round_output_format_follows_extension(tmp_path, name, ok):
    """Observed: round --output x.txt wrote CSV into a .txt; a missing folder named the internal .partial file."""
    q = tmp_path / "q.csv"
    q.write_text(QUERIES)
    out = tmp_path / "missing" / name
    r = runner.invoke(app, ["round", "qwen3-32b-bf16-b300", "--tp", "2", "--queries", str(q), "--output", str(out)])
    if ok:
        assert r.exit_code == 0, r.output
        assert out.exists() and _mode(out) == 0o644
        if name.endswith(".parquet"):
            assert pq.read_table(out).num_rows == 1
        else:
            assert out.read_text().startswith("\"workload_kind\"")
        assert [p.name for p in out.parent.iterdir()] == [name]
    else:
        assert r.exit_code == 2 and "is not a format this command writes" in r.stderr and ".partial" not in r.output
        assert not out.parent.exists()


def test_every_writer_creates_missing_folders(tmp_path):
    """One policy: round, replay, trace synth, sweep and plot all create a missing output folder."""
    t = tmp_path / "a" / "t.csv"
    r = runner.invoke(app, ["trace", "synth", "--n", "3", "--isl", "fixed:600", "--osl", "fixed:40", "--output", str(t)])
    assert r.exit_code == 0, r.output
    assert _mode(t) == 0o644
    out = tmp_path / "b" / "r.parquet"
    r = runner.invoke(app, ["replay", str(ROOT / "configs" / "deployment_llama_h200.toml"), "--trace", str(t), "--output", str(out),
                            "--no-progress"])
    assert r.exit_code == 0, r.output
    assert _mode(out) == 0o644 and pq.read_table(out).num_rows == 3
    assert sorted(p.name for p in out.parent.iterdir()) == ["r.parquet"]


def test_replay_refuses_non_parquet_output(tmp_path):
    r = runner.invoke(app, ["replay", str(ROOT / "configs" / "deployment_llama_h200.toml"), "--trace", "mooncake_tiny",
                            "--output", str(tmp_path / "r.csv")])
    assert r.exit_code == 2 and "use .parquet" in r.stderr and not (tmp_path / "r.csv").exists()


def test_output_under_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = runner.invoke(app, ["trace", "synth", "--n", "3", "--output", str(f / "t.csv")])
    assert r.exit_code == 2 and "is a file, not a folder" in r.stderr


@pytest.mark.slow
def test_killed_trace_synth_leaves_nothing_under_the_final_name(tmp_path):
    """Observed: a killed trace synth --n 1e8 left a 785 MB t.csv that looked valid."""
    out = tmp_path / "t.csv"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-m", "jaxsim", "trace", "synth", "--n", "10000000", "--output", str(out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 120
    while time.time() < deadline and not any(p.name.endswith(".partial") for p in tmp_path.iterdir()):
        time.sleep(0.05)
    p.kill()
    p.wait()
    assert not out.exists()


def test_profile_import_files_are_0644_in_a_created_folder(tmp_path):
    """Observed: import output files were mode 0600 (a bare temporary file's mode)."""
    d = ROOT / "tests" / "data" / "fpm_qwen3_32b_tp1_excerpt"
    out = tmp_path / "new" / "my_profile"
    r = runner.invoke(
        app,
        [
            "import",
            "fpm-log",
            str(d / "fpm_metrics_detail.csv"),
            "--model-card",
            str(d / "dynamo_model_card_runtime.json"),
            "--vllm-metadata",
            str(d / "vllm_metadata.json"),
            "--model-revision",
            "abc",
            "--system",
            "b300_sxm",
            "--architecture",
            "Qwen3ForCausalLM",
            "--kv-bytes-per-token",
            "262144",
            "--output",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    names = sorted(p.name for p in out.iterdir())
    assert names == [outputs.MARKER, "fpm_forward_perf.metadata.json", "fpm_forward_perf.parquet", "profile.json"]
    assert all(_mode(out / n) == 0o644 for n in names) and _mode(out) == 0o755
    assert sorted(p.name for p in out.parent.iterdir()) == ["my_profile"]  # no temporary folder left


def test_write_table_extension_decides(tmp_path):
    t = pa.table({"a": [1, 2]})
    outputs.write_table(t, tmp_path / "x.csv")
    assert (tmp_path / "x.csv").read_text().splitlines()[0] == '"a"'
    with pytest.raises(outputs.OutputError):
        outputs.write_table(t, tmp_path / "x.txt")


def test_plot_cdf_refuses_a_sweep_table(tmp_path):
    """Observed: plot cdf sweep.parquet drew an empty CDF, exit 0."""
    pytest.importorskip("matplotlib")
    sweep = tmp_path / "sweep.parquet"
    pq.write_table(pa.table({"config_id": [0, 1], "ttft_ms": [10.0, 20.0], "tpot_ms": [5.0, 6.0], "e2e_ms": [100.0, 200.0],
                             "sla_ok": [True, False]}), sweep)
    out = tmp_path / "cdf.png"
    r = runner.invoke(app, ["plot", "cdf", str(sweep), "--output", str(out)])
    assert r.exit_code == 2 and "a sweep result table" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("blocks", ["-5", "0"])
def test_plot_timeline_refuses_bad_pool_size(tmp_path, blocks):
    """Observed: plot timeline --num-gpu-blocks -5 drew '% of -5 blocks', exit 0."""
    pytest.importorskip("matplotlib")
    tl = tmp_path / "t.parquet"
    pq.write_table(pa.table({"config": ["a"], "seed": [0], "worker": [0], "pass": [0], "time_ms": [1.0], "kv_blocks_used": [3]}), tl)
    out = tmp_path / "kv.png"
    r = runner.invoke(app, ["plot", "timeline", str(tl), "--num-gpu-blocks", blocks, "--output", str(out)])
    assert r.exit_code == 2 and "--num-gpu-blocks: must be an integer >= 1" in r.stderr and not out.exists()


def test_plot_creates_a_missing_folder(tmp_path):
    """One policy for missing output folders: plot (like sweep and import before) creates it, as round,
    replay and trace synth now do."""
    pytest.importorskip("matplotlib")
    import numpy as np

    n = 40
    rng = np.random.default_rng(0)
    sweep = tmp_path / "sweep.parquet"
    pq.write_table(pa.table({
        "config_id": np.arange(n), "workload": ["chat"] * n, "tokens_per_s_per_user": rng.uniform(5, 120, n),
        "output_tokens_per_s_per_gpu": rng.uniform(100, 4000, n), "sla_ok": rng.uniform(size=n) < 0.5,
        "status": np.zeros(n, np.int32), "on_pareto": np.zeros(n, bool),
    }), sweep)
    out = tmp_path / "figs" / "new" / "pareto.png"
    r = runner.invoke(app, ["plot", "pareto", str(sweep), "--output", str(out)])
    assert r.exit_code == 0, r.output
    assert out.is_file() and _mode(out) == 0o644 and [p.name for p in out.parent.iterdir()] == ["pareto.png"]
