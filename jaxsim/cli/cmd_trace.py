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


PREFIX_HELP = """Check a Mooncake trace's hash_ids and report its prefix sharing.

Each prompt must carry one hash id per started block of --trace-block-size tokens (bad rows are refused
with the file and row). Prints the distinct KV blocks at the engine's --block-size and the share of
prompt tokens an unbounded prefix cache would serve in trace order (the sweep's prefix_hit_ratio =
"measured"). See docs/prefix_caching.md.

Example:

  jaxsim trace prefix mooncake_conversation_1k
"""


SESSIONS_HELP = """Write synthetic multi-turn sessions (Mooncake JSONL with session_id, turn, delay_ms and hash_ids).

Sessions start at gamma-distributed gaps (RATE sessions/s, CV; 1 is Poisson). Turn 1's prompt is
--new-input tokens; turn k's prompt is the conversation so far (turn k-1's prompt and output) plus
--new-input new tokens. `jaxsim replay` sends turn k --think-time-ms after turn k-1 completes. With
--shared-prefix-ratio R and --prefix-groups G, sessions in one of G groups share a system prompt of R x the
mean new input (hash_ids say so). See docs/sessions.md.

Example:

  jaxsim trace sessions --sessions 50 --rate 0.5 --turns 4 --new-input uniform:200:800 --osl uniform:50:300 --think-time-ms 2000 --output chat.jsonl
"""


def _check_synthetic(output: Path, suffix: str, written_as: str, count: tuple[str, int], rate: float, cv: float, seed: int,
                     force: bool) -> None:
    """A synthetic trace's options and output file, before any work (one line, exit 2)."""
    limits.check("requests", count[1], count[0])
    limits.check("rate", rate, "--rate")
    limits.check("rate", cv, "--cv")
    limits.check("seed", seed, "--seed")
    if output.suffix.lower() != f".{suffix}":
        fail(f"{output}: {written_as}; use a .{suffix} file name")
    refuse_overwrite(output, force, (suffix,))


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

    @trace_app.command("prefix", help=PREFIX_HELP)
    @guarded
    def prefix_cmd(
        trace: str = typer.Argument(..., help="A Mooncake JSONL trace with hash_ids, or a bundled trace name."),
        trace_block_size: int = typer.Option(512, "--trace-block-size", help="Prompt tokens per hash id (Mooncake: 512)."),
        block_size: int = typer.Option(16, "--block-size", help="Engine KV block in tokens (hits are whole blocks)."),
    ) -> None:
        import json

        from jaxsim.replay.prefix_cache import block_keys, measured_hit_ratio, read_hash_ids
        from jaxsim.replay.traces import bundled_trace_path, list_traces

        if block_size < 1:
            fail(f"--block-size={block_size} must be an integer >= 1")
        path = bundled_trace_path(trace) if trace in list_traces() else Path(trace)
        if not path.is_file():
            fail(f"{trace}: no such trace file or bundled trace (bundled: {', '.join(list_traces())})")
        hashes = read_hash_ids(path, trace_block_size)
        lengths = [int(json.loads(x)["input_length"]) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
        keys, distinct = block_keys(hashes, lengths, trace_block_size, block_size)
        total = sum(lengths)
        typer.echo(f"{path.name}: {len(lengths)} prompts, {total:,} prompt tokens; {distinct:,} distinct of "
                   f"{sum(len(k) for k in keys):,} full {block_size}-token KV blocks")
        typer.echo(f"prefix-hit ratio with an unbounded cache (trace order, {trace_block_size}-token hash blocks): "
                   f"{measured_hit_ratio(hashes, lengths, trace_block_size):.4f}")

    @trace_app.command("sessions", help=SESSIONS_HELP)
    @guarded
    def sessions_cmd(
        output: Path = typer.Option(..., "--output", "-o", help="Trace file to write (.jsonl, Mooncake with session fields)."),
        sessions: int = typer.Option(100, "--sessions", help="Number of sessions."),
        rate: float = typer.Option(1.0, "--rate", help="Mean session start rate, sessions/s."),
        cv: float = typer.Option(1.0, "--cv", help="Coefficient of variation of the gaps between session starts (1 = Poisson)."),
        turns: int = typer.Option(4, "--turns", help="Turns per session."),
        new_input: str = typer.Option("fixed:1024", "--new-input", help="New prompt tokens per turn (length spec)."),
        osl: str = typer.Option("fixed:128", "--osl", help="Output tokens per turn (length spec)."),
        shared_prefix_ratio: float = typer.Option(
            0.0, "--shared-prefix-ratio", help="Share of the mean new input that is the group's system prompt, at the start of turn 1, in [0, 1)."
        ),
        prefix_groups: int = typer.Option(
            0, "--prefix-groups", help="Groups of sessions sharing one system prompt (>= 1 with a shared prefix)."
        ),
        think_time_ms: float = typer.Option(0.0, "--think-time-ms", help="Delay between a turn's completion and the next turn's send (ms)."),
        trace_block_size: int = typer.Option(512, "--trace-block-size", help="Prompt tokens per hash id (Mooncake: 512)."),
        seed: int = typer.Option(0, "--seed", help="RNG seed."),
        force: bool = typer.Option(False, "--force", help="Overwrite OUTPUT if it exists."),
    ) -> None:
        from jaxsim.replay.session_traces import SessionShape, session_trace, write_session_jsonl

        _check_synthetic(output, "jsonl", "session traces are written as Mooncake JSONL", ("--sessions", sessions), rate, cv, seed, force)
        shape = SessionShape(turns=turns, new_input=new_input, output=osl, shared_prefix_ratio=shared_prefix_ratio,
                             prefix_groups=prefix_groups, think_time_ms=think_time_ms, trace_block_size=trace_block_size)
        t, hashes = session_trace(sessions, rate, shape, cv=cv, seed=seed, name=output.stem)
        write_session_jsonl(t, hashes, output)
        typer.echo(f"wrote {output}: {sessions} sessions x {turns} turns = {len(t)} requests; prompts {int(t.input_tokens.min())}.."
                   f"{int(t.input_tokens.max())} tokens; sessions start over {t.duration_ms / 1e3:,.1f} s (rate {rate}/s, cv {cv}, seed {seed})")

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

        _check_synthetic(output, "csv", "synthetic traces are written as plain CSV", ("--n", n), rate, cv, seed, force)
        t = gamma_trace(n, rate, cv, isl, osl, seed=seed, name=output.stem)
        write_trace_csv(t, output)
        typer.echo(f"wrote {output}: {len(t)} requests over {t.duration_ms / 1e3:,.1f} s (gamma arrivals, rate {rate}/s, cv {cv}, seed {seed})")
