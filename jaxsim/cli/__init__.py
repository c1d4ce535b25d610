"""The ``jaxsim`` command line (Typer): one module per command; ``jaxsim.cli.main.app`` is the app.
Commands import what they need when they run, so ``--help``, ``profiles list`` and ``validate`` start
without JAX."""

from jaxsim._lazy import lazy_api

__getattr__, __all__ = lazy_api("jaxsim.cli", {"app": "main", "main": "main"})
