"""Cost and sizing (issue 28, deliver 3): GPU list prices with their source and date, overridable in the spec
([cost]) or by --price; $/hour per serving unit and $ per 1M output tokens in every sweep row; the maximum
SLA-feasible request rate per deployment (goodput) as a column; ``jaxsim size`` (N × GPU at TPk for a load)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from test_sweep_run import spec_dict, toml
from typer.testing import CliRunner

import jaxsim._jax  # noqa: F401  (turns x64 on)
from jaxsim import cost
from jaxsim.cli.main import app
from jaxsim.errors import InputError
from jaxsim.sweep import SpecError, run_sweep
from jaxsim.sweep.run import GOODPUT_COLUMN, goodput_per_s
from jaxsim.sweep.sizing import SizingTarget, describe_sla, size_fleet
from jaxsim.sweep.spec import spec_from_dict

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


# ---- the price table


def test_bundled_list_prices_name_their_source_and_date():
    prices = cost.list_prices()
    on_demand = {p.system for p in prices if p.basis == "on-demand"}
    assert {"a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "gb200"} <= on_demand
    from jaxsim.systems import list_systems

    for p in prices:
        assert p.system in list_systems() and p.basis in cost.PRICE_BASES
        assert p.usd_per_gpu_hour > 0 and p.source.startswith("https://") and len(p.read_on) == 10 and p.provider
    readme = (ROOT / "jaxsim" / "data" / "prices" / "README.md").read_text(encoding="utf-8")
    assert "list prices" in readme.lower()
    for p in prices:  # every source and date is stated in the data's README too
        assert p.source in readme and p.read_on in readme
    assert cost.bundled_price("l40s") is None and math.isnan(cost.Prices().usd_per_gpu_hour("l40s"))


@pytest.mark.parametrize("system, usd, msg", [
    ("h999", 2.0, "unknown system 'h999'"), ("b200_sxm", -1.0, "must be a finite number"), ("b200_sxm", float("nan"), "must be a finite"),
    ("b200_sxm", 0, "> 0"), ("b200_sxm", float("inf"), "finite"), ("b200_sxm", True, "finite number"),
])
def test_bad_prices_are_one_line_errors(system, usd, msg):
    with pytest.raises(InputError, match=msg) as e:
        cost.check_price(system, usd, "--price")
    assert "\n" not in str(e.value)


def test_price_option_and_overrides():
    assert cost.parse_price_option("b200_sxm=4.5") == ("b200_sxm", 4.5)
    for bad in ("b200_sxm", "=4", "b200_sxm=cheap", "b200_sxm=-3", "nope=3"):
        with pytest.raises(InputError):
            cost.parse_price_option(bad)
    p = cost.Prices().with_overrides({"b200_sxm": 4.5})
    assert p.usd_per_gpu_hour("b200_sxm") == 4.5 and p.source("b200_sxm") == "given by the user"
    assert p.usd_per_gpu_hour("h200_sxm") == cost.bundled_price("h200_sxm").usd_per_gpu_hour
    assert cost.Prices("reserved").usd_per_gpu_hour("h200_sxm") == cost.bundled_price("h200_sxm", "reserved").usd_per_gpu_hour
    assert cost.gpu_name("b200_sxm") == "B200" and cost.gpu_name("gb200") == "GB200" and cost.gpu_name("h100_pcie") == "H100 PCIe"


@given(price=hs.floats(0.01, 100), rate=hs.floats(0.001, 1e5))
@settings(max_examples=50, deadline=None)
def test_usd_per_million_tokens_is_an_hour_over_the_tokens_of_an_hour(price, rate):
    got = float(cost.usd_per_million_tokens(price, rate))
    assert math.isclose(got * rate * 3600 / 1e6, price, rel_tol=1e-12)
    assert math.isnan(float(cost.usd_per_million_tokens(price, 0.0))) and math.isnan(float(cost.usd_per_million_tokens(price, np.nan)))


# ---- the spec's [cost]


def test_spec_cost_overrides_and_refusals():
    s = spec_from_dict(spec_dict(cost={"basis": "reserved", "usd_per_gpu_hour": {"h200_sxm": 2.5}}))
    assert s.cost.usd_per_gpu_hour("h200_sxm") == 2.5 and s.cost.basis == "reserved"
    assert s.digest() != spec_from_dict(spec_dict()).digest()  # a price change is a different sweep (no stale resume)
    for bad, msg in (({"usd_per_gpu_hour": {"h999": 2}}, "cost.usd_per_gpu_hour.h999: unknown system"),
                     ({"usd_per_gpu_hour": {"h200_sxm": -2}}, "cost.usd_per_gpu_hour.h200_sxm"),
                     ({"usd_per_gpu_hour": {"h200_sxm": float("nan")}}, "finite"),
                     ({"usd_per_gpu_hour": 3}, "expected a table"), ({"basis": "spot"}, "cost.basis"), ({"dollars": 1}, "cost.dollars")):
        with pytest.raises(SpecError, match=msg.replace(".", r"\.")) as e:
            spec_from_dict(spec_dict(cost=bad), source="s.toml")
        assert "\n" not in str(e.value) and str(e.value).startswith("s.toml")


# ---- cost and goodput columns of a real sweep


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    d = spec_dict(cost={"usd_per_gpu_hour": {"h200_sxm": 2.5}})
    out = tmp_path_factory.mktemp("cost") / "r.parquet"
    res = run_sweep(spec_from_dict(d), out, top=3, devices=jax.devices()[:1])
    return res, out


def test_every_row_carries_its_cost(swept):
    res, out = swept
    t = pq.read_table(out).to_pandas()
    assert (t["usd_per_gpu_hour"] == 2.5).all()
    np.testing.assert_allclose(t["usd_per_hour_per_unit"], 2.5 * t["gpus"], rtol=0)
    ok = np.isfinite(t["output_tokens_per_s_per_gpu"]) & (t["output_tokens_per_s_per_gpu"] > 0)
    np.testing.assert_allclose(t["usd_per_1m_output_tokens"][ok], 2.5 / (t["output_tokens_per_s_per_gpu"][ok] * 3600) * 1e6, rtol=1e-12)
    assert t["usd_per_1m_output_tokens"][~ok].isna().all()
    meta = json.loads(pq.read_schema(out).metadata[b"jaxsim.sweep"])["summary"]
    assert meta["prices"]["h200_sxm"] == {"usd_per_gpu_hour": 2.5, "basis": "on-demand", "source": "given by the user"}
    assert meta["sla"] == {"mean_ttft_ms": 800.0, "mean_tpot_ms": 25.0}


def _goodput_by_hand(t) -> np.ndarray:
    """The largest SLA-feasible request rate of the row's (binding, workload): a plain loop over groups."""
    key = list(zip(t["profile"].astype(str), t["mode"].astype(str), t["prefill_workers"], t["decode_workers"], t["tp"], t["nextn"],
                   t["acceptance"].astype(str), t["max_num_seqs"], t["max_num_batched_tokens"], t["workload"].astype(str)))
    best: dict = {}
    for k, ok, r in zip(key, t["sla_ok"], t["request_rate_per_s"]):
        if ok and np.isfinite(r):
            best[k] = max(best.get(k, -np.inf), r)
    return np.array([best.get(k, np.nan) for k in key])


def test_goodput_is_the_largest_feasible_rate_of_each_deployment(swept):
    res, out = swept
    t = pq.read_table(out).to_pandas()
    np.testing.assert_array_equal(t[GOODPUT_COLUMN].to_numpy(), _goodput_by_hand(t))
    ok = t["sla_ok"].to_numpy()
    assert ok.any() and (t[GOODPUT_COLUMN].to_numpy()[ok] >= t["request_rate_per_s"].to_numpy()[ok]).all()
    top = res.top.to_pandas()  # the top and frontier rows carry it too
    want = t.set_index("config_id")[GOODPUT_COLUMN]
    np.testing.assert_array_equal(top[GOODPUT_COLUMN].to_numpy(), want.loc[top["config_id"]].to_numpy())


def test_goodput_does_not_depend_on_where_chunks_cut_bindings(swept, tmp_path):
    """Chunks of 256 configs cut this sweep's bindings (40 configs each) anywhere; the column is the same."""
    _, out = swept
    small = tmp_path / "s.parquet"
    run_sweep(spec_from_dict(spec_dict(cost={"usd_per_gpu_hour": {"h200_sxm": 2.5}})), small, top=3, chunk_size=1, devices=jax.devices()[:1])
    a, b = pq.read_table(out), pq.read_table(small)
    assert a.num_rows == b.num_rows
    assert a.column("config_id").to_pylist() == b.column("config_id").to_pylist()
    np.testing.assert_array_equal(a.column(GOODPUT_COLUMN).to_numpy(), b.column(GOODPUT_COLUMN).to_numpy())


def test_goodput_per_s_groups_by_binding_and_workload():
    # inner = 2 concurrencies x 2 workloads: config i is binding i // 4, workload i % 2
    ids = np.arange(8)
    ok = np.array([1, 1, 1, 0, 0, 0, 0, 1], bool)
    rate = np.array([1.0, 2.0, 3.0, 9.0, 5.0, 6.0, 7.0, np.nan])
    np.testing.assert_array_equal(goodput_per_s(ids, ok, rate, 4, 2), [3.0, 2.0, 3.0, 2.0, np.nan, np.nan, np.nan, np.nan])


# ---- sizing


def _results(rows: list[dict], sla: dict | None = None) -> pa.Table:
    base = {"workload": "chat", "system": "b200_sxm", "data_source": "modelled", "mode": "aggregated", "prefill_workers": 0,
            "decode_workers": 1, "nextn": 0, "acceptance": "none", "concurrency": 8, "isl_mean": 4096.0, "osl_mean": 512.0,
            "tokens_per_s_per_user": 30.0, "usd_per_gpu_hour": 6.0, "usd_per_hour_per_unit": 12.0, "usd_per_1m_output_tokens": 1.0,
            "goodput_req_per_s": 1.0}
    full = [{**base, "config_id": i, **r} for i, r in enumerate(rows)]
    for r in full:
        r.setdefault("concurrency_target", r["concurrency"])
        r.setdefault("output_tokens_per_s_per_gpu", r["request_rate_per_s"] * r["osl_mean"] / r["gpus"])
    t = pa.Table.from_pylist(full)
    meta = {"summary": {"sla": sla or {"p90_ttft_ms": 2000.0}}}
    return t.replace_schema_metadata({b"jaxsim.sweep": json.dumps(meta).encode()})


def test_size_rounds_replicas_up_and_picks_the_fewest_gpus_per_profile_and_tp():
    t = _results([
        dict(profile="b200", tp=2, gpus=2, request_rate_per_s=3.0, sla_ok=True),
        dict(profile="b200", tp=2, gpus=2, request_rate_per_s=2.0, sla_ok=True, tokens_per_s_per_user=60.0),
        dict(profile="b200", tp=2, gpus=2, request_rate_per_s=9.0, sla_ok=False),  # misses the SLA: never used
        dict(profile="b200", tp=4, gpus=4, request_rate_per_s=5.0, sla_ok=True),
        dict(profile="h200", tp=2, gpus=2, request_rate_per_s=1.5, sla_ok=True, system="h200_sxm", usd_per_gpu_hour=4.0),
    ])
    opts, ctx = size_fleet(t, SizingTarget(request_rate_per_s=20.0))
    by = {(o.profile, o.tp): o for o in opts}
    assert (by["b200", 2].units, by["b200", 2].gpus, by["b200", 2].config_id) == (7, 14, 0)  # ceil(20 / 3) = 7
    assert (by["b200", 4].units, by["b200", 4].gpus) == (4, 16) and (by["h200", 2].units, by["h200", 2].gpus) == (14, 28)
    assert [o.answer() for o in opts] == ["14 × B200 at TP2", "16 × B200 at TP4", "28 × H200 at TP2"]  # cheapest first ($84, $96, $112)
    assert by["b200", 2].usd_per_hour == 84.0
    assert math.isclose(by["b200", 2].usd_per_1m_output_tokens, 84.0 / (20 * 512 * 3600) * 1e6)
    assert ctx["workload"] == "chat" and describe_sla(ctx["sla"]) == "p90 TTFT ≤ 2,000 ms"
    # exact multiples are not rounded up once more; a load in output tokens/s is the same load
    assert size_fleet(t, SizingTarget(request_rate_per_s=21.0))[0][0].units == 7
    tok = size_fleet(t, SizingTarget(output_tokens_per_s=20.0 * 512))[0]
    assert [(o.profile, o.tp, o.gpus) for o in tok] == [(o.profile, o.tp, o.gpus) for o in opts]
    # a user's price replaces the recorded one and can change the answer
    cheap = size_fleet(t, SizingTarget(request_rate_per_s=20.0), prices={"h200_sxm": 1.0})[0]
    assert cheap[0].answer() == "28 × H200 at TP2" and cheap[0].usd_per_hour == 28.0


@pytest.mark.parametrize("kw", [dict(), dict(request_rate_per_s=1.0, output_tokens_per_s=1.0), dict(request_rate_per_s=0.0),
                                dict(request_rate_per_s=-3.0), dict(request_rate_per_s=float("nan")), dict(output_tokens_per_s=float("inf"))])
def test_size_target_refuses_a_missing_or_non_positive_load(kw):
    with pytest.raises(InputError):
        SizingTarget(**kw)


def test_describe_sla_reads_both_percentile_key_schemes():
    assert describe_sla({"max_tpot_ms": 50.0, "p90_ttft_ms": 2000.0, "min_tokens_per_s_per_user": 20.0}) == \
        "p90 TTFT ≤ 2,000 ms, mean TPOT ≤ 50 ms, ≥ 20 tok/s per user"
    assert describe_sla({"ttft_p99_ms": 500.0}) == "p99 TTFT ≤ 500 ms" and describe_sla({}) == "no SLA"
    assert describe_sla({"mean_e2e_ms": 9000.0, "median_ttft_ms": 300.0, "p50_tpot_ms": 20.0}) == \
        "median TTFT ≤ 300 ms, median TPOT ≤ 20 ms, mean E2E ≤ 9,000 ms"


def test_size_cli(swept, tmp_path):
    _, out = swept
    r = runner.invoke(app, ["size", str(out), "--rate", "20", "--workload", "m"])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if ln.startswith("for "))
    assert line.startswith("for 20 req/s of m (mean ") and " at mean TTFT ≤ 800 ms, mean TPOT ≤ 25 ms: " in line
    assert " × H200 at TP" in line and "per 1M output tokens" in line
    r = runner.invoke(app, ["size", str(out), "--rate", "20", "--workload", "m", "--json", "--price", "h200_sxm=1"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["answer"]["usd_per_gpu_hour"] == 1.0 and rep["answer"]["answer"] == rep["options"][0]["answer"]
    assert all(o["units"] >= 1 and o["gpus"] == o["units"] * o["unit_gpus"] for o in rep["options"])


@pytest.mark.parametrize("args, msg", [
    (["--rate", "0"], "--rate: must be a finite number > 0"), (["--rate", "-5"], "> 0"), (["--rate", "nan"], "> 0"),
    ([], "give the load to serve"), (["--rate", "1", "--tokens-per-s", "5"], "exactly one"),
    (["--rate", "1", "--price", "h999=3"], "unknown system 'h999'"), (["--rate", "1", "--price", "h200_sxm=-1"], "> 0"),
    (["--rate", "1"], "choose one with --workload"), (["--rate", "1", "--workload", "zz"], "no workload 'zz'"),
])
def test_size_cli_bad_input_is_one_line_exit_2(swept, args, msg):
    _, out = swept
    r = runner.invoke(app, ["size", str(out), *args])
    assert r.exit_code == 2 and msg in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_size_cli_nothing_feasible_exits_3(tmp_path):
    t = _results([dict(profile="b200", tp=2, gpus=2, request_rate_per_s=3.0, sla_ok=False)])
    p = tmp_path / "r.parquet"
    pq.write_table(t, p)
    r = runner.invoke(app, ["size", str(p), "--rate", "5"])
    assert r.exit_code == 3 and "nothing to size" in r.output


@pytest.mark.slow
def test_sweep_price_flag_and_cost_columns_in_a_real_subprocess(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text(toml(spec_dict(serving={"mode": ["aggregated"]}, scheduler={"concurrency": [1, 4, 16]})))
    out = tmp_path / "s.parquet"
    r = subprocess.run([sys.executable, "-m", "jaxsim", "sweep", str(spec), "-o", str(out), "--price", "h200_sxm=2.0", "--quiet"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert "best SLA-feasible output tokens/s per GPU by profile and TP" in r.stdout
    assert "prices ($ per GPU-hour): h200_sxm 2.00 (given by the user" in r.stdout
    assert set(pq.read_table(out, columns=["usd_per_gpu_hour"]).column(0).to_pylist()) == {2.0}
    r = subprocess.run([sys.executable, "-m", "jaxsim", "size", str(out), "--rate", "3", "--workload", "a-128x64"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert "for 3 req/s of a-128x64 (128 in / 64 out)" in r.stdout and "× H200 at TP" in r.stdout
    r = subprocess.run([sys.executable, "-m", "jaxsim", "sweep", str(spec), "-o", str(tmp_path / "x.parquet"), "--price", "h200_sxm=abc"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and r.stderr.strip().splitlines() == ["error: --price 'h200_sxm=abc': 'abc' is not a number of US dollars per GPU-hour"]


# ---- the report: best per (profile, TP), where speculation stops paying


def test_best_per_profile_tp_is_each_groups_best_feasible_row(swept):
    from jaxsim.sweep.report import best_per_profile_tp

    res, out = swept
    t = pq.read_table(out).to_pandas()
    feas = t[t["sla_ok"]]
    want = {}
    for (wl, prof, tp), g in feas.groupby(["workload", "profile", "tp"], observed=True):
        g = g.sort_values(["output_tokens_per_s_per_gpu", "config_id"], ascending=[False, True])
        want[(wl, prof, tp)] = int(g["config_id"].iloc[0])
    got = best_per_profile_tp(out)
    assert {(r["workload"], r["profile"], r["tp"]): r["config_id"] for r in got} == want
    assert [r["config_id"] for r in got] == [r["config_id"] for r in res.best]
    wl_order = list(dict.fromkeys(t["workload"].astype(str)))
    assert [wl_order.index(r["workload"]) for r in got] == sorted(wl_order.index(r["workload"]) for r in got)


def _spec_rows(base_gpu, k_gpu, conc=(1, 8, 64, 128), **over):
    rows = []
    for k, ys in ((0, base_gpu), (3, k_gpu)):
        for c, y in zip(conc, ys):
            rows.append({"workload": "chat", "profile": "base" if k == 0 else "eagle3", "nextn": k, "acceptance": "none" if k == 0 else "p",
                         "system": "b300_sxm", "mode": "aggregated", "prefill_workers": 0, "decode_workers": 1, "prefill_tp": 2, "tp": 2,
                         "max_num_seqs": 256 if k == 0 else 128, "max_num_batched_tokens": 8192, "concurrency_target": c,
                         "tokens_per_s_per_user": y * 2 / c, "output_tokens_per_s_per_gpu": y, **over})
    return rows


def test_speculation_pays_until_the_concurrency_where_it_falls_below_plain_decoding():
    from jaxsim.sweep.report import speculation_verdicts

    t = pa.Table.from_pylist(_spec_rows([10.0, 80.0, 500.0, 900.0], [20.0, 150.0, 480.0, 850.0]))
    (v,) = speculation_verdicts(t, {"base": "Q", "eagle3": "Q"})
    assert (v.pays_until, v.stops_at, v.concurrency) == (8, 64, (1, 8, 64, 128)) and v.baseline_profile == "base"
    assert v.user_ratio[0] == pytest.approx(2.0) and v.gpu_ratio[2] == pytest.approx(0.96)
    assert v.line().startswith("speculation pays until concurrency 8: eagle3 K=3 (p) vs base K=0, b300_sxm TP2 aggregated, chat: "
                               "x2.00 tok/s/user at concurrency 1; falls below K=0 in tok/s/GPU from 64 (x0.96)")
    (v,) = speculation_verdicts(pa.Table.from_pylist(_spec_rows([10.0, 80.0], [20.0, 150.0], conc=(1, 8))))
    assert v.stops_at is None and v.line().startswith("speculation pays at every compared concurrency (1-8)")
    (v,) = speculation_verdicts(pa.Table.from_pylist(_spec_rows([10.0, 80.0], [9.0, 150.0], conc=(1, 8))))
    assert v.pays_until is None and v.line().startswith("speculation never pays in tok/s/GPU")
    # another model, another GPU or TP, or rows outside support: nothing to compare
    assert speculation_verdicts(t, {"base": "Q", "eagle3": "L"}) == []
    other = pa.Table.from_pylist(_spec_rows([10.0], [20.0], conc=(1,))[:1] + _spec_rows([10.0], [20.0], conc=(1,), system="h200_sxm")[1:])
    assert speculation_verdicts(other) == []
    nan = pa.Table.from_pylist(_spec_rows([float("nan"), 80.0], [20.0, 150.0], conc=(1, 8)))
    assert speculation_verdicts(nan)[0].concurrency == (8,)


def test_sweep_report_prints_the_profile_tp_table_and_speculation(swept, tmp_path):
    _, out = swept
    spec = tmp_path / "s.toml"
    spec.write_text(toml(spec_dict(serving={"mode": ["aggregated"]}, speculation={"acceptance": [1.5]},
                                   workload=[{"name": "chat", "isl": 128, "osl": 64}, {"name": "m", "requests": [[256, 100, 1], [1500, 200, 1]]}])))
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(tmp_path / "s.parquet"), "--quiet"])
    assert r.exit_code == 0, r.output
    assert "workload m: best SLA-feasible output tokens/s per GPU by profile and TP ($ per 1M output tokens)" in r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("speculation ")]
    assert len(lines) == 2 and "sd3 K=3 (accepted=1.5) vs ar K=0, h200_sxm TP1 aggregated, chat: " in lines[0], lines
    r = runner.invoke(app, ["sweep", str(spec), "-o", str(tmp_path / "s.parquet"), "--quiet", "--force", "--json"])
    rep = json.loads(r.stdout)
    assert {(b["workload"], b["profile"]) for b in rep["best_per_profile_tp"]} == {(w, p) for w in ("chat", "m") for p in ("ar", "sd3")}
    assert [s["line"] for s in rep["speculation"]] == lines
