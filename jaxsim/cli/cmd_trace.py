"""``jaxsim trace``: list bundled request traces and generate synthetic ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import typer

from jaxsim import limits
from jaxsim.cli.common import fail, guarded, refuse_overwrite

SYNTH_HELP = """Write a synthetic request trace (plain CSV: arrival_ms, input_length, output_length).

Arrivals are gamma-distributed with mean 1/RATE and coefficient of variation CV (CV=1 is Poisson,
below 1 more regular, above 1 burstier). Lengths are specs: N, fixed:N, uniform:LO:HI,
normal:MEAN:STD, lognormal:MEAN:CV or exponential:MEAN.

Example (a workload inside the bundled Llama-3.1-8B profile's measured support):

  jaxsim trace synth --n 200 --rate 1 --cv 0.1 --isl uniform:400:8000 --osl uniform:32:1000 --output t.csv
"""


def register(app: typer.Typer) -> None:
    trace_app = typer.Typer(help="Request traces: bundled excerpts and synthetic arrivals.", no_args_is_help=True)
    app.add_typer(trace_app, name="trace")

    @trace_app.command("list", help="List the bundled traces with their size and length ranges.\n\nExample:\n\n  jaxsim trace list")
    @guarded
    def list_cmd() -> None:
        from jaxsim.replay.traces import list_traces, load_trace

        for name in list_traces():
            t = load_trace(name)
            typer.echo(
                f"{name}: {len(t)} requests over {t.duration_ms / 1e3:,.0f} s; input {int(np.min(t.input_tokens))}.."
                f"{int(np.max(t.input_tokens))} tokens (median {int(np.median(t.input_tokens))}), output "
                f"{int(np.min(t.output_tokens))}..{int(np.max(t.output_tokens))} (median {int(np.median(t.output_tokens))})"
            )

    @trace_app.command("synth", help=SYNTH_HELP)
    @guarded
    def synth_cmd(
        output: Path = typer.Option(..., "--output", "-o", help="Trace file to write (.csv)."),
        n: int = typer.Option(200, "--n", help="Number of requests."),
        rate: float = typer.Option(1.0, "--rate", help="Mean arrival rate, requests/s."),
        cv: float = typer.Option(1.0, "--cv", help="Coefficient of variation of inter-arrival times (1 = Poisson)."),
        isl: str = typer.Option("fixed:1024", "--isl", help="Input length spec (tokens)."),
        osl: str = typer.Option("fixed:128", "--osl", help="Output length spec (tokens)."),
        seed: int = typer.Option(0, "--seed", help="RNG seed."),
        force: bool = typer.Option(False, "--force", help="Overwrite OUTPUT if it exists."),
    ) -> None:
        from jaxsim.replay.traces import gamma_trace, write_trace_csv

        limits.check("requests", n, "--n")
        limits.check("rate", rate, "--rate")
        limits.check("rate", cv, "--cv")
        limits.check("seed", seed, "--seed")
        if output.suffix.lower() != ".csv":
            fail(f"{output}: synthetic traces are written as plain CSV; use a .csv file name")
        refuse_overwrite(output, force, ("csv",))
        t = gamma_trace(n, rate, cv, isl, osl, seed=seed, name=output.stem)
        write_trace_csv(t, output)
        typer.echo(f"wrote {output}: {len(t)} requests over {t.duration_ms / 1e3:,.1f} s (gamma arrivals, rate {rate}/s, cv {cv}, seed {seed})")
