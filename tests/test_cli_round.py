"""End-to-end tests of ``jaxsim round`` through CliRunner and a real subprocess."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from jaxsim.cli.main import app

GOLDENS = Path(__file__).parent / "goldens" / "public"
AR = GOLDENS / "tables" / "ar_core"
SD = GOLDENS / "tables" / "sd_k3"
runner = CliRunner()


def _golden_queries(table: str, n: int = 60):
    look = json.loads((GOLDENS / "lookups.json").read_text())["tables"][table]
    rows = []
    for q in look["decode"][:n]:
        rows.append(
            {
                "workload_kind": "decode",
                "batch_size": q["batch_size"],
                "total_prefill_tokens": 0,
                "total_kv_read_tokens": q["total_kv_read_tokens"],
                "want": q["result"],
            }
        )
    for q in look["prefill"][:n]:
        rows.append(
            {
                "workload_kind": "prefill",
                "batch_size": q["batch_size"],
                "total_prefill_tokens": q["total_prefill_tokens"],
                "total_kv_read_tokens": q["total_kv_read_tokens"],
                "want": q["result"],
            }
        )
    return rows


def _write_csv(path: Path, rows, extra=()):
    cols = ["workload_kind", "batch_size", "total_prefill_tokens", "total_kv_read_tokens", *extra]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def test_round_csv_matches_goldens(tmp_path):
    rows = _golden_queries("ar_core")
    _write_csv(tmp_path / "q.csv", rows)
    res = runner.invoke(app, ["round", str(AR), "--queries", str(tmp_path / "q.csv"), "--output", str(tmp_path / "o.csv")])
    assert res.exit_code == 0, res.output
    out = list(csv.DictReader((tmp_path / "o.csv").open()))
    assert len(out) == len(rows)
    for row, got in zip(rows, out):
        want = row["want"]
        if want["status"] == "ok":
            assert float(got["latency_ms"]) == pytest.approx(want["latency_ms"], rel=1e-9)
            assert got["status"] == want["resolution"]
        else:
            assert got["latency_ms"] == "" and got["status"].startswith("unsupported:")


def test_round_parquet_mixed_and_speculative(tmp_path):
    q = pa.table({
        "workload_kind": ["mixed", "decode", "mixed"],
        "batch_size": [1, 4, 0],
        "total_prefill_tokens": [512, 0, 0],
        "total_kv_read_tokens": [0, 4096, 0],
        "num_decode_requests": [4, None, 4],
        "total_decode_kv_tokens": [4096, None, 4096],
    })
    pq.write_table(q, tmp_path / "q.parquet")
    res = runner.invoke(app, ["round", str(SD), "-q", str(tmp_path / "q.parquet"), "-o", str(tmp_path / "o.parquet")])
    assert res.exit_code == 0, res.output
    out = pq.read_table(tmp_path / "o.parquet").to_pylist()
    assert out[0]["status"] == "unsupported:speculative_round_has_no_mixed_composition" and out[0]["latency_ms"] is None
    # a pure-decode "mixed" row is the measured round itself, at the actual batch
    assert out[2]["latency_ms"] == out[1]["latency_ms"] and out[1]["latency_ms"] > 0


@pytest.mark.parametrize(
    "content, needle",
    [
        ("workload_kind,batch_size,total_prefill_tokens\ndecode,1,0\n", "missing column(s) total_kv_read_tokens"),
        ("workload_kind,batch_size,total_prefill_tokens,total_kv_read_tokens\nverify,1,0,5\n", "row 1: workload_kind='verify'"),
        ("workload_kind,batch_size,total_prefill_tokens,total_kv_read_tokens\ndecode,1,0,5\ndecode,-2,0,5\n", "row 2: batch_size=-2"),
        ("workload_kind,batch_size,total_prefill_tokens,total_kv_read_tokens\ndecode,1.5,0,5\n", "batch_size must hold integers"),
        ("workload_kind,batch_size,total_prefill_tokens,total_kv_read_tokens\ndecode,1,0,5\n\ndecode,abc,0,5\n",
         "row 2: column batch_size must hold integers (found 'abc')"),
        ("workload_kind,batch_size,total_prefill_tokens,total_kv_read_tokens\ndecode,1,0,5\ndecode,1,0\n", "row 2: expected 4 fields"),
        ("workload_kind,batch_size,total_prefill_tokens,total_kv_read_tokens,num_decode_requests,total_decode_kv_tokens\n"
         "decode,1,0,5,,\nmixed,1,5,5,x,3\n", "row 2: column num_decode_requests must hold integers (found 'x')"),
        ("workload_kind,batch_size,total_prefill_tokens,total_kv_read_tokens\ndecode,1,7,5\n", "row 1: decode rows have total_prefill_tokens = 0"),
        ("workload_kind,batch_size,total_prefill_tokens,total_kv_read_tokens\nmixed,1,7,5\n", "mixed rows need column num_decode_requests"),
    ],
)
def test_bad_query_files_get_one_line_errors(tmp_path, content, needle):
    (tmp_path / "q.csv").write_text(content)
    res = runner.invoke(app, ["round", str(AR), "-q", str(tmp_path / "q.csv"), "-o", str(tmp_path / "o.csv")])
    assert res.exit_code == 2
    assert needle in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "o.csv").exists()


def test_output_never_overwritten_without_force(tmp_path):
    _write_csv(tmp_path / "q.csv", _golden_queries("ar_core", 3))
    (tmp_path / "o.csv").write_text("precious\n")
    res = runner.invoke(app, ["round", str(AR), "-q", str(tmp_path / "q.csv"), "-o", str(tmp_path / "o.csv")])
    assert res.exit_code == 2 and "--force" in res.output
    assert (tmp_path / "o.csv").read_text() == "precious\n"
    res = runner.invoke(app, ["round", str(AR), "-q", str(tmp_path / "q.csv"), "-o", str(tmp_path / "o.csv"), "--force"])
    assert res.exit_code == 0 and (tmp_path / "o.csv").read_text() != "precious\n"


def test_bad_profile_dir_and_deployment_choice(tmp_path):
    _write_csv(tmp_path / "q.csv", _golden_queries("ar_core", 3))
    res = runner.invoke(app, ["round", str(tmp_path / "nope"), "-q", str(tmp_path / "q.csv"), "-o", str(tmp_path / "o.csv")])
    assert res.exit_code == 2 and "nope" in res.output
    res = runner.invoke(app, ["round", str(AR), "--tp", "2", "-q", str(tmp_path / "q.csv"), "-o", str(tmp_path / "o.csv")])
    assert res.exit_code == 2 and "no deployment matches tp=2" in res.output


@pytest.mark.slow
def test_round_real_subprocess(tmp_path):
    _write_csv(tmp_path / "q.csv", _golden_queries("sd_k2", 10))
    proc = subprocess.run(
        [sys.executable, "-m", "jaxsim", "round", str(GOLDENS / "tables" / "sd_k2"), "-q", str(tmp_path / "q.csv"), "-o", str(tmp_path / "o.csv")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "answered" in proc.stdout
    assert len((tmp_path / "o.csv").read_text().splitlines()) == 21
    proc = subprocess.run(
        [sys.executable, "-m", "jaxsim", "round", "x", "-q", "y.csv", "-o", str(tmp_path / "o.csv")], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_streamed_batches_keep_row_numbers_and_leave_nothing_on_error(tmp_path, monkeypatch):
    import jaxsim.round_queries as Q

    monkeypatch.setattr(Q, "CHUNK", 4)  # force several streamed batches
    rows = _golden_queries("ar_core", 6)
    _write_csv(tmp_path / "q.csv", rows)
    res = runner.invoke(app, ["round", str(AR), "-q", str(tmp_path / "q.csv"), "-o", str(tmp_path / "o.parquet")])
    assert res.exit_code == 0, res.output
    out = pq.read_table(tmp_path / "o.parquet").to_pylist()
    assert [r["batch_size"] for r in out] == [r["batch_size"] for r in rows]
    for row, got in zip(rows, out):
        if row["want"]["status"] == "ok":
            assert got["latency_ms"] == pytest.approx(row["want"]["latency_ms"], rel=1e-9)
    bad = tmp_path / "bad.parquet"
    t = pa.table({"workload_kind": ["decode"] * 9, "batch_size": [1, 2, 3, 4, 5, 6, 7, -1, 9],
                  "total_prefill_tokens": [0] * 9, "total_kv_read_tokens": [100] * 9})
    pq.write_table(t, bad, row_group_size=4)
    res = runner.invoke(app, ["round", str(AR), "-q", str(bad), "-o", str(tmp_path / "o2.parquet")])
    assert res.exit_code == 2 and "row 8: batch_size=-1" in res.output
    assert not (tmp_path / "o2.parquet").exists() and not (tmp_path / "o2.parquet.partial").exists()


def test_unreadable_row_past_the_first_block_is_named(tmp_path):
    """pyarrow reads query files in 8 MiB blocks with types inferred from the first; a bad value in a later
    block fails the read without a row number, so the row is located and named."""
    from jaxsim.errors import QueryError
    from jaxsim.query_files import stream_queries

    n = 700_000  # > 8 MiB of rows
    p = tmp_path / "q.csv"
    p.write_text("workload_kind,batch_size,total_prefill_tokens,total_kv_read_tokens\n" + "decode,1,0,5\n" * n + "decode,1,0,x\n")
    with pytest.raises(QueryError) as e:
        for _ in stream_queries(p, 1 << 18):
            pass
    assert str(e.value) == f"{p}: row {n + 1}: column total_kv_read_tokens must hold integers (found 'x')"


def test_counts_beyond_32_bits_are_refused_row_by_row(tmp_path):
    """The FPM query fields are unsigned 32-bit: the reference refuses a count or sum >= 2**32 (OverflowError
    or 'expected u32'), so jaxsim refuses those rows too, even where it would otherwise answer (a prefill row
    with no new tokens is 0 ms at any past KV), and answers 2**32 - 1 and every other row as before."""
    top = 2**32
    good = _golden_queries("ar_core", 3)
    rows = [
        *good,
        {"workload_kind": "prefill", "batch_size": 1, "total_prefill_tokens": 0, "total_kv_read_tokens": top - 1},
        {"workload_kind": "prefill", "batch_size": 1, "total_prefill_tokens": 0, "total_kv_read_tokens": top},
        {"workload_kind": "decode", "batch_size": top, "total_prefill_tokens": 0, "total_kv_read_tokens": 0},
        {"workload_kind": "prefill", "batch_size": 1, "total_prefill_tokens": top, "total_kv_read_tokens": 0},
        {"workload_kind": "mixed", "batch_size": 0, "total_prefill_tokens": 0, "total_kv_read_tokens": 0,
         "num_decode_requests": 1, "total_decode_kv_tokens": top},
        {"workload_kind": "mixed", "batch_size": 0, "total_prefill_tokens": 0, "total_kv_read_tokens": 0,
         "num_decode_requests": top, "total_decode_kv_tokens": 10},
    ]
    for r in rows:
        r.setdefault("num_decode_requests", 0)
        r.setdefault("total_decode_kv_tokens", 0)
    _write_csv(tmp_path / "q.csv", rows, extra=("num_decode_requests", "total_decode_kv_tokens"))
    res = runner.invoke(app, ["round", str(AR), "--queries", str(tmp_path / "q.csv"), "--output", str(tmp_path / "o.csv")])
    assert res.exit_code == 0, res.output
    out = list(csv.DictReader((tmp_path / "o.csv").open()))
    n = len(good)
    for row, got in zip(good, out[:n]):
        if row["want"]["status"] == "ok":
            assert float(got["latency_ms"]) == pytest.approx(row["want"]["latency_ms"], rel=1e-9)
    assert out[n]["status"] == "no_prefill_work" and float(out[n]["latency_ms"]) == 0.0
    assert [o["status"] for o in out[n + 1:]] == ["unsupported:count_beyond_32_bits"] * 5
    assert all(o["latency_ms"] == "" for o in out[n + 1:])
