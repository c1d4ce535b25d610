"""The block pool's chunked operations (take / register / release, a chunk of blocks per loop step) and its operations
on several tables at once (``take_one_each`` / ``register_own_each``: a decode pass's crossings) leave the pool cell for
cell as the one-block-at-a-time specification (``take_each`` / ``register_each`` / ``release_each``) does, on random
request lifecycles that share prompt keys, register duplicates, evict, and read their own generated keys."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsim._jax import ensure_x64
from jaxsim.replay import block_pool as bp

NUM_KEYS, TABLES, TABLE_BLOCKS = 64, 8, 96


def _key_fn(keys):
    """Position j's key (``keys``: prompt keys, then generated keys ≥ NUM_KEYS)."""
    def key_at(j):
        return keys[jnp.clip(j, 0, keys.shape[0] - 1)]

    return key_at


@functools.partial(jax.jit, static_argnames=("bulk", "chunk"))
def _take(pool, t, n, bulk, chunk=bp.CHUNK):  # chunk: a cache key only (bp.CHUNK is read when traced)
    return (bp.take if bulk else bp.take_each)(pool, t, n)


@functools.partial(jax.jit, static_argnames=("bulk", "chunk"))
def _register(pool, t, start, full, keys, bulk, chunk=bp.CHUNK):
    return (bp.register if bulk else bp.register_each)(pool, t, start, full, _key_fn(keys))


@functools.partial(jax.jit, static_argnames=("bulk", "chunk"))
def _release(pool, t, bulk, chunk=bp.CHUNK):
    return (bp.release if bulk else bp.release_each)(pool, t, jnp.ones((), bool))


@functools.partial(jax.jit, static_argnames=("bulk",))
def _take_one_each(pool, tables, on, bulk):
    if bulk:
        return bp.take_one_each(pool, tables, on)
    return jax.lax.fori_loop(0, tables.shape[0], lambda i, q: bp.take_each(q, tables[i], jnp.where(on[i], 1, 0)), pool)


@functools.partial(jax.jit, static_argnames=("bulk",))
def _register_own_each(pool, tables, positions, keys, on, bulk):
    if bulk:
        return bp.register_own_each(pool, tables, positions, keys, on)

    def one(i, q):
        key_at = lambda j: keys[i]  # noqa: E731
        return bp.register_each(q, tables[i], positions[i], jnp.where(on[i], positions[i] + 1, positions[i]), key_at)

    return jax.lax.fori_loop(0, tables.shape[0], one, pool)


@jax.jit
def _open(pool, keys, limit):
    num, hits = bp.leading_hits(pool, keys, limit)
    pool, t = bp.open_table(pool, hits, num, jnp.ones((), bool))
    return pool, t, num


def _same(a: bp.BlockPool, b: bp.BlockPool) -> None:
    a, b = jax.device_get(a), jax.device_get(b)
    np.testing.assert_array_equal(a.rows[:-1], b.rows[:-1])  # the scratch row aside
    for f in ("plain_top", "queued", "queue_head", "queue_tail", "next_seq", "free_top"):
        assert int(getattr(a, f)) == int(getattr(b, f)), f
    np.testing.assert_array_equal(a.plain[: int(a.plain_top)], b.plain[: int(b.plain_top)])
    np.testing.assert_array_equal(a.table_len, b.table_len)
    np.testing.assert_array_equal(a.free_tables[: int(a.free_top)], b.free_tables[: int(b.free_top)])
    for t in range(a.tables.shape[0]):
        np.testing.assert_array_equal(a.tables[t, : int(a.table_len[t])], b.tables[t, : int(b.table_len[t])])


@pytest.mark.parametrize("seed", range(12))
def test_chunked_pool_operations_equal_one_block_at_a_time(seed, monkeypatch):
    ensure_x64()
    chunk = 16 if seed % 2 else bp.CHUNK  # 16: requests of several chunks
    monkeypatch.setattr(bp, "CHUNK", chunk)
    rng = np.random.default_rng(seed)
    capacity = 128
    blocks = int(rng.choice([40, 90, 128]))
    pool = bp.empty_pool(jnp.asarray(blocks, jnp.int64), capacity, NUM_KEYS, TABLES, TABLE_BLOCKS)
    pools = {False: pool, True: pool}
    prefixes = [rng.permutation(NUM_KEYS)[: int(rng.integers(30, 60))] for _ in range(3)]
    live: dict[int, tuple] = {}  # table -> (keys, blocks held)
    exercised = {"evict": 0, "chunked": 0, "chunks": 0, "decode": 0}
    for _ in range(60):
        free = int(pools[False].free_blocks)
        if live and rng.random() < 0.25 and free >= len(live):  # a decode pass: some tables cross a block boundary
            slots = np.full(TABLES, int(rng.integers(0, TABLES)), np.int64)  # padding slots: any table, not on
            on = np.zeros(TABLES, bool)
            for i, t in enumerate(rng.permutation(sorted(live))):
                slots[i], on[i] = t, rng.random() < 0.7
            slots, on = jnp.asarray(slots), jnp.asarray(on)
            pools = {k: _take_one_each(v, slots, on, k) for k, v in pools.items()}
            _same(pools[False], pools[True])
            exercised["decode"] += int(jnp.sum(on))
            lens = pools[False].table_len[slots]
            own = NUM_KEYS + 10_000 + slots * TABLE_BLOCKS + lens - 1
            pools = {k: _register_own_each(v, slots, lens - 1, own, on, k) for k, v in pools.items()}
        elif live and (rng.random() < 0.35 or len(live) == TABLES or free < 4):
            t = int(rng.choice(sorted(live)))
            pools = {k: _release(v, t, k, chunk) for k, v in pools.items()}
            del live[t]
        else:
            base = prefixes[int(rng.integers(0, 3))]
            n_keys = int(rng.integers(1, len(base)))
            own = NUM_KEYS + 500 + TABLE_BLOCKS * int(rng.integers(0, 1000)) + np.arange(TABLE_BLOCKS - n_keys)
            keys = jnp.asarray(np.concatenate([base[:n_keys], own]).astype(np.int64))
            opened = {k: _open(v, keys, jnp.asarray(n_keys, jnp.int64)) for k, v in pools.items()}
            _same(opened[False][0], opened[True][0])
            t, hits = int(opened[False][1]), int(opened[False][2])
            pools = {k: v[0] for k, v in opened.items()}
            want = min(int(rng.integers(1, n_keys + 20)), TABLE_BLOCKS) - hits
            want = max(0, min(want, int(pools[False].free_blocks)))
            exercised["evict"] += want > int(pools[False].plain_top)
            exercised["chunked"] += want >= bp.FEW
            exercised["chunks"] += want > chunk
            pools = {k: _take(v, t, jnp.asarray(want, jnp.int64), k, chunk) for k, v in pools.items()}
            _same(pools[False], pools[True])
            full = hits + want - int(rng.integers(0, 2))  # the last block sometimes not yet full
            start = max(hits - 1, 0)
            pools = {k: _register(v, t, jnp.asarray(start, jnp.int64), jnp.asarray(full, jnp.int64), keys, k, chunk)
                     for k, v in pools.items()}
            live[t] = (keys, hits + want)
        _same(pools[False], pools[True])
    assert exercised["chunked"] > 0 and exercised["evict"] > 0 and exercised["decode"] > 0, exercised
    assert chunk > 16 or exercised["chunks"] > 0, exercised


def _open_empty(pools: dict) -> tuple[dict, int]:
    """Both pools with a new table holding no hit, and its id."""
    nothing = jnp.full((TABLE_BLOCKS,), -1, jnp.int64)
    opened = {k: bp.open_table(v, nothing, jnp.zeros((), jnp.int64), jnp.ones((), bool)) for k, v in pools.items()}
    return {k: v[0] for k, v in opened.items()}, int(opened[False][1])


def _two_copies(num_blocks: int, capacity: int, blocks: int, keys) -> dict:
    """Pools (chunked and one at a time) where two tables took ``blocks`` blocks each, cached them under the same
    ``keys`` (computed side by side: two copies in each key's chain) and released them (both copies free)."""
    pool = bp.empty_pool(jnp.asarray(num_blocks, jnp.int64), capacity, NUM_KEYS, TABLES, TABLE_BLOCKS)
    pools = {False: pool, True: pool}
    tables = []
    for _ in range(2):
        pools, t = _open_empty(pools)
        tables.append(t)
        pools = {k: _take(v, t, jnp.asarray(blocks, jnp.int64), k) for k, v in pools.items()}
    for t in tables:
        pools = {k: _register(v, t, jnp.asarray(0, jnp.int64), jnp.asarray(blocks, jnp.int64), keys, k) for k, v in pools.items()}
    for t in tables:
        pools = {k: _release(v, t, k) for k, v in pools.items()}
    _same(pools[False], pools[True])
    return pools


def test_take_hands_out_duplicate_keys_one_at_a_time():
    """Both copies of 40 keys sit in the free queue; a take evicting both in one chunk falls back to the one-at-a-time
    path for that chunk and stays equal (the chunks before it go in bulk)."""
    ensure_x64()
    capacity = 128
    pools = _two_copies(capacity, capacity, 40, jnp.arange(TABLE_BLOCKS, dtype=jnp.int64) % NUM_KEYS)
    pools, t = _open_empty(pools)
    pools = {k: _take(v, t, jnp.asarray(capacity, jnp.int64), k) for k, v in pools.items()}  # 48 plain, then 80 cached
    _same(pools[False], pools[True])
    assert int(pools[True].queued) == 0 and int(pools[True].plain_top) == 0


def test_take_one_each_evicting_two_copies_of_a_key_goes_table_by_table():
    """Two blocks, both cached under key 0, both free: one decode pass of two tables evicts both (no plain block left);
    the shared key sends it one table at a time, cell for cell as take_each."""
    ensure_x64()
    pools = _two_copies(2, 64, 1, jnp.zeros((TABLE_BLOCKS,), jnp.int64))
    assert int(pools[True].queued) == 2 and int(pools[True].plain_top) == 0
    opened = []
    for _ in range(2):
        pools, t = _open_empty(pools)
        opened.append(t)
    slots = jnp.asarray(opened + [0] * (TABLES - 2), jnp.int64)
    on = jnp.arange(TABLES) < 2
    pools = {k: _take_one_each(v, slots, on, k) for k, v in pools.items()}
    _same(pools[False], pools[True])
    assert int(pools[True].queued) == 0 and int(pools[True].rows[0, bp.KEY]) == -1 and int(pools[True].rows[1, bp.KEY]) == -1
