"""Compiled round timings: one forward pass (engine iteration) per query.

Functions here are written for ONE query and are pure functions of arrays; vmap them at the call site
(``jax.vmap(decode_latency_ms, in_axes=(None, 0, 0))``) and jit the result. Every function returns
``(latency_ms, status)``; an unsupported query has ``latency_ms = nan`` and a status code ≥ 16
(see :mod:`jaxsim.kernels.status`). Nothing is extrapolated.
"""

from __future__ import annotations

import dataclasses
import hashlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float64, Int32, Int64

from jaxsim._jax import ensure_x64, jit_x64, load_arrays, save_arrays, source_digest
from jaxsim.kernels import status as st
from jaxsim.kernels.buckets import pow2_bucket
from jaxsim.kernels.support import (
    DecodeSupport,
    PrefillSupport,
    compile_decode,
    compile_prefill,
)

_I64_MAX = np.iinfo(np.int64).max
_CODE_SHIFT = 24
_LO_MASK = 0xFFF


# Fill value of every RoundTable array when padded: padding never changes a lookup (pad grid points are
# int64 max, pad rows/pieces are unsupported, pad batches unmeasured).
PAD_FILL: dict[str, object] = {
    "kv_grid": _I64_MAX,
    "n_kv": 0,
    "row_of_batch": 0,
    "packed": np.int32(st.BATCH_OUT_OF_RANGE << _CODE_SHIFT),
    "curve_batch": 0,
    "seg": 0.0,
    "curve_base_ms": 0.0,
    "pre_batch_index": -1,
    "pre_tok_grid": _I64_MAX,
    "pre_n_tok": 0,
    "pre_kv_grid": _I64_MAX,
    "pre_n_kv": 0,
    "pre_coef": 0.0,
    "pre_code": st.PREFILL_NO_SUPPORT,
}


def _pad(a: np.ndarray, shape: tuple[int, ...], fill) -> np.ndarray:
    out = np.full(shape, fill, dtype=a.dtype)
    out[tuple(slice(0, n) for n in a.shape)] = a
    return out


class RoundTable(eqx.Module):
    """A measured cell compiled into padded lookup arrays (one pytree per deployment).

    Sizes are bucketed to powers of two, so tables of similar size share one compilation.
    """

    kv_grid: Int64[Array, " M"]
    n_kv: Int32[Array, ""]
    row_of_batch: Int32[Array, " B"]
    packed: Int32[Array, "U P"]
    curve_batch: Int64[Array, " C"]
    seg: Float64[Array, "C M 2"]
    curve_base_ms: Float64[Array, " C"]
    pre_batch_index: Int32[Array, " Bp"]
    pre_tok_grid: Int64[Array, "NB Pt"]
    pre_n_tok: Int32[Array, " NB"]
    pre_kv_grid: Int64[Array, "NB Pk"]
    pre_n_kv: Int32[Array, " NB"]
    pre_coef: Float64[Array, "NB Qt Qk 4"]
    pre_code: Int32[Array, "NB Qt Qk"]
    speculative: bool = eqx.field(static=True)
    num_draft_tokens: int = eqx.field(static=True)

    @property
    def max_decode_kv(self) -> int:
        """Largest measured decode total KV (the reference's fpm_decode_kv_ceiling)."""
        return int(np.asarray(self.kv_grid)[int(self.n_kv) - 1])


def compile_round_table(cell, *, speculative: bool = False, num_draft_tokens: int = 0) -> RoundTable:
    """Compile a selected cell (``CellRows``-like: decode_* and prefill_* arrays) for the kernels."""
    ensure_x64()
    dec, pre = _compiled_supports(cell)
    return _assemble(dec, pre, speculative=speculative, num_draft_tokens=num_draft_tokens)


_CELL_FIELDS = ("decode_batch", "decode_kv", "decode_latency_ms", "prefill_batch", "prefill_tokens", "prefill_kv", "prefill_latency_ms")


def _compiled_supports(cell) -> tuple[DecodeSupport, PrefillSupport]:
    """The cell's decode and prefill lookup arrays: computed on the host (a second or more for a large
    cell), or loaded from the on-disk cache where an earlier process stored them for the same rows and
    the same jaxsim sources (:func:`jaxsim._jax.load_arrays`; identical arrays either way)."""
    h = hashlib.sha256(source_digest().encode())
    for f in _CELL_FIELDS:
        a = np.ascontiguousarray(getattr(cell, f))
        h.update(f"{f}:{a.dtype.str}:{a.shape}".encode() + a.tobytes())
    key = h.hexdigest()[:40]
    names = [("dec", f.name) for f in dataclasses.fields(DecodeSupport)] + [("pre", f.name) for f in dataclasses.fields(PrefillSupport)]
    hit = load_arrays("round-table", key)
    if hit is not None and set(hit) == {f"{a}_{b}" for a, b in names}:
        return (DecodeSupport(**{b: hit[f"dec_{b}"] for a, b in names if a == "dec"}),
                PrefillSupport(**{b: hit[f"pre_{b}"] for a, b in names if a == "pre"}))
    dec = compile_decode(cell.decode_batch, cell.decode_kv, cell.decode_latency_ms)
    pre = compile_prefill(cell.prefill_batch, cell.prefill_tokens, cell.prefill_kv, cell.prefill_latency_ms)
    save_arrays("round-table", key, {f"{a}_{b}": np.asarray(getattr(dec if a == "dec" else pre, b)) for a, b in names})
    return dec, pre


def _assemble(dec: DecodeSupport, pre: PrefillSupport, *, speculative: bool, num_draft_tokens: int) -> RoundTable:
    m = pow2_bucket(dec.kv_grid.size, 8)
    c = pow2_bucket(dec.curve_batch.size, 4)
    u = pow2_bucket(dec.packed.shape[0], 4)
    b = pow2_bucket(dec.row_of_batch.size, 64)
    nb = pow2_bucket(pre.tok_grid.shape[0], 4)
    pt = pow2_bucket(pre.tok_grid.shape[1], 4)
    pk = pow2_bucket(pre.kv_grid.shape[1], 4)
    bp = pow2_bucket(pre.batch_index.size, 64)
    parts = {
        "kv_grid": (dec.kv_grid, (m,)),
        "n_kv": (np.int32(dec.kv_grid.size), ()),
        "row_of_batch": (dec.row_of_batch, (b,)),
        "packed": (dec.packed, (u, 2 * m - 1)),
        "curve_batch": (dec.curve_batch, (c,)),
        "seg": (dec.seg, (c, m, 2)),
        "curve_base_ms": (dec.curve_base_ms, (c,)),
        "pre_batch_index": (pre.batch_index, (bp,)),
        "pre_tok_grid": (pre.tok_grid, (nb, pt)),
        "pre_n_tok": (pre.n_tok, (nb,)),
        "pre_kv_grid": (pre.kv_grid, (nb, pk)),
        "pre_n_kv": (pre.n_kv, (nb,)),
        "pre_coef": (pre.coef, (nb, 2 * pt - 1, 2 * pk - 1, 4)),
        "pre_code": (pre.code, (nb, 2 * pt - 1, 2 * pk - 1)),
    }
    arrays = {
        k: jax.device_put(_pad(np.asarray(a), shape, PAD_FILL[k])) for k, (a, shape) in parts.items()
    }  # a transfer: jnp.asarray compiles a conversion per shape
    return RoundTable(**arrays, speculative=bool(speculative), num_draft_tokens=int(num_draft_tokens))


def table_shapes(t: RoundTable) -> dict[str, tuple[int, ...]]:
    """Shape of every array of a compiled table."""
    return {f: tuple(np.shape(getattr(t, f))) for f in PAD_FILL}


def pad_round_table(
    t: RoundTable, shapes: dict[str, tuple[int, ...]], *, speculative: bool | None = None, num_draft_tokens: int | None = None
) -> RoundTable:
    """``t`` with every array padded (at the end of each axis) to ``shapes``; lookups are unchanged."""
    arrays = {}
    for f, fill in PAD_FILL.items():
        a = np.asarray(getattr(t, f))
        target = tuple(shapes[f])
        if any(n < m for n, m in zip(target, a.shape)):
            raise ValueError(f"cannot pad RoundTable.{f} of shape {a.shape} down to {target}")
        arrays[f] = jax.device_put(_pad(a, target, fill))
    return RoundTable(
        **arrays,
        speculative=t.speculative if speculative is None else bool(speculative),
        num_draft_tokens=t.num_draft_tokens if num_draft_tokens is None else int(num_draft_tokens),
    )


def common_shapes(tables) -> dict[str, tuple[int, ...]]:
    """Elementwise-largest shape of every array over ``tables`` (one compilation for all of them)."""
    shapes = [table_shapes(t) for t in tables]
    return {f: tuple(max(s[f][i] for s in shapes) for i in range(len(shapes[0][f]))) for f in PAD_FILL}


def common_tables(tables) -> list[RoundTable]:
    """Tables padded to their elementwise-largest shapes (lookups unchanged) with the static fields
    reset to AR/0, so they share one compilation: the sweep and the replay engine take the draft
    depth as traced data and price passes with explicit lookups."""
    target = common_shapes(tables)
    return [pad_round_table(t, target, speculative=False, num_draft_tokens=0) for t in tables]


def stack_round_tables(tables) -> RoundTable:
    """:func:`common_tables` stacked on a leading axis."""
    if not tables:
        raise ValueError("stack_round_tables needs at least one table")
    return jax.tree.map(lambda *xs: jnp.stack(xs), *common_tables(tables))


def _count_le(flat: Int64[ArrayLike, " N"], start, width: int, x: Int64[ArrayLike, ""]):
    """Number of entries ≤ x in the sorted run flat[start : start + width] (width a power of two,
    padded with int64 max): a statically unrolled binary search, one gather per step."""
    pos = jnp.zeros((), jnp.int32)
    step = width // 2
    while step >= 1:
        cand = pos + step
        pos = jnp.where(flat[start + cand - 1] <= x, cand, pos)
        step //= 2
    return pos + (flat[start + pos] <= x).astype(jnp.int32)


def _piece(flat: Int64[ArrayLike, " N"], start, width: int, n: Int32[ArrayLike, ""], x: Int64[ArrayLike, ""]):
    """Piece index of x on a sorted grid (even: on a point; odd: between points) and in-range flag."""
    j = _count_le(flat, start, width, x) - 1
    jc = jnp.clip(j, 0, width - 1)
    on_point = flat[start + jc] == x
    p = 2 * jc + jnp.where(on_point, 0, 1)
    return jc, p, (j >= 0) & (p <= 2 * n - 2)


def _decode_parts(t: RoundTable, batch: Int64[ArrayLike, ""], kv: Int64[ArrayLike, ""]):
    batch = jnp.asarray(batch, jnp.int64)
    kv = jnp.asarray(kv, jnp.int64)
    jc, p, in_range = _piece(t.kv_grid, 0, t.kv_grid.shape[0], t.n_kv, kv)
    b_ok = (batch >= 1) & (batch < t.row_of_batch.shape[0])
    row = jnp.where(b_ok, t.row_of_batch[jnp.clip(batch, 0, t.row_of_batch.shape[0] - 1)], 0)
    packed = t.packed[row, jnp.clip(p, 0, t.packed.shape[1] - 1)]
    lo = packed & _LO_MASK
    hi = (packed >> 12) & _LO_MASK
    code = packed >> _CODE_SHIFT
    code = jnp.where(in_range | (row == 0), code, st.KV_OUT_OF_RANGE)
    code = jnp.where((batch < 0) | (kv < 0), st.INVALID_QUERY, code)
    w = (batch - t.curve_batch[lo]) / jnp.maximum(t.curve_batch[hi] - t.curve_batch[lo], 1)
    w = jnp.where(hi == lo, 0.0, w)
    return jc, lo, hi, w, code


def _curve_at(t: RoundTable, curve, jc, kv):
    y_slope = t.seg[curve, jc]
    return y_slope[0] + y_slope[1] * (kv - t.kv_grid[jc])


def decode_latency_ms(
    t: RoundTable, batch: Int64[ArrayLike, ""], total_kv_tokens: Int64[ArrayLike, ""]
) -> tuple[Float64[Array, ""], Int32[Array, ""]]:
    """One decode iteration (or one measured speculative round) of ``batch`` requests.

    ``total_kv_tokens`` is the sum of the requests' past KV. For a speculative-round table this is the
    whole draft+verify round: the batch is never multiplied by K+1 and no draft cost is added.
    """
    batch = jnp.asarray(batch, jnp.int64)
    total_kv_tokens = jnp.asarray(total_kv_tokens, jnp.int64)
    jc, lo, hi, w, code = _decode_parts(t, batch, total_kv_tokens)
    l_lo = _curve_at(t, lo, jc, total_kv_tokens)
    l_hi = _curve_at(t, hi, jc, total_kv_tokens)
    lat = l_lo + (l_hi - l_lo) * w
    # no requests: empty work (0 ms) unless a past-KV sum is given for them (an invalid query)
    empty = (batch == 0) & (total_kv_tokens == 0)
    code = jnp.where(empty, st.EMPTY, jnp.where((batch == 0) & (total_kv_tokens > 0), st.SUM_WITHOUT_REQUESTS, code))
    code = jnp.where((batch < 0) | (total_kv_tokens < 0), st.INVALID_QUERY, code)
    lat = jnp.where(empty, 0.0, lat)
    ok = code < st.FIRST_UNSUPPORTED
    return jnp.where(ok, lat, jnp.nan), code.astype(jnp.int32)


def decode_baseline_ms(t: RoundTable, batch: Int64[ArrayLike, ""], total_kv_tokens: Int64[ArrayLike, ""]) -> Float64[Array, ""]:
    """Lowest-KV decode latency at ``batch``, bracketed like the decode query (mixed composition)."""
    _, lo, hi, w, code = _decode_parts(t, batch, total_kv_tokens)
    b_lo, b_hi = t.curve_base_ms[lo], t.curve_base_ms[hi]
    base = b_lo + (b_hi - b_lo) * w
    return jnp.where(code < st.FIRST_UNSUPPORTED, base, jnp.nan)


def prefill_latency_ms(
    t: RoundTable, batch: Int64[ArrayLike, ""], prefill_tokens: Int64[ArrayLike, ""], kv_read_tokens: Int64[ArrayLike, ""]
) -> tuple[Float64[Array, ""], Int32[Array, ""]]:
    """Table lookup of one prefill iteration of ``batch`` requests computing ``prefill_tokens`` new tokens
    in total and reading ``kv_read_tokens`` cached tokens. Same measured batch only; token-first then
    KV-first. This is the prefill part of a pass (mixed work, replay); a ``prefill`` query row is
    :func:`prefill_query_ms`, which adds the reference prefill lookup's rules for degenerate queries."""
    batch = jnp.asarray(batch, jnp.int64)
    tok = jnp.asarray(prefill_tokens, jnp.int64)
    kv = jnp.asarray(kv_read_tokens, jnp.int64)
    nbp = t.pre_batch_index.shape[0]
    bi = jnp.where((batch >= 0) & (batch < nbp), t.pre_batch_index[jnp.clip(batch, 0, nbp - 1)], -1)
    bic = jnp.clip(bi, 0, t.pre_tok_grid.shape[0] - 1)
    wt, wk = t.pre_tok_grid.shape[1], t.pre_kv_grid.shape[1]
    jt, pt, t_in = _piece(t.pre_tok_grid.reshape(-1), bic * wt, wt, t.pre_n_tok[bic], tok)
    jk, pk, k_in = _piece(t.pre_kv_grid.reshape(-1), bic * wk, wk, t.pre_n_kv[bic], kv)
    pt = jnp.clip(pt, 0, t.pre_coef.shape[1] - 1)
    pk = jnp.clip(pk, 0, t.pre_coef.shape[2] - 1)
    c = t.pre_coef[bic, pt, pk]
    dt = (tok - t.pre_tok_grid.reshape(-1)[bic * wt + jt]).astype(jnp.float64)
    dk = (kv - t.pre_kv_grid.reshape(-1)[bic * wk + jk]).astype(jnp.float64)
    lat = c[0] + c[1] * dt + c[2] * dk + c[3] * dt * dk
    code = jnp.where(t_in & k_in, t.pre_code[bic, pt, pk], st.PREFILL_NO_SUPPORT)
    code = jnp.where(bi < 0, st.PREFILL_BATCH_UNMEASURED, code)
    code = jnp.where((batch < 0) | (tok < 0) | (kv < 0), st.INVALID_QUERY, code)
    ok = code < st.FIRST_UNSUPPORTED
    return jnp.where(ok, lat, jnp.nan), code.astype(jnp.int32)


def _combined_code(has_p, has_d, cp, cd):
    """Status of a pass from its parts: the first unsupported part (prefill first), else composed, the
    single part's code, or empty."""
    return jnp.where(
        has_p & (cp >= st.FIRST_UNSUPPORTED),
        cp,
        jnp.where(
            has_d & (cd >= st.FIRST_UNSUPPORTED),
            cd,
            jnp.where(has_p & has_d, st.COMPOSED, jnp.where(has_p, cp, jnp.where(has_d, cd, st.EMPTY))),
        ),
    )


def pass_lookups(t: RoundTable, num_prefill_requests, prefill_tokens, prefill_kv_tokens, num_decode_requests, decode_kv_tokens):
    """The prefill and decode lookups of one iteration (``has_p, has_d, prefill_ms, decode_ms, code``; a
    part without requests costs 0), and the status of their combination: shared by the round kernels
    and the replay engine's pass pricing."""
    has_p = num_prefill_requests > 0
    has_d = num_decode_requests > 0
    lp, cp = prefill_latency_ms(t, num_prefill_requests, prefill_tokens, prefill_kv_tokens)
    ld, cd = decode_latency_ms(t, num_decode_requests, decode_kv_tokens)
    code = _combined_code(has_p, has_d, cp, cd)
    bad = (num_prefill_requests < 0) | (num_decode_requests < 0) | ((num_prefill_requests == 0) & (prefill_tokens != 0))
    code = jnp.where(bad, st.INVALID_QUERY, code)
    return has_p, has_d, jnp.where(has_p, lp, 0.0), jnp.where(has_d, ld, 0.0), code


def prefill_query_ms(
    t: RoundTable, batch: Int64[ArrayLike, ""], prefill_tokens: Int64[ArrayLike, ""], kv_read_tokens: Int64[ArrayLike, ""]
) -> tuple[Float64[Array, ""], Int32[Array, ""]]:
    """A ``prefill`` query row, decided like the reference's prefill lookup.

    No new tokens is no prefill work (0 ms, whatever the batch and cached KV); otherwise every prefill
    request must compute at least one token (``0 < prefill_tokens < batch`` or a batch of 0 is refused),
    then :func:`prefill_latency_ms`.
    """
    batch = jnp.asarray(batch, jnp.int64)
    tok = jnp.asarray(prefill_tokens, jnp.int64)
    kv = jnp.asarray(kv_read_tokens, jnp.int64)
    lat, code = prefill_latency_ms(t, batch, tok, kv)
    none = tok == 0
    code = jnp.where(
        none,
        jnp.where((batch == 0) & (kv == 0), st.EMPTY, st.NO_PREFILL_WORK),
        jnp.where((batch == 0) | (tok < batch), st.PREFILL_TOKENS_BELOW_BATCH, code),
    )
    code = jnp.where((batch < 0) | (tok < 0) | (kv < 0), st.INVALID_QUERY, code)
    ok = code < st.FIRST_UNSUPPORTED
    return jnp.where(ok, jnp.where(none, 0.0, lat), jnp.nan), code.astype(jnp.int32)


def mixed_latency_ms(
    t: RoundTable,
    num_prefill_requests: Int64[ArrayLike, ""],
    prefill_tokens: Int64[ArrayLike, ""],
    prefill_kv_tokens: Int64[ArrayLike, ""],
    num_decode_requests: Int64[ArrayLike, ""],
    decode_kv_tokens: Int64[ArrayLike, ""],
) -> tuple[Float64[Array, ""], Int32[Array, ""]]:
    """A ForwardPassMetrics iteration: ``prefill + max(0, decode − decode's lowest-KV baseline)``.

    The marginal decode cost is clamped at 0: a decode curve that dips below its lowest-KV point adds
    nothing, never a negative amount. Prefill requests with no new tokens are no prefill work; pure
    decode or pure prefill work reduces to that lookup (no ``tokens ≥ batch`` rule here, unlike a
    prefill query row); empty work costs 0 ms; a KV or token sum without requests of that phase is
    refused. A measured speculative round has no qualified mixed composition and is refused.
    """
    np_ = jnp.asarray(num_prefill_requests, jnp.int64)
    pt = jnp.asarray(prefill_tokens, jnp.int64)
    pk = jnp.asarray(prefill_kv_tokens, jnp.int64)
    nd = jnp.asarray(num_decode_requests, jnp.int64)
    dk = jnp.asarray(decode_kv_tokens, jnp.int64)
    has_p = (np_ > 0) & (pt > 0)
    has_d = nd > 0
    both = has_p & has_d
    lp, cp = prefill_latency_ms(t, np_, pt, pk)
    ld, cd = decode_latency_ms(t, nd, dk)
    code = _combined_code(has_p, has_d, cp, cd)
    if t.speculative:
        code = jnp.where(both, st.SD_MIXED_REFUSED, code)
    orphan = ((np_ == 0) & ((pt != 0) | (pk != 0))) | ((nd == 0) & (dk != 0))
    code = jnp.where(orphan, st.SUM_WITHOUT_REQUESTS, code)
    code = jnp.where((np_ < 0) | (pt < 0) | (pk < 0) | (nd < 0) | (dk < 0), st.INVALID_QUERY, code)
    base = jnp.where(both, decode_baseline_ms(t, nd, dk), 0.0)
    marginal = jnp.where(both, jnp.maximum(ld - base, 0.0), ld)
    lat = jnp.where(has_p, lp, 0.0) + jnp.where(has_d, marginal, 0.0)
    ok = code < st.FIRST_UNSUPPORTED
    return jnp.where(ok, lat, jnp.nan), code.astype(jnp.int32)


def scheduler_pass_latency_ms(
    t: RoundTable,
    num_prefill_requests: Int64[ArrayLike, ""],
    prefill_tokens: Int64[ArrayLike, ""],
    prefill_kv_tokens: Int64[ArrayLike, ""],
    num_decode_requests: Int64[ArrayLike, ""],
    decode_kv_tokens: Int64[ArrayLike, ""],
) -> tuple[Float64[Array, ""], Int32[Array, ""]]:
    """Cost of one replay scheduler pass: the prefill-chunk lookup plus the decode (or measured
    speculative round) lookup, summed, as the reference's replay engine prices a pass. (The
    ForwardPassMetrics composition with a decode baseline is :func:`mixed_latency_ms`.)"""
    _, _, lp, ld, code = pass_lookups(t, num_prefill_requests, prefill_tokens, prefill_kv_tokens, num_decode_requests, decode_kv_tokens)
    ok = code < st.FIRST_UNSUPPORTED
    return jnp.where(ok, lp + ld, jnp.nan), code.astype(jnp.int32)


# Batched, jitted entry points: the table is an argument, so a new table of the same bucket shapes
# reuses the compiled executable.
decode_batch = jit_x64(jax.vmap(decode_latency_ms, in_axes=(None, 0, 0)))
prefill_batch = jit_x64(jax.vmap(prefill_query_ms, in_axes=(None, 0, 0, 0)))
prefill_lookup_batch = jit_x64(jax.vmap(prefill_latency_ms, in_axes=(None, 0, 0, 0)))
mixed_batch = jit_x64(jax.vmap(mixed_latency_ms, in_axes=(None, 0, 0, 0, 0, 0)))
