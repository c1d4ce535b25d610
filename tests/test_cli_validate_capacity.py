"""``jaxsim validate`` and ``jaxsim capacity`` through Typer's CliRunner and one real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jaxsim.cli.main import app

TABLES = Path(__file__).parent / "goldens" / "public" / "tables"
MODEL = "golden-ckpt/pub-dense-8b"
runner = CliRunner()


def _write(tmp_path: Path, name: str, table: str, extra: str = "") -> Path:
    k = {"sd_k3": 3, "sd_k2": 2}.get(table, 0)
    spec = f"nextn = {k}\naccepted_tokens = 1.0\n" if k else ""
    p = tmp_path / name
    p.write_text(
        f'model = "{MODEL}"\nsystem = "h200_sxm"\nbackend_version = "0.24.0"\n'
        f'profile = "{TABLES / table}"\n{spec}{extra}'
    )
    return p


def test_validate_all_valid(tmp_path):
    a = _write(tmp_path, "a.toml", "ar_core")
    b = _write(tmp_path, "b.toml", "sd_k3")
    res = runner.invoke(app, ["validate", str(a), str(b)])
    assert res.exit_code == 0, res.output
    assert f"{a}: ok" in res.output and f"{b}: ok" in res.output


def test_validate_lists_every_problem_prefixed(tmp_path):
    good = _write(tmp_path, "good.toml", "sd_k2")
    bad = _write(tmp_path, "bad.toml", "sd_k3", 'method = "sol"\nkv_offload = true\n[roles.aggregated]\nmax_num_seqs = 7\n')
    typo = _write(tmp_path, "typo.toml", "ar_core", "nextm = 1\n")
    res = runner.invoke(app, ["validate", str(good), str(bad), str(typo)])
    assert res.exit_code == 2
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(str(bad))]
    rules = {ln[len(str(bad)) + 2:].split(":", 1)[0] for ln in lines}
    assert {"estimator-policy", "kv-offload", "scheduler-envelope"} <= rules
    assert any(ln.startswith(f"{typo}: nextm: unknown key") for ln in res.stdout.splitlines())
    assert f"{good}: ok" in res.stdout


def test_validate_json(tmp_path):
    good = _write(tmp_path, "good.toml", "ar_core")
    bad = _write(tmp_path, "bad.toml", "ar_core", "nextn = 2\naccepted_tokens = 1.0\n")
    res = runner.invoke(app, ["validate", "--json", str(good), str(bad)])
    assert res.exit_code == 2
    doc = json.loads(res.stdout)
    assert doc[str(good)] == {"valid": True, "problems": []}
    assert not doc[str(bad)]["valid"] and doc[str(bad)]["problems"][0].startswith("ar-nextn:")


def test_capacity_json_matches_binding(tmp_path):
    cfg = _write(tmp_path, "sd.toml", "sd_k3")
    res = runner.invoke(app, ["capacity", str(cfg), "--isl", "1024", "--osl", "256", "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    r = rep["roles"]["aggregated"]
    # sd_k3 profile: 33,293,336,576 B pool at 147,456 B/token (capacity golden sd_k3-recorded-defaults)
    assert r["kv_tokens"] == 33293336576 // 147456 == 225784
    assert r["kv_blocks"] == 225784 // 64 == 3527
    assert r["request_blocks"] == -(-(1024 + 256 + 4) // 64) == 21
    assert r["max_concurrency_per_rank"] == min(32, 3527 // 21) == 32
    assert rep["nextn"] == 3 and rep["isl"] == 1024
    assert r["status"] == "ok"  # the capacity status's registry name (jaxsim.kernels.status)


def test_capacity_defaults_to_context_length_and_tables(tmp_path):
    cfg = _write(tmp_path, "ar.toml", "ar_core", "block_size = 16\n")
    res = runner.invoke(app, ["capacity", str(cfg), "--json"])
    rep = json.loads(res.stdout)
    r = rep["roles"]["aggregated"]
    assert rep["isl"] == 32768 and rep["osl"] == 0
    assert r["kv_blocks"] == 294912 // 16 and r["request_blocks"] == 32768 // 16
    assert r["max_concurrency_per_rank"] == 294912 // 32768 == 9
    res = runner.invoke(app, ["capacity", str(cfg), "--isl", "100", "--osl", "28"])
    assert res.exit_code == 0 and "KV blocks" in res.stdout and "18,432" in res.stdout


def test_capacity_refuses_invalid_config(tmp_path):
    cfg = _write(tmp_path, "bad.toml", "sd_k3", "block_size = 0\n")
    res = runner.invoke(app, ["capacity", str(cfg)])
    assert res.exit_code == 2 and res.stderr.startswith(f"error: {cfg}: block-size:")
    res = runner.invoke(app, ["capacity", str(_write(tmp_path, "ok.toml", "ar_core")), "--isl", "5"])
    assert res.exit_code == 2 and "both --isl and --osl" in res.stderr
    res = runner.invoke(app, ["capacity", str(tmp_path / "missing.toml")])
    assert res.exit_code == 2 and "cannot read config" in res.stderr


@pytest.mark.parametrize("cmd", ["validate", "capacity"])
def test_help_has_example(cmd):
    res = runner.invoke(app, [cmd, "--help"])
    assert res.exit_code == 0 and f"jaxsim {cmd} configs/" in res.stdout


@pytest.mark.slow
def test_real_subprocess(tmp_path):
    good = _write(tmp_path, "good.toml", "sd_k2")
    bad = _write(tmp_path, "bad.toml", "sd_k2", 'fallback = "allow"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "jaxsim", "validate", str(good), str(bad)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{bad}: estimator-policy: speculative-round FPM requires" in proc.stdout
    assert f"{good}: ok" in proc.stdout and "1 of 2 config(s) invalid" in proc.stderr
