"""Fuzzing the CLI (issue 12, item 7): hypothesis throws malformed deployment configs, sweep specs,
profile JSON/parquet, traces and query files at the commands. A refusal is always exit 2 with ONE line
on stderr, never a traceback, and nothing is written under the output name. Inputs that happen to be
valid may succeed (exit 0); nothing else is allowed."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from jaxsim.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
AGG = (ROOT / "configs" / "deployment_aggregated.toml").read_text()
PLANNER = (ROOT / "configs" / "planner_qwen3_32b.toml").read_text()
LLAMA = ROOT / "jaxsim" / "data" / "profiles" / "llama-3.1-8b-fp8-h200"
runner = CliRunner()
# CI: 25 fixed (derandomized) examples per test; JAXSIM_FUZZ_EXAMPLES=N runs N random ones locally
_N = os.environ.get("JAXSIM_FUZZ_EXAMPLES")
FUZZ = settings(max_examples=int(_N or 25), deadline=None, suppress_health_check=list(HealthCheck), derandomize=_N is None,
                database=None)


def _refused_cleanly(r, out: Path | None = None, allow_ok: bool = False) -> None:
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    if allow_ok and r.exit_code in (0, 3):  # a valid input (3: a replay that stopped outside support)
        return
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    if out is not None:
        assert not out.exists()
        assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]  # no temporary left


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return str(v)


# values that are wrong for every numeric key they replace (type, sign, range or finiteness)
BAD = st.one_of(
    st.integers(max_value=0), st.integers(min_value=10**13, max_value=10**30), st.sampled_from([float("nan"), float("inf"), -1.5]),
    st.text(max_size=8), st.booleans(), st.just([]),
)
GARBAGE = st.one_of(st.binary(max_size=200), st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass")))


@FUZZ
@given(key=st.sampled_from(["tp", "replicas", "max_num_seqs", "max_num_batched_tokens"]), value=BAD)
def test_fuzz_deployment_config_role_values(key, value):
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "c.toml"
        text = AGG.replace("replicas = 1\n", "replicas = 1\n" if key != "replicas" else "")
        text = text.replace("tp = 1 ", "" if key == "tp" else "tp = 1 ")
        cfg.write_text(text.replace("[roles.aggregated]\n", f"[roles.aggregated]\n{key} = {_toml(value)}\n"))
        _refused_cleanly(runner.invoke(app, ["capacity", str(cfg), "--isl", "1000", "--osl", "100"]))


@FUZZ
@given(data=GARBAGE)
def test_fuzz_deployment_config_garbage(data):
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "c.toml"
        cfg.write_bytes(data)
        out = Path(d) / "o.parquet"
        _refused_cleanly(runner.invoke(app, ["replay", str(cfg), "--trace", "mooncake_tiny", "--output", str(out)]), out)


SPEC_KEYS = {
    "block_size": ("block_size = 16", "block_size = {}"),
    "gpu_budget": ("gpu_budget = 8 ", "gpu_budget = {} "),
    "tp": ("tp = [2, 4]", "tp = [{}]"),
    "concurrency": ("concurrency = [1, 2, 4, 8, 12, 16, 20, 24, 28, 32]", "concurrency = [{}]"),
    "isl": ("isl = 4096", "isl = {}"),
    "osl": ("osl = 512", "osl = {}"),
    "p90_ttft_ms": ("p90_ttft_ms = 2000.0", "p90_ttft_ms = {}"),
    "mode": ('mode = ["aggregated"]', "mode = [{}]"),
}


@FUZZ
@given(key=st.sampled_from(sorted(SPEC_KEYS)), value=BAD)
def test_fuzz_sweep_spec_values(key, value):
    old, new = SPEC_KEYS[key]
    assert old in PLANNER
    with tempfile.TemporaryDirectory() as d:
        spec = Path(d) / "s.toml"
        spec.write_text(PLANNER.replace(old, new.format(_toml(value)), 1))
        out = Path(d) / "o.parquet"
        _refused_cleanly(runner.invoke(app, ["sweep", str(spec), "--output", str(out), "--quiet"]), out)


@FUZZ
@given(data=GARBAGE, truncate=st.integers(min_value=0, max_value=len(PLANNER) - 1))
def test_fuzz_sweep_spec_garbage_and_truncation(data, truncate):
    with tempfile.TemporaryDirectory() as d:
        for i, blob in enumerate((data, PLANNER[:truncate].encode() + data)):
            spec = Path(d) / f"s{i}.toml"
            spec.write_bytes(blob)
            out = Path(d) / f"o{i}.parquet"
            r = runner.invoke(app, ["sweep", str(spec), "--output", str(out), "--quiet"])
            _refused_cleanly(r, out, allow_ok=i == 1)  # a truncation can end on a complete, valid spec


def _json_paths(obj, path=()):
    yield path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _json_paths(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _json_paths(v, path + (i,))


PROFILE = json.loads((LLAMA / "profile.json").read_text())
PROFILE_PATHS = [p for p in _json_paths(PROFILE) if p]
JSON_BAD = st.one_of(st.none(), st.integers(min_value=-(10**20), max_value=10**20), st.floats(allow_nan=False),
                     st.text(max_size=6), st.booleans(), st.just([]), st.just({}))


def _round(profile_dir: Path, d: Path):
    q = d / "q.csv"
    q.write_text("workload_kind,batch_size,total_prefill_tokens,total_kv_read_tokens\ndecode,4,0,4000\n")
    out = d / "out.csv"
    return runner.invoke(app, ["round", str(profile_dir), "--queries", str(q), "--output", str(out)]), out


@FUZZ
@given(path=st.sampled_from(PROFILE_PATHS), value=JSON_BAD)
def test_fuzz_profile_json(path, value):
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        prof = d / "p"
        shutil.copytree(LLAMA, prof)
        doc = json.loads(json.dumps(PROFILE))
        node = doc
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        (prof / "profile.json").write_text(json.dumps(doc))
        r, out = _round(prof, d)
        _refused_cleanly(r, out, allow_ok=True)


@FUZZ
@given(which=st.sampled_from(["fpm_forward_perf.parquet", "fpm_forward_perf.metadata.json", "profile.json"]),
       cut=st.floats(min_value=0.0, max_value=0.99), junk=st.binary(max_size=64))
def test_fuzz_profile_files_corrupted(which, cut, junk):
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        prof = d / "p"
        shutil.copytree(LLAMA, prof)
        raw = (prof / which).read_bytes()
        (prof / which).write_bytes(raw[: int(len(raw) * cut)] + junk)
        r, out = _round(prof, d)
        _refused_cleanly(r, out, allow_ok=True)
        r = runner.invoke(app, ["profiles", "validate", str(prof)])
        assert r.exit_code in (0, 2) and "Traceback" not in r.output


# cells wrong for every trace column (arrival, input, output) and every numeric query column
CELL_BAD = st.one_of(st.sampled_from(["", "x", "-1", "nan", "inf", "-inf", "1e400", " ", "--", "0x10"]),
                     st.text(alphabet="abcxyz_-", min_size=1, max_size=6))


@FUZZ
@given(rows=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 5000), st.integers(1, 500)), min_size=0, max_size=5),
       bad_row=st.integers(0, 5), bad_col=st.integers(0, 2), bad=st.one_of(CELL_BAD, st.sampled_from(["0", "99999999999", "2.5"])))
def test_fuzz_trace_files(rows, bad_row, bad_col, bad):
    cells = [[str(a), str(b), str(c)] for a, b, c in rows] + [["0", "100", "10"]]
    i = min(bad_row, len(cells) - 1)
    if bad_col == 0 and bad in ("0", "99999999999", "2.5"):  # valid arrival times; lengths are bad then
        bad_col = 1 if bad != "0" else 2
    cells[i][bad_col] = bad
    text = "arrival_ms,input_length,output_length\n" + "\n".join(",".join(r) for r in cells) + "\n"
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        t = d / "t.csv"
        t.write_text(text)
        out = d / "o.parquet"
        r = runner.invoke(app, ["replay", str(ROOT / "configs" / "deployment_llama_h200.toml"), "--trace", str(t), "--output", str(out)])
        _refused_cleanly(r, out)


@FUZZ
@given(col=st.integers(0, 3), bad=CELL_BAD, kind=st.sampled_from(["decode", "prefill", "mixed", "x", ""]))
def test_fuzz_query_files(col, bad, kind):
    row = [kind, "4", "0" if kind == "decode" else "512", "4000"]
    row[col] = bad if col else row[col]
    text = "workload_kind,batch_size,total_prefill_tokens,total_kv_read_tokens\n" + ",".join(row) + "\n"
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        q = d / "q.csv"
        q.write_text(text)
        out = d / "out.csv"
        r = runner.invoke(app, ["round", "llama-3.1-8b-fp8-h200", "--queries", str(q), "--output", str(out)])
        _refused_cleanly(r, out, allow_ok=True)
