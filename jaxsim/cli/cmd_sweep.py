"""``jaxsim sweep``: evaluate every configuration of a sweep spec; best deployments under the SLA."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import typer

from jaxsim.cli.common import console, fail, guarded, paragraphs, refuse_overwrite, stderr_is_tty

EVALUATE = ("steady", "replay", "auto")  # jaxsim.sweep.spec.EVALUATE (not imported here: the CLI starts without JAX)
EXIT_UNVERIFIED = 3

SWEEP_HELP = paragraphs("""Evaluate every combination of a sweep spec (profiles x TP x serving mode x nextn/acceptance x scheduler
x concurrency x workload) with the steady-state model, stream the results to parquet, and print the best deployments
under the SLA and the Pareto frontier of output tokens/s per GPU against tokens/s per user.

With --evaluate replay (or evaluate = "replay" in the spec) every point is instead replayed under its benchmark load
(\\[benchmark]: by default a closed loop of C clients, 10 x C prompts, all C sent at t = 0, as InferenceX runs vllm bench
serve; a disaggregated x:y point: one closed loop of y x C clients over its pipeline), thousands of replays per compiled
call; the method column says which evaluation produced each row
(docs/benchmark-loads.md). With --evaluate auto only the points the steady state flags kv_preemption (their requests
in flight outgrow the KV pool at their peak, where vLLM preempts) are replayed. --verify-top N replays the best rows
each at its own load and says by how much the replay differs.

Every row carries its cost (bundled GPU list prices, or \\[cost] in the spec, or --price) and its deployment's goodput
(the largest SLA-feasible request rate over the swept concurrencies); the report adds the best configuration per profile
and TP and, for speculative what-ifs, where speculation stops paying. jaxsim size turns the results into GPUs and
dollars for a target load.

Invalid combinations are validated before any compilation and reported with their reasons (--strict refuses the run
instead). Points outside measured support are kept with their status, never extrapolated. A killed run resumes from its
finished chunks (kept in OUTPUT.work/) and gives a byte-identical result. Results never overwrite existing files unless
--force. The model and the spec format: docs/sweep.md.

Exit codes: 0 done; 2 bad input (nothing written); 3 --verify-top verified no row (results written; --allow-unverified exits 0).

Examples:

  jaxsim sweep configs/quickstart.toml

  jaxsim sweep configs/planner_qwen3_32b.toml --verify-top 2

  jaxsim sweep configs/planner_qwen3_32b.toml --evaluate replay

  jaxsim sweep configs/quickstart.toml -o qs.parquet --csv --top 20 --plot pareto.png

  jaxsim sweep configs/sweep_large.toml --chunk-size 262144 --json > summary.json
""")


def _fmt(v, digits: int = 1) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        if math.isinf(v):
            return "inf"
        return f"{v:,.{digits}f}"
    return str(v)


def _rows(table) -> list[dict]:
    return table.to_pylist() if table is not None and table.num_columns else []


def _describe(r: dict, pct_keys: tuple[str, ...] = ()) -> dict:
    mode = r["mode"] if r["mode"] == "aggregated" else f"disagg {r['prefill_workers']}:{r['decode_workers']}"
    return {
        "profile": r["profile"],
        "source": r.get("data_source", "-"),
        "mode": mode,
        "tp": _tp_label(r),
        "nextn": r["nextn"],
        "acceptance": r["acceptance"] if r["nextn"] else "-",
        "conc": f"{r['concurrency']}/{r['concurrency_target']}",
        "mean ttft": _fmt(r["mean_ttft_ms"]),
        **{_stat_label(k): _fmt(r.get(k, float("nan"))) for k in pct_keys},
        "mean tpot": _fmt(r["mean_tpot_ms"], 2),
        "tok/s/user": _fmt(r["tokens_per_s_per_user"]),
        "tok/s/gpu": _fmt(r["output_tokens_per_s_per_gpu"]),
        "req/s": _fmt(r["request_rate_per_s"], 2),
        **({"method": r["method"]} if "method" in r else {}),
        "$/1M tok": _fmt(r.get("usd_per_1m_output_tokens", float("nan")), 2),
    }


def _tp_label(r: dict):
    """TP, with attention DP (``2 dp2 ep4``: 2 ranks of TP2) and expert parallelism (moe_tp 1 x moe_ep) when present."""
    dp, ep = r.get("dp", 1), r.get("moe_ep", 1)
    if dp == 1 and ep == 1:
        return r["tp"]
    return f"{r['tp']}" + (f" dp{dp}" if dp != 1 else "") + (f" ep{ep}" if ep != 1 else "")


def _stat_label(key: str) -> str:
    """``p90_ttft_ms`` → ``p90 ttft``."""
    stat, metric, _ = key.split("_")
    return f"{stat} {metric}"


def _table(title: str, rows: list[dict], pct_keys: tuple[str, ...] = (), first=None, last=None):
    """Rows as a rich table; ``first``/``last``: an extra (column name, value of a row) at either end."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    if not rows:
        t.add_column("(none)")
        return t
    extra = lambda r: {**({first[0]: first[1](r)} if first else {}), **_describe(r, pct_keys), **({last[0]: last[1](r)} if last else {})}  # noqa: E731
    cols = list(extra(rows[0]))
    for c in cols:
        t.add_column(c, justify="left" if c in ("workload", "profile", "source", "mode", "acceptance") else "right")
    for r in rows:
        d = extra(r)
        t.add_row(*(str(d[c]) for c in cols))
    return t


MAX_WORKLOAD_TABLES = 8  # more workloads than this: one best-per-workload table unless --all-tables


def _best_tables(best: list[dict], all_tables: bool):
    """Per workload: profile × TP, the best SLA-feasible output tokens/s per GPU and its $ per 1M output tokens."""
    from rich.table import Table

    from jaxsim.cost import gpu_name

    workloads = list(dict.fromkeys(r["workload"] for r in best))
    for wl in workloads if all_tables else workloads[:MAX_WORKLOAD_TABLES]:
        rows = [r for r in best if r["workload"] == wl]
        tps = sorted({r["tp"] for r in rows})
        yield f"workload {wl}: best SLA-feasible output tokens/s per GPU by profile and TP ($ per 1M output tokens)"
        t = Table()
        for c in ("profile", "GPU", *(f"TP{tp}" for tp in tps)):
            t.add_column(c, justify="left" if c in ("profile", "GPU") else "right")
        for prof in dict.fromkeys(r["profile"] for r in rows):
            cell = {r["tp"]: r for r in rows if r["profile"] == prof}
            first = next(iter(cell.values()))
            t.add_row(prof, gpu_name(first["system"]), *(
                "-" if tp not in cell else f"{_fmt(cell[tp]['output_tokens_per_s_per_gpu'], 0)}"
                + (f" (${cell[tp]['usd_per_1m_output_tokens']:,.2f})" if math.isfinite(cell[tp].get("usd_per_1m_output_tokens") or math.nan) else "")
                for tp in tps))
        yield t
    if not all_tables and len(workloads) > MAX_WORKLOAD_TABLES:
        yield f"(best-per-profile-and-TP tables of {len(workloads) - MAX_WORKLOAD_TABLES} more workloads: --all-tables or --json)"


MAX_SPECULATION_LINES = 4  # more speculative comparisons than this: one table (its first MAX_SPECULATION_ROWS rows)
MAX_SPECULATION_ROWS = 12


def _speculation_table(verdicts):
    from rich.table import Table

    t = Table(title="speculation vs K=0 on the same GPU, TP, serving and concurrency (x = K / K=0)", title_justify="left")
    for c in ("workload", "profile", "K", "acceptance", "TP", "mode", "pays until conc", "below K=0 from", "x tok/s/user", "x tok/s/gpu"):
        t.add_column(c, justify="left" if c in ("workload", "profile", "acceptance", "mode") else "right")
    for v in verdicts:
        t.add_row(v.workload, v.profile, str(v.nextn), v.acceptance, str(v.tp), v.mode, "-" if v.pays_until is None else str(v.pays_until),
                  "-" if v.stops_at is None else str(v.stops_at), f"{v.user_ratio[0]:.2f} at {v.concurrency[0]}",
                  f"{v.gpu_ratio[-1]:.2f} at {v.concurrency[-1]}")
    return t


def _report_extras(res, all_tables: bool) -> None:
    """The best-per-(profile, TP) tables, where speculation stops paying, and the prices used."""
    con = console()
    for t in _best_tables(res.best, all_tables):
        con.print(t)
    verdicts = res.speculation
    if len(verdicts) <= MAX_SPECULATION_LINES:
        for v in verdicts:
            typer.echo(v.line())
    else:
        shown = verdicts if all_tables else verdicts[:MAX_SPECULATION_ROWS]
        con.print(_speculation_table(shown))
        if len(shown) < len(verdicts):
            con.print(f"(first {len(shown)} of {len(verdicts)} speculative comparisons; all of them: --all-tables or --json)")
    prices = res.summary.get("prices", {})
    missing = [s for s, p in prices.items() if p["usd_per_gpu_hour"] is None]
    if missing:
        typer.echo(f"no price for {', '.join(missing)}: cost columns are empty for them; give one in the spec "
                  f"([cost] usd_per_gpu_hour = {{{missing[0]} = USD}}) or --price {missing[0]}=USD")
    priced = sorted({p["source"] for p in prices.values() if p["usd_per_gpu_hour"] is not None})
    if priced:
        typer.echo("prices ($ per GPU-hour): " + ", ".join(f"{s} {p['usd_per_gpu_hour']:,.2f}" for s, p in prices.items()
                                                        if p["usd_per_gpu_hour"] is not None)
                   + f" ({'; '.join(priced)}; list prices: jaxsim/data/prices/README.md)")


def _report(res, plot: Path | None, max_pareto: int, sla=None, all_tables: bool = False) -> None:
    from rich.table import Table

    con = console()
    s = res.summary
    con.print(
        f"[bold]sweep {s['name']}[/bold]: {s['configs_total']:,} configs, {s['configs_evaluated']:,} evaluated "
        f"({s['bindings_valid']} valid bindings), {s['configs_invalid']:,} invalid ({s['bindings_invalid']} bindings)"
    )
    if s["invalid"]:
        t = Table(title="invalid combinations (not evaluated)", title_justify="left")
        for c in ("rule", "bindings", "configs", "example"):
            t.add_column(c, overflow="fold")
        for i in s["invalid"]:
            t.add_row(i["rule"], str(i["bindings"]), f"{i['configs']:,}", i["example"])
        con.print(t)
    t = Table(title="status of the evaluated configs", title_justify="left")
    t.add_column("status")
    t.add_column("configs", justify="right")
    for k, v in s["status_counts"].items():
        t.add_row(k, f"{v:,}")
    con.print(t)
    con.print(f"SLA-feasible: {s['sla_feasible']:,} of {s['configs_evaluated']:,}")
    wls = s.get("workloads", {})
    if wls:
        t = Table(title="per workload", title_justify="left")
        for c in ("workload", "configs", "inside support", "SLA-feasible", "most common refusal"):
            t.add_column(c, justify="left" if c in ("workload", "most common refusal") else "right")
        for name, d in wls.items():
            ref = next(iter(d["refusals"].items()), None)
            t.add_row(name, f"{d['configs']:,}", f"{d['supported']:,}", f"{d['sla_feasible']:,}",
                      f"{ref[0]} ({ref[1]:,})" if ref else "-")
        con.print(t)
        for name, d in wls.items():
            if d["configs"] and not d["supported"]:
                ref = next(iter(d["refusals"]), "?")
                con.print(f"[bold]workload {name} is unsupported[/bold]: none of its {d['configs']:,} configurations lies inside "
                          f"measured support (mostly {ref}); no rows for it below, nothing was extrapolated")
    top_rows, front = _rows(res.top), _rows(res.pareto)
    pk = tuple(sla.percentile_limits()) if sla is not None else ()
    shown_wls = list(dict.fromkeys([r["workload"] for r in top_rows] + [r["workload"] for r in front]))
    if len(shown_wls) > MAX_WORKLOAD_TABLES and not all_tables:
        best = {}
        for r in top_rows:
            best.setdefault(r["workload"], r)
        n_front = {wl: sum(r["workload"] == wl for r in front) for wl in shown_wls}
        t = _table(f"best SLA-feasible configuration per workload (by output tokens/s per GPU; {len(shown_wls)} workloads)",
                   list(best.values()), pk, first=("workload", lambda r: r["workload"]),
                   last=("pareto pts", lambda r: str(n_front[r["workload"]])))
        con.print(t)
        con.print(f"per-workload top {max((sum(r['workload'] == w for r in top_rows) for w in shown_wls), default=0)} and Pareto "
                  "tables: rerun with --all-tables, or read the results file (column on_pareto; the tables are its rows)")
        shown_wls = []
    for wl in shown_wls:
        rows = [r for r in top_rows if r["workload"] == wl]
        con.print(_table(f"workload {wl}: top {len(rows)} by output tokens/s per GPU (SLA-feasible)", rows, pk))
        pts = [r for r in front if r["workload"] == wl]
        shown = pts if len(pts) <= max_pareto else [pts[round(i * (len(pts) - 1) / (max_pareto - 1))] for i in range(max_pareto)]
        more = f", {len(shown)} shown" if len(shown) < len(pts) else ""
        con.print(_table(f"workload {wl}: Pareto frontier, tokens/s per user vs per GPU ({len(pts)} points{more})", shown, pk))
    if not top_rows:
        con.print("no configuration meets the SLA")
    _report_extras(res, all_tables)
    sources = sorted({str(r.get("data_source", "measured")) for r in top_rows + front} - {"measured"})
    methods = s.get("methods", {})
    if methods.get("replay"):
        con.print(f"evaluated by replay: {methods.get('replay', 0):,} rows, each its own benchmark ({res.plan.spec.benchmark.describe()}); "
                  + (f"{methods['steady']:,} rows by the steady state; "
                     if methods.get("steady") else "") + "column method")
    con.print(
        "columns: conc = concurrency per worker reached/target (reached < target when max_num_seqs or the KV pool caps it); "
        "tp \"8 ep8\" = TP8 with the MoE experts over 8 GPUs (moe_tp 1 x moe_ep 8), \"2 dp2 ep4\" = 2 attention-DP ranks of TP2 "
        "(4 GPUs; conc per worker, batch and pool per rank); "
        + ("mean/pNN columns = statistics of the replayed requests (vLLM's definitions, numpy linear percentiles); "
           if methods.get("replay") else
           "mean ttft, mean tpot = means over the workload mix; median/p90/p99 columns = percentiles over the mix and, in a closed "
           "loop, the benchmark's prompt waves; ")
        + "tok/s/user = 1000 / mean TPOT; tok/s/gpu = output tokens/s per GPU; req/s = requests/s per serving unit; "
        "source = what the profile's numbers are; method = steady state or replay (docs/sweep.md); "
        + "$/1M tok = US dollars per million output tokens at the row's throughput; "
    )
    if s.get("kv_preemption_steady_rows"):
        con.print(f"[bold]KV preemption not modelled[/bold]: in {s['kv_preemption_steady_rows']:,} steady-state rows (column kv_preemption) "
                  "the requests in flight, at their longest together, need more KV blocks than the pool holds; requests that grow "
                  "in step (a closed-loop benchmark's prompt waves) then make vLLM preempt, and TTFT can be far above the steady "
                  "state's: replay them (--evaluate auto replays exactly those; --evaluate replay, or --verify-top)")
    if sources:
        con.print(f"[bold]not measured[/bold]: rows with source {', '.join(sources)} come from profiles whose timings are "
                  "derived or modelled, not measured (speculative rows also depend on the stated acceptance); "
                  "check them with jaxsim profiles show PROFILE and docs/data-provenance.md")
    rate = f"{res.configs_per_s:,.{0 if res.configs_per_s >= 100 else 2}f} configs/s" if s["configs_evaluated_this_run"] else "all chunks reused"
    rt = res.replay_timings
    if rt:
        rate += (f"; replays: compile {rt.get('compile_s', 0.0):.1f} s ({rt.get('compilations', 0)} compiled, "
                 f"{rt.get('executables_loaded', 0)} loaded), run {rt.get('run_s', 0.0):.1f} s")
    con.print(
        f"results: {res.output}" + (f" and {res.csv}" if res.csv else "") + (f"; plot: {plot}" if plot else "")
        + f"\nvalidate {res.plan_s:.1f} s, compile {res.compile_s:.1f} s, evaluate {res.eval_s:.2f} s ({rate}, "
        f"{res.num_devices} device(s)), merge {res.finalize_s:.1f} s, wall {res.wall_s:.1f} s; "
        f"chunks run {res.chunks_run}, reused {res.chunks_reused}"
    )



def _next(spec: Path, out: Path, verified, evaluate: str, feasible: bool = True) -> None:
    """The command to run next (no verification hint when nothing met the SLA: there is nothing to verify)."""
    if not feasible:
        typer.echo(f"next: no configuration met the SLA; loosen [sla] in {spec}, widen its axes (concurrency, TP, "
                   f"serving mode), or see how far the points are with jaxsim plot pareto {out} --output pareto.png")
    elif verified is None:
        typer.echo(f"next: jaxsim sweep {spec} --output {out} --force --verify-top 3   "
                   "(replay the best rows, each at its own load, and compare)"
                   + ("" if evaluate == "replay" else "; or --evaluate replay (every row its own benchmark replay)"))
    elif verified.num_rows and not any(verified.column("verified").to_pylist()):
        typer.echo(f"next: the replays above say why no row verified; evaluate every row by replay with jaxsim sweep {spec} "
                   f"--evaluate replay, or plot the frontier with jaxsim plot pareto {out} --output pareto.png")
    else:
        typer.echo(f"next: jaxsim plot pareto {out} --output pareto.png   (the frontier), or jaxsim replay a verified "
                   "deployment with --timeline to see its KV use over time")


def _pct(v) -> str:
    return "-" if v is None else f"{v:+.0%}"


def _report_verified(verified, trace, path: Path) -> None:
    from rich.table import Table

    con = console()
    lengths = f"lengths of {trace.name}" if trace is not None else "the row's workload lengths"
    tol = verified.column("tolerance")[0].as_py() if verified.num_rows else 0.2
    t = Table(title=f"replay verification: each row replayed at its own load ({lengths}); the SLA applied to the replayed "
                    f"requests; deviations (replay - row) / row, agreement within {tol:.0%}", title_justify="left")
    cols = ("workload", "replay", "load", "done", "mean ttft", "p90 ttft", "mean tpot", "tok/s/gpu", "dev ttft", "dev tpot",
            "dev tok/s/gpu", "verified", "why")
    num = {"done", "mean ttft", "p90 ttft", "mean tpot", "tok/s/gpu", "dev ttft", "dev tpot", "dev tok/s/gpu"}
    for c in cols:
        t.add_column(c, justify="right" if c in num else "left", overflow="fold")
    nan = float("nan")
    for r in verified.to_pylist():
        g = lambda k: nan if r.get(k) is None else r[k]  # noqa: E731
        t.add_row(r["workload"], r["replay"], r["load"], f"{r['completed']}/{r['requests']}", _fmt(g("mean_ttft_ms")),
                  _fmt(g("p90_ttft_ms")), _fmt(g("mean_tpot_ms"), 2), _fmt(g("output_tokens_per_s_per_gpu")),
                  _pct(r.get("dev_mean_ttft_ms")), _pct(r.get("dev_mean_tpot_ms")), _pct(r.get("dev_output_tokens_per_s_per_gpu")),
                  "yes" if r["verified"] else "NO", r["why"] or "-")
    con.print(t)
    con.print(f"verification: {path}")


def _json(res, plot: Path | None, verified=None, vpath: Path | None = None) -> str:
    def clean(rows):
        return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in rows]

    out = dict(res.summary)
    out.update(
        output=str(res.output),
        csv=str(res.csv) if res.csv else None,
        plot=str(plot) if plot else None,
        plan_s=res.plan_s,
        compile_s=res.compile_s,
        eval_s=res.eval_s,
        finalize_s=res.finalize_s,
        wall_s=res.wall_s,
        configs_per_s=res.configs_per_s if res.eval_s else None,
        devices=res.num_devices,
        chunks_run=res.chunks_run,
        chunks_reused=res.chunks_reused,
        replay_timings=res.replay_timings or None,
        top=clean(_rows(res.top)),
        pareto=clean(_rows(res.pareto)),
        best_per_profile_tp=clean(res.best),
        speculation=[v.to_dict() for v in res.speculation],
    )
    if verified is not None:
        out.update(verified=clean(verified.to_pylist()), verified_output=str(vpath))
    return json.dumps(out, indent=1, default=str)


def register(app: typer.Typer) -> None:
    """Add ``jaxsim sweep``."""

    @app.command("sweep", help=SWEEP_HELP, no_args_is_help=True)
    @guarded
    def sweep(
        spec: Path = typer.Argument(..., help="Sweep spec (TOML), e.g. configs/quickstart.toml.", exists=False),
        output: Path | None = typer.Option(
            None,
            "--output",
            "-o",
            help="Results parquet [default: <spec name>.results.parquet in the working directory; an existing file is refused without --force].",
        ),
        csv: bool = typer.Option(False, "--csv", help="Also write the results as CSV next to the parquet file."),
        top: int = typer.Option(5, "--top", help="Rows per workload in the top table (SLA-feasible, by tokens/s per GPU)."),
        plot: Path | None = typer.Option(None, "--plot", help="Write the Pareto plot (PNG; needs matplotlib)."),
        strict: bool = typer.Option(False, "--strict", help="Refuse the run if any combination is invalid."),
        force: bool = typer.Option(False, "--force", help="Overwrite existing results (and discard a foreign work dir)."),
        chunk_size: int = typer.Option(65536, "--chunk-size", help="Configs per compiled chunk (memory is bounded by it)."),
        as_json: bool = typer.Option(False, "--json", help="Print a JSON summary (counts, top rows, frontier) instead of tables."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress (a bar on a terminal, else a line on stderr every 10 s)."),
        all_tables: bool = typer.Option(
            False,
            "--all-tables",
            help="Print the top and Pareto tables of every workload (by default, "
            f"more than {MAX_WORKLOAD_TABLES} workloads get one best-per-workload table instead).",
        ),
        distributed: bool = typer.Option(
            False,
            "--distributed",
            help="Multi-host: jax.distributed.initialize() (cluster auto-detection, or the three options below); "
            "each process evaluates its share of the chunks into OUTPUT.work/ on a shared filesystem and process 0 merges.",
        ),
        coordinator: str | None = typer.Option(None, "--coordinator", help="Multi-host: coordinator address HOST:PORT (process 0's host)."),
        num_processes: int | None = typer.Option(None, "--num-processes", help="Multi-host: number of processes."),
        process_id: int | None = typer.Option(None, "--process-id", help="Multi-host: this process's index (0 merges)."),
        evaluate: str | None = typer.Option(
            None,
            "--evaluate",
            help=(
                "How every point is evaluated: steady (the analytic steady state, the fast screen), replay (a batched replay of each "
                "point's benchmark load, [benchmark] in the spec: by default a closed loop of C clients and 10 x C prompts) or auto (the "
                "steady state, and a replay for the points it flags kv_preemption) [default: the spec's evaluate, else steady]."
            ),
        ),
        verify_top: int | None = typer.Option(
            None,
            "--verify-top",
            help=(
                "Replay the best N rows per workload, each at its own load (aggregated: the benchmark at its concurrency per worker x its "
                "replicas; disaggregated: an open loop at its request rate), in one batched replay; compare the replayed statistics with "
                "the row's and apply the SLA; writes OUTPUT with suffix .verified.parquet."
            ),
        ),
        trace: str | None = typer.Option(
            None,
            "--trace",
            help="--verify-top: take the requests' lengths from this trace (in order) instead of the row's workload; the load stays the row's own.",
        ),
        verify_tolerance: float = typer.Option(
            0.2,
            "--verify-tolerance",
            help=(
                "--verify-top: the largest relative deviation (replay - row) / row of a compared statistic for a verified row (mean "
                "TTFT/TPOT/E2E, tok/s/GPU, the SLA's percentiles)."
            ),
        ),
        allow_unverified: bool = typer.Option(False, "--allow-unverified", help="--verify-top: exit 0 even when no row verifies (default: exit 3)."),
        price: list[str] | None = typer.Option(
            None,
            "--price",
            help="SYSTEM=USD per GPU-hour, e.g. b200_sxm=4.5 (repeatable): replaces the "
            "spec's [cost] and the bundled list price of that system (jaxsim/data/prices/README.md).",
        ),
    ) -> None:
        from jaxsim import limits
        from jaxsim.sweep import load_spec, run_sweep

        limits.check("top", top, "--top")
        if verify_top is None and trace is not None:
            fail("--trace gives --verify-top's request lengths; add --verify-top N")
        if verify_top is not None:
            limits.check("top", verify_top, "--verify-top")
        if not (math.isfinite(verify_tolerance) and verify_tolerance > 0):
            fail(f"--verify-tolerance: must be a positive number (got {verify_tolerance})")
        if evaluate is not None and evaluate not in EVALUATE:
            fail(f"--evaluate: one of {', '.join(EVALUATE)} (got {evaluate!r})")
        if chunk_size < 1:
            fail(f"--chunk-size must be >= 1 (got {chunk_size})")
        if not spec.is_file():
            fail(f"{spec}: no such sweep spec")
        s = load_spec(spec)
        if evaluate is not None:
            s = dataclasses.replace(s, evaluate=evaluate)
        if price:
            from dataclasses import replace

            from jaxsim.cost import parse_price_option

            s = replace(s, cost=s.cost.with_overrides(dict(parse_price_option(p) for p in price)))
        out = output or Path(f"{spec.stem}.results.parquet")
        if out.suffix.lower() != ".parquet":
            fail(f"{out}: results are written as parquet; use a .parquet file name (--csv adds the CSV)")
        inputs = (spec, trace) if trace is not None else (spec,)
        refuse_overwrite(out, force, None, inputs)
        vpath = out.with_name(out.stem + ".verified.parquet")
        tr = None
        if verify_top is not None:
            refuse_overwrite(vpath, force, None, inputs)
        if trace is not None:
            from jaxsim.replay.traces import load_trace

            tr = load_trace(trace)
        if csv:
            refuse_overwrite(out.with_suffix(".csv"), force, None, inputs)
        if plot is not None:
            if plot.suffix.lower() != ".png":
                fail(f"{plot}: the plot is written as PNG; use a .png file name")
            if importlib.util.find_spec("matplotlib") is None:
                fail("--plot needs matplotlib, which is not installed: pip install -e '.[plot]' (in the jaxsim checkout)")
            refuse_overwrite(plot, force, None, (*inputs, out))
        pid, count = 0, 1
        if distributed or coordinator or num_processes is not None or process_id is not None:
            import jax

            jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
            pid, count = jax.process_index(), jax.process_count()
        res = run_sweep(
            s, out, csv=csv, chunk_size=chunk_size, force=force, strict=strict, top=top,
            progress=None if quiet else ("bar" if stderr_is_tty() and not as_json else "lines"), process_index=pid, process_count=count,
        )
        if not res.finished:
            typer.echo(f"process {pid}/{count}: {res.chunks_run} chunks written to {out}.work/; process 0 merges them", err=True)
            return
        if plot is not None:
            from jaxsim.plots import plot_pareto

            plot_pareto(out, plot, title=f"jaxsim sweep {s.name}: throughput vs interactivity (SLA-feasible highlighted)")
        verified = None
        if verify_top is not None:
            from jaxsim.outputs import write_table
            from jaxsim.sweep.verify import verify_top as run_verify

            verified = run_verify(res.plan, res.top, verify_top, trace=tr, tolerance=verify_tolerance)
            write_table(verified, vpath, allowed=("parquet",))
        if as_json:
            typer.echo(_json(res, plot, verified, vpath))
        else:
            _report(res, plot, max_pareto=10, sla=s.sla, all_tables=all_tables)
            if verified is not None:
                _report_verified(verified, tr, vpath)
            _next(spec, out, verified, s.evaluate, feasible=bool(res.top.num_rows))
        if verified is not None and not any(verified.column("verified").to_pylist()):
            what = "no row to verify (none is SLA-feasible)" if not verified.num_rows else f"none of the {verified.num_rows} replayed rows verified"
            typer.echo(f"{'warning' if allow_unverified else 'unverified'}: --verify-top {verify_top}: {what}"
                       + ("" if allow_unverified else f"; exit {EXIT_UNVERIFIED} (--allow-unverified exits 0)"), err=True)
            if not allow_unverified:
                raise typer.Exit(EXIT_UNVERIFIED)
