"""x64 is checked at every compiled entry point: switching it off after import cannot silently turn the
int64 sentinels and nanosecond clocks into int32 (jaxsim._jax.jit_x64 / ensure_x64)."""

from __future__ import annotations

from contextlib import contextmanager

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsim._jax as jx
from jaxsim.kernels import capacity, rounds
from jaxsim.replay import engine, executables, runner
from jaxsim.sweep import evaluate, run

ENTRY_MODULES = (rounds, capacity, evaluate, run, engine, executables, runner)


def _raw_jits(module) -> list[str]:
    return [n for n, v in vars(module).items()
            if not isinstance(v, jx._X64Jit) and (type(v).__name__ == "PjitFunction" or isinstance(v, jax.stages.Wrapped))]


@pytest.mark.parametrize("module", ENTRY_MODULES, ids=lambda m: m.__name__)
def test_module_level_compiled_functions_check_x64(module):
    assert _raw_jits(module) == [], f"{module.__name__}: build compiled entry points with jaxsim._jax.jit_x64"


def test_rounds_kernels_hold_x64_entry_points():
    for name in ("decode_batch", "prefill_batch", "prefill_lookup_batch", "mixed_batch"):
        assert isinstance(getattr(rounds, name), jx._X64Jit), name
    for f in (capacity.pool_capacity_jit, capacity.pool_capacity_batch, evaluate.expected_rounds_table):
        assert isinstance(f, jx._X64Jit)


@contextmanager
def x64_off():
    jax.config.update("jax_enable_x64", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", True)


def test_an_entry_point_called_with_x64_off_turns_it_back_on():
    i64 = lambda v: jnp.asarray(v, jnp.int64)  # noqa: E731
    pool = capacity.KvPool(i64(2**40), i64(1000), i64(16), i64(256), i64(0), jnp.asarray(False),
                           *(jnp.zeros(capacity.MAX_GROUPS, jnp.int64) for _ in range(3)))
    with x64_off():
        assert not jax.config.read("jax_enable_x64")
        out = capacity.pool_capacity_jit(pool, np.int64(3_000_000_000), np.int64(1))  # needs int64: > 2**31
        assert jax.config.read("jax_enable_x64")
    assert out.request_blocks.dtype == np.int64 and int(out.request_blocks) == -(-3_000_000_001 // 16)


def test_x64_that_cannot_be_enabled_is_a_clear_error(monkeypatch):
    with x64_off():
        monkeypatch.setattr(jax.config, "update", lambda *a, **k: None)  # a process that refuses x64
        with pytest.raises(RuntimeError, match="needs JAX's 64-bit mode"):
            rounds.decode_batch(None, np.array([1]), np.array([1]))
        monkeypatch.undo()
