"""``jaxsim plot``: PNG figures of measured curves, support maps, Pareto frontiers and latency CDFs."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import typer

from jaxsim.cli.common import guarded, refuse_overwrite

PLOT_HELP = """Draw PNG figures: decode curves, support maps, prefill surfaces, Pareto frontiers, latency CDFs, KV timelines.

Needs the plot extra: pip install -e '.\\[plot]' in the jaxsim checkout. Existing files are never overwritten without --force.

Examples:

  jaxsim plot curves qwen3-32b-bf16-b300 --tp 2 --output curves.png

  jaxsim plot pareto results.parquet --output pareto.png
"""

CURVES_HELP = """Measured decode curves of one deployment: latency vs total past KV, one line per batch size.

Example:

  jaxsim plot curves qwen3-32b-bf16-b300 --tp 2 --output curves.png
"""

SUPPORT_HELP = """Support map: where decode queries of one deployment are answered, and why not elsewhere.

A batch × total-KV grid is evaluated by the compiled kernels and coloured by each query's status code
(legend: status names and their share of the grid); measured rows are overlaid.

Example:

  jaxsim plot support qwen3-32b-bf16-b300 --tp 2 --output support.png
"""

PREFILL_HELP = """Prefill latency of one measured batch size, vs new tokens and over the tokens × cached-KV plane.

Latencies come from the compiled kernels; the plane is blank outside measured support.

Example:

  jaxsim plot prefill qwen3-32b-bf16-b300 --tp 2 --batch 1 --output prefill.png
"""

PARETO_HELP = """Pareto plot of a sweep result: output tokens/s per GPU vs tokens/s per user.

SLA-feasible configs are highlighted, with one Pareto frontier per workload (--workload draws one);
configs outside measured support are counted, not drawn.

Example:

  jaxsim sweep configs/quickstart.toml --output results.parquet

  jaxsim plot pareto results.parquet --output pareto.png
"""

CDF_HELP = """Latency CDFs of a replay result: TTFT, TPOT and end-to-end latency (ms) per request.

One line per replayed config; only completed requests are counted.

Example:

  jaxsim replay configs/deployment_speculative.toml --trace azure_code_1k --output replay.parquet

  jaxsim plot cdf replay.parquet --output cdf.png
"""

TIMELINE_HELP = """KV use over time of a replay: KV blocks in use and requests running / waiting after each pass.

Reads the per-pass table that jaxsim replay --timeline writes next to its output.

Example:

  jaxsim replay configs/deployment_speculative.toml --trace azure_conv_1k --timeline --output replay.parquet

  jaxsim plot timeline replay.timeline.parquet --output kv.png
"""


def _output_option():
    return typer.Option(..., "--output", "-o", help="PNG file to write.")


def _force_option():
    return typer.Option(False, "--force", help="Overwrite OUTPUT if it exists.")


_PROFILE = typer.Argument(..., help="Profile directory (profile.json + FPM table) or bundled profile name.")
_TP = typer.Option(None, help="Tensor-parallel size of the deployment to draw.")
_DP = typer.Option(None, help="Attention data-parallel size.")
_MOE_TP = typer.Option(None, help="MoE tensor-parallel size.")
_MOE_EP = typer.Option(None, help="MoE expert-parallel size.")
_ROLE = typer.Option(None, help="Worker role: aggregated, prefill or decode.")
_SYSTEM = typer.Option(None, help="System id (e.g. h200_sxm).")
_VERSION = typer.Option(None, help="Literal backend version.")
_QUIET = typer.Option(False, "--quiet", help="Print nothing on success.")
_IDENTITY = (  # (parameter, type, option) of a deployment's identity inside a profile
    ("tp", int | None, _TP), ("dp", int | None, _DP), ("moe_tp", int | None, _MOE_TP),
    ("moe_ep", int | None, _MOE_EP), ("role", str | None, _ROLE), ("system", str | None, _SYSTEM),
    ("backend_version", str | None, _VERSION),
)


def _done(path: Path, quiet: bool) -> None:
    if not quiet:
        typer.echo(f"wrote {path}")


def _figure(output: Path, force: bool, quiet: bool, draw, source=None) -> None:
    """Check the PNG path, matplotlib and overwrite rule (never over ``source``, the input) before anything
    loads; then ``draw(plots)``."""
    from jaxsim import plots

    plots.check_png_path(output)
    plots.require_matplotlib()
    refuse_overwrite(output, force, None, (source,))
    _done(draw(plots), quiet)


def _profile_figure(profile: str, output: Path, force: bool, quiet: bool, identity: dict, draw) -> None:
    """A figure of one deployment: ``draw(plots_module, view)``."""
    _figure(output, force, quiet, lambda plots: draw(plots, plots.load_view(profile, **identity)), profile)


def register(app: typer.Typer) -> None:
    plot_app = typer.Typer(help=PLOT_HELP, no_args_is_help=True)
    app.add_typer(plot_app, name="plot")

    def profile_command(name: str, help_text: str, draw, *extra: tuple[str, Any, Any]) -> None:
        """A figure of one deployment of a profile: ``draw(plots, view, output, **extra)``; ``extra``
        (name, type, typer option) parameters stand after OUTPUT, before the identity options."""

        def cmd(**kw) -> None:
            identity = {k: kw[k] for k, _, _ in _IDENTITY}
            more = {k: kw[k] for k, _, _ in extra}
            _profile_figure(kw["profile"], kw["output"], kw["force"], kw["quiet"], identity,
                            lambda plots, view: draw(plots, view, kw["output"], **more))

        params = [("profile", str, _PROFILE), ("output", Path, _output_option()), *extra, *_IDENTITY,
                  ("force", bool, _force_option()), ("quiet", bool, _QUIET)]
        cmd.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d, annotation=t) for n, t, d in params],
            return_annotation=None,
        )
        plot_app.command(name, help=help_text)(guarded(cmd))

    profile_command("curves", CURVES_HELP, lambda plots, view, output: plots.plot_decode_curves(view, output))
    profile_command("support", SUPPORT_HELP, lambda plots, view, output: plots.plot_support_map(view, output))
    profile_command(
        "prefill", PREFILL_HELP, lambda plots, view, output, batch: plots.plot_prefill_surface(view, output, batch=batch),
        ("batch", int | None, typer.Option(None, help="Measured prefill batch size to draw (default: the one with most rows).")),
    )

    @plot_app.command("pareto", help=PARETO_HELP)
    @guarded
    def pareto_cmd(
        results: Path = typer.Argument(..., help="Sweep result table (.parquet or .csv) written by jaxsim sweep."),
        output: Path = _output_option(),
        workload: str | None = typer.Option(None, help="Draw one workload only (default: every workload, one frontier each)."),
        force: bool = _force_option(),
        quiet: bool = _QUIET,
    ) -> None:
        _figure(output, force, quiet, lambda plots: plots.plot_pareto(results, output, workload=workload), results)

    @plot_app.command("cdf", help=CDF_HELP)
    @guarded
    def cdf_cmd(
        results: Path = typer.Argument(..., help="Replay result table (.parquet or .csv) written by jaxsim replay."),
        output: Path = _output_option(),
        force: bool = _force_option(),
        quiet: bool = _QUIET,
    ) -> None:
        _figure(output, force, quiet, lambda plots: plots.plot_latency_cdf(results, output), results)

    @plot_app.command("timeline", help=TIMELINE_HELP)
    @guarded
    def timeline_cmd(
        timeline: Path = typer.Argument(..., help="Replay timeline (.parquet or .csv) written by jaxsim replay --timeline."),
        output: Path = _output_option(),
        num_gpu_blocks: int | None = typer.Option(None, help="KV pool size in blocks: draw use as a percentage of it."),
        force: bool = _force_option(),
        quiet: bool = _QUIET,
    ) -> None:
        if num_gpu_blocks is not None:
            from jaxsim import limits

            limits.check("blocks", num_gpu_blocks, "--num-gpu-blocks")
        _figure(output, force, quiet, lambda plots: plots.plot_kv_timeline(timeline, output, num_gpu_blocks=num_gpu_blocks), timeline)
