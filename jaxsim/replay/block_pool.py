"""vLLM's KV block pool with automatic prefix caching, as fixed-capacity arrays (one replay; pure functions).

The specification is ``_Pool`` in ``tests/replay_support.py`` (vLLM's ``block_pool.py`` as the reference's
replay implements it): every block has a reference count and at most one cached hash (here a block key,
:func:`jaxsim.replay.prefix_cache.block_keys`; blocks holding generated tokens get keys of their own request,
:func:`jaxsim.replay.cache_engine`). A free block is either *plain* (it holds no cached hash: handed out first, any
order) or *cached* (handed out after every plain block, the least recently released first; handing it out
evicts its hash). A request releases its blocks tail first, so its prefix is evicted last.

As in vLLM, two linked lists make every operation O(1) per block: the free cached blocks in release order (vLLM's
``FreeKVCacheBlockQueue``, doubly linked: a block read again leaves it from the middle) and, per prompt key, the
blocks holding it in registration order (the first serves the key's hits; evicting it hands them to the next).

Layout, for speed under XLA: every per-block and per-key field lives in one ``int64`` array ``rows`` (``P`` block
rows, then ``K`` key rows; columns below), the plain free blocks in a stack, the request tables in ``T x B``. A loop
over a request's blocks carries the pool and changes single cells, which XLA does in place only when it can see
that every read of the array's old version is done before the write: otherwise it copies the whole array, every
iteration (an O(P) copy per block: 0.07 ms at P = 131,072, measured). :class:`_Rows` makes that visible to XLA:
each write's value depends on every read made since the previous write. Work per request is then proportional to
the blocks it takes, reads or releases, never to ``P``.
"""

from __future__ import annotations

import functools
import operator

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int64

from jaxsim.replay.engine import _materialize as materialize

NEVER = jnp.iinfo(jnp.int64).max  # a sequence number above every registered block's
_NO_VALUE = jnp.iinfo(jnp.int64).min  # no cell ever holds it (see _Rows.write)

# block rows [0, P)
KEY, REF, SEQ, QUEUE_NEXT, QUEUE_PREV, KEY_NEXT, KEY_PREV = range(7)
# key rows [P, P + K): the key's earliest and latest registered block still cached (-1: none)
SERVING, KEY_TAIL = 0, 1
COLUMNS = 7


class BlockPool(eqx.Module):
    """The pool of one replay; build it with :func:`empty_pool`. Links are block ids, -1 for none."""

    rows: Int64[Array, "PK C"]  # P block rows (KEY .. KEY_PREV), K key rows (SERVING, KEY_TAIL), a scratch row
    plain: Int64[Array, " P"]  # stack of free blocks holding no cached hash ([0, plain_top))
    plain_top: Int64[Array, ""]
    queued: Int64[Array, ""]  # free cached blocks (in the free queue)
    queue_head: Int64[Array, ""]  # the least recently released free cached block (evicted next)
    queue_tail: Int64[Array, ""]
    next_seq: Int64[Array, ""]
    tables: Int64[Array, "T B"]  # per table: the blocks a request holds, in order
    table_len: Int64[Array, " T"]
    free_tables: Int64[Array, " T"]  # stack of unused table ids ([0, free_top))
    free_top: Int64[Array, ""]

    @property
    def capacity(self) -> int:
        return self.plain.shape[0]

    @property
    def num_keys(self) -> int:
        return self.rows.shape[0] - self.plain.shape[0] - 1

    @property
    def free_blocks(self) -> Int64[Array, ""]:
        """Blocks nobody holds (plain or cached)."""
        return self.plain_top + self.queued

    def column(self, c: int) -> Int64[Array, " P"]:
        """Column ``c`` of the block rows (a whole-pool read: O(P))."""
        return self.rows[: self.capacity, c]

    def refs(self, blocks: Int64[Array, " W"]) -> Int64[Array, " W"]:
        """The reference counts of ``blocks`` (clipped into the pool)."""
        return self.rows[jnp.clip(blocks, 0, self.capacity - 1), REF]

    def serving(self, keys: Int64[Array, " W"]) -> Int64[Array, " W"]:
        """Per prompt key (< K): the block its hits read (-1: not cached)."""
        return self.rows[self.capacity + jnp.clip(keys, 0, self.num_keys - 1), SERVING]


def empty_pool(num_blocks: Int64[Array, ""], capacity: int, num_keys: int, tables: int, table_blocks: int) -> BlockPool:
    """A pool of ``num_blocks`` plain free blocks (of ``capacity`` entries), ``num_keys`` prompt keys and
    ``tables`` empty block tables of ``table_blocks`` blocks."""
    ids = jnp.arange(capacity, dtype=jnp.int64)
    rows = jnp.full((capacity + num_keys + 1, COLUMNS), -1, jnp.int64).at[:capacity, REF].set(0).at[:capacity, SEQ].set(0)
    minus = jnp.full((), -1, jnp.int64)
    return BlockPool(
        rows=rows, plain=ids[::-1] - (capacity - num_blocks),  # top of the stack: block 0
        plain_top=jnp.asarray(num_blocks, jnp.int64), queued=jnp.zeros((), jnp.int64), queue_head=minus, queue_tail=minus,
        next_seq=jnp.zeros((), jnp.int64), tables=jnp.zeros((tables, table_blocks), jnp.int64),
        table_len=jnp.zeros((tables,), jnp.int64), free_tables=jnp.arange(tables, dtype=jnp.int64)[::-1],
        free_top=jnp.asarray(tables, jnp.int64),
    )


def widen_tables(pool: BlockPool, tables: int) -> BlockPool:
    """Host-side (numpy): ``pool`` with ``tables`` (≥ its number of) block tables, the new ones unused (their ids under
    the free ones on the stack: which id a request gets changes nothing else)."""
    import numpy as np  # noqa: PLC0415

    old = pool.tables.shape[0]
    extra = int(tables) - old
    if extra < 0:
        raise ValueError(f"cannot narrow {old} block tables to {tables}")
    free = np.asarray(pool.free_tables)
    top = int(pool.free_top)
    stack = np.concatenate([np.arange(old, int(tables), dtype=np.int64)[::-1], free[:top], free[top:]])
    return eqx.tree_at(
        lambda q: (q.tables, q.table_len, q.free_tables, q.free_top), pool,
        (np.concatenate([np.asarray(pool.tables), np.zeros((extra, pool.tables.shape[1]), np.int64)]),
         np.concatenate([np.asarray(pool.table_len), np.zeros(extra, np.int64)]), stack, np.asarray(top + extra, np.int64)),
    )


# ----------------------------------------------------------------------------------------------------
# reads


def leading_hits(pool: BlockPool, keys: Int64[Array, " B"], limit: Int64[Array, ""]) -> tuple[Int64[Array, ""], Int64[Array, " B"]]:
    """The leading cached blocks of ``keys`` (at most ``limit``): their number, and the block serving each
    position (-1 past them)."""
    num_keys = pool.num_keys
    width = keys.shape[0]
    j = jnp.arange(width, dtype=jnp.int64)
    shared = jnp.where(keys < num_keys, pool.serving(keys), -1)
    own_base = keys[-1] - (width - 1)  # generated keys are num_keys + row * B + j

    def own_blocks(rows):
        """Per position, the earliest registered block holding the request's own key (an O(P) scan: only for
        a recompute with blocks of generated tokens)."""
        capacity = pool.capacity
        key, seq = rows[:capacity, KEY], rows[:capacity, SEQ]
        pos = key - own_base
        mine = (key >= num_keys) & (pos >= 0) & (pos < width)
        code = jnp.full((width,), NEVER).at[jnp.where(mine, pos, width)].min(seq * capacity + jnp.arange(capacity), mode="drop")
        return jnp.where(code < NEVER, code % capacity, -1)

    needs_own = jnp.any((keys >= num_keys) & (j < limit))
    own = jax.lax.cond(needs_own, own_blocks, lambda rows: jnp.full((width,), -1, jnp.int64), pool.rows)
    blocks = jnp.where(keys < num_keys, shared, own)
    run = jnp.cumprod(((blocks >= 0) & (j < limit)).astype(jnp.int64))
    return jnp.sum(run), jnp.where(run > 0, blocks, -1)


# ----------------------------------------------------------------------------------------------------
# cell by cell, in place


class _Rows:
    """``rows`` changed cell by cell in program order: :meth:`read` reads the latest version and :meth:`write`
    makes its value depend on every value read (or :meth:`note`-d) since the previous write, so XLA finishes
    those reads before it writes the array in place."""

    def __init__(self, rows):
        self.rows, self.pending = rows, []

    def read(self, r, c: int):
        v = materialize(self.rows[jnp.clip(r, 0, self.rows.shape[0] - 1), c])
        self.pending.append(v)
        return v

    def note(self, *values) -> None:
        """Values computed from earlier reads that must exist before the next write (scalars the loop carries)."""
        self.pending.extend(values)

    def write(self, r, c: int, v, on=True) -> None:
        """Cell ``(r, c)`` set to ``v`` where ``on`` and ``r`` is a real row (else the scratch row is written: no read
        of the old value, which XLA would rewrite into a read of an older version)."""
        trash = self.rows.shape[0] - 1
        target = jnp.where(jnp.asarray(on) & (r >= 0) & (r < trash), r, trash)
        if self.pending:  # a data dependence XLA cannot fold away (no cell ever holds _NO_VALUE)
            v = jnp.where(functools.reduce(operator.or_, [jnp.asarray(p) == _NO_VALUE for p in self.pending]), 0, v)
        self.rows = jax.lax.dynamic_update_slice(self.rows, jnp.reshape(jnp.asarray(v, self.rows.dtype), (1, 1)), (target, c))
        self.pending = []


def set_entry(x, i, v, on=True):
    """``x`` with entry ``i`` (along its first axis) set to ``v`` where ``on`` and ``i`` is inside: one read and one
    ``dynamic_update_slice`` of that entry, which XLA does in place (a ``mode="drop"`` scatter is a select over the
    whole array, and a copy of it)."""
    safe = jnp.clip(i, 0, x.shape[0] - 1)
    return jax.lax.dynamic_update_index_in_dim(x, jnp.where(jnp.asarray(on) & (i >= 0) & (i < x.shape[0]), v, x[safe]).astype(x.dtype), safe, 0)


def _set_cell(x, i, j, v):
    """``x`` (2-D) with cell ``(i, j)`` set to ``v`` (nothing when ``j`` is past the row)."""
    jj = jnp.clip(j, 0, x.shape[1] - 1)
    return jax.lax.dynamic_update_slice(x, jnp.reshape(jnp.where(j < x.shape[1], v, x[i, jj]), (1, 1)).astype(x.dtype), (i, jj))


class _Queue(eqx.Module):
    """The free queue's scalars."""

    head: Int64[Array, ""]
    tail: Int64[Array, ""]
    queued: Int64[Array, ""]


def _queue_remove(rows: _Rows, q: _Queue, b, on) -> _Queue:
    """Free queue without block ``b``."""
    prev, nxt = rows.read(b, QUEUE_PREV), rows.read(b, QUEUE_NEXT)
    q = _Queue(jnp.where(on & (prev < 0), nxt, q.head), jnp.where(on & (nxt < 0), prev, q.tail), q.queued - on)
    rows.note(q.head, q.tail, q.queued)
    rows.write(prev, QUEUE_NEXT, nxt, on)
    rows.write(nxt, QUEUE_PREV, prev, on)
    return q


def _queue_append(rows: _Rows, q: _Queue, b, on) -> _Queue:
    """Free queue with block ``b`` at its back (released last, evicted last)."""
    new = _Queue(jnp.where(on & (q.tail < 0), b, q.head), jnp.where(on, b, q.tail), q.queued + on)
    rows.note(new.head, new.tail, new.queued)
    rows.write(q.tail, QUEUE_NEXT, b, on)
    rows.write(b, QUEUE_NEXT, -1, on)
    rows.write(b, QUEUE_PREV, q.tail, on)
    return new


def _key_remove(rows: _Rows, capacity: int, b, k, on) -> None:
    """Key ``k``'s chain without block ``b`` (its next copy serves when ``b`` did)."""
    prev, nxt = rows.read(b, KEY_PREV), rows.read(b, KEY_NEXT)
    rows.write(prev, KEY_NEXT, nxt, on)
    rows.write(nxt, KEY_PREV, prev, on)
    rows.write(capacity + k, SERVING, nxt, on & (prev < 0))
    rows.write(capacity + k, KEY_TAIL, prev, on & (nxt < 0))


def _key_append(rows: _Rows, capacity: int, b, k, on) -> None:
    """Key ``k``'s chain with block ``b`` registered last."""
    tail = rows.read(capacity + k, KEY_TAIL)
    rows.write(tail, KEY_NEXT, b, on)
    rows.write(b, KEY_NEXT, -1, on)
    rows.write(b, KEY_PREV, tail, on)
    rows.write(capacity + k, SERVING, b, on & (tail < 0))
    rows.write(capacity + k, KEY_TAIL, b, on)


def _queue(pool: BlockPool) -> _Queue:
    return _Queue(pool.queue_head, pool.queue_tail, pool.queued)


def _with(pool: BlockPool, rows: _Rows, q: _Queue, **fields) -> BlockPool:
    names = ("rows", "queue_head", "queue_tail", "queued", *fields)
    return eqx.tree_at(lambda x: tuple(getattr(x, n) for n in names), pool, (rows.rows, q.head, q.tail, q.queued, *fields.values()))


# ----------------------------------------------------------------------------------------------------
# writes (a request's work, masked by ``enabled`` where it may be skipped)


def open_table(pool: BlockPool, hits: Int64[Array, " B"], num_hits: Int64[Array, ""], enabled: Bool[Array, ""]) -> tuple[BlockPool, Int64[Array, ""]]:
    """A new table holding the hit blocks (referenced: a free one leaves the free queue), and its id; nothing
    changes unless ``enabled``."""
    t = pool.free_tables[pool.free_top - 1]

    def one(i, pool: BlockPool) -> BlockPool:
        rows, b = _Rows(pool.rows), hits[i]
        ref = rows.read(b, REF)
        q = _queue_remove(rows, _queue(pool), b, ref == 0)
        rows.write(b, REF, ref + 1)
        return _with(pool, rows, q)

    pool = jax.lax.fori_loop(0, jnp.where(enabled, num_hits, 0), one, pool)
    j = jnp.arange(hits.shape[0], dtype=jnp.int64)
    pool = eqx.tree_at(
        lambda q: (q.tables, q.table_len, q.free_top), pool,
        (set_entry(pool.tables, t, jnp.where(j < num_hits, hits, 0), enabled), set_entry(pool.table_len, t, num_hits, enabled),
         pool.free_top - enabled),
    )
    return pool, t


def take(pool: BlockPool, table: Int64[Array, ""], count: Int64[Array, ""]) -> BlockPool:
    """``count`` free blocks appended to ``table``, one at a time: plain blocks first, then the least recently
    released cached block (evicting its key)."""
    capacity, num_keys = pool.capacity, pool.num_keys
    n = pool.table_len[table]

    def one(i, pool: BlockPool) -> BlockPool:
        plain = pool.plain_top > 0
        b = jnp.where(plain, pool.plain[jnp.clip(pool.plain_top - 1, 0, capacity - 1)], pool.queue_head)
        evict = ~plain
        rows = _Rows(pool.rows)
        k = rows.read(b, KEY)
        q = _queue_remove(rows, _queue(pool), b, evict)
        _key_remove(rows, capacity, b, jnp.clip(k, 0, num_keys - 1), evict & (k >= 0) & (k < num_keys))
        rows.write(b, KEY, -1, evict)
        rows.write(b, REF, 1)
        return _with(pool, rows, q, plain_top=pool.plain_top - plain, tables=_set_cell(pool.tables, table, n + i, b))

    pool = jax.lax.fori_loop(0, count, one, pool)
    return eqx.tree_at(lambda q: q.table_len, pool, set_entry(pool.table_len, table, n + count))


def register(pool: BlockPool, table: Int64[Array, ""], start: Int64[Array, ""], full: Int64[Array, ""], key_at) -> BlockPool:
    """The table's blocks ``[start, full)`` cached under ``key_at(position)`` (blocks already holding a key keep it; a
    key's first copy serves its hits). Blocks before ``start`` must hold their keys already (every block is
    registered once it is full)."""
    capacity, num_keys = pool.capacity, pool.num_keys
    end = jnp.minimum(full, pool.table_len[table])

    def one(j, pool: BlockPool) -> BlockPool:
        rows, b, k = _Rows(pool.rows), pool.tables[table, j], key_at(j)
        new = rows.read(b, KEY) < 0
        next_seq = pool.next_seq + new
        rows.note(next_seq)
        _key_append(rows, capacity, b, jnp.clip(k, 0, num_keys - 1), new & (k < num_keys))
        rows.write(b, SEQ, pool.next_seq, new)
        rows.write(b, KEY, k, new)
        return eqx.tree_at(lambda x: (x.rows, x.next_seq), pool, (rows.rows, next_seq))

    return jax.lax.fori_loop(start, end, one, pool)


def release(pool: BlockPool, table: Int64[Array, ""], enabled: Bool[Array, ""]) -> BlockPool:
    """When ``enabled``: the table's blocks released tail first (a block nobody holds any more joins the plain stack,
    or, when it holds a cached key, the back of the free queue) and the table freed."""
    n = pool.table_len[table]

    def one(i, pool: BlockPool) -> BlockPool:
        rows, b = _Rows(pool.rows), pool.tables[table, n - 1 - i]
        ref, key = rows.read(b, REF), rows.read(b, KEY)
        freed = ref == 1
        cached = freed & (key >= 0)
        plain = freed & ~cached
        stack, top = set_entry(pool.plain, pool.plain_top, b, plain), pool.plain_top + plain
        rows.note(stack[jnp.clip(pool.plain_top, 0, stack.shape[0] - 1)], top)
        q = _queue_append(rows, _queue(pool), b, cached)
        rows.write(b, REF, ref - 1)
        return _with(pool, rows, q, plain=stack, plain_top=top)

    pool = jax.lax.fori_loop(0, jnp.where(enabled, n, 0), one, pool)
    return eqx.tree_at(
        lambda q: (q.table_len, q.free_tables, q.free_top), pool,
        (set_entry(pool.table_len, table, 0, enabled), set_entry(pool.free_tables, pool.free_top, table, enabled), pool.free_top + enabled),
    )
