"""JAX set-up in one place: jaxsim's timing math is float64 (int64 sentinels, nanosecond clocks).

Importing :mod:`jaxsim` does not import JAX (so ``jaxsim --help``, ``profiles list`` and ``validate``
start instantly). Every jaxsim module that builds or runs compiled code imports this module and calls
:func:`ensure_x64` (at import and at its compiled entry points), which turns x64 on and refuses to go on
if it is not on. Module-level compiled functions are built with :func:`jit_x64` (``jax.jit`` + the check
at every call), so switching x64 off after import cannot silently turn int64 inputs into int32.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

__all__ = ["ensure_x64", "jit_x64"]


def ensure_x64() -> None:
    """Enable ``jax_enable_x64`` and check it took effect; raise RuntimeError when it did not."""
    if not jax.config.read("jax_enable_x64"):
        jax.config.update("jax_enable_x64", True)
    if not jax.config.read("jax_enable_x64") or jax.dtypes.canonicalize_dtype(np.float64) != np.float64:
        raise RuntimeError(
            "jaxsim needs JAX's 64-bit mode (jax_enable_x64): float64 timings and int64 clocks would "
            "silently lose precision without it; it could not be enabled in this process"
        )


class _X64Jit:
    """A ``jax.jit`` function that calls :func:`ensure_x64` before every call and lowering (in Python,
    before the arguments are converted: with x64 off, int64 inputs would silently become int32)."""

    def __init__(self, fun, **jit_kwargs):
        self._jitted = jax.jit(fun, **jit_kwargs)
        functools.update_wrapper(self, fun)

    def __call__(self, *args, **kwargs):
        ensure_x64()
        return self._jitted(*args, **kwargs)

    def lower(self, *args, **kwargs):
        ensure_x64()
        return self._jitted.lower(*args, **kwargs)

    def __getattr__(self, name):  # anything else (e.g. ``_cache_size``) is the jitted function's
        if name == "_jitted":
            raise AttributeError(name)
        return getattr(self._jitted, name)

    def __repr__(self) -> str:
        return f"jit_x64({getattr(self, '__qualname__', self._jitted)})"


def jit_x64(fun=None, **jit_kwargs):
    """``jax.jit`` for jaxsim's compiled entry points: checks x64 (:func:`ensure_x64`) at every call.
    Use as ``jit_x64(f, static_argnums=...)`` or as a decorator ``@jit_x64``."""
    if fun is None:
        return functools.partial(jit_x64, **jit_kwargs)
    return _X64Jit(fun, **jit_kwargs)


ensure_x64()
