"""CLI start-up: `jaxsim --help`, `jaxsim profiles list` and `jaxsim validate` import no JAX.

Binding validation is plain Python; only commands that compile kernels import JAX (and turn x64 on).
Each command runs in a fresh interpreter; the test asserts which heavy modules it loaded and that the
command did its job (exit code and output), never how long it took (scripts/bench_startup.py measures).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # subprocesses / whole documents: `pytest -m "not slow"` skips them

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("jax", "jaxlib", "ml_dtypes", "equinox", "jaxtyping", "pandas")

# run the Typer app in-process in a fresh interpreter, then report the exit code and loaded heavy modules
PROBE = f"""
import json, sys
from jaxsim.cli.main import app
code = 0
try:
    app(sys.argv[1:], prog_name="jaxsim")
except SystemExit as e:
    code = e.code or 0
print("\\n@@" + json.dumps({{"code": code, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def _run(*args: str) -> tuple[dict, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out, _, tail = proc.stdout.rpartition("\n@@")
    assert tail, f"probe printed no report (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(tail), out + proc.stderr


@pytest.mark.parametrize(
    ("args", "code", "expect"),
    [
        (("--help",), 0, "validate"),
        (("profiles", "list"), 0, "qwen3-32b-bf16-b300"),
        (("profiles", "list", "--json"), 0, '"name"'),
        (("validate", "configs/deployment_aggregated.toml"), 0, "ok"),
        (("validate", "configs/deployment_speculative.toml", "configs/deployment_disaggregated.toml"), 0, "ok"),
        (("size", "no-such.parquet", "--rate", "20"), 2, "no-such.parquet: no such sweep results file"),
    ],
)
def test_fast_commands_import_no_jax(args, code, expect):
    report, out = _run(*args)
    assert report["code"] == code, out
    assert expect in out
    assert report["heavy"] == [], f"`jaxsim {' '.join(args)}` imported {report['heavy']}"


def test_validate_rejection_imports_no_jax(tmp_path):
    cfg = "nextn = 3\n" + (ROOT / "configs" / "deployment_aggregated.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(cfg)
    report, out = _run("validate", str(bad))
    assert report["code"] == 2, out
    assert "ar-nextn:" in out
    assert report["heavy"] == []


def test_compiled_paths_run_in_float64():
    """Importing a kernel module turns x64 on (the package itself does not import JAX)."""
    probe = (
        "import sys, jaxsim; assert 'jax' not in sys.modules\n"
        "from jaxsim.kernels import rounds\n"
        "import jax, jax.numpy as jnp\n"
        "assert jax.config.read('jax_enable_x64') and jnp.asarray(1.0).dtype == jnp.float64\n"
        "print('ok')"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_ensure_x64_refuses_when_x64_cannot_be_enabled(monkeypatch):
    import jax

    from jaxsim import _jax

    monkeypatch.setattr(jax.config, "update", lambda *a, **k: None)
    monkeypatch.setattr(jax.config, "read", lambda name: False)
    with pytest.raises(RuntimeError, match="jax_enable_x64"):
        _jax.ensure_x64()


def test_a_cached_replay_of_a_mooncake_trace_imports_no_pandas(tmp_path):
    """Reading a trace's hash_ids and the profile table goes through Arrow buffers: pyarrow's ``to_numpy`` would import
    pandas (0.2 s of every warm replay)."""
    out = tmp_path / "r.parquet"
    report, text = _run("replay", "configs/routing_mooncake.toml", "--trace", "mooncake_conversation_1k",
                        "--max-requests", "20", "--output", str(out), "--no-progress", "--allow-incomplete")
    assert report["code"] == 0, text
    assert out.is_file() and "cache" in text.lower()
    assert "pandas" not in report["heavy"], text
