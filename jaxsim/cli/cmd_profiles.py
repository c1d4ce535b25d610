"""Placeholder: this command group is registered by its owner module."""

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
