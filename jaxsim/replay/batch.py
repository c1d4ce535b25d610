"""Many replays in one compiled call: the engine vmapped over configurations (tables, scheduler
settings, acceptance rates) and seeds. A batched replay equals the same replays run one by one.

Tables of different sizes are padded to one common bucket shape (padding never changes a lookup), so
a whole sweep compiles once.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsim.kernels import status as st
from jaxsim.kernels.rounds import RoundTable
from jaxsim.replay.engine import EngineParams, Requests, ReplayResult, replay

_I64_MAX = np.iinfo(np.int64).max
_UNSUPPORTED_PACKED = np.int32(st.BATCH_OUT_OF_RANGE << 24)

# fill value of each padded RoundTable array (as in jaxsim.kernels.rounds._assemble)
_FILLS = {
    "kv_grid": _I64_MAX, "row_of_batch": 0, "packed": _UNSUPPORTED_PACKED, "curve_batch": 0, "seg": 0.0,
    "curve_base_ms": 0.0, "pre_batch_index": -1, "pre_tok_grid": _I64_MAX,
    "pre_n_tok": 0, "pre_kv_grid": _I64_MAX, "pre_n_kv": 0, "pre_coef": 0.0, "pre_code": st.PREFILL_NO_SUPPORT,
}


def _array_fields(t: RoundTable) -> list[str]:
    names = [f.name for f in dataclasses.fields(t) if not f.metadata.get("static", False) and f.name != "n_kv"]
    unknown = [n for n in names if n not in _FILLS]
    if unknown:
        raise TypeError(f"RoundTable field {unknown[0]!r} has no padding rule in jaxsim.replay.batch")
    return names


def table_shapes(t: RoundTable) -> dict[str, tuple[int, ...]]:
    """Shape of every array of a compiled table."""
    return {f: tuple(np.shape(getattr(t, f))) for f in _array_fields(t)}


def pad_round_table(t: RoundTable, shapes: dict[str, tuple[int, ...]]) -> RoundTable:
    """``t`` with every array padded (at the end of each axis) to ``shapes``; lookups are unchanged.

    The static fields are reset (speculative=False, num_draft_tokens=0): the replay engine takes the
    draft depth as a traced parameter and never uses the table's mixed composition.
    """
    arrays = {}
    for f in _array_fields(t):
        fill = _FILLS[f]
        a = np.asarray(getattr(t, f))
        target = tuple(shapes[f])
        if any(n < m for n, m in zip(target, a.shape)):
            raise ValueError(f"cannot pad {f} of shape {a.shape} down to {target}")
        out = np.full(target, fill, dtype=a.dtype)
        out[tuple(slice(0, m) for m in a.shape)] = a
        arrays[f] = jnp.asarray(out)
    return RoundTable(n_kv=jnp.asarray(t.n_kv), speculative=False, num_draft_tokens=0, **arrays)


def common_tables(tables: Sequence[RoundTable]) -> list[RoundTable]:
    """Pad tables to their elementwise-largest shapes (one compilation for all of them)."""
    shapes = [table_shapes(t) for t in tables]
    target = {f: tuple(max(s[f][i] for s in shapes) for i in range(len(shapes[0][f]))) for f in shapes[0]}
    return [pad_round_table(t, target) for t in tables]


def stack_params(params: Sequence[EngineParams]) -> EngineParams:
    """Stack per-configuration parameters along a leading axis (tables padded to a common shape)."""
    tables = common_tables([p.table for p in params])
    params = [dataclasses.replace(p, table=t) for p, t in zip(params, tables)]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *params)


def unstack(tree, i: int):
    """Element ``i`` of a stacked pytree (results or parameters)."""
    return jax.tree.map(lambda x: x[i], tree)


def _replay_many(p, rq, keys, slots, stochastic, timeline_len):
    one = lambda pp, r, k: replay(pp, r, k, slots=slots, stochastic=stochastic, timeline_len=timeline_len)
    return jax.vmap(one)(p, rq, keys)


replay_many = jax.jit(_replay_many, static_argnames=("slots", "stochastic", "timeline_len"))
replay_many.__doc__ = """Replay a stack of (configuration, trace, PRNG key) items (leading axis of every argument).

Result arrays carry the same leading axis; item ``i`` equals ``replay(p[i], rq[i], keys[i])``."""


def stack_requests(requests: Sequence[Requests]) -> Requests:
    """Stack padded traces of one size along a leading axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *requests)


def seed_keys(seeds: Sequence[int]) -> jax.Array:
    """One PRNG key per seed."""
    return jnp.stack([jax.random.PRNGKey(int(s)) for s in seeds])


def replay_batch(
    params: Sequence[EngineParams],
    requests: Requests,
    seeds: Sequence[int] | int = 0,
    *,
    slots: int,
    stochastic: bool,
    timeline_len: int = 0,
    chunk: int | None = None,
) -> ReplayResult:
    """Replay ``requests`` for every configuration (each with its seed; an int seed is shared).

    ``chunk`` splits very large sweeps into several calls of at most ``chunk`` configurations (the
    last call is padded with copies so every call reuses one compilation).
    """
    n = len(params)
    if n == 0:
        raise ValueError("replay_batch needs at least one configuration")
    seeds = [int(seeds)] * n if isinstance(seeds, (int, np.integer)) else [int(s) for s in seeds]
    if len(seeds) != n:
        raise ValueError(f"{len(seeds)} seeds for {n} configurations")
    stacked = stack_params(params)
    keys = seed_keys(seeds)
    size = n if not chunk else min(int(chunk), n)
    outs = []
    for lo in range(0, n, size):
        idx = np.arange(lo, lo + size) % n
        rq = jax.tree.map(lambda x: jnp.broadcast_to(x, (size,) + x.shape), requests)
        part = replay_many(
            jax.tree.map(lambda x: x[idx], stacked), rq, keys[idx], slots=slots, stochastic=stochastic,
            timeline_len=timeline_len,
        )
        outs.append(jax.tree.map(lambda x: x[: min(size, n - lo)], part))
    return outs[0] if len(outs) == 1 else jax.tree.map(lambda *xs: jnp.concatenate(xs), *outs)
