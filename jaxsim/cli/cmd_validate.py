"""``jaxsim validate``: check deployment configs against their profiles before anything is compiled."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from jaxsim.cli.common import EXIT_INVALID, paragraphs

VALIDATE_HELP = paragraphs("""Validate deployment configs (TOML) against their measured profiles; nothing is compiled.

Every problem is printed on its own line, prefixed by the config file and the rule it breaks (for example sd-nextn,
estimator-policy, scheduler-envelope). Exit code 0 when every config is valid, 2 otherwise.

Examples:

  jaxsim validate configs/deployment_aggregated.toml

  jaxsim validate configs/*.toml --json
""")


def check_configs(paths: list[Path]) -> list[tuple[Path, list[str], object]]:
    """(path, problems, config or None) for each path; problems are one line each."""
    from jaxsim.errors import JaxsimError
    from jaxsim.rules.config import load_config
    from jaxsim.rules.validate import validate_config

    out = []
    for p in paths:
        try:
            cfg = load_config(p)
        except JaxsimError as e:
            msg = " ".join(str(e).split())
            prefix = f"{p}: "
            out.append((p, [msg[len(prefix):] if msg.startswith(prefix) else msg], None))
            continue
        out.append((p, validate_config(cfg), cfg))
    return out


def register(app: typer.Typer) -> None:
    @app.command("validate", help=VALIDATE_HELP)
    def validate_cmd(
        configs: list[Path] = typer.Argument(..., help="Deployment config files (TOML)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object: {config: {valid, problems}}."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Print problems only (nothing for valid configs)."),
    ) -> None:
        results = check_configs(list(configs))
        bad = sum(1 for _, problems, _ in results if problems)
        if as_json:
            doc = {str(p): {"valid": not problems, "problems": problems} for p, problems, _ in results}
            typer.echo(json.dumps(doc, indent=1))
        else:
            for p, problems, cfg in results:
                if problems:
                    for line in problems:
                        typer.echo(f"{p}: {line}")
                elif not quiet:
                    roles = ", ".join(cfg.role_names)
                    typer.echo(f"{p}: ok ({cfg.mode}: {roles}; nextn={cfg.nextn})")
            if bad:
                typer.echo(f"error: {bad} of {len(results)} config(s) invalid", err=True)
        if bad:
            raise typer.Exit(EXIT_INVALID)
