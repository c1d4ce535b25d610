"""``jaxsim size``: GPUs (which kind, at which TP) and dollars for a target load, within a sweep's SLA."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

from jaxsim.cli.common import console, fail, guarded

EXIT_NO_ANSWER = 3  # like an incomplete replay: the command ran, and there is no answer to give

SIZE_HELP = """How many GPUs of which kind, at which TP, serve a target load within a sweep's SLA, and what they cost.

Reads a sweep's results (jaxsim sweep writes them). For every (profile, TP) it takes the SLA-feasible row
(a deployment at one concurrency per worker) that needs the fewest GPUs for the load: ceil(load / the row's
requests/s per serving unit) serving units, rounded up. Prints one option per (profile, TP), cheapest first,
and the answer: N × GPU at TPk, with US dollars per hour and per million output tokens at the target load
(bundled on-demand list prices unless the sweep spec's [cost] or --price gave others: jaxsim/data/prices/README.md).

Exit codes: 0 an answer; 3 no configuration of the results meets the SLA (nothing to size); 2 bad input.

Examples:

  jaxsim size gpu_whatif.results.parquet --rate 20

  jaxsim size planner.parquet --tokens-per-s 50000 --price b300_sxm=5.50 --json
"""


def _money(v: float, digits: int = 2) -> str:
    return "-" if not math.isfinite(v) else f"${v:,.{digits}f}"


def register(app: typer.Typer) -> None:
    """Add ``jaxsim size``."""

    @app.command("size", help=SIZE_HELP, no_args_is_help=True)
    @guarded
    def size_cmd(
        results: Path = typer.Argument(..., help="Sweep results (.parquet) written by jaxsim sweep."),
        rate: float | None = typer.Option(None, "--rate", help="Target load in requests/s."),
        tokens_per_s: float | None = typer.Option(None, "--tokens-per-s", help="Target load in output tokens/s (instead of --rate)."),
        workload: str | None = typer.Option(None, "--workload", help="The workload to size for (needed when the sweep has several)."),
        price: list[str] | None = typer.Option(
            None, "--price", help="SYSTEM=USD per GPU-hour, e.g. b200_sxm=4.5 (repeatable); replaces the results' price."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the options and the answer as JSON."),
    ) -> None:
        from jaxsim.cost import parse_price_option
        from jaxsim.sweep.sizing import SizingTarget, describe_sla, describe_workload, size_fleet

        target = SizingTarget(rate, tokens_per_s)
        prices = dict(parse_price_option(p) for p in price or ())
        if results.suffix.lower() != ".parquet":
            fail(f"{results}: expected the sweep results parquet (jaxsim sweep writes <spec>.results.parquet)")
        options, ctx = size_fleet(results, target, workload=workload, prices=prices)
        load = f"{target.describe(ctx['osl_mean'])} of {describe_workload(ctx['workload'], ctx['isl_mean'], ctx['osl_mean'], ctx['classes'])}"
        sla = describe_sla(ctx["sla"])
        if as_json:
            typer.echo(json.dumps({"results": str(results), "workload": ctx["workload"], "sla": ctx["sla"], "load": load,
                                   "options": [o.to_dict() for o in options],
                                   "answer": options[0].to_dict() if options else None}, indent=1))
        else:
            _print_options(options, load, sla)
        if not options:
            typer.echo(f"no configuration in {results} meets the SLA ({sla}) for {ctx['workload']}: nothing to size", err=True)
            raise typer.Exit(EXIT_NO_ANSWER)


def _print_options(options, load: str, sla: str) -> None:
    from rich.table import Table

    from jaxsim.sweep.sizing import FleetOption

    con = console()
    t = Table(title=f"fleet per profile and TP for {load} (cheapest first)", title_justify="left")
    for c in ("profile", "GPU", "TP", "mode", "K", "conc", "req/s/unit", "units", "GPUs", "tok/s/user", "$/GPU-h", "$/hour", "$/1M out tok"):
        t.add_column(c, justify="left" if c in ("profile", "GPU", "mode") else "right")
    for o in options:
        o: FleetOption
        t.add_row(
            o.profile,
            o.gpu,
            str(o.tp),
            o.mode,
            str(o.nextn),
            str(o.concurrency),
            f"{o.unit_request_rate_per_s:,.2f}",
            str(o.units),
            str(o.gpus),
            f"{o.tokens_per_s_per_user:,.1f}",
            _money(o.usd_per_gpu_hour),
            _money(o.usd_per_hour),
            _money(o.usd_per_1m_output_tokens),
        )
    con.print(t)
    if not options:
        return
    best = options[0]
    cost = (
        f", {_money(best.usd_per_1m_output_tokens)} per 1M output tokens ({_money(best.usd_per_hour)} per hour)"
        if math.isfinite(best.usd_per_hour)
        else f" (no price for {best.system}: give --price {best.system}=USD)"
    )
    typer.echo(
        f"for {load} at {sla}: {best.answer()} ({best.units} serving unit{'s' if best.units > 1 else ''} of {best.unit_gpus} "
        f"GPU{'s' if best.unit_gpus > 1 else ''}, "
        f"{best.mode}{f', K={best.nextn}' if best.nextn else ''}, concurrency {best.concurrency} per worker){cost}"
    )
    if best.data_source != "measured":
        typer.echo(f"note: {best.profile}'s numbers are {best.data_source}, not measured (docs/data-provenance.md)")
