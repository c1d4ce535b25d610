"""Trace loaders, synthetic arrivals, scaling/truncation and one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from jaxsim.errors import QueryError
from jaxsim.replay.traces import (
    gamma_trace,
    list_traces,
    load_trace,
    make_trace,
    poisson_trace,
    request_bucket,
    sample_lengths,
    write_trace_csv,
)


def test_bundled_traces_load_with_attribution():
    names = list_traces()
    assert names == ["azure_code_1k", "azure_conv_1k", "mooncake_conversation_1k", "mooncake_tiny"]
    for name in names:
        t = load_trace(name)
        assert len(t) == (16 if name == "mooncake_tiny" else 1000)
        assert t.arrival_ms[0] == 0.0 and np.all(np.diff(t.arrival_ms) >= 0)
        assert t.input_tokens.min() >= 1 and t.output_tokens.min() >= 1
    from importlib import resources

    readme = resources.files("jaxsim").joinpath("data", "traces", "README.md").read_text()
    assert "Splitwise" in readme and "CC-BY-4.0" in readme and "Apache-2.0" in readme


def test_azure_timestamps_are_exact_differences(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n"
                 "2023-11-16 18:17:04.0319600,3180,8\n2023-11-16 18:18:04.0319601,7,1\n")
    t = load_trace(p)
    assert t.arrival_ms.tolist() == [0.0, 52.0, 60052.0001]
    assert t.input_tokens.tolist() == [4808, 3180, 7] and t.output_tokens.tolist() == [10, 8, 1]
    code = load_trace("azure_code_1k")
    assert code.arrival_ms[1] == 52.0 and code.input_tokens[0] == 4808


def test_mooncake_and_plain_formats(tmp_path):
    m = tmp_path / "m.jsonl"
    m.write_text("\n".join(json.dumps({"timestamp": ts, "input_length": i, "output_length": o, "hash_ids": [1]})
                           for ts, i, o in ((10, 100, 5), (3, 50, 2), (10, 70, 1))) + "\n")
    t = load_trace(m)
    assert t.arrival_ms.tolist() == [0.0, 7.0, 7.0]  # sorted (stable) and rebased to the first arrival
    assert t.input_tokens.tolist() == [50, 100, 70] and t.row.tolist() == [1, 0, 2]
    j = tmp_path / "p.jsonl"
    j.write_text('{"arrival_ms": 0.5, "input_length": 3, "output_length": 4}\n')
    assert load_trace(j).input_tokens.tolist() == [3]
    c = tmp_path / "p.csv"
    write_trace_csv(t, c)
    back = load_trace(c)
    assert back.arrival_ms.tolist() == t.arrival_ms.tolist() and back.output_tokens.tolist() == t.output_tokens.tolist()
    assert load_trace(m, fmt="mooncake", max_requests=2).input_tokens.tolist() == [50, 100]


@pytest.mark.parametrize(
    "name,text,needle",
    [
        ("x.csv", "arrival_ms,input_length,output_length\n0,10,5\n1,abc,5\n", "row 2: input_length='abc'"),
        ("x.csv", "arrival_ms,input_length,output_length\n0,10,0\n", "row 1: output_length=0 must be an integer in 1..10,000,000"),
        ("x.csv", "arrival_ms,input_length\n0,10\n", "missing column 'output_length'"),
        ("x.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_length": 5}\n',
         "row 2: missing field 'output_length'"),
        ("x.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\nnot json\n', "row 2: invalid JSON"),
        ("x.jsonl", '{"timestamp": "nan", "input_length": 5, "output_length": 1}\n', "row 1: timestamp='nan' must be finite"),
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,4,1\nyesterday,4,1\n", "row 2: TIMESTAMP='yesterday'"),
        ("x.jsonl", '{"arrival_ms": -1, "input_length": 5, "output_length": 1}\n', "row 1: arrival time -1.0"),
        ("x.txt", "hello\n", "unknown trace format"),
    ],
)
def test_bad_rows_raise_one_line_errors(tmp_path, name, text, needle):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(QueryError) as e:
        load_trace(p)
    msg = str(e.value)
    assert needle in msg and str(p) in msg and "\n" not in msg


def test_missing_trace_names_the_bundled_ones(tmp_path):
    with pytest.raises(QueryError, match="azure_code_1k"):
        load_trace(tmp_path / "nope.csv")


def test_scaling_truncation_and_window():
    t = load_trace("azure_conv_1k", time_scale=0.5, max_requests=10)
    full = load_trace("azure_conv_1k")
    assert len(t) == 10
    np.testing.assert_allclose(t.arrival_ms, full.arrival_ms[:10] * 0.5)
    w = full.window(5000.0)
    assert w.arrival_ms.max() <= 5000.0 and len(w) == int(np.sum(full.arrival_ms <= 5000.0))
    with pytest.raises(QueryError):
        full.scaled(0.0)


def test_poisson_rate_and_lengths():
    t = poisson_trace(4000, 20.0, "uniform:100:200", "fixed:7", seed=3)
    gaps = np.diff(t.arrival_ms)
    assert abs(gaps.mean() - 50.0) < 50.0 * 4 / np.sqrt(len(gaps))
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.08
    assert t.input_tokens.min() >= 100 and t.input_tokens.max() <= 200 and set(t.output_tokens.tolist()) == {7}
    again = poisson_trace(4000, 20.0, "uniform:100:200", "fixed:7", seed=3)
    assert np.array_equal(again.arrival_ms, t.arrival_ms)


@settings(max_examples=20, deadline=None)
@given(hst.floats(0.2, 4.0), hst.integers(0, 2**31 - 1))
def test_gamma_cv(cv, seed):
    t = gamma_trace(3000, 10.0, cv, "lognormal:512:0.5", "exponential:64", seed=seed)
    gaps = np.diff(t.arrival_ms)
    assert abs(gaps.std() / gaps.mean() - cv) < 0.25 * cv
    assert t.input_tokens.min() >= 1 and t.output_tokens.min() >= 1


def test_length_specs():
    rng = np.random.default_rng(0)
    assert sample_lengths(5, 3, rng).tolist() == [5, 5, 5]
    assert set(sample_lengths([3, 9], 50, rng).tolist()) <= {3, 9}
    assert sample_lengths("normal:2:50", 50, rng).min() == 1  # the tail is cut to the tokens range
    for bad in ("zipf:2", "uniform:5", "uniform:9:3", "lognormal:-1:1", "fixed:x", "fixed:-5", "fixed:2.5", "normal:-50:1",
                "uniform:0:4", "fixed:10000001"):
        with pytest.raises(QueryError):
            sample_lengths(bad, 2, rng)


def test_requests_padding():
    t = make_trace("t", [0.0, 1.0, 1.0], [4, 5, 6], [1, 2, 3])
    rq = t.requests()
    assert rq.size == request_bucket(3) == 16
    assert np.asarray(rq.valid).sum() == 3 and np.isinf(np.asarray(rq.arrival_ms)[3:]).all()
    assert request_bucket(1000) == 1024
    with pytest.raises(QueryError):
        t.requests(pad_to=2)


VARIANTS = [
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n2023-11-16T18:17:04,3180.0,8\n"
              "2023-11-16 18:17:01.5,7,1\n"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n2023-11-16T18:17:04,3180.0,8\n"
              "2023-11-16 18:17:04.1234567891,7,1\n"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-02-30 18:17:03,4,1\n"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n 2023-11-16 18:17:03 ,4,1\n"),
    ("p.csv", "arrival_ms,input_length,output_length,extra\n5,10,2,x\n\n1.5,1e3,3,y\n"),
    ("p.csv", "arrival_ms,input_length,output_length\r\n0,10,2\r\n1, 11,3\r\n"),
    ("p.csv", "arrival_ms,input_length,output_length\n0,10,2\n1,,3\n"),
    ("p.csv", "arrival_ms,input_length,output_length\n0,10,2\n1,2.5,3\n"),
    ("p.csv", "arrival_ms,input_length,output_length\n0,10,2\n1,99999999999999999999,3\n"),
    ("p.csv", "arrival_ms,input_length,output_length\n0,10,2\n-1,5,3\n"),
    ("p.csv", "arrival_ms,input_length,output_length\n0,10,2\ninf,5,3\n"),
    ("p.csv", "arrival_ms,input_length,output_length\n0,10\n"),
    ("p.csv", "arrival_ms,input_length,output_length\n"),
    ("m.jsonl", '{"timestamp": 3, "input_length": 5, "output_length": 1, "hash_ids": [1, 2]}\n\n'
                '{"timestamp": 1.5, "input_length": 5.0, "output_length": 2}\n'),
    ("m.jsonl", '{"timestamp": 0, "input_length": "5", "output_length": 1}\n'),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": true}\n'),
    ("m.jsonl", '{"timestamp": 0, "timestamp": 4, "input_length": 5, "output_length": 1}\n'),
    ("m.jsonl", '{"timestamp": NaN, "input_length": 5, "output_length": 1}\n'),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n[1, 2]\n'),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 0, "input_length": 0, "output_length": 1}\n'),
    ("j.jsonl", '{"arrival_ms": 0.25, "input_length": 5, "output_length": 1}\n{"arrival_ms": 0, "input_length": 6, "output_length": null}\n'),
]


def _outcome(path, fmt):
    try:
        t = load_trace(path, fmt=fmt)
    except QueryError as e:
        return str(e)
    return (t.arrival_ms.tolist(), t.input_tokens.tolist(), t.output_tokens.tolist(), t.row.tolist(),
            t.input_tokens.dtype, t.output_tokens.dtype)


@pytest.mark.parametrize("i", range(len(VARIANTS)))
def test_pyarrow_path_agrees_with_the_row_reader(tmp_path, monkeypatch, i):
    """Files are read by pyarrow; whatever it does not take exactly as it is goes to the row reader, so
    accepted values and every error (naming the row) are the same with the pyarrow path switched off."""
    from jaxsim.replay import traces

    name, text = VARIANTS[i]
    p = tmp_path / name
    p.write_text(text)
    fmt = {"a": "azure", "p": "csv", "m": "mooncake", "j": "jsonl"}[name[0]]
    fast = _outcome(p, fmt)
    monkeypatch.setattr(traces, "_arrow_csv", lambda *a: None)
    monkeypatch.setattr(traces, "_arrow_jsonl", lambda *a: None)
    assert _outcome(p, fmt) == fast
    if isinstance(fast, str):
        assert "\n" not in fast and str(p) in fast


def test_bundled_traces_are_read_by_pyarrow(monkeypatch):
    """The bundled traces take the pyarrow path (the row reader is never called) and give the row reader's values."""
    from jaxsim.replay import traces

    fast = {n: load_trace(n) for n in list_traces()}
    monkeypatch.setattr(traces, "_read_csv_rows", lambda *a: pytest.fail("row reader used"))
    monkeypatch.setattr(traces, "_read_jsonl", lambda *a: pytest.fail("row reader used"))
    for n in list_traces():
        load_trace(n)
    monkeypatch.undo()
    monkeypatch.setattr(traces, "_arrow_csv", lambda *a: None)
    monkeypatch.setattr(traces, "_arrow_jsonl", lambda *a: None)
    for n, t in fast.items():
        slow = load_trace(n)
        assert np.array_equal(slow.arrival_ms, t.arrival_ms) and np.array_equal(slow.row, t.row)
        assert np.array_equal(slow.input_tokens, t.input_tokens) and np.array_equal(slow.output_tokens, t.output_tokens)
