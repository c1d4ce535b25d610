"""Lazy re-exports for package ``__init__`` modules: a package states its public API (``__all__``)
without importing its modules (the CLI must start without JAX; see tests/test_startup.py)."""

from __future__ import annotations

import importlib


def lazy_api(package: str, api: dict[str, str]):
    """(``__getattr__``, ``__all__``) for ``package``: ``api`` maps each public name to its submodule."""

    def __getattr__(name: str):
        if name in api:
            return getattr(importlib.import_module(f"{package}.{api[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__, sorted(api)
