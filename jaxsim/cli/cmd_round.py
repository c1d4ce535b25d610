"""``jaxsim round``: evaluate a file of forward-pass queries against one measured deployment."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from jaxsim.cli.common import guarded, refuse_overwrite

ROUND_HELP = """Evaluate forward-pass (round) timings for every query row of a CSV/parquet file.

Query columns: workload_kind (decode|prefill|mixed), batch_size, total_prefill_tokens,
total_kv_read_tokens; mixed rows add num_decode_requests, total_decode_kv_tokens. The output repeats
them and adds latency_ms (empty when unsupported: nothing is extrapolated), status and data_source (what the
profile's numbers are: measured, derived, modelled or calibrated).

Example:

  jaxsim round qwen3-32b-bf16-b300 --tp 2 --queries q.csv --output out.csv
"""


def register(app: typer.Typer) -> None:
    @app.command("round", help=ROUND_HELP)
    @guarded
    def round_cmd(
        profile: str = typer.Argument(..., help="Profile directory (profile.json + FPM table) or bundled profile name."),
        queries: Path = typer.Option(..., "--queries", "-q", help="Query file (.csv or .parquet)."),
        output: Path = typer.Option(..., "--output", "-o", help="Result file (.csv or .parquet)."),
        tp: int | None = typer.Option(None, help="Tensor-parallel size of the deployment to use."),
        dp: int | None = typer.Option(None, help="Attention data-parallel size."),
        moe_tp: int | None = typer.Option(None, help="MoE tensor-parallel size."),
        moe_ep: int | None = typer.Option(None, help="MoE expert-parallel size."),
        role: str | None = typer.Option(None, help="Worker role: aggregated, prefill or decode."),
        system: str | None = typer.Option(None, help="System id (e.g. h200_sxm)."),
        backend_version: str | None = typer.Option(None, help="Literal backend version."),
        force: bool = typer.Option(False, "--force", help="Overwrite OUTPUT if it exists."),
        quiet: bool = typer.Option(False, "--quiet", help="Print nothing on success."),
    ) -> None:
        from jaxsim.kernels.tables import load_round_table
        from jaxsim.profile.resolve import profile_data_source
        from jaxsim.round_queries import evaluate_file

        refuse_overwrite(output, force, ("csv", "parquet"), inputs=(queries, profile))
        t0 = time.perf_counter()
        table, deployment = load_round_table(
            profile, tp=tp, dp=dp, moe_tp=moe_tp, moe_ep=moe_ep, role=role, system=system, backend_version=backend_version
        )
        source = profile_data_source(profile)
        total, ok = evaluate_file(table, queries, output, data_source=source)
        if not quiet:
            typer.echo(
                f"{total} queries on {deployment.describe()} ({source}): {ok} answered, {total - ok} unsupported "
                f"→ {output} ({time.perf_counter() - t0:.2f} s)"
            )
