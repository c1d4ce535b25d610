"""The ``jaxsim`` command line: thin orchestration over the library (no latency math here)."""

from __future__ import annotations

import importlib
import sys

import typer

from jaxsim.devices import enable_compilation_cache, use_all_cpu_cores

use_all_cpu_cores()
enable_compilation_cache()

import jaxsim  # noqa: E402  (imports no JAX: commands import it inside their functions)
from jaxsim.cli.common import fail, set_debug  # noqa: E402
from jaxsim.errors import JaxsimError  # noqa: E402

app = typer.Typer(
    name="jaxsim",
    help="Evaluate LLM-serving deployments from measured forward-pass profiles (FPM) with JAX.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each command module exposes ``register(app)``; one module per command group.
COMMAND_MODULES = (
    "cmd_round",
    "cmd_profiles",
    "cmd_import",
    "cmd_validate",
    "cmd_capacity",
    "cmd_sweep",
    "cmd_size",
    "cmd_replay",
    "cmd_trace",
    "cmd_plot",
    "cmd_calibrate",
)
NO_JAX_COMMANDS = ("profiles", "validate", "size")
"""Commands that never start JAX: a broken JAX_PLATFORMS / XLA_FLAGS does not concern them."""


def _version(value: bool) -> None:
    if value:
        typer.echo(f"jaxsim {jaxsim.__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool | None = typer.Option(None, "--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show the full traceback of any error (for bug reports; same as JAXSIM_DEBUG=1)."),
) -> None:
    """jaxsim: measured forward-pass profiles → round timings, capacity, sweeps and replays."""
    set_debug(ctx, debug)
    from jaxsim.environment import check_jax_environment, console_safe_streams

    console_safe_streams()
    if ctx.invoked_subcommand is not None and ctx.invoked_subcommand not in NO_JAX_COMMANDS:
        try:
            check_jax_environment()  # before any work: one line naming the variable
        except JaxsimError as e:
            fail(str(e))


for _name in COMMAND_MODULES:
    importlib.import_module(f"jaxsim.cli.{_name}").register(app)


def main() -> None:
    from jaxsim.environment import check_arguments, console_safe_streams, terminate_cleanly

    console_safe_streams()
    terminate_cleanly()
    try:
        check_arguments(sys.argv[1:])
    except JaxsimError as e:
        typer.echo(f"error: {e}", err=True)
        raise SystemExit(2) from None
    app()
