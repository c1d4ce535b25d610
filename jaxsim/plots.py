"""Figures for people (PNG): measured curves, support maps, Pareto frontiers, latency CDFs.

Optional extra: ``pip install -e '.[plot]' (in the jaxsim checkout)``. Figures are drawn on the Agg canvas without touching
pyplot's global state. Measured points are drawn as recorded; every modelled latency comes from the
compiled kernels in :mod:`jaxsim.kernels.rounds` (never recomputed here).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxsim._jax import ensure_x64  # noqa: F401  (importing it turns x64 on; entry points call it)
from jaxsim.errors import JaxsimError, QueryError
from jaxsim.kernels import status as st
from jaxsim.kernels.batched import prefill_grid, support_grid
from jaxsim.kernels.rounds import RoundTable
from jaxsim.kernels.tables import round_table
from jaxsim.profile.resolve import cell_rows, choose_deployment, load_bundle, resolve_profile_dir
from jaxsim.sweep.frontier import pareto_mask

MISSING_MATPLOTLIB = "matplotlib is not installed: pip install -e '.[plot]' (in the jaxsim checkout)"

# one fixed colour per status code, so every support map reads the same
_ANSWERED_COLOURS = {
    st.EXACT: "#00441b",
    st.WITHIN_CURVE: "#238b45",
    st.CROSS_BATCH: "#74c476",
    st.CROSS_KV: "#41ab5d",
    st.KV_FIRST: "#a1d99b",
    st.COMPOSED: "#c7e9c0",
    st.EMPTY: "#e5f5e0",
    st.NO_PREFILL_WORK: "#f7fcf5",
}
_UNSUPPORTED_COLOURS = {
    st.BATCH_OUT_OF_RANGE: "#bdbdbd",
    st.KV_OUT_OF_RANGE: "#e0e0e0",
    st.NO_LOWER_BRACKET: "#fd8d3c",
    st.NO_UPPER_BRACKET: "#fdd0a2",
    st.REGIME_LOWER: "#9e9ac8",
    st.REGIME_UPPER: "#6a51a3",
    st.BATCH_RATIO: "#ef3b2c",
    st.NOT_NEAREST: "#8c510a",
    st.PREFILL_BATCH_UNMEASURED: "#969696",
    st.PREFILL_NO_SUPPORT: "#d9d9d9",
    st.SD_MIXED_REFUSED: "#67000d",
    st.INVALID_QUERY: "#000000",
    st.SUM_WITHOUT_REQUESTS: "#252525",
    st.PREFILL_TOKENS_BELOW_BATCH: "#525252",
    st.COUNT_BEYOND_U32: "#737373",
}
STATUS_COLOURS = {**_ANSWERED_COLOURS, **_UNSUPPORTED_COLOURS}


def require_matplotlib() -> None:
    """Raise the one-line install hint when matplotlib is missing (call before any expensive work)."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        raise JaxsimError(MISSING_MATPLOTLIB) from None


def _figure(width: float = 8.0, height: float = 5.0, ncols: int = 1):
    require_matplotlib()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, axes


def check_png_path(path: str | os.PathLike) -> Path:
    """The output path, if it names a .png file."""
    out = Path(path)
    if out.suffix.lower() != ".png":
        raise QueryError(f"{out}: figures are written as PNG; use a .png file name")
    return out


def _save(fig, path: str | os.PathLike) -> Path:
    from jaxsim.outputs import atomic_file

    out = check_png_path(path)
    with atomic_file(out) as f:
        fig.savefig(f, format="png", bbox_inches="tight")
    return out


# --------------------------------------------------------------------------------------------------
# profiles


@dataclass(frozen=True, eq=False)
class ProfileView:
    """One deployment of a profile: its measured rows and its compiled round table."""

    label: str
    deployment: Any
    cell: Any
    table: RoundTable


def load_view(profile: str | os.PathLike, **want) -> ProfileView:
    """Load a profile (directory or bundled name) and select one deployment (``tp=``, ``role=``, ...)."""
    bundle = load_bundle(resolve_profile_dir(str(profile)))
    d = choose_deployment(bundle, **want)
    cell = cell_rows(bundle, d)
    table = round_table(bundle, d)
    name = Path(str(profile)).name
    kind = f"speculative round K={d.num_draft_tokens}" if d.is_speculative else "autoregressive"
    label = f"{name} · {bundle.profile.model} · {d.system} TP{d.tp} · {kind}"
    return ProfileView(label=label, deployment=d, cell=cell, table=table)


def _is_speculative(view_or_table) -> bool:
    t = view_or_table.table if isinstance(view_or_table, ProfileView) else view_or_table
    return bool(getattr(t, "speculative", False))


def _decode_ylabel(speculative: bool) -> str:
    return "round latency (ms, draft + verify, one lookup)" if speculative else "decode iteration latency (ms)"


KV_LABEL = "total past KV over the batch (tokens)"


def plot_decode_curves(view: ProfileView, path: str | os.PathLike, *, title: str | None = None) -> Path:
    """Measured decode curves: latency vs total past KV, one line per batch size (points as measured)."""
    cell = view.cell
    batches = np.unique(cell.decode_batch)
    if batches.size == 0:
        raise QueryError(f"{view.label}: the deployment has no measured decode rows to plot")
    fig, (ax,) = _figure(9.5, 5.5)
    from matplotlib import colormaps

    cmap = colormaps["turbo"]
    for i, b in enumerate(batches):
        m = cell.decode_batch == b
        c = cmap(0.05 + 0.9 * i / max(batches.size - 1, 1))
        ax.plot(cell.decode_kv[m], cell.decode_latency_ms[m], "o-", color=c, ms=3, lw=1.0, label=f"{int(b)}")
    ax.set_xlabel(KV_LABEL)
    ax.set_ylabel(_decode_ylabel(_is_speculative(view)))
    if cell.decode_latency_ms.max() > 20 * cell.decode_latency_ms.min():
        ax.set_yscale("log")
    ax.set_title(title or f"Measured decode curves per batch size\n{view.label}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ncol = 1 if batches.size <= 16 else (2 if batches.size <= 40 else 3)
    ax.legend(title="batch (requests)", fontsize=7, title_fontsize=8, ncol=ncol, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.text(
        0.01, 0.99, "points: measured rows · lines join points of one batch (linear within a curve)",
        transform=ax.transAxes, va="top", fontsize=7, color="#555555",
    )
    return _save(fig, path)


def _default_batches(cell, table: RoundTable) -> np.ndarray:
    measured = np.unique(cell.decode_batch) if cell is not None else np.unique(np.asarray(table.curve_batch))
    measured = measured[measured > 0]
    top = int(np.ceil(measured.max() * 1.15)) + 1 if measured.size else 8
    if top <= 160:
        return np.arange(1, top + 1, dtype=np.int64)
    return np.unique(np.round(np.geomspace(1, top, 160)).astype(np.int64))


def support_summary(codes: np.ndarray) -> list[tuple[int, str, int, float, str]]:
    """(code, name, count, share, explanation) for each status present in a grid, most common first."""
    values, counts = np.unique(np.asarray(codes), return_counts=True)
    order = np.argsort(-counts, kind="stable")
    total = max(int(counts.sum()), 1)
    out = []
    for i in order:
        c = int(values[i])
        why = st.EXPLAIN.get(c, "answered from measured rows")
        out.append((c, st.name(c), int(counts[i]), float(counts[i]) / total, why))
    return out


def plot_support_map(
    view: ProfileView,
    path: str | os.PathLike,
    *,
    batches=None,
    kv_tokens=None,
    title: str | None = None,
) -> Path:
    """Where decode queries are answered and why not elsewhere: a batch × total-KV grid coloured by the
    kernel's status code, measured rows overlaid."""
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch

    table, cell = view.table, view.cell
    b = _default_batches(cell, table) if batches is None else np.asarray(batches, dtype=np.int64)
    k = np.linspace(0, 1.1 * table.max_decode_kv, 221).astype(np.int64) if kv_tokens is None else np.asarray(kv_tokens, dtype=np.int64)
    if b.size < 1 or k.size < 1:
        raise QueryError("support map needs at least one batch size and one KV value")
    _, codes = support_grid(table, b, k)
    present = [int(c) for c in np.unique(codes)]
    index = {c: i for i, c in enumerate(present)}
    img = np.vectorize(index.get)(codes)
    cmap = ListedColormap([STATUS_COLOURS.get(c, "#ff00ff") for c in present])
    norm = BoundaryNorm(np.arange(len(present) + 1) - 0.5, len(present))

    fig, (ax,) = _figure(10.5, 5.8)
    ax.pcolormesh(k, b, img, cmap=cmap, norm=norm, shading="nearest", rasterized=True)
    if b.max() / max(b.min(), 1) > 64:
        ax.set_yscale("log", base=2)
        ax.set_ylim(0.85 * b.min(), 1.08 * b.max())
    if cell is not None and cell.num_decode_rows:
        ax.scatter(cell.decode_kv, cell.decode_batch, s=5, c="black", marker=".", label="measured decode row")
    total = codes.size
    handles = []
    for c in present:
        share = 100.0 * float(np.sum(codes == c)) / total
        tag = "answered" if c < st.FIRST_UNSUPPORTED else "refused"
        handles.append(Patch(facecolor=STATUS_COLOURS.get(c, "#ff00ff"), edgecolor="#444444", label=f"{st.name(c)} ({tag}, {share:.1f} %)"))
    if cell is not None and cell.num_decode_rows:
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], ls="", marker=".", color="black", label="measured decode row"))
    ax.legend(handles=handles, title="kernel status (share of grid)", fontsize=7, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_xlabel(KV_LABEL)
    ax.set_ylabel("batch (decoding requests)")
    ax.set_xlim(k.min(), k.max())
    what = "speculative rounds" if table.speculative else "decode iterations"
    ax.set_title(title or f"Where {what} are answered (greens) and why not elsewhere\n{view.label}", fontsize=10)
    return _save(fig, path)


def _prefill_batch_choice(view: ProfileView, batch: int | None) -> int:
    cell = view.cell
    measured = np.unique(cell.prefill_batch)
    if measured.size == 0:
        raise QueryError(f"{view.label}: the deployment has no measured prefill rows to plot")
    if batch is None:
        counts = [(int(np.sum(cell.prefill_batch == x)), -int(x)) for x in measured]
        return -max(counts)[1]
    if int(batch) not in set(measured.tolist()):
        raise QueryError(f"{view.label}: prefill batch {batch} is not measured (measured: {', '.join(map(str, measured.tolist()))})")
    return int(batch)


def plot_prefill_surface(view: ProfileView, path: str | os.PathLike, *, batch: int | None = None, title: str | None = None) -> Path:
    """Prefill latency of one measured batch size: (a) vs new tokens at each measured cached-KV level,
    (b) over the tokens × cached-KV plane (blank outside measured support). Kernel-evaluated."""
    cell, table = view.cell, view.table
    pb = _prefill_batch_choice(view, batch)
    m = cell.prefill_batch == pb
    tok, kv, lat = cell.prefill_tokens[m], cell.prefill_kv[m], cell.prefill_latency_ms[m]
    levels = np.unique(kv)
    surface = sum(np.unique(tok[kv == lv]).size >= 2 for lv in levels) >= 2
    fig, axes = _figure(13.0 if surface else 8.0, 5.0, 2 if surface else 1)
    from matplotlib import colormaps

    ax = axes[0]
    cmap = colormaps["plasma"]
    shown = levels if levels.size <= 8 else levels[np.unique(np.linspace(0, levels.size - 1, 8).round().astype(int))]
    for i, lv in enumerate(shown):
        sel = kv == lv
        tgrid = np.unique(np.concatenate([np.linspace(tok[sel].min(), tok[sel].max(), 200).astype(np.int64), tok[sel]]))
        y, _ = prefill_grid(table, pb, tgrid, int(lv))
        c = cmap(0.85 * i / max(len(shown) - 1, 1))
        ax.plot(tgrid, y, "-", color=c, lw=1.2, label=f"{int(lv)}")
        ax.plot(tok[sel], lat[sel], "o", color=c, ms=3)
    ax.set_xlabel("new prompt tokens computed in the iteration (tokens)")
    ax.set_ylabel("prefill iteration latency (ms)")
    ax.set_title(f"(a) batch {pb}: latency vs new tokens", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(title="cached KV read (tokens)", fontsize=7, title_fontsize=8)
    if surface:
        ax2 = axes[1]
        tg = np.linspace(0, tok.max() * 1.05, 160).astype(np.int64)
        kg = np.linspace(0, kv.max() * 1.05, 120).astype(np.int64)
        tt, kk = np.meshgrid(tg, kg, indexing="xy")
        y, _ = prefill_grid(table, pb, tt, kk)
        z = np.ma.masked_invalid(y.reshape(tt.shape))
        ax2.set_facecolor("#eeeeee")
        mesh = ax2.pcolormesh(tg, kg, z, shading="nearest", cmap="viridis", rasterized=True)
        fig.colorbar(mesh, ax=ax2, label="prefill iteration latency (ms)")
        ax2.scatter(tok, kv, s=6, c="white", edgecolors="black", linewidths=0.3, label="measured row")
        ax2.set_xlabel("new prompt tokens computed in the iteration (tokens)")
        ax2.set_ylabel("cached KV read by the prefill (tokens)")
        ax2.set_title(f"(b) batch {pb}: kernel answer over the plane (grey: outside measured support)", fontsize=9)
        ax2.legend(fontsize=7, loc="upper right")
    fig.suptitle(title or f"Prefill latency, measured batch {pb}\n{view.label}", fontsize=10)
    return _save(fig, path)


# --------------------------------------------------------------------------------------------------
# result tables (sweep / replay)

# column names written by ``jaxsim sweep`` and ``jaxsim replay``
SWEEP_PER_GPU = "output_tokens_per_s_per_gpu"
SWEEP_PER_USER = "tokens_per_s_per_user"
SWEEP_FEASIBLE = "sla_ok"
SWEEP_ON_PARETO = "on_pareto"
SWEEP_WORKLOAD = "workload"
SWEEP_LABEL_COLUMNS = ("profile", "system", "mode", "prefill_workers", "decode_workers", "tp", "nextn", "concurrency", "concurrency_target")
REPLAY_TTFT = "ttft_ms"
REPLAY_TPOT = "tpot_ms"
REPLAY_E2E = "e2e_ms"
REPLAY_TERMINAL = "terminal"  # "completed" | "unfinished" | "rejected"
REPLAY_STATUS = "status"  # the replay's status text, repeated on each request row
REPLAY_CONFIGS = ("config", "config_id", "config_index")


def read_columns(results: Any) -> dict[str, np.ndarray]:
    """Columns of a result: a parquet/CSV path, a pyarrow Table, or a mapping of name → array."""
    if isinstance(results, (str, os.PathLike)):
        p = Path(results)
        if not p.is_file():
            raise QueryError(f"{p}: no such result file")
        try:
            if p.suffix.lower() == ".csv":
                import pyarrow.csv as pacsv

                results = pacsv.read_csv(p)
            else:
                import pyarrow.parquet as pq

                results = pq.read_table(p)
        except Exception as e:  # pyarrow raises many types for a damaged file
            raise QueryError(f"{p}: not a readable {'CSV' if p.suffix.lower() == '.csv' else 'parquet'} result table ({type(e).__name__})") from None
    if hasattr(results, "column_names") and hasattr(results, "column"):
        return {n: results.column(n).to_numpy(zero_copy_only=False) for n in results.column_names}
    if isinstance(results, Mapping):
        return {str(k): np.asarray(v) for k, v in results.items()}
    raise QueryError(f"cannot read result columns from a {type(results).__name__}")


def _need(cols: dict, names: tuple[str, ...], what: str, source: str) -> None:
    missing = [n for n in names if n not in cols]
    if missing:
        raise QueryError(f"{source}: not a {what} (missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)})")


def _first(cols: dict, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in cols), None)


def _read_sweep(results: Any, src: str, max_points: int) -> dict[str, np.ndarray]:
    """The sweep columns a Pareto plot needs; large parquet files are streamed by row group and the
    non-frontier points thinned to about ``max_points`` (the frontier is always kept whole)."""
    want = (SWEEP_PER_USER, SWEEP_PER_GPU, SWEEP_FEASIBLE, SWEEP_ON_PARETO, SWEEP_WORKLOAD, *SWEEP_LABEL_COLUMNS)
    if isinstance(results, (str, os.PathLike)) and Path(results).suffix.lower() == ".parquet" and Path(results).is_file():
        import pyarrow.parquet as pq

        try:
            f = pq.ParquetFile(results)
        except Exception as e:
            raise QueryError(f"{src}: not a readable parquet result table ({type(e).__name__})") from None
        names = set(f.schema_arrow.names)
        _need({n: None for n in names}, (SWEEP_PER_GPU, SWEEP_PER_USER), "sweep result table", src)
        cols_to_read = [c for c in want if c in names]
        step = max(1, f.metadata.num_rows // max(max_points, 1))
        parts = []
        for rg in range(f.num_row_groups):
            t = read_columns(f.read_row_group(rg, columns=cols_to_read))
            if step > 1:
                keep = np.zeros(t[SWEEP_PER_GPU].shape, bool)
                keep[::step] = True
                if SWEEP_ON_PARETO in t:
                    keep |= np.asarray(t[SWEEP_ON_PARETO], bool)
                t = {k: v[keep] for k, v in t.items()}
            parts.append(t)
        return {k: np.concatenate([p[k] for p in parts]) for k in cols_to_read}
    cols = read_columns(results)
    _need(cols, (SWEEP_PER_GPU, SWEEP_PER_USER), "sweep result table", src)
    return cols


_TP_MARKERS = {1: "o", 2: "s", 4: "^", 8: "D", 16: "v", 32: "P", 64: "X"}
_WORKLOAD_STYLES = ("-", "--", ":", "-.", (0, (8, 2, 2, 2, 2, 2)), (0, (1, 1)), (0, (10, 3)), (0, (4, 2, 1, 2, 1, 2, 1, 2)))


def _tp_marker(tp: int) -> str:
    return _TP_MARKERS.get(int(tp), "*")


def _col(cols: dict, name: str, n: int, default) -> np.ndarray:
    return np.asarray(cols[name]) if name in cols else np.full(n, default)


@dataclass(frozen=True)
class _PointStyle:
    """How the points of one (profile, TP, mode) look: colour by profile (its GPU named), marker by TP,
    filled when aggregated and hollow when disaggregated."""

    profile: str
    gpu: str
    tp: int
    disaggregated: bool

    @property
    def profile_label(self) -> str:
        if not self.gpu:
            return self.profile
        return self.profile if self.gpu.lower().replace(" ", "") in self.profile.lower() else f"{self.profile} ({self.gpu})"


def _styles(cols: dict, n: int) -> np.ndarray | None:
    """A :class:`_PointStyle` per point, or None when the table names no profile (one colour then)."""
    if "profile" not in cols:
        return None
    from jaxsim.cost import gpu_name

    prof = np.asarray(cols["profile"]).astype(str)
    system = _col(cols, "system", n, "").astype(str)
    tp = _col(cols, "tp", n, 0).astype(np.int64)
    dis = _col(cols, "mode", n, "aggregated").astype(str) == "disaggregated"
    cache: dict = {}
    out = np.empty(n, dtype=object)
    for i, key in enumerate(zip(prof, system, tp, dis)):
        if key not in cache:
            cache[key] = _PointStyle(key[0], gpu_name(key[1]) if key[1] else "", int(key[2]), bool(key[3]))
        out[i] = cache[key]
    return out


def _config_label(cols: dict, i: int) -> str:
    """A frontier point's annotation: GPU, TP, serving mode, K (when speculative) and concurrency."""
    parts = []
    if "system" in cols:
        from jaxsim.cost import gpu_name

        parts.append(gpu_name(str(np.asarray(cols["system"])[i])))
    elif "profile" in cols:
        parts.append(str(np.asarray(cols["profile"])[i]))
    if "tp" in cols:
        parts.append(f"TP{int(np.asarray(cols['tp'])[i])}")
    if "mode" in cols:
        mode = str(np.asarray(cols["mode"])[i])
        if mode == "disaggregated" and "prefill_workers" in cols:
            mode = f"disagg {int(cols['prefill_workers'][i])}:{int(cols['decode_workers'][i])}"
        parts.append("agg" if mode == "aggregated" else mode)
    if "nextn" in cols and int(np.asarray(cols["nextn"])[i]):
        parts.append(f"K={int(np.asarray(cols['nextn'])[i])}")
    conc = _first(cols, ("concurrency_target", "concurrency"))
    if conc is not None:
        parts.append(f"c={int(np.asarray(cols[conc])[i])}")
    return " ".join(parts)


def _draw_points(ax, x, y, feasible, styles) -> list:
    """The SLA-feasible points, one scatter per style (or one "meets the SLA" layer); legend handles of
    the colours (profiles), markers (TP) and fills (serving mode)."""
    from matplotlib import colormaps
    from matplotlib.lines import Line2D

    if styles is None:
        ax.scatter(x[feasible], y[feasible], s=8, c="#9ecae1", label="meets the SLA", rasterized=True)
        return []
    keys = list(dict.fromkeys(styles[feasible].tolist()))
    profiles = list(dict.fromkeys(k.profile_label for k in keys))
    cmap = colormaps["tab10" if len(profiles) <= 10 else "tab20"]
    colour = {p: cmap(i % cmap.N) for i, p in enumerate(profiles)}
    for k in keys:
        sel = feasible & (styles == k)
        c = colour[k.profile_label]
        ax.scatter(x[sel], y[sel], s=22, marker=_tp_marker(k.tp), facecolors="none" if k.disaggregated else [c], edgecolors=[c],
                   linewidths=0.9, label=f"{k.profile_label} TP{k.tp} {'disaggregated' if k.disaggregated else 'aggregated'}", rasterized=True)
    handles = [Line2D([], [], ls="", marker="o", ms=7, color=colour[p], label=p) for p in profiles]
    handles += [Line2D([], [], ls="", marker=_tp_marker(tp), ms=7, color="#444444", label=f"TP{tp}")
                for tp in sorted({k.tp for k in keys})]
    modes = sorted({k.disaggregated for k in keys})
    if len(modes) > 1 or modes == [True]:
        handles += [Line2D([], [], ls="", marker="o", ms=7, color="#444444", markerfacecolor="none" if d else "#444444",
                           label="disaggregated (hollow)" if d else "aggregated (filled)") for d in modes]
    return handles


def _draw_frontiers(ax, cols, x, y, feasible, given, groups, styled: bool) -> list[np.ndarray]:
    """One frontier line per workload: dark, a line style per workload when points carry profile colours."""
    from matplotlib import colormaps

    names = list(dict.fromkeys(groups[feasible].tolist()))
    cmap = colormaps["tab10"]
    fronts = []
    for j, g in enumerate(names):
        sel = feasible & (groups == g)
        front = given & sel if given is not None else pareto_mask(np.where(sel, x, np.nan), np.where(sel, y, np.nan))
        o = np.flatnonzero(front)[np.argsort(x[front])]
        fronts.append(o)
        label = "SLA-feasible Pareto frontier" + ("" if len(names) == 1 and g == "all" else f": {g}") + f" ({o.size})"
        if styled:
            ax.plot(x[o], y[o], linestyle=_WORKLOAD_STYLES[j % len(_WORKLOAD_STYLES)], color="#222222", lw=1.3, label=label, zorder=3)
        else:
            ax.plot(x[o], y[o], "o-", color=cmap(j % 10) if len(names) > 1 else "#d94801", ms=4, lw=1.6, label=label)
    return fronts


def plot_pareto(
    results: Any, path: str | os.PathLike, *, workload: str | None = None, title: str | None = None, max_points: int = 200_000
) -> Path:
    """Output tokens/s per GPU vs tokens/s per user for the evaluated configs (a sweep result table):
    SLA-feasible points coloured by profile (its GPU named), marked by TP, filled when aggregated and hollow
    when disaggregated; one Pareto frontier per workload (``workload``: draw one only)."""
    src = str(results) if isinstance(results, (str, os.PathLike)) else "results"
    cols = _read_sweep(results, src, max_points)
    groups = np.asarray(cols[SWEEP_WORKLOAD]).astype(str) if SWEEP_WORKLOAD in cols else np.full(cols[SWEEP_PER_GPU].shape, "all")
    if workload is not None:
        names = sorted(set(groups.tolist()))
        if workload not in names:
            raise QueryError(f"{src}: no workload {workload!r} (workloads: {', '.join(names)})")
        keep = groups == workload
        cols = {k: v[keep] for k, v in cols.items()}
        groups = groups[keep]
    x = np.asarray(cols[SWEEP_PER_USER], dtype=np.float64)
    y = np.asarray(cols[SWEEP_PER_GPU], dtype=np.float64)
    finite = np.isfinite(x) & np.isfinite(y)
    feasible = (np.asarray(cols[SWEEP_FEASIBLE], dtype=bool) if SWEEP_FEASIBLE in cols else np.ones(x.shape, bool)) & finite
    given = np.asarray(cols[SWEEP_ON_PARETO], dtype=bool) & feasible if SWEEP_ON_PARETO in cols else None
    styles = _styles(cols, x.size)
    fig, (ax,) = _figure(11.0, 6.5)
    miss = finite & ~feasible
    ax.scatter(x[miss], y[miss], s=5, c="#d0d0d0", label="misses the SLA", rasterized=True, zorder=1)
    handles = _draw_points(ax, x, y, feasible, styles)
    fronts = _draw_frontiers(ax, cols, x, y, feasible, given, groups, styles is not None)
    n_front = sum(o.size for o in fronts)
    if 0 < n_front <= 12:
        right = np.nanmax(x[finite]) if finite.any() else 0.0
        for i in np.concatenate(fronts):
            text = _config_label(cols, int(i))
            if text:  # labels of the right-most points grow leftwards, inside the axes
                near_edge = x[i] > 0.8 * right
                ax.annotate(text, (x[i], y[i]), fontsize=6.5, xytext=(-4 if near_edge else 4, 3), textcoords="offset points",
                            ha="right" if near_edge else "left")
    ax.set_xlabel("output tokens/s per user (interactivity)")
    ax.set_ylabel("output tokens/s per GPU (throughput)")
    ax.grid(True, alpha=0.3)
    n_out = int(np.sum(~finite))
    extra = f"; {n_out} outside measured support, not drawn" if n_out else ""
    scope = f" ({workload})" if workload else ""
    ax.set_title(title or f"Throughput vs interactivity{scope}: {int(finite.sum())} configs drawn{extra}", fontsize=10)
    lines = [h for h in ax.get_lines() if h.get_label().startswith("SLA-feasible Pareto frontier")]
    grey = [c for c in ax.collections if c.get_label() == "misses the SLA" and len(c.get_offsets())]
    if handles:
        first = ax.legend(handles=handles, title="colour: profile (GPU) · marker: TP", fontsize=7, title_fontsize=7.5,
                          loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.add_artist(first)
        ax.legend(handles=lines + grey, fontsize=7, loc="lower left", bbox_to_anchor=(1.01, 0.0))
    else:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


_CDF_METRICS = (
    (REPLAY_TTFT, "TTFT: time to first token (ms)"),
    (REPLAY_TPOT, "TPOT: time per output token after the first (ms)"),
    (REPLAY_E2E, "E2E: arrival to last token (ms)"),
)


def _ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(values[np.isfinite(values)])
    return v, np.arange(1, v.size + 1) / max(v.size, 1)


def _replay_stop_note(cols: dict, sel: np.ndarray) -> str:
    """The replay status of the selected rows when it is not a clean completion (else '')."""
    if REPLAY_STATUS not in cols or not sel.any():
        return ""
    status = str(np.asarray(cols[REPLAY_STATUS])[np.flatnonzero(sel)[0]])
    return "" if status == "completed" else status.replace("stopped: pass lookup unsupported:", "stopped outside support: ")


def plot_latency_cdf(results: Any, path: str | os.PathLike, *, title: str | None = None, max_series: int = 8) -> Path:
    """Per-request TTFT / TPOT / E2E cumulative distributions (ms) of the completed requests; one line
    per replayed config (first ``max_series``). A replay that stopped outside measured support says so."""
    src = str(results) if isinstance(results, (str, os.PathLike)) else "results"
    cols = read_columns(results)
    names = (REPLAY_TTFT, REPLAY_TPOT, REPLAY_E2E)
    if "config_id" in cols or "sla_ok" in cols:
        raise QueryError(f"{src}: a sweep result table (one row per configuration), not a replay's per-request table; "
                         "draw it with jaxsim plot pareto, or replay a configuration with jaxsim replay")
    _need(cols, names, "replay per-request table", src)
    if REPLAY_TERMINAL in cols:
        done = np.asarray(cols[REPLAY_TERMINAL]).astype(str) == "completed"
    else:
        done = np.isfinite(np.asarray(cols[REPLAY_E2E], dtype=np.float64))
    config_col = _first(cols, REPLAY_CONFIGS)
    groups = np.asarray(cols[config_col]).astype(str) if config_col else np.full(done.shape, "replay")
    keys = list(dict.fromkeys(groups.tolist()))[:max_series]
    if not done.any():
        notes = sorted({_replay_stop_note(cols, groups == k) for k in keys} - {""})
        raise QueryError(f"{src}: no completed requests to plot" + (f" ({'; '.join(notes)})" if notes else ""))
    fig, axes = _figure(15.0, 4.8, 3)
    for ax, name, (_, text) in zip(axes, names, _CDF_METRICS):
        for key in keys:
            mine = groups == key
            sel = done & mine
            v, p = _ecdf(np.asarray(cols[name], dtype=np.float64)[sel])
            if v.size == 0:
                continue
            stats = f"p50 {np.percentile(v, 50):.1f}, p90 {np.percentile(v, 90):.1f}, p99 {np.percentile(v, 99):.1f} ms"
            head = f"{key} ({int(sel.sum())}/{int(mine.sum())} done): " if len(keys) > 1 else ""
            ax.step(v, p, where="post", lw=1.4, label=head + stats)
        ax.set_xlabel(text)
        ax.set_ylabel("fraction of completed requests")
        ax.set_ylim(0, 1.01)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6 if len(keys) > 1 else 7, loc="lower right")
    n_done = int(done.sum())
    notes = sorted({_replay_stop_note(cols, groups == k) for k in keys} - {""})
    stop = f"\nreplay incomplete — {notes[0]}" if len(notes) == 1 else (f"\n{len(notes)} replays incomplete" if notes else "")
    fig.suptitle(title or f"Latency distributions over {n_done} completed requests ({done.size - n_done} not completed){stop}", fontsize=10)
    return _save(fig, path)


def _series(cols: dict) -> list[tuple[str, np.ndarray]]:
    """(label, row mask) per replayed config / worker of a timeline table."""
    n = np.asarray(cols["end_ms"]).shape[0]
    key = np.full(n, "", dtype=object)
    for c in ("config", "seed", "worker"):
        if c in cols and np.unique(np.asarray(cols[c])).size > 1:
            key = key + np.array([f"{c} {v} " for v in np.asarray(cols[c])], dtype=object)
    return [(str(k).strip() or "replay", key == k) for k in dict.fromkeys(key.tolist())]


POOL_LINE_MIN_SHARE = 0.3
"""The KV timeline draws the pool as a line (use as % of it) when the peak use reaches this share of it."""


def _series_pools(cols: dict, series, num_gpu_blocks: int | None) -> list[int | None]:
    """The KV pool (blocks) of each series: ``num_gpu_blocks`` when given, else the timeline's own
    ``kv_pool_blocks`` column (``jaxsim replay --timeline`` writes it), else unknown."""
    if num_gpu_blocks:
        return [int(num_gpu_blocks)] * len(series)
    if "kv_pool_blocks" not in cols:
        return [None] * len(series)
    col = np.asarray(cols["kv_pool_blocks"], dtype=np.int64)
    return [int(col[m].max()) if m.any() else None for _, m in series]


def plot_kv_timeline(
    timeline: Any, path: str | os.PathLike, *, num_gpu_blocks: int | None = None, title: str | None = None, max_series: int = 6
) -> Path:
    """KV-cache blocks in use, with the KV pool's size, and running / waiting requests over simulated time,
    from a replay timeline (``jaxsim.replay.metrics.timeline_table`` or ``jaxsim replay --timeline``); one line
    per config/worker. Use is drawn as a percentage of each worker's pool, with the pool as a dashed line at
    100 %, when the peak use reaches 30 % of it; otherwise in blocks, the pool named in a note."""
    from matplotlib import colormaps

    src = str(timeline) if isinstance(timeline, (str, os.PathLike)) else "timeline"
    cols = read_columns(timeline)
    _need(cols, ("end_ms", "kv_blocks_used", "running", "waiting"), "replay timeline", src)
    series = _series(cols)[:max_series]
    pools = _series_pools(cols, series, num_gpu_blocks)
    used_all = np.asarray(cols["kv_blocks_used"], dtype=np.float64)
    peaks = [float(np.max(used_all[m], initial=0.0)) for _, m in series]
    # as a share of the pool (with the pool's line at 100 %) when the replay fills a good part of it; a pool
    # it hardly touches would squash the use to the floor: then use in blocks, the pool named in a note
    percent = all(pools) and max((pk / pl for pk, pl in zip(peaks, pools)), default=0.0) >= POOL_LINE_MIN_SHARE
    fig, axes = _figure(12.5, 4.8, 2)
    ax, ax2 = axes
    cmap = colormaps["tab10"]
    passes = 0
    drawn = 0
    for j, ((label, m), pool) in enumerate(zip(series, pools)):
        colour = cmap(j % 10)
        t = np.asarray(cols["end_ms"], dtype=np.float64)[m] / 1000.0
        used = used_all[m]
        passes += t.size
        tag = "" if len(series) == 1 else f"{label}: "
        ax.step(t, 100.0 * used / pool if percent else used, where="post", lw=1.0, color=colour, label=f"{tag}KV blocks in use")
        if pool and (percent or pool * POOL_LINE_MIN_SHARE <= max(peaks)):
            level = 100.0 if percent else pool
            ax.axhline(level, color=colour, ls="--", lw=1.1, label=f"{tag}KV pool: {pool:,} blocks")
            drawn += 1
        elif pool:
            ax.text(0.99, 0.97 - 0.06 * j, f"{tag}KV pool: {pool:,} blocks (off the scale: peak use {100.0 * peaks[j] / pool:.1f} %)",
                    transform=ax.transAxes, ha="right", va="top", fontsize=7, color=colour)
        ax2.step(t, np.asarray(cols["running"])[m], where="post", lw=1.0, color=colour, label=f"{tag}running (admitted)")
        ax2.step(t, np.asarray(cols["waiting"])[m], where="post", lw=1.0, ls="--", color=colour, alpha=0.7, label=f"{tag}waiting (queued)")
        if "preemptions" in cols:
            pre = np.asarray(cols["preemptions"])[m] > 0
            if pre.any():
                ax2.plot(t[pre], np.asarray(cols["running"])[m][pre], "x", color="#cb181d", ms=4, label=f"{tag}pass with a preemption")
    if percent:
        ax.set_ylabel("KV pool in use (% of the worker's blocks)")
        ax.set_ylim(0, 108)
    else:
        ax.set_ylabel("KV blocks in use")
        ax.set_ylim(bottom=0)
    ax.set_xlabel("simulated time (s)")
    pool_note = "dashed: the KV pool" if drawn else ("the KV pool: top right" if any(pools) else "pool size unknown: --num-gpu-blocks")
    ax.set_title(f"KV cache use after each scheduler pass ({pool_note})", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    ax2.set_xlabel("simulated time (s)")
    ax2.set_ylabel("requests")
    ax2.set_title("Requests running and waiting", fontsize=9)
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=7)
    fig.suptitle(title or f"Replay timeline over {passes} scheduler passes", fontsize=10)
    return _save(fig, path)
