"""``jaxsim profiles`` and ``jaxsim import`` through the Typer app and one real subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jaxsim.cli.main import app
from jaxsim.data.registry import resolve_profile

EXCERPT = Path(__file__).parent / "data" / "fpm_qwen3_32b_tp1_excerpt"
REV = "0123456789abcdef0123456789abcdef01234567"
runner = CliRunner()


def _import_args(out: Path, *extra: str) -> list[str]:
    return [
        "import", "fpm-log", str(EXCERPT / "fpm_metrics_detail.csv"), "--model-card", str(EXCERPT / "dynamo_model_card_runtime.json"),
        "--vllm-metadata", str(EXCERPT / "vllm_metadata.json"), "--system", "b300_sxm", "--architecture", "Qwen3ForCausalLM",
        "--kv-bytes-per-token", "262144", "--output", str(out), *extra,
    ]


def test_profiles_list_marks_derived_profiles():
    r = runner.invoke(app, ["profiles", "list", "--json"])
    assert r.exit_code == 0, r.output
    items = {p["name"]: p for p in json.loads(r.output)}
    assert items["qwen3-32b-bf16-b300-eagle3-k2"]["kind"] == "derived"
    assert items["qwen3-32b-bf16-b300"]["kind"] == "measured" and items["qwen3-32b-bf16-b300"]["tps"] == [1, 2, 4]
    r = runner.invoke(app, ["profiles", "list"])
    assert r.exit_code == 0 and "derived" in r.output and "llama-3.1-8b-fp8-h200" in r.output


@pytest.mark.slow
def test_profiles_list_piped_keeps_whole_names():
    """Observed (issue 28): piped, `profiles list` cut names at rich's default 80 columns ("qwen3-32b-bf16-b3…")."""
    import os

    from jaxsim.data.registry import list_bundled

    r = subprocess.run([sys.executable, "-m", "jaxsim", "profiles", "list"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "80", "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout
    for p in list_bundled():
        assert f" {p.name} " in r.stdout and f" {p.model} " in r.stdout, p.name


def test_profiles_show_reports_support_provenance_and_licence():
    r = runner.invoke(app, ["profiles", "show", "qwen3-32b-bf16-b300", "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert [d["tp"] for d in info["deployments"]] == [1, 2, 4]
    s = info["deployments"][0]["support"]
    assert s["decode_batches"] == list(range(1, 33)) and s["decode_kv_range"][0] < s["decode_kv_range"][1]
    assert info["deployments"][0]["resources"]["kv_cache_tokens"] == 723_056
    assert "Apache-2.0" in info["licence"] and "inferred" in info["provenance"]
    r = runner.invoke(app, ["profiles", "show", "qwen3-32b-bf16-b300-eagle3-k1"])
    assert r.exit_code == 0 and "DERIVED" in r.output and "Licence" in r.output
    r = runner.invoke(app, ["profiles", "show", "no-such-profile"])
    assert r.exit_code == 2 and r.output.startswith("error:") and "qwen3-32b-bf16-b300" in r.output


def test_profiles_validate_exit_codes(tmp_path):
    r = runner.invoke(app, ["profiles", "validate", "llama-3.1-8b-fp8-h200"])
    assert r.exit_code == 0 and r.output.strip().endswith(": ok")
    bad = tmp_path / "bad"
    shutil.copytree(resolve_profile("qwen3-32b-bf16-b300"), bad)
    side = bad / "fpm_forward_perf.metadata.json"
    doc = json.loads(side.read_text())
    doc["row_count"] += 1
    side.write_text(json.dumps(doc))
    prof = json.loads((bad / "profile.json").read_text())
    prof["model_revision"] = "main"
    (bad / "profile.json").write_text(json.dumps(prof))
    r = runner.invoke(app, ["profiles", "validate", str(bad)])
    assert r.exit_code == 2
    lines = [ln for ln in r.stdout.splitlines() if ln]
    assert len(lines) >= 2 and any("row_count" in ln for ln in lines) and any("model_revision" in ln for ln in lines)


def test_import_fpm_log_writes_summarizes_and_refuses_overwrite(tmp_path):
    out = tmp_path / "prof"
    r = runner.invoke(app, _import_args(out))
    assert r.exit_code == 2 and "--model-revision" in r.output and not out.exists()
    r = runner.invoke(app, _import_args(out, "--model-revision", REV, "--json"))
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert summary["rows_read"] == 1200 and summary["dropped"]["mis_split_admission"] > 0
    assert summary["rows_used"] + sum(summary["dropped"].values()) + summary["mixed_kept_out"] == 1200
    r = runner.invoke(app, ["profiles", "validate", str(out)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, _import_args(out, "--model-revision", REV))
    assert r.exit_code == 2 and "exists" in r.output
    r = runner.invoke(app, _import_args(out, "--model-revision", REV, "--force", "--kv-bin-tokens", "1024"))
    assert r.exit_code == 0 and "rows read" in r.output and "coverage" in r.output


def test_import_dynamo_planner(tmp_path):
    d = tmp_path / "planner"
    d.mkdir()
    (d / "prefill.csv").write_text("isl_tokens,ttft_ms,prefill_tokens_per_s_per_gpu\n100,10,1\n2000,40,1\n")
    (d / "decode.csv").write_text(
        "kv_usage_fraction,context_length_tokens,itl_ms,decode_tokens_per_s_per_gpu,max_kv_tokens\n"
        "0.001,1000,5,1,1000000\n0.02,1000,6,1,1000000\n0.08,1000,9,1,1000000\n"
    )
    out = tmp_path / "out"
    base = ["import", "dynamo-planner", str(d), "--output", str(out), "--model", "org/m"]
    r = runner.invoke(app, base)
    assert r.exit_code == 2 and "--model-revision" in r.output
    r = runner.invoke(app, base + ["--model-revision", "r", "--system", "h200_sxm", "--backend-version", "0.11.0",
                                   "--architecture", "LlamaForCausalLM", "--kv-bytes-per-token", "131072",
                                   "--context-length", "4096", "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["decode_batches"] == [1, 2, 4, 8, 16, 32, 64] and s["prefill_rows"] == 2
    assert runner.invoke(app, ["profiles", "validate", str(out)]).exit_code == 0


@pytest.mark.slow
def test_subprocess_profiles_validate_and_list():
    r = subprocess.run([sys.executable, "-m", "jaxsim", "profiles", "validate", "qwen3-32b-bf16-b300-eagle3-k3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith(": ok")
    r = subprocess.run([sys.executable, "-m", "jaxsim", "profiles", "validate", "/nonexistent/dir"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error:")


@pytest.mark.parametrize("cmd", [["profiles", "list"], ["profiles", "show"], ["profiles", "validate"],
                                 ["import", "fpm-log"], ["import", "dynamo-planner"]])
def test_every_command_has_help_with_an_example(cmd):
    r = runner.invoke(app, [*cmd, "--help"])
    assert r.exit_code == 0 and "Example" in r.output
