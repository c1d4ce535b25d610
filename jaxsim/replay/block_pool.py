"""vLLM's KV block pool with automatic prefix caching, as fixed-capacity arrays (one replay; pure functions).

The specification is ``_Pool`` in ``tests/replay_support.py`` (vLLM's ``block_pool.py`` as the reference's
replay implements it): every block has a reference count and at most one cached hash (here a block key,
:func:`jaxsim.replay.prefix_cache.block_keys`; blocks holding generated tokens get keys of their own request,
:func:`request_block_keys`). A free block is either *plain* (it holds no cached hash: handed out first, any
order) or *cached* (handed out after every plain block, the least recently released first; handing it out
evicts its hash). A request releases its blocks tail first, so its prefix is evicted last.

Arrays have ``P`` entries per block (``P`` ≥ the pool's blocks; blocks past the pool are never free), ``K``
per prompt key (the block that serves a key's hits: its earliest registered copy still cached) and ``T × B``
for the block tables of the requests that hold blocks (``T`` tables of ``B`` blocks; a request's table id
lives with its row). Work per call is proportional to ``B`` (one request's blocks) or, when blocks are
evicted, to ``P + K`` (the evicted blocks are the least recently released: one ``top_k``; the serving block
of every key is then recomputed).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int64

NEVER = jnp.iinfo(jnp.int64).max  # the stamp of a block that is not a free cached block


class BlockPool(eqx.Module):
    """The pool of one replay (fields below); build it with :func:`empty_pool`."""

    key: Int64[Array, " P"]  # the cached block key a block holds (-1: none)
    ref: Int64[Array, " P"]  # requests holding the block
    stamp: Int64[Array, " P"]  # a free cached block: its release order (eviction: smallest first); else NEVER
    seq: Int64[Array, " P"]  # when the block's key was registered (earlier copies of a key serve its hits)
    plain: Int64[Array, " P"]  # stack of free blocks holding no cached hash ([0, plain_top))
    plain_top: Int64[Array, ""]
    queued: Int64[Array, ""]  # free cached blocks
    clock: Int64[Array, ""]  # the next release stamp
    next_seq: Int64[Array, ""]
    serving: Int64[Array, " K"]  # per prompt key: the block its hits read (-1: not cached)
    tables: Int64[Array, "T B"]  # per table: the blocks a request holds, in order
    table_len: Int64[Array, " T"]
    free_tables: Int64[Array, " T"]  # stack of unused table ids ([0, free_top))
    free_top: Int64[Array, ""]

    @property
    def free_blocks(self) -> Int64[Array, ""]:
        """Blocks nobody holds (plain or cached)."""
        return self.plain_top + self.queued


def empty_pool(num_blocks: Int64[Array, ""], capacity: int, num_keys: int, tables: int, table_blocks: int) -> BlockPool:
    """A pool of ``num_blocks`` plain free blocks (of ``capacity`` entries), ``num_keys`` prompt keys and
    ``tables`` empty block tables of ``table_blocks`` blocks."""
    ids = jnp.arange(capacity, dtype=jnp.int64)
    return BlockPool(
        key=jnp.full((capacity,), -1, jnp.int64), ref=jnp.zeros((capacity,), jnp.int64), stamp=jnp.full((capacity,), NEVER),
        seq=jnp.zeros((capacity,), jnp.int64), plain=ids[::-1] - (capacity - num_blocks),  # top of the stack: block 0
        plain_top=jnp.asarray(num_blocks, jnp.int64), queued=jnp.zeros((), jnp.int64), clock=jnp.zeros((), jnp.int64),
        next_seq=jnp.zeros((), jnp.int64), serving=jnp.full((num_keys,), -1, jnp.int64),
        tables=jnp.zeros((tables, table_blocks), jnp.int64), table_len=jnp.zeros((tables,), jnp.int64),
        free_tables=jnp.arange(tables, dtype=jnp.int64)[::-1], free_top=jnp.asarray(tables, jnp.int64),
    )


def request_block_keys(
    prompt_keys: Int64[Array, " F"], offset: Int64[Array, ""], prompt_blocks: Int64[Array, ""], row: Int64[Array, ""],
    num_keys: int, table_blocks: int,
) -> Int64[Array, " B"]:
    """The keys of a request's blocks ``[0, B)``: its prompt's full blocks (``prompt_keys[offset:]``, shared
    across requests), then blocks holding generated tokens (keyed by request row and position: only the
    request's own recompute reads them back)."""
    j = jnp.arange(table_blocks, dtype=jnp.int64)
    shared = prompt_keys[jnp.clip(offset + j, 0, prompt_keys.shape[0] - 1)]
    return jnp.where(j < prompt_blocks, shared, num_keys + row * table_blocks + j)


# ----------------------------------------------------------------------------------------------------
# reads


def leading_hits(pool: BlockPool, keys: Int64[Array, " B"], limit: Int64[Array, ""]) -> tuple[Int64[Array, ""], Int64[Array, " B"]]:
    """The leading cached blocks of ``keys`` (at most ``limit``): their number, and the block serving each
    position (-1 past them)."""
    num_keys = pool.serving.shape[0]
    width = keys.shape[0]
    j = jnp.arange(width, dtype=jnp.int64)
    shared = jnp.where(keys < num_keys, pool.serving[jnp.clip(keys, 0, num_keys - 1)], -1)
    own_base = keys[-1] - (width - 1)  # generated keys are num_keys + row * B + j

    def own_blocks():
        """Per position, the earliest registered block holding the request's own key (an O(P) scan: only for
        a recompute with blocks of generated tokens)."""
        capacity = pool.key.shape[0]
        pos = pool.key - own_base
        mine = (pool.key >= num_keys) & (pos >= 0) & (pos < width)
        code = jnp.full((width,), NEVER).at[jnp.where(mine, pos, width)].min(pool.seq * capacity + jnp.arange(capacity), mode="drop")
        return jnp.where(code < NEVER, code % capacity, -1)

    needs_own = jnp.any((keys >= num_keys) & (j < limit))
    own = jax.lax.cond(needs_own, own_blocks, lambda: jnp.full((width,), -1, jnp.int64))
    blocks = jnp.where(keys < num_keys, shared, own)
    run = jnp.cumprod(((blocks >= 0) & (j < limit)).astype(jnp.int64))
    return jnp.sum(run), jnp.where(run > 0, blocks, -1)


# ----------------------------------------------------------------------------------------------------
# writes


def open_table(pool: BlockPool, hits: Int64[Array, " B"], num_hits: Int64[Array, ""]) -> tuple[BlockPool, Int64[Array, ""]]:
    """A new table holding the hit blocks (referenced: a free one leaves the eviction queue), and its id."""
    t = pool.free_tables[pool.free_top - 1]
    j = jnp.arange(hits.shape[0], dtype=jnp.int64)
    held = j < num_hits
    index = jnp.where(held, hits, pool.key.shape[0])
    idle = held & (pool.ref[jnp.clip(hits, 0, pool.key.shape[0] - 1)] == 0)
    pool = eqx.tree_at(
        lambda q: (q.ref, q.stamp, q.queued, q.tables, q.table_len, q.free_top), pool,
        (pool.ref.at[index].add(1, mode="drop"), pool.stamp.at[jnp.where(idle, hits, pool.key.shape[0])].set(NEVER, mode="drop"),
         pool.queued - jnp.sum(idle), pool.tables.at[t].set(jnp.where(held, hits, 0)), pool.table_len.at[t].set(num_hits),
         pool.free_top - 1),
    )
    return pool, t


def take(pool: BlockPool, table: Int64[Array, ""], count: Int64[Array, ""], most: int) -> BlockPool:
    """``count`` (≤ ``most``, static) free blocks appended to ``table``: plain blocks first, then the least
    recently released cached blocks (evicting their keys)."""
    capacity = pool.key.shape[0]
    i = jnp.arange(most, dtype=jnp.int64)
    from_plain = jnp.minimum(count, pool.plain_top)
    plain_ids = pool.plain[jnp.clip(pool.plain_top - 1 - i, 0, capacity - 1)]

    def evict():
        _, oldest = jax.lax.top_k(-pool.stamp, most)
        ids = oldest[jnp.clip(i - from_plain, 0, most - 1)].astype(jnp.int64)
        gone = (i >= from_plain) & (i < count)
        at = jnp.where(gone, ids, capacity)
        key = pool.key.at[at].set(-1, mode="drop")
        return ids, key, pool.stamp.at[at].set(NEVER, mode="drop"), _serving(key, pool.seq, pool.serving.shape[0])

    evicting = count > from_plain
    evicted, key, stamp, serving = jax.lax.cond(
        evicting, evict, lambda: (jnp.zeros((most,), jnp.int64), pool.key, pool.stamp, pool.serving)
    )
    ids = jnp.where(i < from_plain, plain_ids, evicted)
    taken = i < count
    n = pool.table_len[table]
    return eqx.tree_at(
        lambda q: (q.key, q.stamp, q.serving, q.ref, q.plain_top, q.queued, q.tables, q.table_len), pool,
        (key, stamp, serving, pool.ref.at[jnp.where(taken, ids, capacity)].set(1, mode="drop"), pool.plain_top - from_plain,
         pool.queued - (count - from_plain), pool.tables.at[table, jnp.where(taken, n + i, pool.tables.shape[1])].set(ids, mode="drop"),
         pool.table_len.at[table].add(count)),
    )


def _serving(key: Int64[Array, " P"], seq: Int64[Array, " P"], num_keys: int) -> Int64[Array, " K"]:
    """Per prompt key, its earliest registered block still holding it (-1: none)."""
    capacity = key.shape[0]
    shared = (key >= 0) & (key < num_keys)
    code = jnp.full((num_keys,), NEVER).at[jnp.where(shared, key, num_keys)].min(seq * capacity + jnp.arange(capacity), mode="drop")
    return jnp.where(code < NEVER, code % capacity, -1)


def register(pool: BlockPool, table: Int64[Array, ""], keys: Int64[Array, " B"], full: Int64[Array, ""]) -> BlockPool:
    """The table's first ``full`` blocks cached under ``keys`` (blocks already holding a key keep it; a key's
    first copy serves its hits)."""
    capacity = pool.key.shape[0]
    num_keys = pool.serving.shape[0]
    j = jnp.arange(keys.shape[0], dtype=jnp.int64)
    blocks = pool.tables[table]
    new = (j < full) & (j < pool.table_len[table]) & (pool.key[blocks] < 0)
    at = jnp.where(new, blocks, capacity)
    seq = pool.next_seq + jnp.cumsum(new) - new
    first = new & (keys < num_keys) & (pool.serving[jnp.clip(keys, 0, num_keys - 1)] < 0)
    return eqx.tree_at(
        lambda q: (q.key, q.seq, q.next_seq, q.serving), pool,
        (pool.key.at[at].set(keys, mode="drop"), pool.seq.at[at].set(seq, mode="drop"), pool.next_seq + jnp.sum(new),
         pool.serving.at[jnp.where(first, keys, num_keys)].set(blocks, mode="drop")),
    )


def release(pool: BlockPool, table: Int64[Array, ""]) -> BlockPool:
    """The table's blocks released tail first (a block nobody holds any more joins the plain stack, or, when it
    holds a cached key, the back of the eviction queue) and the table freed."""
    capacity = pool.key.shape[0]
    blocks = pool.tables[table]
    j = jnp.arange(blocks.shape[0], dtype=jnp.int64)
    held = j < pool.table_len[table]
    safe = jnp.clip(blocks, 0, capacity - 1)
    freed = held & (pool.ref[safe] == 1)
    cached = freed & (pool.key[safe] >= 0)
    plain = freed & ~cached
    later_cached = jnp.sum(cached) - jnp.cumsum(cached)  # released before this one (tail first)
    plain_at = pool.plain_top + jnp.cumsum(plain) - plain
    return eqx.tree_at(
        lambda q: (q.ref, q.stamp, q.queued, q.clock, q.plain, q.plain_top, q.table_len, q.free_tables, q.free_top), pool,
        (pool.ref.at[jnp.where(held, blocks, capacity)].add(-1, mode="drop"),
         pool.stamp.at[jnp.where(cached, blocks, capacity)].set(pool.clock + later_cached, mode="drop"),
         pool.queued + jnp.sum(cached), pool.clock + jnp.sum(cached),
         pool.plain.at[jnp.where(plain, plain_at, capacity)].set(blocks, mode="drop"), pool.plain_top + jnp.sum(plain),
         pool.table_len.at[table].set(0), pool.free_tables.at[pool.free_top].set(table), pool.free_top + 1),
    )


def holds(pool: BlockPool) -> Bool[Array, " P"]:
    """Blocks some request holds."""
    return pool.ref > 0
