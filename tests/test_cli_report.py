"""The main job's output (issue 12): unsupported workloads named, non-measured rows marked, columns
explained, the next command printed; result tables stay readable when piped."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from jaxsim.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_sweep_report_names_unsupported_workloads_and_marks_sources(tmp_path):
    spec = tmp_path / "s.toml"
    text = (ROOT / "configs" / "planner_qwen3_32b.toml").read_text().replace('"qwen3-32b-bf16-b300-calibrated"', '"qwen3-32b-bf16-b300"')
    text = text.replace('tp = [2, 4]\n', 'tp = [2, 4]\n\n[[profile]]\nname = "qwen3-32b-bf16-b300-eagle3-k1"\nlabel = "k1"\ntp = [2]\n', 1)
    # an open-loop benchmark: the measured profile prefilled one prompt at a time, so a closed loop's prompt waves
    # lie outside its support; without waves its rows are priced (and their TTFT is a number, not a leaked NaN)
    text = text.replace("[sla]", '[speculation]\nnextn = ["profile"]\nacceptance = [1.0]\n\n'
                        '[[workload]]\nname = "mooncake"\ntrace = "mooncake_conversation_1k"\nbins = 2\n\n'
                        '[benchmark]\nload = "poisson"\nrequest_rate = 2.0\n\n[sla]')
    spec.write_text(text)
    out = tmp_path / "o.parquet"
    r = runner.invoke(app, ["sweep", str(spec), "--output", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    text = r.stdout
    assert "workload mooncake is unsupported: none of its" in text
    assert "per workload" in text and "most common refusal" in text
    assert "columns: conc = concurrency per worker reached/target" in text
    assert "not measured: rows with source derived" in text
    import pyarrow.parquet as pq

    rows = pq.read_table(out).to_pylist()
    assert any(r["sla_ok"] for r in rows) and all(r["mean_ttft_ms"] == r["mean_ttft_ms"] for r in rows if r["sla_ok"])
    assert text.rstrip().splitlines()[-1].startswith(f"next: jaxsim sweep {spec} --output {out} --force --verify-top 3 ")
    assert "…" not in text  # piped: the tables are not cut to 80 columns


def test_replay_table_is_not_cut_when_piped(tmp_path):
    """Observed: piped, replay tables were cut to 80 columns ('conf…', '200/…')."""
    t = tmp_path / "t.csv"
    t.write_text("arrival_ms,input_length,output_length\n0,600,40\n10,700,40\n")
    r = runner.invoke(app, ["replay", str(ROOT / "configs" / "deployment_llama_h200.toml"), "--trace", str(t),
                            "--output", str(tmp_path / "r.parquet"), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "deployment_llama_h200" in r.stdout and "2/2" in r.stdout and "…" not in r.stdout


def test_profiles_presets_lists_acceptance_presets():
    import json

    from jaxsim.acceptance import list_presets

    r = runner.invoke(app, ["profiles", "presets"])
    assert r.exit_code == 0 and all(p.name in r.stdout for p in list_presets())
    r = runner.invoke(app, ["profiles", "presets", "--json"])
    assert [p["name"] for p in json.loads(r.stdout)] == [p.name for p in list_presets()]
