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

With --benchmark FILE (instead of --log) it fits a serving overhead instead: what a benchmark measures outside the
forward passes, TTFT + fixed + per prompt token × ISL and TPOT + per output token, each term >= 0, to closed-loop
benchmark results (vllm bench serve --save-result JSON, one object, a list or JSON lines; or CSV rows in aiconfigurator's
silicon-sample schema, the rows of the profile's model, system and TP) against the profile's steady state; 7 of every
10 rows fit, 3 are held out. It writes the overhead as JSON (--output FILE.json: fitted from FILE), which a sweep spec's
[[profile]] takes as overhead = "FILE.json", and prints the held-out error without and with it.

Examples:

  jaxsim calibrate profiles/qwen3-32b-b300-modelled --log run/fpm_metrics_detail.csv --output profiles/qwen3-32b-calibrated
  jaxsim calibrate my_profile --benchmark results.jsonl --tp 2 --output overhead.json
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
        log: Path | None = typer.Option(None, "--log", help="Measured passes: FPM CSV/JSONL, or a planner results folder."),
        benchmark: list[Path] = typer.Option(
            [], "--benchmark",
            help="Benchmark results to fit a serving overhead to (repeatable): vllm bench serve --save-result JSON, or a silicon-sample CSV."),
        output: Path = typer.Option(..., "--output", "-o", help="Calibrated profile directory to write (--benchmark: the overhead JSON file)."),
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
        async_scheduling: bool = typer.Option(
            False, "--async-scheduling",
            help="--benchmark: predict the rows with async scheduling (the benchmarked server ran vLLM's --async-scheduling; "
                 "sweep with [[profile]] async_scheduling = true to use the fit)."),
    ) -> None:
        from jaxsim.calibrate import CalibrationConfig, calibrate, calibrated_profile, write_calibrated
        from jaxsim.profile.resolve import resolve_profile_dir

        if (log is None) == (not benchmark):
            raise typer.BadParameter("give --log (measured passes) or --benchmark (benchmark results), not both", param_hint="--log/--benchmark")
        profile_dir = resolve_profile_dir(profile)
        if benchmark:
            _fit_overhead(profile_dir, benchmark, output, tp, force, as_json, async_scheduling)
            return
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


def _fit_overhead(profile_dir: Path, files: list[Path], output: Path, tp: int | None, force: bool, as_json: bool,
                  async_scheduling: bool = False) -> None:
    """``jaxsim calibrate PROFILE --benchmark FILE``: fit and write the serving overhead, print held-out error."""
    from jaxsim.outputs import atomic_file, check_output
    from jaxsim.overhead import OverheadError, read_benchmark
    from jaxsim.profile.resolve import load_bundle
    from jaxsim.sweep.benchmark_fit import fit_benchmark, matching_rows, predict_rows

    check_output(output, ("json",), force=force, inputs=(*files, profile_dir))
    prof = load_bundle(profile_dir).profile
    tps = {d.tp for d in prof.deployments}
    systems = sorted({d.system for d in prof.deployments})
    rows = []
    for f in files:
        rows += matching_rows(read_benchmark(f), prof.model, systems[0], tps if tp is None else {tp}, str(f))
    row_tps = {r.tp for r in rows if r.tp is not None}
    if tp is None:
        if len(row_tps) > 1 or (not row_tps and len(tps) > 1):
            raise OverheadError(f"the benchmark rows measure TP {sorted(row_tps) or '?'} and the profile records TP {sorted(tps)}: give --tp")
        tp = row_tps.pop() if row_tps else next(iter(tps))
    rows = [r for r in rows if r.tp in (None, tp)]
    ttft, tpot, _ = predict_rows(profile_dir, rows, tp, async_scheduling=async_scheduling)
    names = ", ".join(str(f) for f in files)
    how = ", async scheduling" if async_scheduling else ""
    fit = fit_benchmark(rows, ttft, tpot, f"fitted from {names} ({len(rows)} rows, TP{tp}{how}) by jaxsim calibrate --benchmark")
    doc = {"profile": str(profile_dir), "tp": tp, "async_scheduling": async_scheduling, **fit.summary()}
    with atomic_file(output, "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, indent=1, default=float) + "\n")
    if as_json:
        typer.echo(json.dumps({"output": str(output), **doc}, indent=1, default=float))
        return
    ov = fit.overhead
    typer.echo(f"serving overhead: {ov.describe()}")
    typer.echo(f"rows: {fit.rows} ({fit.predicted} inside the profile's support; {fit.train} fit, {fit.held_out} held out)")
    for part in ("held_out", "train"):
        s = fit.scores[part]
        line = "; ".join(f"{m.upper()} median/p90 |err| {s[m]['without']['median_pct']:.1f}/{s[m]['without']['p90_pct']:.1f} % "
                         f"-> {s[m]['with']['median_pct']:.1f}/{s[m]['with']['p90_pct']:.1f} %" for m in ("ttft", "tpot"))
        typer.echo(f"{part.replace('_', '-')} ({s['ttft']['with']['n']} rows): {line}")
    typer.echo(f"wrote {output} (a sweep spec's [[profile]] takes it as overhead = \"{output}\")")
