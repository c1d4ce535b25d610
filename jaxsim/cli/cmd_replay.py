"""``jaxsim replay``: replay a request trace against one deployment or a whole sweep, in one compiled call."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import typer

from jaxsim import limits
from jaxsim.cli.common import console, fail, guarded, refuse_overwrite, stderr_is_tty
from jaxsim.sla import Goodput

EXIT_INCOMPLETE = 3

REPLAY_HELP = """Replay a request trace (Azure, Mooncake, plain CSV/JSONL or a bundled excerpt) through the
continuous-batching engine of a deployment: chunked prefill, KV blocks with preemption, measured
speculative rounds. Writes one parquet row per request (per configuration and seed): TTFT, TTST,
ITL/TPOT, E2E, decode rounds, preemptions, status. The summary is printed (or --json).

A replay stops, with an explicit status, at the first pass whose lookup lies outside the profile's
measured support: nothing is extrapolated. Requests a worker can never run (prompt at or over
max_model_len, or more KV blocks than the pool) are rejected and named on stderr with the reason.

Prefix caching (vLLM's automatic prefix caching, on by default as in vLLM and the reference): a Mooncake trace's
hash_ids say which prompts share leading blocks (--trace-block-size tokens per hash); requests read those blocks
from the KV cache instead of computing them, and the request table's cache_hit_tokens column says how many. Set
prefix_caching = false in a role to turn it off. Modelled for aggregated autoregressive replays (any router, each
replica its own cache; multi-turn sessions); elsewhere (speculative decoding, disaggregated, grouped KV caches) every
prompt is computed and the summary says so. See docs/prefix_caching.md.

Async scheduling (vLLM's --async-scheduling): async_scheduling = true in a role schedules each pass while the previous
one runs, so a request sent to a busy engine starts a pass later (a closed loop's next request two); off by default,
as the reference schedules. See docs/benchmark-loads.md#async-scheduling.

Exit codes: 0 every replay completed every request; 3 a replay stopped outside measured support (or hit
its pass limit), rejected requests (status "rejected: N of M requests") or completed no request (the
results are still written; --allow-incomplete exits 0 then); 2 bad input (nothing written).

Examples:

  jaxsim replay configs/deployment_speculative.toml --trace azure_code_1k --output out.parquet

  jaxsim replay configs/deployment_aggregated.toml --trace my_trace.jsonl --max-requests 500 --time-scale 2 --seeds 8 --output out.parquet --force

  jaxsim replay --sweep configs/quickstart.toml --trace mooncake_tiny --output sweep_replay.parquet --json

Bundled traces: azure_code_1k, azure_conv_1k, mooncake_conversation_1k, mooncake_tiny.
"""

def configs_from_sweep(spec_path: Path):
    """One replay configuration per valid binding of a sweep spec (:func:`~jaxsim.sweep.replayed.sweep_configs`)."""
    from jaxsim.sweep.replayed import sweep_configs
    from jaxsim.sweep.spec import load_spec, plan_sweep

    plan = plan_sweep(load_spec(spec_path))
    out = sweep_configs(plan)
    if not out:
        fail(f"{spec_path}: no valid binding to replay ({len(plan.invalid)} rule(s) refused every one)")
    return out


def _timings(t: dict, t_results: float, t_start: float) -> dict:
    """Wall-time split of one replay command (seconds): bindings and trace, compilation (lowering +
    XLA, or an executable-cache load), replay, and results (summaries and files); the scheduler passes
    replayed and the loop steps they took (decode stretches: several passes a step); the replays that took another's
    result (configurations that differ only in a max_num_seqs no admission reached: jaxsim.replay.runner.run_items)."""
    now = time.perf_counter()
    out = {"prepare_s": t.get("prepare_s", 0.0), "compile_s": t.get("compile_s", 0.0), "compilations": int(t.get("compilations", 0)),
           "executables_loaded": int(t.get("executables_loaded", 0)),
           "run_s": t.get("run_s", 0.0), "results_s": now - t_results, "total_s": now - t_start,
           "passes": int(t.get("passes", 0)), "loop_steps": int(t.get("loop_steps", 0)),
           "replays_shared": int(t.get("replays_shared", 0))}
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


def _progress_note(p) -> str:
    """Where a replay run stands (:class:`~jaxsim.replay.runner.ReplayProgress`), in words."""
    return (f"simulated time {p.simulated_ms / 1000:,.1f} s of {p.span_ms / 1000:,.1f} s (to the last arrival), "
            f"{p.requests_done:,} / {p.requests:,} requests completed, {p.replays_done} / {p.replays} replays done")


def _print_summary(summaries: list[dict], trace_name: str, n: int) -> None:
    from rich.table import Table

    t = Table(title=f"replay of {trace_name} ({n} requests)")
    for h in ("config", "seed", "status", "done", "TTFT mean", "TTFT p99", "TPOT mean", "E2E p99", "out tok/s", "preempt"):
        t.add_column(h, justify="left" if h in ("config", "status") else "right")
    f = lambda v, d=2: "-" if v is None else f"{v:,.{d}f}"  # noqa: E731
    for s in summaries:
        status = s["status"].replace("stopped: pass lookup unsupported:", "unsupported ")
        status += f" at {s['stopped_at']}" if s["stopped_at"] else ""
        t.add_row(s["config"], str(s["seed"]), status, f"{int(s['completed_requests'])}/{n}", f(s["mean_ttft_ms"]),
                  f(s["p99_ttft_ms"]), f(s["mean_tpot_ms"]), f(s["p99_e2e_ms"]), f(s["output_throughput_tok_s"], 1),
                  str(int(s["preemptions"])))
    console().print(t)
    for line in _routing_lines(summaries):
        typer.echo(line)
    for line in _cache_lines(summaries):
        typer.echo(line)
    ahead = list(dict.fromkeys(s["config"] for s in summaries if s.get("async_scheduling")))
    if ahead:
        typer.echo(f"{', '.join(ahead)}: async scheduling (vLLM's --async-scheduling): a request sent to a busy engine starts a pass "
                   "later, a closed loop's next request two (docs/benchmark-loads.md#async-scheduling)")
    for s in summaries[:1]:
        if s.get("sessions"):
            unsent = int(s.get("unsent_turns") or 0)
            typer.echo(f"{s['sessions']:,} multi-turn sessions: each later turn sent when its previous turn completed plus its think time"
                       + (f"; {unsent:,} turns never sent (their session ended at a rejected or unfinished turn)" if unsent else ""))
    shown = set()
    for s in summaries:
        ov = s.get("overhead")
        if ov and s["config"] not in shown:
            shown.add(s["config"])
            typer.echo(f"{s['config']}: latencies include the serving overhead {ov['fixed_ms']:g} ms + {ov['per_prompt_token_ms']:g} ms/prompt "
                       f"token (TTFT) + {ov['per_output_token_ms']:g} ms/output token (TPOT), per request after the replay "
                       f"(throughput unchanged); {ov['provenance']}")


def _with_router(configs: list, router: str) -> list:
    """Every configuration with the router ``--router`` names (Dynamo's default weights); one line otherwise."""
    from jaxsim.router import RouterError, read_router

    try:
        r = read_router(router, "--router")
    except RouterError as e:
        fail(str(e))
    return _replaced(lambda c: dataclasses.replace(c, router=r), configs)


def _replaced(change, configs: list) -> list:
    """``change`` applied to every configuration; a combination a replay configuration refuses (a routed pool under a
    closed loop, ...) is one line."""
    try:
        return [change(c) for c in configs]
    except ValueError as e:
        fail(str(e))


def _cache_lines(summaries: list[dict]) -> list[str]:
    """One line per configuration whose trace has shared prefixes (hash_ids): what its prefix cache did."""
    out, seen = [], set()
    for s in summaries:
        mode = s.get("prefix_caching")
        if s["config"] in seen or mode in (None, "no hash_ids"):
            continue
        seen.add(s["config"])
        if mode == "modelled":
            out.append(f"{s['config']}: prefix caching on: {s['prefix_hit_ratio']:.1%} of completed requests' prompt tokens read from "
                       f"the cache ({int(s['cache_hit_tokens']):,} tokens; column cache_hit_tokens)")
        elif mode == "off":
            out.append(f"{s['config']}: prefix caching off (prefix_caching = false): every prompt computed")
        else:
            out.append(f"{s['config']}: prefix caching {mode}: every prompt computed, an upper bound on prefill work "
                       "(set prefix_caching = false to say so)")
    return out


def _routing_lines(summaries: list[dict]) -> list[str]:
    """One line per routed configuration (its first seed): policy, rounds, requests per replica, predicted overlap."""
    lines, shown = [], set()
    for s in summaries:
        r = s.get("router")
        if not r or s["config"] in shown:
            continue
        shown.add(s["config"])
        lines.append(f"{s['config']}: router {r['policy']} (in the loop): requests per replica "
                     f"{'/'.join(str(x) for x in r['requests_per_replica'])}; router-predicted cache overlap "
                     f"{100 * r['predicted_overlap_share']:.1f} % of prompt tokens")
    return lines


def _requests(trace, trace_format, time_scale, max_requests, load, isl, osl, range_ratio, length_rule, arrival_rule, seed,
              trace_block_size=None):
    """The requests to replay and their benchmark load (None: the trace's own arrivals, an open loop)."""
    from jaxsim.replay.loads import Lengths, benchmark_trace, parse_load
    from jaxsim.replay.prefix_cache import DEFAULT_TRACE_BLOCK_SIZE
    from jaxsim.replay.traces import load_trace

    if load is None:
        given = [o for o, v in (("--isl", isl), ("--osl", osl), ("--range-ratio", range_ratio or None)) if v is not None]
        if given:
            fail(f"{given[0]} goes with --load (a benchmark load); a trace brings its own lengths")
        if trace is None:
            fail("give --trace TRACE or --load LOAD (a benchmark load: closed:C[:N], poisson:RATE[:N], gamma:RATE:N:BURSTINESS)")
        tr = load_trace(trace, fmt=trace_format, time_scale=time_scale, max_requests=max_requests, trace_block_size=trace_block_size)
        if trace_block_size is None and tr.hash_ids is not None and tr.trace_block_size != DEFAULT_TRACE_BLOCK_SIZE:
            typer.echo(f"{trace}: hash_ids read at {tr.trace_block_size} tokens per hash id: every row has ceil(input_length / "
                       f"{tr.trace_block_size}) of them, not ceil(input_length / 512) (--trace-block-size states the size)", err=True)
        return tr, None
    if time_scale != 1.0:
        fail("--time-scale rescales a trace's arrivals; with --load the load sets them")
    bench = parse_load(load, arrival_rule=arrival_rule)
    if trace is not None:
        if isl is not None or osl is not None or range_ratio:
            fail("--isl/--osl/--range-ratio and --trace both give lengths; give one")
        lengths = load_trace(trace, fmt=trace_format, max_requests=max_requests)
    else:
        lengths = Lengths(1024 if isl is None else isl, 128 if osl is None else osl, range_ratio, length_rule)
    return benchmark_trace(bench, lengths, seed=seed), bench


def register(app: typer.Typer) -> None:
    """Add ``jaxsim replay``."""

    @app.command("replay", help=REPLAY_HELP, no_args_is_help=True)
    @guarded
    def replay_cmd(
        config: Path | None = typer.Argument(None, help="Deployment config (TOML); omit with --sweep."),
        trace: str | None = typer.Option(
            None,
            "--trace",
            "-t",
            help="Trace file (Azure CSV, Mooncake JSONL, plain CSV/JSONL) or a bundled trace name; with --load, only its lengths are used.",
        ),
        output: Path = typer.Option(..., "--output", "-o", help="Per-request results (parquet)."),
        sweep: Path | None = typer.Option(None, "--sweep", help="Sweep spec (TOML): replay every valid binding of it."),
        force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
        seeds: int = typer.Option(1, "--seeds", help="Replays per configuration with seeds seed..seed+N-1 (stochastic acceptance)."),
        seed: int = typer.Option(0, "--seed", help="First seed."),
        timeline: bool = typer.Option(False, "--timeline", help="Also write per-pass records to OUTPUT with suffix .timeline.parquet."),
        trace_format: str | None = typer.Option(None, "--format", help="Trace format: azure, mooncake, csv or jsonl (default: sniffed)."),
        time_scale: float = typer.Option(1.0, "--time-scale", help="Multiply arrival times (>1 slows the trace down)."),
        max_requests: int | None = typer.Option(None, "--max-requests", help="Keep the first N requests."),
        trace_block_size: int | None = typer.Option(
            None, "--trace-block-size",
            help=("Prompt tokens per hash id of a Mooncake trace's hash_ids (prefix caching reads them). Default: the power of "
                  "two most rows fit, 512 (as Mooncake and the reference) when it fits as many; the replay says when it is not "
                  "512."),
        ),
        load: str | None = typer.Option(
            None,
            "--load",
            help=(
                "A benchmark load instead of the trace's arrivals (docs/benchmark-loads.md): closed:C[:N] (C clients, N prompts, default "
                "10 x C, all C sent at t = 0, the next when one completes; vllm bench serve --max-concurrency C), poisson:RATE[:N] or "
                "gamma:RATE:N:BURSTINESS (open loop, requests/s, default N 1000). Lengths: --isl/--osl/--range-ratio, or --trace's "
                "requests in order."
            ),
        ),
        isl: int | None = typer.Option(None, "--isl", help="--load: input tokens per request (default 1024, vllm bench serve's)."),
        osl: int | None = typer.Option(None, "--osl", help="--load: output tokens per request (default 128, vllm bench serve's)."),
        range_ratio: float = typer.Option(
            0.0, "--range-ratio", help="--load: draw lengths around --isl/--osl, in [0, 1) (vllm: U[L(1-r), L(1+r)]; inferencex: U[rL, L])."
        ),
        length_rule: str = typer.Option("vllm", "--length-rule", help="--load: whose random lengths: vllm or inferencex."),
        arrival_rule: str = typer.Option(
            "vllm", "--arrival-rule", help="--load open loop: whose arrivals: vllm (rescaled to N/RATE) or inferencex (first at 0, no rescaling)."
        ),
        max_concurrency: int = typer.Option(
            0,
            "--max-concurrency",
            help=(
                "Closed loop, as vllm bench serve --max-concurrency C: at most C requests in flight per replica, each sent when it has "
                "arrived and a slot is free (FIFO); TTFT and E2E from the send. 0: open loop. Disaggregated: C in flight over the "
                "whole prefill-decode pipeline."
            ),
        ),
        router: str | None = typer.Option(
            None,
            "--router",
            help=(
                "How a pool's requests go to its replicas: round_robin, least_loaded (fewest in flight) or kv (Dynamo's KV router: "
                "prefix overlap against load, its default weights); overrides the deployment's [router]. Open loops only."
            ),
        ),
        sla_ttft_ms: float | None = typer.Option(None, "--sla-ttft-ms", help="Goodput SLA: TTFT bound (ms)."),
        sla_tpot_ms: float | None = typer.Option(None, "--sla-tpot-ms", help="Goodput SLA: TPOT bound (ms)."),
        sla_e2e_ms: float | None = typer.Option(None, "--sla-e2e-ms", help="Goodput SLA: E2E bound (ms)."),
        as_json: bool = typer.Option(False, "--json", help="Print the summaries as JSON instead of a table."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress on stderr: a bar on a terminal, else a line every 10 s."),
        allow_incomplete: bool = typer.Option(
            False,
            "--allow-incomplete",
            help="Exit 0 even when a replay stopped outside support, rejected requests or completed nothing (default: exit 3).",
        ),
    ) -> None:
        t_start = time.perf_counter()
        from jaxsim.replay.deployment import config_from_binding
        from jaxsim.replay.orchestrate import run_replays

        if (config is None) == (sweep is None):
            fail("give a deployment CONFIG or --sweep SPEC (exactly one)")
        limits.check("seeds", seeds, "--seeds")
        limits.check("seed", seed, "--seed")
        limits.check("time_scale", time_scale, "--time-scale")
        if max_requests is not None:
            limits.check("requests", max_requests, "--max-requests")
        if max_concurrency:
            limits.check("max_num_seqs", max_concurrency, "--max-concurrency")
        for opt, v in (("--sla-ttft-ms", sla_ttft_ms), ("--sla-tpot-ms", sla_tpot_ms), ("--sla-e2e-ms", sla_e2e_ms)):
            if v is not None:
                limits.check("ms", v, opt)
        tl_path = output.with_name(output.stem + ".timeline.parquet")
        inputs = (config, sweep, trace) if trace is not None else (config, sweep)
        refuse_overwrite(output, force, ("parquet",), inputs)
        if timeline:
            refuse_overwrite(tl_path, force, None, inputs)
        goodput = None
        if any(v is not None for v in (sla_ttft_ms, sla_tpot_ms, sla_e2e_ms)):
            goodput = Goodput(ttft_ms=sla_ttft_ms, tpot_ms=sla_tpot_ms, e2e_ms=sla_e2e_ms)
        if sweep is not None:
            configs = configs_from_sweep(sweep)
        else:
            from jaxsim.deploy.binding import bind
            from jaxsim.rules.config import load_config

            configs = [config_from_binding(bind(load_config(config)), name=config.stem)]
        from jaxsim.replay import budget

        if trace is not None and load is None and Path(trace).is_file() and not budget.check_environment_override():
            import numpy as np

            rows = budget.file_rows(trace)  # before parsing: a trace this machine cannot replay is refused unread
            if rows:
                rows = min(rows, max_requests or rows)
                why = budget.refusal(budget.estimate(configs, np.ones(rows, np.int64), seeds), budget.available_bytes())
                if why is not None:
                    fail(f"{trace}: {rows:,} rows: {why} (JAXSIM_REPLAY_NO_MEMORY_CHECK=1 skips this check)")
        if router is not None:
            configs = _with_router(configs, router)
        if trace_block_size is not None and trace_block_size < 1:
            fail(f"--trace-block-size {trace_block_size} must be >= 1")
        tr, bench = _requests(trace, trace_format, time_scale, max_requests, load, isl, osl, range_ratio, length_rule,
                              arrival_rule, seed, trace_block_size)
        if bench is not None:
            from jaxsim.replay.loads import with_load

            if max_concurrency:
                fail("--max-concurrency caps a trace's replay; with --load the load sets the concurrency (closed:C)")
            configs = _replaced(lambda c: with_load(c, bench), configs)
        if max_concurrency:
            configs = _replaced(lambda c: dataclasses.replace(c, max_concurrency=int(max_concurrency)), configs)
        from jaxsim.replay.orchestrate import closed_loop_refusal

        for c in configs:
            why = closed_loop_refusal(c, tr)
            if why:
                fail(f"{trace or 'the load'}: {why}")
        if tr.sessions is not None and bool((tr.sessions.previous >= 0).any()):
            from jaxsim.replay.orchestrate import session_refusal

            for c in configs:
                why = session_refusal(c)
                if why:
                    fail(f"{trace}: {why}")
        seed_list = list(range(seed, seed + seeds))
        cost = budget.estimate(configs, tr.output_tokens, len(seed_list), timeline_len=(1 << 18) if timeline else 0)
        why = None if budget.check_environment_override() else budget.refusal(cost, budget.available_bytes())
        if why is not None:
            fail(f"{trace or load}: {why} (JAXSIM_REPLAY_NO_MEMORY_CHECK=1 skips this check)")
        timings: dict = {"prepare_s": time.perf_counter() - t_start}

        what = f"replaying {len(tr)} requests x {len(configs) * len(seed_list)} replays"
        if progress and stderr_is_tty():
            from rich.progress import Progress

            with Progress(transient=True) as bar:
                task = bar.add_task(what, total=1000)

                def show(p) -> None:
                    bar.update(task, completed=int(1000 * p.fraction), description=f"{what}: {_progress_note(p)}")

                outcomes = run_replays(configs, tr, seed_list, timeline=timeline, goodput=goodput, progress=show, timings=timings)
        elif progress:  # not a terminal (piped, CI): a plain line on stderr every 10 s
            from jaxsim.progress import ProgressLines

            lines = ProgressLines(what, 100, "%")
            outcomes = run_replays(configs, tr, seed_list, timeline=timeline, goodput=goodput,
                                   progress=lambda p: lines.set(int(100 * p.fraction), _progress_note(p)), timings=timings)
        else:
            outcomes = run_replays(configs, tr, seed_list, timeline=timeline, goodput=goodput, timings=timings)
        t_results = time.perf_counter()
        from jaxsim.replay.results import rejection_lines, write_results

        summaries = write_results(outcomes, output, tl_path if timeline else None)
        timings = _timings(timings, t_results, t_start)
        if as_json:
            typer.echo(json.dumps({"trace": tr.name, "load": bench.describe() if bench is not None else None, "requests": len(tr),
                                   "output": str(output), "timings": timings,
                                   "replays": summaries}, indent=1))
        else:
            _print_summary(summaries, tr.name if bench is None else f"{bench.describe()}, {tr.source.split('; ')[1]}", len(tr))
            typer.echo(f"wrote {output}" + (f" and {tl_path}" if timeline else ""))
            typer.echo(f"time: {timings['total_s']:.2f} s = prepare {timings['prepare_s']:.2f} s + compile {timings['compile_s']:.2f} s "
                       f"({timings['compilations']} compiled, {timings['executables_loaded']} loaded from the executable cache) + "
                       f"replay {timings['run_s']:.2f} s + results {timings['results_s']:.2f} s; {timings['passes']:,} scheduler passes in "
                       f"{timings['loop_steps']:,} loop steps"
                       + (f"; {timings['replays_shared']} replays shared another's result (only max_num_seqs differed, and no "
                          "admission reached it)" if timings["replays_shared"] else ""))
        for line in rejection_lines(outcomes):
            typer.echo(f"warning: {line}", err=True)
        incomplete = [s for s in summaries if s["status"] != "completed" or not s["completed_requests"]]
        if incomplete:
            first = incomplete[0]
            why = first["status"] if first["status"] != "completed" else "completed no request"
            why = why.replace("rejected: ", "rejected ")
            where = f" at {first['stopped_at']}" if first["stopped_at"] else ""
            typer.echo(f"{'warning' if allow_incomplete else 'incomplete'}: {len(incomplete)} of {len(summaries)} replays did not "
                       f"complete the trace (first: {first['config']} seed {first['seed']}: {why}{where})"
                       + ("" if allow_incomplete else f"; exit {EXIT_INCOMPLETE} (--allow-incomplete exits 0)"), err=True)
            if not allow_incomplete:
                raise typer.Exit(EXIT_INCOMPLETE)
