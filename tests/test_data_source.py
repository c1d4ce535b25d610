"""Provenance everywhere: every profile has a data source (measured, derived, modelled, calibrated), stored in
profile.json, shown by ``profiles list/show`` and carried into round, sweep and replay outputs as a column."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from jaxsim.cli.main import app
from jaxsim.data.registry import resolve_profile
from jaxsim.errors import ProfileError
from jaxsim.profile import load_profile_dir
from jaxsim.profile.model import DATA_SOURCES, infer_data_source, parse_profile_text

runner = CliRunner()


@pytest.fixture(scope="module")
def modelled(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ds") / "qwen-h200"
    r = runner.invoke(app, ["import", "op-model", "Qwen/Qwen3-32B", "--system", "h200_sxm", "--tp", "1", "--output", str(out),
                            "--max-num-seqs", "16", "--max-num-batched-tokens", "2048", "--max-model-len", "8192",
                            "--max-prefill-batch", "4"])
    assert r.exit_code == 0, r.output
    return out


def _profile_obj(name: str) -> dict:
    return json.loads((resolve_profile(name) / "profile.json").read_text())


def test_stored_value_round_trips_and_bad_values_are_refused_naming_the_field():
    obj = _profile_obj("qwen3-32b-bf16-b300")
    assert "data_source" not in obj  # written before the field existed: inferred from its provenance
    assert parse_profile_text(json.dumps(obj)).source == "measured"
    for src in DATA_SOURCES:
        p = parse_profile_text(json.dumps({**obj, "data_source": src}))
        assert p.source == src and p.data_source == src
        assert parse_profile_text(p.to_json()).to_json() == p.to_json()  # save -> load -> save identical
    with pytest.raises(ProfileError, match=r"profile.json: data_source: must be 'measured' or 'derived' or 'modelled' or 'calibrated'"):
        parse_profile_text(json.dumps({**obj, "data_source": "guessed"}))


def test_old_profiles_are_inferred_from_their_provenance():
    assert load_profile_dir(resolve_profile("qwen3-32b-bf16-b300-eagle3-k2")).profile.source == "derived"
    assert load_profile_dir(resolve_profile("llama-3.1-8b-fp8-h200")).profile.source == "measured"
    assert infer_data_source("MODELLED, NOT MEASURED: ...") == "modelled"
    assert infer_data_source("  calibrated: ...") == "calibrated"
    assert infer_data_source("Imported by jaxsim from an FPM log; the word DERIVED later does not count") == "measured"


def test_profiles_list_and_show(modelled):
    r = runner.invoke(app, ["profiles", "list", "--json"])
    assert r.exit_code == 0, r.output
    items = {p["name"]: p["data_source"] for p in json.loads(r.output)}
    assert items["qwen3-32b-bf16-b300"] == "measured" and items["qwen3-32b-bf16-b300-eagle3-k1"] == "derived"
    r = runner.invoke(app, ["profiles", "show", str(modelled), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["data_source"] == "modelled"
    assert json.loads((modelled / "profile.json").read_text())["data_source"] == "modelled"  # stored, not inferred
    r = runner.invoke(app, ["profiles", "show", str(modelled)])
    assert r.exit_code == 0 and "data source: modelled" in r.output
    r = runner.invoke(app, ["profiles", "show", "qwen3-32b-bf16-b300-eagle3-k1"])
    assert r.exit_code == 0 and "data source: derived" in r.output


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_round_output_carries_the_data_source(modelled, tmp_path, suffix):
    q = tmp_path / "q.csv"
    q.write_text("workload_kind,batch_size,total_prefill_tokens,total_kv_read_tokens\ndecode,4,0,4096\nprefill,1,512,0\ndecode,99,0,10\n")
    for profile, want in ((str(modelled), "modelled"), ("qwen3-32b-bf16-b300", "measured")):
        out = tmp_path / f"{want}{suffix}"
        r = runner.invoke(app, ["round", profile, "--tp", "1", "--queries", str(q), "--output", str(out)])
        assert r.exit_code == 0, r.output
        assert f"({want})" in r.output
        rows = pq.read_table(out).to_pylist() if suffix == ".parquet" else list(csv.DictReader(out.open()))
        assert [x["data_source"] for x in rows] == [want] * 3


def test_sweep_and_replay_outputs_carry_the_data_source(modelled, tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text(
        f'name = "ds"\n\n[[profile]]\nname = "{modelled}"\nlabel = "modelled-h200"\n\n[[profile]]\nname = "qwen3-32b-bf16-b300"\n'
        'label = "measured-b300"\ntp = [1]\n\n[serving]\nmode = ["aggregated"]\n\n[scheduler]\nconcurrency = [1, 2, 4]\n\n'
        '[[workload]]\nname = "w"\nisl = [512]\nosl = [64]\n'
    )
    out = tmp_path / "r.parquet"
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    t = pq.read_table(out).to_pylist()
    assert {(x["profile"], x["data_source"]) for x in t} == {("modelled-h200", "modelled"), ("measured-b300", "measured")}

    cfg = tmp_path / "d.toml"
    cfg.write_text(f'model = "Qwen/Qwen3-32B"\nsystem = "h200_sxm"\nbackend_version = "0.24.0"\nprofile = "{modelled}"\n'
                   'mode = "aggregated"\nblock_size = 16\n\n[roles.aggregated]\ntp = 1\n')
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_ms,input_length,output_length\n0,600,20\n50,300,10\n120,1000,5\n")
    out = tmp_path / "replay.parquet"
    r = runner.invoke(app, ["replay", str(cfg), "--trace", str(trace), "--output", str(out), "--timeline", "--json", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert set(pq.read_table(out).column("data_source").to_pylist()) == {"modelled"}
    assert set(pq.read_table(out.with_name("replay.timeline.parquet")).column("data_source").to_pylist()) == {"modelled"}
    assert json.loads(r.output[r.output.index("["):] if r.output.lstrip().startswith("[") else r.output)


def test_every_bundled_profile_states_the_data_source_its_index_lists():
    from jaxsim.data.registry import list_bundled

    for b in list_bundled():
        prof = parse_profile_text((b.path / "profile.json").read_text())
        assert prof.source == b.kind, b.name
