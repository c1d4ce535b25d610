"""JAX set-up in one place: jaxsim's timing math is float64 (int64 sentinels, nanosecond clocks).

Importing :mod:`jaxsim` does not import JAX (so ``jaxsim --help``, ``profiles list`` and ``validate``
start instantly). Every jaxsim module that builds or runs compiled code imports this module and calls
:func:`ensure_x64` (at import and at its compiled entry points), which turns x64 on and refuses to go on
if it is not on.
"""

from __future__ import annotations

import jax
import numpy as np

__all__ = ["ensure_x64"]


def ensure_x64() -> None:
    """Enable ``jax_enable_x64`` and check it took effect; raise RuntimeError when it did not."""
    if not jax.config.read("jax_enable_x64"):
        jax.config.update("jax_enable_x64", True)
    if not jax.config.read("jax_enable_x64") or jax.dtypes.canonicalize_dtype(np.float64) != np.float64:
        raise RuntimeError(
            "jaxsim needs JAX's 64-bit mode (jax_enable_x64): float64 timings and int64 clocks would "
            "silently lose precision without it; it could not be enabled in this process"
        )


ensure_x64()
