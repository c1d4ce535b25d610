"""Host-side compilation of a measured cell into flat lookup arrays.

All interpolation decisions (which curves bracket a query, whether support exists, why not) are made
here once per table, in plain numpy. A compiled query is then one search plus a few gathers and lerps.

Decode (batch b, total past KV k), per the reference's direct interpolation:
  * the KV axis is cut at every measured KV value into pieces: the points themselves and the open
    intervals between them; inside one piece the set of curves covering k is constant;
  * for every integer batch up to the largest measured one and every piece we record the curve pair
    (lo, hi) and a status; a curve is evaluated by its own bracketing points at the same total KV;
  * rows for batches sharing the same decisions are deduplicated.
Prefill (b, tokens t, KV read k): same measured batch only; each batch's token x KV grid is cut into
pieces and each piece stores the bilinear coefficients of its token-first (else KV-first) path.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from jaxsim.errors import TableError
from jaxsim.kernels import status as st

_LO_BITS = 12
_MAX_CURVES = (1 << _LO_BITS) - 1


@dataclass(frozen=True)
class DecodeSupport:
    """Flat decode lookup arrays (numpy, unpadded sizes in ``n_*``)."""

    kv_grid: np.ndarray  # int64 [M]
    row_of_batch: np.ndarray  # int32 [Bmax+1]; row 0 = all unsupported
    packed: np.ndarray  # int32 [U, 2M-1]: lo | hi << 12 | code << 24
    curve_batch: np.ndarray  # int64 [C]
    seg: np.ndarray  # float64 [C, M, 2]: curve latency at grid point j and slope (ms per KV token) after it
    curve_base_ms: np.ndarray  # float64 [C]  lowest-KV latency of each curve


@dataclass(frozen=True)
class PrefillSupport:
    batch_index: np.ndarray  # int32 [Bp+1]; -1 = unmeasured
    tok_grid: np.ndarray  # int64 [NB, Pt] padded with int64 max
    n_tok: np.ndarray  # int32 [NB]
    kv_grid: np.ndarray  # int64 [NB, Pk]
    n_kv: np.ndarray  # int32 [NB]
    coef: np.ndarray  # float64 [NB, 2Pt-1, 2Pk-1, 4]: c0, d/dt, d/dk, d2/dtdk
    code: np.ndarray  # int32 [NB, 2Pt-1, 2Pk-1]


def _log2_table(n: int) -> np.ndarray:
    out = np.full(n + 1, -np.inf)
    for i in range(1, n + 1):
        out[i] = math.log2(i)
    return out


def compile_decode(batch: np.ndarray, kv: np.ndarray, latency_ms: np.ndarray) -> DecodeSupport:
    """Compile decode rows (one per measured point) into flat lookup arrays."""
    batch = np.asarray(batch, dtype=np.int64)
    kv = np.asarray(kv, dtype=np.int64)
    lat = np.asarray(latency_ms, dtype=np.float64)
    if batch.size == 0:
        return _empty_decode()
    order = np.lexsort((kv, batch))
    cv = _decode_curves(batch[order], kv[order], lat[order])
    rows: dict[bytes, int] = {}
    row_tables = [np.full(cv.p_left.size, st.BATCH_OUT_OF_RANGE << 24, np.int32)]
    rows[row_tables[0].tobytes()] = 0
    row_of_batch = np.zeros(int(cv.batch[-1]) + 1, np.int32)
    for b in range(1, row_of_batch.size):  # batches sharing the same decisions share one row
        packed = _batch_row(cv, b)
        key = packed.tobytes()
        if key not in rows:
            rows[key] = len(row_tables)
            row_tables.append(packed)
        row_of_batch[b] = rows[key]
    return DecodeSupport(
        kv_grid=cv.grid,
        row_of_batch=row_of_batch,
        packed=np.stack(row_tables),
        curve_batch=cv.batch,
        seg=cv.seg,
        curve_base_ms=cv.base_ms,
    )


def _empty_decode() -> DecodeSupport:
    """A table with no decode rows: every batch out of range."""
    return DecodeSupport(
        kv_grid=np.zeros(1, np.int64),
        row_of_batch=np.zeros(1, np.int32),
        packed=np.full((1, 1), st.BATCH_OUT_OF_RANGE << 24, np.int32),
        curve_batch=np.zeros(1, np.int64),
        seg=np.zeros((1, 1, 2)),
        curve_base_ms=np.zeros(1),
    )


@dataclass(frozen=True)
class _DecodeCurves:
    """One decode table's batch curves (C, ascending batch) over its KV pieces (P = 2M-1), with the
    per-piece coverage indexes every batch's decisions read."""

    batch: np.ndarray  # int64 [C]: the measured batches
    kv: np.ndarray  # int64 [N]: every row's total KV, sorted by (batch, kv)
    starts: np.ndarray  # int64 [C]: first row of each curve in ``kv``
    ends: np.ndarray  # int64 [C]: one past its last row
    grid: np.ndarray  # int64 [M]: every measured KV value
    p_left: np.ndarray  # int64 [P]: piece p is the point grid[p//2] (even p) or the open interval after it (odd p)
    seg: np.ndarray  # float64 [C, M, 2]: latency at each grid point and slope after it (0 outside the curve)
    base_ms: np.ndarray  # float64 [C]: lowest-KV latency of each curve
    cov: np.ndarray  # bool [C, P]: curve c covers piece p
    reg_first: np.ndarray  # int64 [C]: first curve of the curve's regime (run of +1 batch steps)
    reg_last: np.ndarray  # int64 [C]: last curve of that regime
    last_cov: np.ndarray  # int64 [C, P]: last covering curve index <= c (-1: none)
    first_cov: np.ndarray  # int64 [C, P]: first covering curve index >= c (C: none)
    count_le: np.ndarray  # int64 [C, P]: how many of curves 0..c cover p
    cov_list: np.ndarray  # int64 [P, C+1]: the covering curves of p, ascending, then -1
    log2: np.ndarray  # float64 [Bmax+1]: log2 of every batch up to the largest measured one
    curve_log2: np.ndarray  # float64 [C]: log2 of each curve's batch


def _decode_curves(batch: np.ndarray, kv: np.ndarray, lat: np.ndarray) -> _DecodeCurves:
    """Curves, pieces and coverage indexes of rows sorted by (batch, kv)."""
    curves, starts = np.unique(batch, return_index=True)
    n_curves = curves.size
    if n_curves > _MAX_CURVES:
        raise TableError(f"decode table has {n_curves} batch curves; at most {_MAX_CURVES} supported")
    ends = np.append(starts[1:], batch.size)
    grid = np.unique(kv)
    seg, cov, base, p_left = _curve_segments(kv, lat, starts, ends, grid)
    reg_first, reg_last = _regime_bounds(curves)
    # last covering index ≤ i and first covering index ≥ i, per piece; cumulative counts
    idx_col = np.arange(n_curves)[:, None]
    last_cov = np.maximum.accumulate(np.where(cov, idx_col, -1), axis=0)
    first_cov = np.minimum.accumulate(np.where(cov, idx_col, n_curves)[::-1], axis=0)[::-1]
    count_le = np.cumsum(cov, axis=0)  # number covering among curves[0..i]
    cov_list = np.full((p_left.size, n_curves + 1), -1, np.int64)
    for p in range(p_left.size):
        w = np.nonzero(cov[:, p])[0]
        cov_list[p, : w.size] = w
    log2 = _log2_table(int(curves[-1]))
    return _DecodeCurves(
        batch=curves, kv=kv, starts=starts, ends=ends, grid=grid, p_left=p_left, seg=seg, base_ms=base, cov=cov,
        reg_first=reg_first, reg_last=reg_last, last_cov=last_cov, first_cov=first_cov, count_le=count_le,
        cov_list=cov_list, log2=log2, curve_log2=log2[curves],
    )


def _curve_segments(kv: np.ndarray, lat: np.ndarray, starts: np.ndarray, ends: np.ndarray, grid: np.ndarray):
    """(seg, cov, base, p_left): each curve evaluated at every grid point by its own bracketing points,
    which pieces it covers, its lowest-KV latency, and the left end of every piece."""
    m = grid.size
    n_curves, n_pieces = starts.size, 2 * m - 1
    seg = np.zeros((n_curves, m, 2))
    cov = np.zeros((n_curves, n_pieces), bool)
    base = np.zeros(n_curves)
    # piece p: even → point grid[p//2]; odd → open interval (grid[p//2], grid[p//2+1])
    p_left = grid[np.arange(n_pieces) // 2]
    p_right = np.where(np.arange(n_pieces) % 2 == 1, grid[np.minimum(np.arange(n_pieces) // 2 + 1, m - 1)], p_left)
    for c in range(n_curves):
        xs, ys = kv[starts[c] : ends[c]], lat[starts[c] : ends[c]]
        base[c] = ys[0]
        cov[c] = (p_left >= xs[0]) & (p_right <= xs[-1])
        a = np.searchsorted(xs, grid, side="right") - 1
        ok = (a >= 0) & (grid <= xs[-1])
        a = np.clip(a, 0, xs.size - 1)
        nxt = np.minimum(a + 1, xs.size - 1)
        dx = (xs[nxt] - xs[a]).astype(np.float64)
        slope = np.where(dx > 0, (ys[nxt] - ys[a]) / np.where(dx > 0, dx, 1.0), 0.0)
        seg[c, :, 0] = np.where(ok, ys[a] + slope * (grid - xs[a]), 0.0)
        seg[c, :, 1] = np.where(ok, slope, 0.0)
    return seg, cov, base, p_left


def _regime_bounds(curves: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and last curve index of each curve's regime: runs of measured batches separated by +1 steps."""
    regime = np.concatenate([[0], np.cumsum(np.diff(curves) == 1)])
    reg_first = np.zeros(curves.size, np.int64)
    reg_last = np.zeros(curves.size, np.int64)
    for r in np.unique(regime):
        idx = np.nonzero(regime == r)[0]
        reg_first[idx], reg_last[idx] = idx[0], idx[-1]
    return reg_first, reg_last


def _batch_row(cv: _DecodeCurves, b: int) -> np.ndarray:
    """Batch ``b``'s packed decisions, one per piece: curve pair (lo, hi) and status code."""
    n_curves, n_pieces = cv.batch.size, cv.p_left.size
    own = int(np.searchsorted(cv.batch, b))
    measured = own < n_curves and cv.batch[own] == b
    below = own - 1  # largest curve index with batch < b
    above = own + 1 if measured else own  # smallest curve index with batch > b
    code = np.full(n_pieces, st.BATCH_OUT_OF_RANGE, np.int64)
    lo = np.zeros(n_pieces, np.int64)
    hi = np.zeros(n_pieces, np.int64)
    if measured or (below >= 0 and above < n_curves):
        code, lo, hi = _bracket(cv, b, own if measured else below, below, above)
        if measured:
            own_cov = cv.cov[own]
            exact = own_cov & (np.arange(n_pieces) % 2 == 0) & np.isin(cv.p_left, cv.kv[cv.starts[own] : cv.ends[own]])
            code = np.where(own_cov, np.where(exact, st.EXACT, st.WITHIN_CURVE), code)
            lo = np.where(own_cov, own, lo)
            hi = np.where(own_cov, own, hi)
    # pieces no curve covers at all
    code = np.where(~cv.cov.any(axis=0), st.KV_OUT_OF_RANGE, code)
    supported = code < st.FIRST_UNSUPPORTED
    lo = np.where(supported, lo, 0)
    hi = np.where(supported, hi, 0)
    return (lo | (hi << _LO_BITS) | (code << 24)).astype(np.int32)


def _bracket(cv: _DecodeCurves, b: int, reg: int, below: int, above: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(code, lo, hi) per piece for an unmeasured batch ``b`` (or a measured one off its own curve): the
    nearest covering curves below and above it, refused when either is missing or outside regime ``reg``,
    when either is more than a factor 4 away (log2 distance > 2), or when a 4th covering batch on one side
    (same regime) is nearer than the bracket on the other (the 4-nearest rule)."""
    n_curves, n_pieces = cv.batch.size, cv.p_left.size
    pieces = np.arange(n_pieces)
    curve_log2 = cv.curve_log2
    lb = cv.log2[b]
    r0, r1 = cv.reg_first[reg], cv.reg_last[reg]
    none = np.full(n_pieces, -1, np.int64)
    cand_lo = cv.last_cov[below] if below >= 0 else none
    cand_hi = cv.first_cov[above] if above < n_curves else np.full(n_pieces, n_curves)
    lo_c = np.clip(cand_lo, 0, n_curves - 1)
    hi_c = np.clip(cand_hi, 0, n_curves - 1)
    d_lo = lb - curve_log2[lo_c]
    d_hi = curve_log2[hi_c] - lb
    # the 4th covering batch on each side (same regime), for the 4-nearest rule
    k4 = (cv.count_le[below] if below >= 0 else np.zeros(n_pieces, np.int64)) - 4
    c4_lo = np.where(k4 >= 0, cv.cov_list[pieces, np.clip(k4, 0, None)], -1)
    n_before = cv.count_le[above - 1] if above >= 1 else np.zeros(n_pieces, np.int64)
    c4_hi = cv.cov_list[pieces, np.clip(n_before + 3, 0, n_curves)] if above < n_curves else none
    c4_lo_ok = (c4_lo >= 0) & (c4_lo >= r0)
    c4_hi_ok = (c4_hi >= 0) & (c4_hi <= r1)
    d4_lo = lb - curve_log2[np.clip(c4_lo, 0, n_curves - 1)]
    d4_hi = curve_log2[np.clip(c4_hi, 0, n_curves - 1)] - lb
    not_nearest = (c4_lo_ok & (d4_lo < d_hi)) | (c4_hi_ok & (d4_hi < d_lo))
    code = np.select(
        [cand_lo < 0, cand_lo < r0, cand_hi >= n_curves, cand_hi > r1, (d_lo > 2.0) | (d_hi > 2.0), not_nearest],
        [st.NO_LOWER_BRACKET, st.REGIME_LOWER, st.NO_UPPER_BRACKET, st.REGIME_UPPER, st.BATCH_RATIO, st.NOT_NEAREST],
        st.CROSS_BATCH,
    )
    return code, lo_c, hi_c


# ---------------------------------------------------------------------------------------------------
# prefill


def _curve_eval(xs, ys, x: float) -> float | None:
    """Linear interpolation inside [xs[0], xs[-1]]; None outside. ``xs``/``ys``: sorted Python float lists
    (the host-side compile calls this ~10^5 times; list + bisect gives the same doubles as numpy, faster)."""
    if x < xs[0] or x > xs[-1]:
        return None
    i = bisect.bisect_right(xs, x) - 1
    if xs[i] == x:
        return float(ys[i])
    return float(ys[i] + (ys[i + 1] - ys[i]) * ((x - xs[i]) / (xs[i + 1] - xs[i])))


def _prefill_path(levels: dict[int | float, tuple[list, list]], q_major: int | float, q_minor: int | float, covers: dict | None = None):
    """Pick the interpolation path along the minor axis first; None when unsupported.

    ``levels`` maps a major-axis value to the (minor coords, latencies) measured at it (sorted float lists).
    Returns a list of (major_value, weight_fn) pairs as a closure ``f(major, minor) -> latency``. ``covers``
    (which levels cover ``q_minor``) may be passed in when the caller reuses it across pieces.
    """
    if covers is None:
        covers = {m: (xs[0] <= q_minor <= xs[-1]) for m, (xs, _) in levels.items()}
    if q_major in levels and covers[q_major]:
        xs, ys = levels[q_major]

        def one(major: float, minor: float) -> float:
            return _curve_eval(xs, ys, minor)

        exact = q_minor in xs
        return one, ("exact" if exact else "1d"), 1
    below = [m for m in levels if m < q_major and covers[m]]
    above = [m for m in levels if m > q_major and covers[m]]
    if not below or not above:
        return None
    m0, m1 = max(below), min(above)
    (x0, y0), (x1, y1) = levels[m0], levels[m1]

    def two(major: float, minor: float) -> float:
        l0 = _curve_eval(x0, y0, minor)
        l1 = _curve_eval(x1, y1, minor)
        return l0 + (l1 - l0) * ((major - m0) / (m1 - m0))

    return two, "2d", 2


def _prefill_batch(tok: np.ndarray, kv: np.ndarray, lat: np.ndarray):
    """Compile one measured prefill batch: grids, bilinear coefficients and codes per piece."""
    tgrid, kgrid = np.unique(tok), np.unique(kv)
    by_kv: dict[int, tuple[list, list]] = {}
    by_tok: dict[int, tuple[list, list]] = {}
    for k in kgrid:
        m = kv == k
        o = np.argsort(tok[m])
        by_kv[int(k)] = (tok[m][o].astype(np.float64).tolist(), lat[m][o].astype(np.float64).tolist())
    for t in tgrid:
        m = tok == t
        o = np.argsort(kv[m])
        by_tok[int(t)] = (kv[m][o].astype(np.float64).tolist(), lat[m][o].astype(np.float64).tolist())
    pt_n, pk_n = 2 * tgrid.size - 1, 2 * kgrid.size - 1

    def memo_covers(levels):
        memo: dict[float, dict] = {}

        def covers(q: float) -> dict:
            if q not in memo:
                memo[q] = {m: (xs[0] <= q <= xs[-1]) for m, (xs, _) in levels.items()}
            return memo[q]

        return covers

    cov_kv, cov_tok = memo_covers(by_kv), memo_covers(by_tok)
    coef = np.zeros((pt_n, pk_n, 4))
    code = np.full((pt_n, pk_n), st.PREFILL_NO_SUPPORT, np.int64)

    def piece_range(grid: np.ndarray, p: int) -> tuple[float, float, float]:
        a = float(grid[p // 2])
        if p % 2 == 0:
            return a, a, a
        b = float(grid[p // 2 + 1])
        return a, b, 0.5 * (a + b)

    for pt in range(pt_n):
        t0, t1, tm = piece_range(tgrid, pt)
        for pk in range(pk_n):
            k0, k1, km = piece_range(kgrid, pk)
            path = _prefill_path(by_kv, km, tm, cov_kv(tm))
            if path is not None:
                fn, kind, _ = path

                def f(t: float, k: float, fn=fn) -> float:
                    return fn(k, t)

                c = st.EXACT if kind == "exact" else (st.WITHIN_CURVE if kind == "1d" else st.CROSS_KV)
            else:
                path = _prefill_path(by_tok, tm, km, cov_tok(km))
                if path is None:
                    continue
                fn, kind, _ = path

                def f(t: float, k: float, fn=fn) -> float:
                    return fn(t, k)

                c = st.EXACT if kind == "exact" else st.KV_FIRST
                if kind == "1d":
                    # a measured token level swept along KV: the reference labels this token-first
                    c = st.CROSS_KV
            f00 = f(t0, k0)
            dt = (f(t1, k0) - f00) / (t1 - t0) if t1 > t0 else 0.0
            dk = (f(t0, k1) - f00) / (k1 - k0) if k1 > k0 else 0.0
            dtk = (f(t1, k1) - f(t1, k0) - f(t0, k1) + f00) / ((t1 - t0) * (k1 - k0)) if (t1 > t0 and k1 > k0) else 0.0
            coef[pt, pk] = (f00, dt, dk, dtk)
            code[pt, pk] = c
    return tgrid, kgrid, coef, code


def compile_prefill(batch: np.ndarray, tokens: np.ndarray, kv: np.ndarray, latency_ms: np.ndarray) -> PrefillSupport:
    batch = np.asarray(batch, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.int64)
    kv = np.asarray(kv, dtype=np.int64)
    lat = np.asarray(latency_ms, dtype=np.float64)
    sentinel = np.iinfo(np.int64).max
    batches = np.unique(batch)
    if batches.size == 0:
        return PrefillSupport(
            batch_index=np.full(1, -1, np.int32),
            tok_grid=np.full((1, 1), sentinel, np.int64),
            n_tok=np.zeros(1, np.int32),
            kv_grid=np.full((1, 1), sentinel, np.int64),
            n_kv=np.zeros(1, np.int32),
            coef=np.zeros((1, 1, 1, 4)),
            code=np.full((1, 1, 1), st.PREFILL_BATCH_UNMEASURED, np.int32),
        )
    parts = [_prefill_batch(tokens[batch == b], kv[batch == b], lat[batch == b]) for b in batches]
    pt = max(p[0].size for p in parts)
    pk = max(p[1].size for p in parts)
    nb = batches.size
    tok_grid = np.full((nb, pt), sentinel, np.int64)
    kv_grid = np.full((nb, pk), sentinel, np.int64)
    coef = np.zeros((nb, 2 * pt - 1, 2 * pk - 1, 4))
    code = np.full((nb, 2 * pt - 1, 2 * pk - 1), st.PREFILL_NO_SUPPORT, np.int32)
    for i, (tg, kg, cf, cd) in enumerate(parts):
        tok_grid[i, : tg.size] = tg
        kv_grid[i, : kg.size] = kg
        coef[i, : cf.shape[0], : cf.shape[1]] = cf
        code[i, : cd.shape[0], : cd.shape[1]] = cd
    batch_index = np.full(int(batches[-1]) + 1, -1, np.int32)
    batch_index[batches] = np.arange(nb, dtype=np.int32)
    return PrefillSupport(
        batch_index=batch_index,
        tok_grid=tok_grid,
        n_tok=np.array([p[0].size for p in parts], np.int32),
        kv_grid=kv_grid,
        n_kv=np.array([p[1].size for p in parts], np.int32),
        coef=coef,
        code=code,
    )
