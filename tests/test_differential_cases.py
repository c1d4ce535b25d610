"""The reference's answers on minimal reproductions of every rule where jaxsim once disagreed with it.

Each case (tests/data/differential_cases/, see PROVENANCE.md there) holds a table, queries and what the
reference answered or refused. jaxsim must take the same decision and, for answers, give the latency to
1e-9 relative; tables the reference refuses to build must be refused at load, and by the CLI with one
line and exit code 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from jaxsim import query_files
from jaxsim.cli.main import app
from jaxsim.errors import JaxsimError
from jaxsim.kernels import queries
from jaxsim.kernels import status as st
from jaxsim.kernels.tables import load_round_table

CASES = Path(__file__).parent / "data" / "differential_cases"
BUNDLED = {"F1-real-bundled-qwen3-32b-tp1": ("qwen3-32b-bf16-b300", {"tp": 1})}
runner = CliRunner()


def _cases():
    return sorted(p.name for p in CASES.iterdir() if (p / "reference.json").is_file())


def _profile(case: str):
    if case in BUNDLED:
        return BUNDLED[case]
    return CASES / case / "table", {}


def test_every_case_is_here():
    names = _cases()
    assert len(names) == 10
    assert {"F1-mixed-negative-marginal", "F2-decode-batch-zero", "F4-sums-without-requests", "L2-prefill-row-with-zero-tokens"} <= set(names)


@pytest.mark.parametrize("case", [c for c in _cases() if json.loads((CASES / c / "reference.json").read_text())["reference_load"] == "accepted"])
def test_answers_match_reference(case):
    ref = json.loads((CASES / case / "reference.json").read_text())
    profile, want = _profile(case)
    table, _ = load_round_table(profile, **want)
    q = query_files.read_queries(CASES / case / "queries.csv")
    lat, code = queries.evaluate(table, q)
    assert len(ref["answers"]) == lat.size
    for a, got, c in zip(ref["answers"], lat, code):
        label = f"{case} {a['kind']} {a['query']}: {st.name(int(c))}"
        if a["status"] == "ok":
            assert c < st.FIRST_UNSUPPORTED, label
            assert got == pytest.approx(a["latency_ms"], rel=1e-9, abs=0.0), label
            assert got >= 0.0, label
        else:
            assert c >= st.FIRST_UNSUPPORTED and np.isnan(got), label


def test_mixed_is_clamped_where_decode_dips_below_its_baseline():
    # decode(4, 220) = 9.75 < decode(4, 40) = 10.0: the marginal decode cost is 0, not −0.25
    table, _ = load_round_table(CASES / "F1-mixed-negative-marginal" / "table")
    from jaxsim.kernels import rounds

    one = lambda *v: [np.array([x], np.int64) for x in v]
    d, _ = rounds.decode_batch(table, *one(4, 220))
    base, _ = rounds.decode_batch(table, *one(4, 40))
    p, _ = rounds.prefill_batch(table, *one(1, 100, 0))
    m, code = rounds.mixed_batch(table, *one(1, 100, 0, 4, 220))
    assert float(d[0]) < float(base[0])
    assert int(code[0]) == st.COMPOSED and float(m[0]) == float(p[0])


def test_degenerate_statuses_are_distinct():
    table, _ = load_round_table(CASES / "F3-zero-new-prefill-tokens" / "table")
    q = query_files.read_queries(CASES / "F3-zero-new-prefill-tokens" / "queries.csv")
    _, code = queries.evaluate(table, q)
    names = [st.name(int(c)) for c in code]
    assert names[:5] == ["no_prefill_work"] * 4 + ["empty_iteration"]
    assert names[-1] == "unsupported:fewer_prefill_tokens_than_requests"
    table, _ = load_round_table(CASES / "F4-sums-without-requests" / "table")
    q = query_files.read_queries(CASES / "F4-sums-without-requests" / "queries.csv")
    _, code = queries.evaluate(table, q)
    assert {st.name(int(c)) for c in code} == {"unsupported:token_sum_without_requests"}


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("L1-table-without-prefill-rows", "no genuine prefill measurements"),
        ("L1b-table-without-decode-rows", "no genuine decode measurements"),
        ("L2-prefill-row-with-zero-tokens", "row 11: total_prefill_tokens: prefill point with no prefill tokens"),
    ],
)
def test_tables_the_reference_refuses_are_refused_at_load(case, needle, tmp_path):
    ref = json.loads((CASES / case / "reference.json").read_text())
    assert ref["reference_load"] != "accepted"
    with pytest.raises(JaxsimError, match=needle):
        load_round_table(CASES / case / "table")
    res = runner.invoke(app, ["round", str(CASES / case / "table"), "-q", str(CASES / case / "queries.csv"), "-o", str(tmp_path / "o.csv")])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output
    assert not (tmp_path / "o.csv").exists()


def test_a_worker_role_needs_only_its_own_phase(tmp_path):
    # the reference builds a decode worker from decode rows alone (and a prefill worker from prefill rows)
    table, _ = load_round_table(CASES / "L1-table-without-prefill-rows" / "table", role="decode")
    from jaxsim.kernels import rounds

    lat, code = rounds.decode_batch(table, np.array([4]), np.array([400]))
    assert int(code[0]) == st.EXACT and float(lat[0]) == 9.5
    load_round_table(CASES / "L1b-table-without-decode-rows" / "table", role="prefill")
    with pytest.raises(JaxsimError, match="no genuine decode measurements"):
        load_round_table(CASES / "L1b-table-without-decode-rows" / "table", role="decode")
