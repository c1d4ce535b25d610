"""Random FPM tables and boundary-biased round queries, for differential and property tests.

Used by ``scripts/diff_vs_reference.py`` (jaxsim against the reference) and by
``tests/test_rounds_fuzz_properties.py`` (jaxsim-only hypothesis properties). Everything here is
SYNTHETIC: made-up latencies shaped to hit the lookup rules' edges, never a measurement.

A table (:func:`random_table`) is autoregressive or a measured speculative round (EAGLE-3, K=2) and mixes:
batch ladders with runs of consecutive batches (capture-regime jumps: a latency step between runs),
irregular per-batch KV grids, smooth / noisy / non-monotone latencies (curves that dip below their
lowest-KV point), ties (latencies on a coarse grid), prefill grids that are not rectangular and hold
token counts below the batch, and decoy rows the selected identity must ignore (another
``kv_cache_dtype``, another model, ``fake_fallback`` rows). A few tables are ones the reference
refuses to build (a prefill row with 0 tokens, a phase without genuine rows).

Files are written from the templates in ``tests/data/differential_cases`` (the reference's own
accepted tables), so both tools load exactly the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

CASES = Path(__file__).parent / "data" / "differential_cases"
TEMPLATES = {False: CASES / "F1-mixed-negative-marginal" / "table", True: CASES / "F3sd-zero-new-prefill-tokens-sd" / "table"}
MODEL = "golden-ckpt/fuzz-dense-8b"
DECOY_MODEL = "golden-ckpt/fuzz-decoy-8b"
KINDS = ("decode", "prefill", "mixed")
BAD_KINDS = ("zero_token_prefill_row", "no_prefill_rows", "no_decode_rows", "only_fake_prefill_rows")


@dataclass
class FuzzTable:
    """Genuine rows of the selected identity, plus decoy rows (tuples) that must not matter."""

    speculative: bool
    decode_batch: np.ndarray
    decode_kv: np.ndarray
    decode_latency_ms: np.ndarray
    prefill_batch: np.ndarray
    prefill_tokens: np.ndarray
    prefill_kv: np.ndarray
    prefill_latency_ms: np.ndarray
    # (workload_kind, batch, tokens, kv, latency_ms, kv_cache_dtype, model_path, kv_seed_regime)
    decoys: list[tuple] = field(default_factory=list)
    bad: str | None = None  # why the reference refuses to build it (one of BAD_KINDS), else None
    style: str = ""

    @property
    def num_draft_tokens(self) -> int:
        return 2 if self.speculative else 0

    def cell(self) -> SimpleNamespace:
        """The genuine rows as a ``CellRows``-like object for ``rounds.compile_round_table``."""
        return SimpleNamespace(
            decode_batch=self.decode_batch, decode_kv=self.decode_kv, decode_latency_ms=self.decode_latency_ms,
            prefill_batch=self.prefill_batch, prefill_tokens=self.prefill_tokens, prefill_kv=self.prefill_kv,
            prefill_latency_ms=self.prefill_latency_ms,
        )


# ----------------------------------------------------------------------------------------------------
# tables


def _ladder(rng: np.random.Generator) -> np.ndarray:
    """Measured decode batches: spaced ladders and runs of consecutive batches (capture regimes)."""
    style = rng.integers(4)
    if style == 0:
        b = [1, 2, 4, 8, 16, 32, 64][: rng.integers(2, 8)]
    elif style == 1:
        b = list(range(1, rng.integers(3, 10)))
    elif style == 2:  # runs separated by jumps
        b, start = [], int(rng.integers(1, 3))
        for _ in range(rng.integers(2, 4)):
            run = int(rng.integers(1, 5))
            b += list(range(start, start + run))
            start = start + run + int(rng.integers(2, 12))
    else:
        b = sorted({int(x) for x in rng.integers(1, 40, size=rng.integers(2, 9))})
    return np.unique(np.asarray(b, np.int64))


def _latency(rng, style: str, base: np.ndarray) -> np.ndarray:
    lat = base.copy()
    if style in ("noisy", "dips"):
        lat *= 1.0 + rng.normal(0.0, 0.15, size=lat.size)
    if style == "ties":
        lat = np.round(lat * 2.0) / 2.0
    return np.maximum(lat, 0.05)


STYLES = ("smooth", "noisy", "dips", "ties")


def random_table(
    rng: np.random.Generator, *, speculative: bool | None = None, bad_rate: float = 0.08, style: str | None = None
) -> FuzzTable:
    """One random table (see the module docstring). ``style`` smooth gives latencies linear in batch and
    KV (plus a constant capture-regime step), non-decreasing along every axis; noisy/dips/ties do not."""
    spec = bool(rng.random() < 0.35) if speculative is None else speculative
    style = str(rng.choice(STYLES)) if style is None else style
    batches = _ladder(rng)
    jump_at = int(rng.choice(batches)) if rng.random() < 0.5 else 10**9
    jump_ms = float(rng.uniform(0.5, 4.0))
    shared_levels = np.unique(rng.integers(1, 600, size=rng.integers(2, 6)))
    db, dk, dl = [], [], []
    a0, a1, a2 = rng.uniform(2, 8), rng.uniform(0.05, 0.6), rng.uniform(1e-4, 2e-3)
    for b in batches:
        if rng.random() < 0.5:
            levels = shared_levels * b  # per-request levels shared across batches (KV scales with b)
        else:
            levels = rng.integers(1, 2000, size=rng.integers(1, 7)) * (b if rng.random() < 0.5 else 1)
        if rng.random() < 0.3:
            levels = np.append(levels, shared_levels[:1] * 4)  # a common total KV across batches
        levels = np.unique(levels.astype(np.int64))
        base = a0 + a1 * b + a2 * levels + (jump_ms if b >= jump_at else 0.0)
        lat = _latency(rng, style, base)
        if style == "dips" and levels.size > 1:
            lat[0] = lat[1:].max() + rng.uniform(0.1, 3.0)  # the curve dips below its lowest-KV point
        db += [b] * levels.size
        dk += levels.tolist()
        dl += lat.tolist()
    pb, pt, pk, pl = [], [], [], []
    pbatches = np.unique(rng.choice([1, 2, 3, 4, 6, 8], size=rng.integers(1, 4)))
    c0, c1, c2 = rng.uniform(1, 5), rng.uniform(5e-4, 5e-3), rng.uniform(1e-4, 1e-3)
    for b in pbatches:
        toks = np.unique(np.concatenate([rng.integers(1, 3000, size=rng.integers(1, 5)), [1] if rng.random() < 0.3 else []]).astype(np.int64))
        kvs = np.unique(np.concatenate([[0], rng.integers(1, 4000, size=rng.integers(0, 4))]).astype(np.int64))
        holes = 0.45 if rng.random() < 0.5 else 0.1  # irregular (per-token-level) KV grids: KV-first paths
        for t in toks:
            for k in kvs:
                if rng.random() < holes and toks.size * kvs.size > 2:
                    continue  # non-rectangular support
                pb.append(int(b)), pt.append(int(t)), pk.append(int(k))
                pl.append(float(_latency(rng, style, np.array([c0 + c1 * t * (1 + 0.2 * b) + c2 * k]))[0]))
    if not pb:
        pb, pt, pk, pl = [1], [64], [0], [c0]
    t = FuzzTable(
        speculative=spec,
        decode_batch=np.asarray(db, np.int64), decode_kv=np.asarray(dk, np.int64), decode_latency_ms=np.asarray(dl),
        prefill_batch=np.asarray(pb, np.int64), prefill_tokens=np.asarray(pt, np.int64), prefill_kv=np.asarray(pk, np.int64),
        prefill_latency_ms=np.asarray(pl), style=style,
    )
    _add_decoys(rng, t)
    if rng.random() < bad_rate:
        _make_bad(rng, t)
    return t


def _add_decoys(rng, t: FuzzTable) -> None:
    for i in range(t.decode_batch.size):
        if rng.random() < 0.3:
            t.decoys.append(("decode", int(t.decode_batch[i]), 0, int(t.decode_kv[i]), float(t.decode_latency_ms[i]) * 3.0, "fp8", MODEL, "real_kv"))
        if rng.random() < 0.2:
            t.decoys.append(
                ("decode", int(t.decode_batch[i]), 0, int(t.decode_kv[i]), float(t.decode_latency_ms[i]) * 0.5, "bfloat16", DECOY_MODEL, "real_kv")
            )
    for i in range(t.prefill_batch.size):
        if rng.random() < 0.3:
            regime = "real_kv" if t.prefill_kv[i] > 0 else "n/a"
            t.decoys.append(
                (
                    "prefill",
                    int(t.prefill_batch[i]),
                    int(t.prefill_tokens[i]),
                    int(t.prefill_kv[i]),
                    float(t.prefill_latency_ms[i]) * 2.5,
                    "fp8",
                    MODEL,
                    regime,
                )
            )
    if not t.speculative and rng.random() < 0.5:
        # fake_fallback rows in the selected identity, at coordinates no genuine row holds
        top = int(t.decode_batch.max())
        for kv in (100, 1000, 10000):
            t.decoys.append(("decode", top + 1, 0, kv, 1000.0 + kv / 100.0, "bfloat16", MODEL, "fake_fallback"))
        b, kv = int(t.decode_batch[0]), int(t.decode_kv[0])
        if not np.any((t.decode_batch == b) & (t.decode_kv == kv + 1)):
            t.decoys.append(("decode", b, 0, kv + 1, 777.0, "bfloat16", MODEL, "fake_fallback"))


def _make_bad(rng, t: FuzzTable) -> None:
    kinds = [k for k in BAD_KINDS if not (k == "only_fake_prefill_rows" and t.speculative)]
    t.bad = str(rng.choice(kinds))
    if t.bad == "zero_token_prefill_row":
        where = "bfloat16" if rng.random() < 0.5 else "fp8"  # refused in any identity
        t.decoys.append(
            ("prefill", int(t.prefill_batch[0]), 0, 0 if t.prefill_kv[0] else 7, 0.5, where, MODEL, "n/a" if t.prefill_kv[0] else "real_kv")
        )
    elif t.bad in ("no_prefill_rows", "only_fake_prefill_rows"):
        if t.bad == "only_fake_prefill_rows":
            for b, tok, k, lat in zip(t.prefill_batch, t.prefill_tokens, t.prefill_kv, t.prefill_latency_ms):
                t.decoys.append(("prefill", int(b), int(tok), int(k), float(lat) + 555.0, "bfloat16", MODEL, "fake_fallback"))
        t.prefill_batch, t.prefill_tokens, t.prefill_kv = (np.zeros(0, np.int64) for _ in range(3))
        t.prefill_latency_ms = np.zeros(0)
    else:
        t.decode_batch, t.decode_kv = np.zeros(0, np.int64), np.zeros(0, np.int64)
        t.decode_latency_ms = np.zeros(0)


# ----------------------------------------------------------------------------------------------------
# queries


def _near(rng, values: np.ndarray, n: int, top: int) -> np.ndarray:
    """n integers biased to ``values``, their neighbours and midpoints, 0 and just past the ends."""
    values = np.unique(np.asarray(values, np.int64))
    if values.size == 0:
        values = np.array([0], np.int64)
    pick = rng.integers(0, 8, size=n)
    v = values[rng.integers(0, values.size, size=n)]
    w = values[rng.integers(0, values.size, size=n)]
    out = np.select(
        [pick <= 2, pick == 3, pick == 4, pick == 5, pick == 6],
        [v, v - 1, v + 1, (v + w) // 2, np.where(rng.random(n) < 0.5, 0, values.max() + 1)],
        rng.integers(0, max(top, 1) + 1, size=n),
    )
    return np.maximum(out, 0).astype(np.int64)


def random_queries(rng: np.random.Generator, t: FuzzTable, n: int) -> dict[str, np.ndarray]:
    """``n`` boundary-biased queries: columns of the ``jaxsim round`` query format (kind = KINDS index)."""
    kind = rng.choice(3, size=n, p=[0.4, 0.25, 0.35]).astype(np.int64)
    dbs = t.decode_batch if t.decode_batch.size else np.array([1], np.int64)
    dks = t.decode_kv if t.decode_kv.size else np.array([1], np.int64)
    pbs = t.prefill_batch if t.prefill_batch.size else np.array([1], np.int64)
    pts = t.prefill_tokens if t.prefill_tokens.size else np.array([1], np.int64)
    pks = t.prefill_kv if t.prefill_kv.size else np.array([0], np.int64)
    d_b = _near(rng, dbs, n, int(dbs.max()) + 2)
    d_k = _near(rng, dks, n, int(dks.max()) + 2)
    # half the decode KVs come from the queried batch's own curve
    own = rng.random(n) < 0.5
    for i in np.flatnonzero(own):
        ks = t.decode_kv[t.decode_batch == d_b[i]]
        if ks.size:
            d_k[i] = _near(rng, ks, 1, int(ks.max()) + 1)[0]
    p_b = np.where(rng.random(n) < 0.75, pbs[rng.integers(0, pbs.size, size=n)], _near(rng, pbs, n, int(pbs.max()) + 1))
    p_t = _near(rng, pts, n, int(pts.max()) + 2)
    p_k = _near(rng, pks, n, int(pks.max()) + 2)
    for i in np.flatnonzero(rng.random(n) < 0.6):  # the batch's own grid
        m = t.prefill_batch == p_b[i]
        if m.any():
            p_t[i] = _near(rng, t.prefill_tokens[m], 1, int(t.prefill_tokens[m].max()) + 1)[0]
            p_k[i] = _near(rng, t.prefill_kv[m], 1, int(t.prefill_kv[m].max()) + 1)[0]
    small = rng.random(n) < 0.05  # 0 < tokens < batch, or no new tokens
    p_t = np.where(small, rng.integers(0, np.maximum(p_b, 1) + 1), p_t)
    batch = np.where(kind == 0, d_b, p_b)
    ptok = np.where(kind == 0, 0, p_t)
    kvr = np.where(kind == 0, d_k, p_k)
    nd = np.where(kind == 2, d_b, 0)
    dkv = np.where(kind == 2, d_k, 0)
    mixed = kind == 2
    r = rng.random(n)
    batch = np.where(mixed & (r < 0.08), 0, batch)  # decode only (or orphan prefill sums)
    ptok = np.where(mixed & (r < 0.05), 0, ptok)
    kvr = np.where(mixed & (r < 0.035), 0, kvr)
    nd = np.where(mixed & (r > 0.92), 0, nd)  # prefill only (or an orphan decode sum)
    dkv = np.where(mixed & (r > 0.95), 0, dkv)
    zero_d = (kind == 0) & (rng.random(n) < 0.02)
    batch = np.where(zero_d, 0, batch)
    kvr = np.where(zero_d & (rng.random(n) < 0.5), 0, kvr)
    return {"kind": kind, "batch": batch.astype(np.int64), "prefill_tokens": ptok.astype(np.int64), "kv_read": kvr.astype(np.int64),
            "decode_requests": nd.astype(np.int64), "decode_kv": dkv.astype(np.int64)}


def query_rows(q: dict[str, np.ndarray]) -> list[tuple]:
    """Queries as (kind name, batch, prefill tokens, kv read, decode requests, decode kv) tuples."""
    return [(KINDS[k], int(b), int(p), int(kv), int(nd), int(dk))
            for k, b, p, kv, nd, dk in zip(q["kind"], q["batch"], q["prefill_tokens"], q["kv_read"], q["decode_requests"], q["decode_kv"])]


# ----------------------------------------------------------------------------------------------------
# files


def write_profile_dir(t: FuzzTable, directory: str | Path, name: str = "fuzz") -> Path:
    """Write profile.json + parquet + sidecar (from the case templates) into ``directory``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = TEMPLATES[t.speculative]
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    template = pq.read_table(src / "fpm_forward_perf.parquet").slice(0, 1).to_pylist()[0]
    rows = []

    def add(kind, b, tok, k, lat, dtype, model, regime):
        r = dict(template)
        r.update(cell_id=f"{name}-{model}-{dtype}", workload_kind=kind, batch_size=int(b), total_prefill_tokens=int(tok),
                 total_kv_read_tokens=int(k), latency_ms=float(lat), kv_cache_dtype=dtype, model_path=model, kv_seed_regime=regime)
        rows.append(r)

    for b, k, lat in zip(t.decode_batch, t.decode_kv, t.decode_latency_ms):
        add("decode", b, 0, k, lat, "bfloat16", MODEL, "real_kv")
    for b, tok, k, lat in zip(t.prefill_batch, t.prefill_tokens, t.prefill_kv, t.prefill_latency_ms):
        add("prefill", b, tok, k, lat, "bfloat16", MODEL, "real_kv" if k > 0 else "n/a")
    for dec in t.decoys:
        add(*dec)
    schema = pq.read_schema(src / "fpm_forward_perf.parquet")
    table = pa.Table.from_pylist(rows, schema=schema)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    data = buf.getvalue()
    (d / "fpm_forward_perf.parquet").write_bytes(data)
    sidecar = json.loads((src / "fpm_forward_perf.metadata.json").read_text())
    sidecar.update(row_count=len(rows), parquet_sha256=hashlib.sha256(data).hexdigest(), model_paths=sorted({r["model_path"] for r in rows}))
    (d / "fpm_forward_perf.metadata.json").write_text(json.dumps(sidecar, indent=1) + "\n")
    (d / "profile.json").write_text((src / "profile.json").read_text())
    return d
