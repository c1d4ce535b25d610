"""Compiled entry points of batched replay: start, advance and finish a stack of replays (and one call
that does all three), and their executables, compiled once per shape bucket (through the on-disk
executable cache, :func:`jaxsim._jax.compile_all`) and called by reference."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import jax
from jax.sharding import PartitionSpec as P

from jaxsim._jax import SERIAL_OPS, compile_all, executable_key, jit_x64, key_statics
from jaxsim.devices import _mesh
from jaxsim.replay import cache_engine as ce
from jaxsim.replay.engine import (
    EngineParams,
    EngineState,
    ReplayConstants,
    advance_stack,
    advance_until_stack,
    finish_stack,
    insert_request_stack,
    param_axes,
    replay_stack,
    start_stack,
)

replay_many = jit_x64(replay_stack, static_argnames=("slots", "stochastic", "timeline_len", "shared_table", "lookahead", "closed_loop"))
replay_many.__doc__ = """Replay a stack of (configuration, trace, PRNG key) items (leading axis of every argument).

Result arrays carry the same leading axis; item ``i`` equals ``replay(p[i], rq[i], keys[i])``."""
start_many = jit_x64(start_stack, static_argnames=("slots", "timeline_len", "shared_table"))
advance_many = jit_x64(advance_stack, static_argnames=("stochastic", "shared_table", "lookahead", "closed_loop"))
finish_many = jit_x64(finish_stack)


def advance_split(
    p: EngineParams, consts: ReplayConstants, keys, s: EngineState, max_steps=None, *, stochastic: bool, shared_table: bool,
    lookahead: int | None = None, closed_loop: bool = True,
) -> EngineState:
    """:func:`~jaxsim.replay.engine.advance_stack` with the items split over the local devices, each
    device running its own loop over its own items (no cross-device step per pass)."""
    items = P("batch")
    p_spec = jax.tree.map(lambda a: P() if a is None else items, param_axes(p, shared_table), is_leaf=lambda a: a is None)
    if max_steps is None:
        local = jax.shard_map(
            lambda *a: advance_stack(*a, stochastic=stochastic, shared_table=shared_table, lookahead=lookahead, closed_loop=closed_loop),
            mesh=_mesh(),
            in_specs=(p_spec, items, items, items), out_specs=items, check_vma=False,
        )
        return local(p, consts, keys, s)
    local = jax.shard_map(
        lambda *a: advance_stack(*a, stochastic=stochastic, shared_table=shared_table, lookahead=lookahead, closed_loop=closed_loop),
            mesh=_mesh(),
        in_specs=(p_spec, items, items, items, P()), out_specs=items, check_vma=False,
    )
    return local(p, consts, keys, s, max_steps)


advance_split_many = jit_x64(advance_split, static_argnames=("stochastic", "shared_table", "lookahead", "closed_loop"))


XLA_CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
"""XLA:CPU compiler options of the replay executables: XLA's older loop emitters for fusions. Measured on
the calibrated single replay (2 cores, one process per setting): the advance loop compiles in about 30 %
less CPU time (lookahead 16: 4.7 -> 3.5 s; lookahead 8: 3.7 -> 2.6 s) and runs no slower (0.79 -> 0.67 s of
CPU at lookahead 8); results are bit-identical (the replay tests and goldens run with them)."""


def xla_options(serial: bool = False) -> dict | None:
    """The compiler options of replay executables on this backend (None: XLA's defaults); ``serial``: no operation
    split over threads (:data:`jaxsim._jax.SERIAL_OPS`)."""
    if jax.default_backend() != "cpu":
        return None
    return {**XLA_CPU_OPTIONS, SERIAL_OPS: True} if serial else XLA_CPU_OPTIONS


@dataclass(frozen=True)
class Executable:
    """A compiled entry point; ``name`` names its executables in the on-disk executable cache."""

    name: str
    function: Callable
    serial: bool = False  # compiled with no operation split over threads (xla_options)


advance_until_many = jit_x64(advance_until_stack, static_argnames=("stochastic", "shared_table", "closed_loop"))
insert_many = jit_x64(insert_request_stack)

# Cached replays run one per call, on threads beside each other: an operation split over two threads waits for a
# core the other replay holds. Measured (bench_prefix_sweep's 256 configurations, 2 cores, one process each): 28.2 ->
# 25.6 s; under load from another process, one replay 0.27-0.31 -> 0.16 s. The vmapped plain replays keep XLA's
# splits: their operations are as wide as the batch (the same 256 configurations: 9.3 s with, 13.6 s without).
CACHED_START = Executable("cached-start", ce.cached_start_jit, serial=True)
CACHED_ADVANCE_UNTIL = Executable("cached-advance-until", ce.advance_until_jit, serial=True)
CACHED_INSERT = Executable("cached-insert", ce.insert_request_jit, serial=True)
CACHED_FINISH = Executable("cached-finish", ce.cached_finish_jit, serial=True)
START = Executable("replay-start", start_many)
ADVANCE_UNTIL = Executable("replay-advance-until", advance_until_many)
INSERT = Executable("replay-insert", insert_many)
ADVANCE = Executable("replay-advance", advance_many)
ADVANCE_SPLIT = Executable("replay-advance-split", advance_split_many)
FINISH = Executable("replay-finish", finish_many)


@dataclass(frozen=True, eq=False)
class Call:
    """One call of an executable: its arguments (``ShapeDtypeStruct`` s are enough to compile it) and
    static arguments."""

    executable: Executable
    args: tuple
    statics: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return executable_key(self.executable.name, self.args, key_statics(self.statics, xla_options(self.executable.serial)))


_LOADED: dict[str, Callable] = {}  # executable key -> this process's compiled executable


def release_all() -> int:
    """Forget every executable this process holds (how many). Each holds about three memory mappings of JIT code
    while it lives and a process may hold only ``vm.max_map_count`` (65,530 by default) mappings: past it, XLA's
    next compilation segfaults. A long-lived process that compiles many shapes (the test suite, after each
    module) releases them; the next call of a released shape compiles or loads it again."""
    n = len(_LOADED)
    _LOADED.clear()
    return n


def compile_calls(calls: Sequence[Call], timings: dict | None = None) -> None:
    """The executables ``calls`` need that this process has not got yet (once per shape bucket), through
    :func:`~jaxsim._jax.compile_all` (the executable cache, else parallel XLA compilation). Wall time
    goes to ``timings`` (``compile_s``, ``compilations``, ``executables_loaded``)."""
    t0 = time.perf_counter()
    todo: dict[str, Call] = {}
    for c in calls:
        if c.key not in _LOADED:
            todo.setdefault(c.key, c)
    if not todo:
        return
    exes, compiled, loaded = compile_all([(c.executable.name, c.executable.function, c.args, c.statics, xla_options(c.executable.serial))
                                          for c in todo.values()])
    _LOADED.update(zip(todo, exes))
    if timings is not None:
        timings["compile_s"] = timings.get("compile_s", 0.0) + time.perf_counter() - t0
        timings["compilations"] = timings.get("compilations", 0) + compiled
        timings["executables_loaded"] = timings.get("executables_loaded", 0) + loaded


def execute(call: Call):
    """Run ``call`` on the executable :func:`compile_calls` compiled for it."""
    return _LOADED[call.key](*call.args)


def executable(call: Call) -> Callable:
    """The executable :func:`compile_calls` compiled for ``call``; it also takes what it returned (its
    output arrays, already on the devices) in place of arguments of the same shapes."""
    return _LOADED[call.key]
