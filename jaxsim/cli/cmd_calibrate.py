"""``jaxsim calibrate``: correct a modelled profile with measured forward passes; print held-out error."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from jaxsim.cli.common import guarded, paragraphs, refuse_output_dir

CALIBRATE_HELP = paragraphs("""Fit a smooth per-phase correction of a (modelled) profile to measured forward passes and write a calibrated profile.

PROFILE is a profile directory or bundled name (typically from `jaxsim import op-model`). LOG is a per-pass FPM log
(fpm_metrics_detail.csv or ForwardPassMetrics JSONL; the Dynamo model card and vLLM metadata beside it are read when
present) or a Dynamo planner results folder (prefill.csv, decode.csv; windows of 10 points by default). The log must
measure the profile's model, TP and
precisions; the calibrated profile takes the log's identity (backend version, KV pool, scheduler envelope).

The log is split by time (windows of --window passes, the first --train-fraction fit, the rest held out). Decode:
a low-order polynomial of log(measured / modelled) in (log2 batch, log2 total KV) fitted to robust per-bin medians,
plus a shrunk per-measured-batch offset (vLLM pads decode batches to CUDA-graph sizes, so real latency steps in batch);
prefill: the same in log2 tokens (+ batch, cached KV where varied), from prefill-only passes and the prefill share of
mixed passes. Features are clipped to the training box (no extrapolated trend), factors to [0.5, 2], corrected rows
never invert the base's order. Prints, for the held-out passes, coverage and median / p90 absolute % error per phase
of the measured-direct table (the training passes imported directly), the source profile and the calibrated one.

Example:

  jaxsim calibrate profiles/qwen3-32b-b300-modelled --log run/fpm_metrics_detail.csv --output profiles/qwen3-32b-calibrated
""")


def _print_scores(title: str, scores: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from jaxsim.calibrate import PHASES

    t = Table(title=title)
    for c in ("phase", "profile", "held-out", "coverage", "median |err|", "p90 |err|"):
        t.add_column(c, justify="left" if c in ("phase", "profile") else "right")
    pct = lambda x: "-" if x != x else f"{x:.2f} %"  # noqa: E731
    for ph in PHASES:
        for lab, by_phase in scores.items():
            s = by_phase[ph]
            cov = "-" if not s["n"] else f"{100 * s['coverage']:.1f} %"
            t.add_row(ph, lab, f"{s['n']:,}", cov, pct(s["median_ape"]), pct(s["p90_ape"]))
    Console().print(t)


def register(app: typer.Typer) -> None:
    @app.command("calibrate", help=CALIBRATE_HELP)
    @guarded
    def calibrate_cmd(
        profile: str = typer.Argument(..., help="Profile directory or bundled name to correct."),
        log: Path = typer.Option(..., "--log", help="Measured passes: FPM CSV/JSONL, or a planner results folder."),
        output: Path = typer.Option(..., "--output", "-o", help="Calibrated profile directory to write."),
        tp: int | None = typer.Option(None, "--tp", help="TP the log measured (default: its vLLM metadata)."),
        backend_version: str | None = typer.Option(None, "--backend-version", help="Backend version of the log (default: its metadata)."),
        model_card: Path | None = typer.Option(None, "--model-card", help="Dynamo model card (default: beside the log)."),
        vllm_metadata: Path | None = typer.Option(None, "--vllm-metadata", help="vLLM metadata (default: beside the log)."),
        model: str | None = typer.Option(
            None,
            "--model",
            help="Name the log measured the profile's model under (same architecture, e.g. a quantized release); the calibrated profile takes it.",
        ),
        model_revision: str | None = typer.Option(
            None,
            "--model-revision",
            help="Pinned revision of the log's checkpoint (default: the log's, else a placeholder from its model card, else the profile's).",
        ),
        window: int = typer.Option(100, "--window", help="Passes per time window of the held-out split."),
        train_fraction: float = typer.Option(0.7, "--train-fraction", help="Leading share of each window that fits."),
        force: bool = typer.Option(False, "--force", help="Overwrite an existing output directory."),
        as_json: bool = typer.Option(False, "--json", help="Print the fit and held-out scores as JSON."),
    ) -> None:
        from jaxsim.calibrate import CalibrationConfig, calibrate, calibrated_profile, write_calibrated
        from jaxsim.profile.resolve import resolve_profile_dir

        profile_dir = resolve_profile_dir(profile)
        refuse_output_dir(output, force, (log, model_card, vllm_metadata, profile_dir))
        cfg = CalibrationConfig(window=window, train_fraction=train_fraction)
        if window == 100 and train_fraction == 0.7 and log.is_dir():
            cfg = CalibrationConfig(window=10, train_fraction=0.7)  # planner sweeps: tens of points
        cal = calibrate(profile_dir, log, tp=tp, backend_version=backend_version, model_card=model_card,
                        vllm_metadata=vllm_metadata, model=model, model_revision=model_revision, config=cfg)
        write_calibrated(output, [calibrated_profile(cal)], force=True, report=cal.summary())
        from jaxsim.calibrate import weak_note

        if weak_note(cal.scores):
            typer.echo(f"warning: {weak_note(cal.scores)} (flagged in {output}/calibration.json weak_phases)", err=True)
        if as_json:
            from jaxsim.calibrate import _json_default

            typer.echo(json.dumps({"output": str(output), **cal.summary()}, indent=1, default=_json_default))
        else:
            _print_scores(f"Held-out passes of {log.name} (TP{cal.deployment.tp}) -> {output}", cal.scores)
