"""Test-suite set-up, loaded by pytest before any test module (and so before any jaxsim module).

jaxtyping annotations (dtype and shape: ``Float64[Array, " W"]``) are checked at runtime in the compiled
layers (``jaxsim.kernels``, ``jaxsim.replay``, ``jaxsim.sweep``) through jaxtyping's import hook with
beartype, when beartype (the ``test`` extra) is installed. Checks run when a function is called or
traced (inside ``jit``/``vmap`` a traced function sees the per-example shapes its annotations describe),
never in the compiled code itself. ``JAXSIM_TYPECHECK=0`` turns them off (e.g. to time a test).
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys

import pytest

# Executables are compiled from the code under test, never loaded from the on-disk executable cache
# (a loaded executable is not traced, so its annotations would go unchecked); tests of the cache turn it on.
os.environ["JAXSIM_EXECUTABLE_CACHE"] = "0"

if os.environ.get("JAXSIM_TYPECHECK", "1") != "0" and importlib.util.find_spec("beartype") is not None:
    _early = sorted(m for m in sys.modules if m.split(".")[:2] in (["jaxsim", "kernels"], ["jaxsim", "replay"], ["jaxsim", "sweep"]))
    if _early:  # a module imported before the hook would silently go unchecked
        raise RuntimeError(f"jaxtyping import hook installed after {', '.join(_early)} was imported")
    import pkgutil
    from pathlib import Path

    from jaxtyping import install_import_hook

    # Every module of the three packages except jaxsim.kernels.support: the host-side (numpy) table
    # compiler, which holds no jaxtyping annotation and defines small closures per measured piece; the
    # hook would re-decorate them at every call (40,000 times per profile: test_replay_engine.py went
    # from 22 s to 72 s with it; 25 s without it, measured on the loaded 2-core machine).
    _kernels = Path(__file__).resolve().parents[1] / "jaxsim" / "kernels"
    _checked = [f"jaxsim.kernels.{m.name}" for m in pkgutil.iter_modules([str(_kernels)]) if m.name != "support"]
    _hook = install_import_hook([*_checked, "jaxsim.replay", "jaxsim.sweep"], "beartype.beartype")


def pytest_configure(config):
    # beartype's advice to write ``collections.abc.Sequence`` instead of ``typing.Sequence``: not a test failure
    config.addinivalue_line("filterwarnings", "ignore::beartype.roar.BeartypeDecorHintPep585DeprecationWarning")


@pytest.fixture(autouse=True, scope="module")
def _free_executables_after_each_module():
    """Compiled executables are freed when a test module ends (JAX's caches cleared, and jaxsim's registry of replay
    executables, which JAX's clearing does not reach: without it the suite segfaulted in test_replay_slots). Each one holds about
    three memory mappings of JIT code while it lives; the suite compiles over ten thousand, and a process may
    hold only ``vm.max_map_count`` (65,530) mappings: past it, XLA's next compile segfaults (CI, exit 139, in
    the 86th percent of the suite)."""
    yield
    import jax  # noqa: PLC0415

    jax.clear_caches()
    if "jaxsim.replay.executables" in sys.modules:  # jaxsim's own registry of executables (not JAX's caches)
        sys.modules["jaxsim.replay.executables"].release_all()
    gc.collect()
