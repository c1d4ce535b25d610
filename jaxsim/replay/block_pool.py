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

A request's blocks go in chunks (:func:`take`, :func:`register`, :func:`release`: up to :data:`CHUNK` blocks per loop
step, one gather per field and one scatter of every cell the chunk changes), which write exactly the cells that the
one-block-at-a-time specifications (:func:`take_each`, :func:`register_each`, :func:`release_each`) write
(``tests/test_block_pool.py``); fewer than :data:`FEW` blocks, and a chunk evicting two copies of one key, go one at a
time. A Mooncake prompt of 860 blocks of 16 tokens is taken in 14 loop steps instead of 860.
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


def take_each(pool: BlockPool, table: Int64[Array, ""], count: Int64[Array, ""]) -> BlockPool:
    """``count`` free blocks appended to ``table``, one at a time (the specification of :func:`take`): plain blocks first, then the least recently
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


def register_each(pool: BlockPool, table: Int64[Array, ""], start: Int64[Array, ""], full: Int64[Array, ""], key_at) -> BlockPool:
    """One block at a time (the specification of :func:`register`): the table's blocks ``[start, full)`` cached under
    ``key_at(position)`` (blocks already holding a key keep it; a key's first copy serves its hits). Blocks before
    ``start`` must hold their keys already (every block is registered once it is full)."""
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


def release_each(pool: BlockPool, table: Int64[Array, ""], enabled: Bool[Array, ""]) -> BlockPool:
    """One block at a time (the specification of :func:`release`): when ``enabled``, the table's blocks released tail
    first (a block nobody holds any more joins the plain stack, or, when it holds a cached key, the back of the free
    queue) and the table freed."""
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

    return _free_table(jax.lax.fori_loop(0, jnp.where(enabled, n, 0), one, pool), table, enabled)


def _free_table(pool: BlockPool, table: Int64[Array, ""], enabled: Bool[Array, ""]) -> BlockPool:
    """When ``enabled``: ``table`` emptied and back on the stack of unused tables."""
    return eqx.tree_at(
        lambda q: (q.table_len, q.free_tables, q.free_top), pool,
        (set_entry(pool.table_len, table, 0, enabled), set_entry(pool.free_tables, pool.free_top, table, enabled), pool.free_top + enabled),
    )


# ----------------------------------------------------------------------------------------------------
# a request's blocks in chunks: the same cells written as one block at a time, with one gather per field read and one
# scatter per chunk (work per chunk, not per block; a block table's chunk is a run of consecutive positions)

CHUNK = 64  # blocks per loop step (a Mooncake prompt chunk of 128 blocks: 2 steps instead of 128)
FEW = 12  # fewer blocks than this go one at a time (a chunk costs about as much as 12 blocks one at a time)


def _width(pool: BlockPool) -> int:
    return min(CHUNK, pool.capacity, pool.tables.shape[1])


def _after_reads(values, *reads):
    """``values`` made to depend on every array in ``reads`` (no cell ever holds ``_NO_VALUE``), so XLA finishes the
    reads of the old ``rows`` before the scatter that writes it in place (see :class:`_Rows`)."""
    seen = functools.reduce(operator.or_, [jnp.any(jnp.asarray(r) == _NO_VALUE) for r in reads])
    return jnp.where(seen, 0, values)


def _scatter(rows, writes: list[tuple], *reads):
    """``rows`` with the cells of ``writes`` (``(row, column, value, on)``, vectors or scalars) set; cells not ``on`` or
    outside the pool go to the scratch row. Cells written must be distinct (the scratch row aside)."""
    trash = rows.shape[0] - 1
    r, c, v = [], [], []
    for row, col, value, on in writes:
        row = jnp.atleast_1d(jnp.asarray(row, jnp.int64))
        on = jnp.broadcast_to(jnp.asarray(on), row.shape)
        r.append(jnp.where(on & (row >= 0) & (row < trash), row, trash))
        c.append(jnp.full(row.shape, col, jnp.int64))
        v.append(jnp.broadcast_to(jnp.asarray(value, jnp.int64), row.shape))
    values = _after_reads(jnp.concatenate(v), *reads)
    return rows.at[jnp.concatenate(r), jnp.concatenate(c)].set(values, mode="promise_in_bounds")


def _write_run(x, start, values, count):
    """``x`` (1-D) with ``x[start + j] = values[j]`` for ``j < count`` (``count`` ≤ len(values), the run inside ``x``):
    one window read and one in-place window write (the window's start clamped into ``x``)."""
    n, w = x.shape[0], values.shape[0]
    s = jnp.clip(start, 0, n - w)
    old = jax.lax.dynamic_slice_in_dim(x, s, w)
    k = s + jnp.arange(w) - start
    new = jnp.where((k >= 0) & (k < count), values[jnp.clip(k, 0, w - 1)], old)
    return jax.lax.dynamic_update_slice_in_dim(x, new.astype(x.dtype), s, 0)


def _distinct(keys, on) -> Bool[Array, ""]:
    """Whether the ``keys`` where ``on`` are pairwise distinct."""
    same = (keys[:, None] == keys[None, :]) & on[:, None] & on[None, :]
    return ~jnp.any(same & ~jnp.eye(keys.shape[0], dtype=bool))


def _chunks(count, width: int, body, pool: BlockPool) -> BlockPool:
    """``body(done, c, pool)`` for chunks of ``c`` ≤ ``width`` of ``count`` items, ``done`` items before each (none
    when ``count`` < :data:`FEW`: the caller goes one at a time then)."""
    def step(x):
        pool, done = x
        c = jnp.minimum(count - done, width)
        return body(done, c, pool), done + c

    count = jnp.where(count < FEW, 0, count)
    return jax.lax.while_loop(lambda x: x[1] < count, step, (pool, jnp.zeros((), jnp.int64)))[0]


def _hand_out(pool: BlockPool, blocks, taken, evict, later, after, e, bulk, *reads) -> BlockPool:
    """When ``bulk``: ``blocks`` (where ``taken``) handed out, those ``evict``-ed being the first ``e`` of the free queue
    (``later``: evicted after its head; ``after``: the block behind them): referenced once, evicted ones leave the queue
    and their key's chain (their keys distinct: one block per chain). The cells of :func:`take_each`, one scatter."""
    capacity, num_keys = pool.capacity, pool.num_keys
    safe = jnp.clip(blocks, 0, capacity - 1)
    key, kprev, knext = pool.rows[safe, KEY], pool.rows[safe, KEY_PREV], pool.rows[safe, KEY_NEXT]
    chained = evict & (key >= 0) & (key < num_keys)
    krow = capacity + jnp.clip(key, 0, num_keys - 1)
    rows = _scatter(pool.rows, [
        (blocks, REF, 1, bulk & taken),
        (blocks, KEY, -1, bulk & evict),
        (blocks, QUEUE_PREV, -1, bulk & later),  # each evicted block but the first had become the head
        (after, QUEUE_PREV, -1, bulk & (e > 0)),
        (kprev, KEY_NEXT, knext, bulk & chained),
        (knext, KEY_PREV, kprev, bulk & chained),
        (krow, SERVING, knext, bulk & chained & (kprev < 0)),
        (krow, KEY_TAIL, kprev, bulk & chained & (knext < 0)),
    ], key, kprev, knext, *reads)
    gone = jnp.where(bulk, e, 0)
    return eqx.tree_at(
        lambda q: (q.rows, q.queue_head, q.queue_tail, q.queued), pool,
        (rows, jnp.where(gone > 0, after, pool.queue_head), jnp.where((gone > 0) & (after < 0), -1, pool.queue_tail),
         pool.queued - gone),
    )


def take(pool: BlockPool, table: Int64[Array, ""], count: Int64[Array, ""]) -> BlockPool:
    """``count`` free blocks appended to ``table``: plain blocks first (from the top of the stack), then the least
    recently released cached blocks (evicting their keys), as :func:`take_each` hands them out one at a time. A chunk
    whose evicted blocks share a key (two copies of one prompt block) is handed out by :func:`take_each`."""
    capacity, num_keys, w = pool.capacity, pool.num_keys, _width(pool)
    j = jnp.arange(w, dtype=jnp.int64)

    def chunk(done, c, pool: BlockPool) -> BlockPool:
        at = pool.table_len[table]
        m = jnp.minimum(c, pool.plain_top)  # plain blocks, then c - m evicted from the queue's head
        plain = pool.plain[jnp.clip(pool.plain_top - 1 - j, 0, capacity - 1)]

        def walk(i, x):
            ev, b = x
            return set_entry(ev, i, b), pool.rows[jnp.clip(b, 0, capacity - 1), QUEUE_NEXT]

        evicted, after = jax.lax.fori_loop(0, c - m, walk, (jnp.full((w,), -1, jnp.int64), pool.queue_head))
        taken = j < c
        evict = taken & (j >= m)
        blocks = jnp.where(j < m, plain, evicted[jnp.clip(j - m, 0, w - 1)])
        key = pool.rows[jnp.clip(blocks, 0, capacity - 1), KEY]
        bulk = _distinct(key, evict & (key >= 0) & (key < num_keys))
        pool = _hand_out(pool, blocks, taken, evict, evict & (j > m), after, c - m, bulk, evicted)
        pool = eqx.tree_at(
            lambda q: (q.plain_top, q.tables, q.table_len), pool,
            (pool.plain_top - jnp.where(bulk, m, 0), _write_table(pool.tables, table, at, blocks, jnp.where(bulk, c, 0)),
             set_entry(pool.table_len, table, at + jnp.where(bulk, c, 0))),
        )
        return take_each(pool, table, jnp.where(bulk, 0, c))

    return take_each(_chunks(count, w, chunk, pool), table, jnp.where(count < FEW, count, 0))


def _write_table(tables, t, start, blocks, count):
    """``tables`` with row ``t``'s positions ``[start, start + count)`` set to ``blocks[:count]``."""
    row = jax.lax.dynamic_index_in_dim(tables, t, 0, keepdims=False)
    return jax.lax.dynamic_update_index_in_dim(tables, _write_run(row, start, blocks, count), t, 0)


def register(pool: BlockPool, table: Int64[Array, ""], start: Int64[Array, ""], full: Int64[Array, ""], key_at) -> BlockPool:
    """The table's blocks ``[start, full)`` cached under ``key_at(position)`` (blocks already holding a key keep it; a
    key's first copy serves its hits), in position order as :func:`register_each`; blocks before ``start`` must hold
    their keys already (every block is registered once it is full)."""
    capacity, num_keys, w = pool.capacity, pool.num_keys, _width(pool)
    end = jnp.minimum(full, pool.table_len[table])
    j = jnp.arange(w, dtype=jnp.int64)

    def chunk(done, c, pool: BlockPool) -> BlockPool:
        first = start + done
        pos = first + j
        on = j < c
        blocks = pool.tables[table, jnp.clip(pos, 0, pool.tables.shape[1] - 1)]
        keys = jax.vmap(key_at)(pos)
        safe = jnp.clip(blocks, 0, capacity - 1)
        new = on & (pool.rows[safe, KEY] < 0)
        chained = new & (keys < num_keys)
        bulk = _distinct(keys, chained)
        krow = capacity + jnp.clip(keys, 0, num_keys - 1)
        tail = pool.rows[krow, KEY_TAIL]
        seq = pool.next_seq + jnp.cumsum(new) - new
        rows = _scatter(pool.rows, [
            (tail, KEY_NEXT, blocks, bulk & chained),
            (blocks, KEY_NEXT, -1, bulk & chained),
            (blocks, KEY_PREV, tail, bulk & chained),
            (krow, SERVING, blocks, bulk & chained & (tail < 0)),
            (krow, KEY_TAIL, blocks, bulk & chained),
            (blocks, SEQ, seq, bulk & new),
            (blocks, KEY, keys, bulk & new),
        ], tail, seq)
        pool = eqx.tree_at(lambda q: (q.rows, q.next_seq), pool, (rows, pool.next_seq + jnp.where(bulk, jnp.sum(new), 0)))
        return register_each(pool, table, first, jnp.where(bulk, first, first + c), key_at)

    pool = _chunks(jnp.maximum(end - start, 0), w, chunk, pool)
    return register_each(pool, table, start, jnp.where(end - start < FEW, end, start), key_at)


def release(pool: BlockPool, table: Int64[Array, ""], enabled: Bool[Array, ""]) -> BlockPool:
    """When ``enabled``: the table's blocks released tail first (a block nobody holds any more joins the plain stack,
    or, when it holds a cached key, the back of the free queue) and the table freed, as :func:`release_each`."""
    capacity, w = pool.capacity, _width(pool)
    n = pool.table_len[table]
    j = jnp.arange(w, dtype=jnp.int64)

    def chunk(done, c, pool: BlockPool) -> BlockPool:
        on = j < c
        blocks = pool.tables[table, jnp.clip(n - 1 - done - j, 0, pool.tables.shape[1] - 1)]
        safe = jnp.clip(blocks, 0, capacity - 1)
        ref, key = pool.rows[safe, REF], pool.rows[safe, KEY]
        freed = on & (ref == 1)
        cached = freed & (key >= 0)
        plain = freed & ~cached
        plain_at = jnp.cumsum(plain) - 1
        stack = jnp.full((w,), -1, jnp.int64).at[jnp.where(plain, plain_at, w)].set(blocks, mode="drop")
        num_plain = jnp.sum(plain)
        at = jnp.cumsum(cached) - 1  # place in the queue's new run
        m = jnp.sum(cached)
        run = jnp.full((w + 1,), -1, jnp.int64).at[jnp.where(cached, at, w)].set(blocks, mode="drop")
        prev = jnp.where(at == 0, pool.queue_tail, run[jnp.clip(at - 1, 0, w)])
        nxt = jnp.where(at == m - 1, -1, run[jnp.clip(at + 1, 0, w)])
        rows = _scatter(pool.rows, [
            (blocks, REF, ref - 1, on),
            (blocks, QUEUE_PREV, prev, cached),
            (blocks, QUEUE_NEXT, nxt, cached),
            (pool.queue_tail, QUEUE_NEXT, run[0], m > 0),
        ], ref, key)
        return eqx.tree_at(
            lambda q: (q.rows, q.plain, q.plain_top, q.queue_head, q.queue_tail, q.queued), pool,
            (rows, _write_run(pool.plain, pool.plain_top, stack, num_plain), pool.plain_top + num_plain,
             jnp.where((m > 0) & (pool.queue_tail < 0), run[0], pool.queue_head), jnp.where(m > 0, run[jnp.clip(m - 1, 0, w)], pool.queue_tail),
             pool.queued + m),
        )

    pool = _chunks(jnp.where(enabled, n, 0), w, chunk, pool)
    few = enabled & (n < FEW)
    return _free_table(release_each(pool, table, few), table, enabled & ~few)  # release_each frees the table it releases


# ----------------------------------------------------------------------------------------------------
# one block for each of several tables at once (a decode pass: the requests crossing a block boundary)

EVICT_WIDTH = 64  # evicted blocks one call checks for shared keys (more go one table at a time)


def take_one_each(pool: BlockPool, tables: Int64[Array, " S"], on: Bool[Array, " S"]) -> BlockPool:
    """One free block appended to each table of ``tables`` where ``on`` (distinct tables), in slot order: the cells of
    :func:`take_each` ``(pool, t, 1)`` table after table. When the blocks evicted share a key, or more than
    :data:`EVICT_WIDTH` are evicted, the tables go one at a time."""
    capacity, num_keys = pool.capacity, pool.num_keys
    w = tables.shape[0]
    j = jnp.arange(w, dtype=jnp.int64)
    c = jnp.sum(on)
    rank = jnp.cumsum(on) - 1  # the block a slot gets, in hand-out order
    m = jnp.minimum(c, pool.plain_top)
    e = c - m
    plain = pool.plain[jnp.clip(pool.plain_top - 1 - j, 0, capacity - 1)]
    ew = min(EVICT_WIDTH, w)

    def walk(i, x):
        ev, b = x
        return set_entry(ev, i, b), pool.rows[jnp.clip(b, 0, capacity - 1), QUEUE_NEXT]

    evicted, after = jax.lax.fori_loop(0, jnp.minimum(e, ew), walk, (jnp.full((ew,), -1, jnp.int64), pool.queue_head))
    k = jnp.arange(ew, dtype=jnp.int64)
    ekey = pool.rows[jnp.clip(evicted, 0, capacity - 1), KEY]
    bulk = (e <= ew) & _distinct(ekey, (k < e) & (ekey >= 0) & (ekey < num_keys))
    blocks = jnp.where(rank < m, plain[jnp.clip(rank, 0, w - 1)], evicted[jnp.clip(rank - m, 0, ew - 1)])
    evict = on & (rank >= m)
    pool = _hand_out(pool, blocks, on, evict, evict & (rank > m), after, e, bulk, evicted)
    t = jnp.clip(tables, 0, pool.tables.shape[0] - 1)
    n = pool.table_len[t]
    put = bulk & on
    nowhere = pool.tables.shape[0]  # out of bounds: dropped
    pool = eqx.tree_at(
        lambda q: (q.plain_top, q.tables, q.table_len), pool,
        (pool.plain_top - jnp.where(bulk, m, 0), pool.tables.at[jnp.where(put, t, nowhere), n].set(blocks, mode="drop"),
         pool.table_len.at[jnp.where(put, t, nowhere)].set(n + 1, mode="drop")),
    )

    def one(i, pool: BlockPool) -> BlockPool:
        return take_each(pool, t[i], jnp.where(on[i], 1, 0))

    return jax.lax.fori_loop(0, jnp.where(bulk, 0, w), one, pool)


def register_own_each(pool: BlockPool, tables: Int64[Array, " S"], positions: Int64[Array, " S"], keys: Int64[Array, " S"],
                      on: Bool[Array, " S"]) -> BlockPool:
    """Each table's block at ``positions`` cached under ``keys`` where ``on`` (distinct tables; every key a request's own,
    ≥ the pool's prompt keys: no key chain), in slot order: the cells of :func:`register_each` ``(pool, t, pos, pos + 1,
    ...)`` table after table (a block already holding a key keeps it)."""
    t = jnp.clip(tables, 0, pool.tables.shape[0] - 1)
    blocks = pool.tables[t, jnp.clip(positions, 0, pool.tables.shape[1] - 1)]
    cur = pool.rows[jnp.clip(blocks, 0, pool.capacity - 1), KEY]
    new = on & (cur < 0) & (positions < pool.table_len[t])
    seq = pool.next_seq + jnp.cumsum(new) - new
    rows = _scatter(pool.rows, [(blocks, SEQ, seq, new), (blocks, KEY, keys, new)], cur)
    return eqx.tree_at(lambda q: (q.rows, q.next_seq), pool, (rows, pool.next_seq + jnp.sum(new)))
