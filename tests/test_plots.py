"""Figures: each plot function, the support-grid evaluation, the Pareto mask and the ``jaxsim plot`` CLI."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from jaxsim import plots
from jaxsim.errors import JaxsimError, QueryError
from jaxsim.kernels import status as st
from jaxsim.kernels.batched import support_grid
from jaxsim.sweep.frontier import pareto_mask

TABLES = Path(__file__).parent / "goldens" / "public" / "tables"
AR = TABLES / "ar_core"
SD = TABLES / "sd_k3"


def assert_png(path: Path, min_bytes: int = 8_000) -> None:
    """A real PNG of a drawn figure: signature, sane size, and more than one colour."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 400 and height >= 300, (width, height)
    assert len(data) >= min_bytes, len(data)
    import matplotlib.image as mpimg

    rgb = (mpimg.imread(path)[..., :3] * 255).astype(np.uint32)
    colours = np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2])
    assert colours.size > 16, colours.size


@pytest.fixture(scope="module")
def ar_view():
    return plots.load_view(AR)


@pytest.fixture(scope="module")
def sd_view():
    return plots.load_view(SD)


def sweep_columns(n: int = 300, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    per_user = rng.uniform(5, 120, n)
    per_gpu = 4000.0 / (1 + per_user / 40) * rng.uniform(0.5, 1.0, n)
    per_gpu[:7] = np.nan  # outside measured support
    return {
        plots.SWEEP_PER_USER: per_user,
        plots.SWEEP_PER_GPU: per_gpu,
        plots.SWEEP_FEASIBLE: per_user > 30,
        "tp": rng.choice([1, 2, 4], n),
        "workload": rng.choice(["chat", "long"], n),
        "nextn": rng.integers(0, 4, n),
    }


def replay_columns(n: int = 200, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ttft = rng.gamma(2.0, 40.0, n)
    tpot = rng.normal(12.0, 1.5, n)
    return {
        plots.REPLAY_TTFT: ttft,
        plots.REPLAY_TPOT: tpot,
        plots.REPLAY_E2E: ttft + 200 * tpot,
        plots.REPLAY_TERMINAL: np.where(rng.uniform(size=n) > 0.05, "completed", "unfinished"),
        "config": np.repeat([0, 1], n // 2),
    }


# --- support grid: the kernels' answers, nothing recomputed --------------------------------------


def test_support_grid_marks_measured_points_exact(ar_view):
    cell = ar_view.cell
    pick = np.arange(0, cell.num_decode_rows, 7)
    for i in pick:
        lat, code = support_grid(ar_view.table, [cell.decode_batch[i]], [cell.decode_kv[i]])
        assert code[0, 0] == st.EXACT
        assert lat[0, 0] == cell.decode_latency_ms[i]


def test_support_grid_nan_exactly_where_refused(sd_view):
    b = np.arange(1, 70)
    k = np.linspace(0, 1.2 * sd_view.table.max_decode_kv, 50)
    lat, code = support_grid(sd_view.table, b, k)
    assert lat.shape == code.shape == (b.size, k.size)
    refused = code >= st.FIRST_UNSUPPORTED
    assert refused.any() and (~refused).any()
    assert np.array_equal(np.isnan(lat), refused)
    # beyond the largest measured KV nothing is answered (no extrapolation)
    assert np.all(code[:, k > sd_view.table.max_decode_kv] >= st.FIRST_UNSUPPORTED)


def test_support_summary_counts_every_cell(sd_view):
    _, code = support_grid(sd_view.table, np.arange(1, 40), np.linspace(0, 40000, 30))
    rows = plots.support_summary(code)
    assert sum(r[2] for r in rows) == code.size
    assert abs(sum(r[3] for r in rows) - 1.0) < 1e-12
    assert [r[2] for r in rows] == sorted((r[2] for r in rows), reverse=True)
    for c, name, _, _, why in rows:
        assert name == st.name(c)
        assert (why == st.EXPLAIN[c]) if c >= st.FIRST_UNSUPPORTED else why.startswith("answered")


# --- plot functions --------------------------------------------------------------------------------


def test_profile_figures(tmp_path, ar_view, sd_view):
    for view, tag in ((ar_view, "ar"), (sd_view, "sd")):
        assert_png(plots.plot_decode_curves(view, tmp_path / f"{tag}_curves.png"))
        assert_png(plots.plot_support_map(view, tmp_path / f"{tag}_support.png"))
        assert_png(plots.plot_prefill_surface(view, tmp_path / f"{tag}_prefill.png"))


def test_prefill_surface_refuses_unmeasured_batch(tmp_path, ar_view):
    with pytest.raises(QueryError, match="prefill batch 77 is not measured"):
        plots.plot_prefill_surface(ar_view, tmp_path / "p.png", batch=77)
    assert not (tmp_path / "p.png").exists()


def test_result_figures_from_mappings_and_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    assert_png(plots.plot_pareto(sweep_columns(), tmp_path / "pareto.png"))
    assert_png(plots.plot_latency_cdf(replay_columns(), tmp_path / "cdf.png"))
    pq.write_table(pa.table(sweep_columns()), tmp_path / "sweep.parquet")
    assert_png(plots.plot_pareto(tmp_path / "sweep.parquet", tmp_path / "pareto2.png"))


def _drawn_figure(monkeypatch, call):
    """Run a plot function and return the matplotlib Figure it saved (its artists hold the plotted data)."""
    saved = []
    real_save = plots._save

    def keep(fig, path):
        saved.append(fig)
        return real_save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    out = call()
    assert len(saved) == 1
    assert_png(out)
    return saved[0]


def _non_dominated(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Brute force, independent of plots.pareto_mask: no other point is at least as good in both and better in one."""
    on = np.zeros(x.shape, bool)
    for i in range(x.size):
        if not (np.isfinite(x[i]) and np.isfinite(y[i])):
            continue
        dominated = (x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i]))
        on[i] = not dominated.any()
    return on


def _frontier_lines(fig) -> dict[str, np.ndarray]:
    (ax,) = fig.axes
    lines = {}
    for line in ax.get_lines():
        if line.get_label().startswith("SLA-feasible Pareto frontier"):
            lines[line.get_label()] = np.column_stack([line.get_xdata(), line.get_ydata()]).astype(np.float64)
    return lines


def _expected_frontier(cols, group_mask) -> np.ndarray:
    x = np.asarray(cols[plots.SWEEP_PER_USER], np.float64)
    y = np.asarray(cols[plots.SWEEP_PER_GPU], np.float64)
    sel = group_mask & np.asarray(cols[plots.SWEEP_FEASIBLE], bool) & np.isfinite(x) & np.isfinite(y)
    on = _non_dominated(np.where(sel, x, np.nan), np.where(sel, y, np.nan))
    o = np.flatnonzero(on)[np.argsort(x[on])]
    return np.column_stack([x[o], y[o]])


def test_pareto_plot_draws_the_computed_frontier(tmp_path, monkeypatch):
    cols = sweep_columns(n=400, seed=5)
    del cols["workload"]
    fig = _drawn_figure(monkeypatch, lambda: plots.plot_pareto(cols, tmp_path / "one.png"))
    want = _expected_frontier(cols, np.ones(400, bool))
    assert 2 <= len(want) < 400
    lines = _frontier_lines(fig)
    assert list(lines) == [f"SLA-feasible Pareto frontier ({len(want)})"], list(lines)
    np.testing.assert_array_equal(lines[f"SLA-feasible Pareto frontier ({len(want)})"], want)
    # the scatter layers hold every drawable point once: SLA misses grey, SLA hits blue, NaN (unsupported) none
    (ax,) = fig.axes
    offsets = {c.get_label(): c.get_offsets() for c in ax.collections}
    finite = np.isfinite(cols[plots.SWEEP_PER_GPU])
    assert len(offsets["meets the SLA"]) == int((cols[plots.SWEEP_FEASIBLE] & finite).sum())
    assert len(offsets["misses the SLA"]) == int((~cols[plots.SWEEP_FEASIBLE] & finite).sum())


def test_pareto_one_frontier_per_workload(tmp_path, monkeypatch):
    cols = sweep_columns(n=400, seed=5)
    groups = np.asarray(cols["workload"])
    fig = _drawn_figure(monkeypatch, lambda: plots.plot_pareto(cols, tmp_path / "all.png"))
    lines = _frontier_lines(fig)
    assert len(lines) == 2
    for g in ("chat", "long"):
        want = _expected_frontier(cols, groups == g)
        np.testing.assert_array_equal(lines[f"SLA-feasible Pareto frontier: {g} ({len(want)})"], want)
    fig = _drawn_figure(monkeypatch, lambda: plots.plot_pareto(cols, tmp_path / "chat.png", workload="chat"))
    want = _expected_frontier(cols, groups == "chat")
    (only,) = _frontier_lines(fig).values()
    np.testing.assert_array_equal(only, want)
    with pytest.raises(QueryError, match="no workload 'nope'.*chat, long"):
        plots.plot_pareto(cols, tmp_path / "nope.png", workload="nope")


def test_large_sweep_is_thinned_but_keeps_the_frontier(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = sweep_columns(n=5000, seed=3)
    ok = cols[plots.SWEEP_FEASIBLE] & np.isfinite(cols[plots.SWEEP_PER_GPU])
    front = pareto_mask(np.where(ok, cols[plots.SWEEP_PER_USER], np.nan), np.where(ok, cols[plots.SWEEP_PER_GPU], np.nan))
    cols[plots.SWEEP_ON_PARETO] = front
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table(cols), path, row_group_size=700)
    read = plots._read_sweep(path, str(path), max_points=500)
    assert 500 <= read[plots.SWEEP_PER_GPU].size <= 500 + 8 + int(front.sum())
    assert read[plots.SWEEP_ON_PARETO].sum() == front.sum()
    assert set(read) <= {
        plots.SWEEP_PER_USER,
        plots.SWEEP_PER_GPU,
        plots.SWEEP_FEASIBLE,
        plots.SWEEP_ON_PARETO,
        plots.SWEEP_WORKLOAD,
        *plots.SWEEP_LABEL_COLUMNS,
    }
    fig = _drawn_figure(monkeypatch, lambda: plots.plot_pareto(path, tmp_path / "big.png", max_points=500))
    lines = _frontier_lines(fig)  # the recorded on_pareto rows, all of them, drawn per workload
    groups = np.asarray(cols["workload"])
    assert sum(len(v) for v in lines.values()) == int(front.sum())
    for g in ("chat", "long"):
        sel = front & (groups == g)
        o = np.flatnonzero(sel)[np.argsort(cols[plots.SWEEP_PER_USER][sel])]
        want = np.column_stack([cols[plots.SWEEP_PER_USER][o], cols[plots.SWEEP_PER_GPU][o]])
        np.testing.assert_array_equal(lines[f"SLA-feasible Pareto frontier: {g} ({len(o)})"], want)


def _gpu_sweep(n: int = 240, seed: int = 4) -> dict[str, np.ndarray]:
    """A multi-GPU, multi-TP, aggregated + disaggregated, two-workload sweep table."""
    cols = sweep_columns(n, seed)
    rng = np.random.default_rng(seed)
    prof = rng.choice(["h100", "h200", "b200"], n)
    cols.update(profile=prof, system=np.char.add(prof, "_sxm"), tp=rng.choice([2, 4, 8], n),
                mode=rng.choice(["aggregated", "disaggregated"], n), prefill_workers=np.ones(n, int), decode_workers=np.ones(n, int),
                concurrency_target=rng.choice([1, 8, 64], n))
    return cols


def test_pareto_colours_by_gpu_marks_by_tp_and_hollows_disaggregated(tmp_path, monkeypatch):
    """Observed (issue 28): points were not coloured by profile and labels named no GPU. Now colour = profile
    (GPU named in the legend), marker = TP, hollow = disaggregated; frontier labels name the GPU."""
    cols = _gpu_sweep()
    fig = _drawn_figure(monkeypatch, lambda: plots.plot_pareto(cols, tmp_path / "gpus.png"))
    (ax,) = fig.axes
    feas = np.asarray(cols[plots.SWEEP_FEASIBLE]) & np.isfinite(cols[plots.SWEEP_PER_GPU])
    layers = [c for c in ax.collections if c.get_label() != "misses the SLA"]
    assert sum(len(c.get_offsets()) for c in layers) == int(feas.sum())
    edge = {c.get_label(): tuple(np.round(c.get_edgecolor()[0], 3)) for c in layers}
    by_profile = {}
    for label, colour in edge.items():
        by_profile.setdefault(label.split()[0], set()).add(colour)
    assert all(len(v) == 1 for v in by_profile.values()) and len({next(iter(v)) for v in by_profile.values()}) == 3
    for c in layers:  # hollow exactly when disaggregated
        assert (len(c.get_facecolor()) == 0 or c.get_facecolor()[0][3] == 0) == c.get_label().endswith("disaggregated"), c.get_label()
    legends = [ch for ch in ax.get_children() if type(ch).__name__ == "Legend"]
    texts = {t.get_text() for lg in legends for t in lg.get_texts()}
    assert {"h100", "h200", "b200", "TP2", "TP4", "TP8", "aggregated (filled)", "disaggregated (hollow)"} <= texts
    marker_of = {h.get_label(): h.get_marker() for lg in legends for h in lg.legend_handles if h.get_label().startswith("TP")}
    assert len(set(marker_of.values())) == 3
    styles = {line.get_label(): line.get_linestyle() for line in ax.get_lines() if line.get_label().startswith("SLA-feasible Pareto")}
    assert len(styles) == 2 and len(set(styles.values())) == 2  # workloads told apart by line style
    # few frontier points: each is annotated with its GPU, TP, mode and concurrency
    one = {k: v[:40] for k, v in _gpu_sweep(seed=9).items()}
    fig = _drawn_figure(monkeypatch, lambda: plots.plot_pareto(one, tmp_path / "few.png", workload="chat"))
    notes = [t.get_text() for t in fig.axes[0].texts]
    assert notes and all(n.split()[0] in ("H100", "H200", "B200") and " TP" in n and " c=" in n for n in notes), notes


def test_kv_timeline_draws_the_pool(tmp_path, monkeypatch):
    """Observed (issue 28): the KV timeline had no line for the pool size."""
    n = 200
    used = (np.arange(n) % 50) * 10
    tl = {"end_ms": np.arange(n) * 10.0, "kv_blocks_used": used, "running": used // 10, "waiting": np.zeros(n, int),
          "kv_pool_blocks": np.full(n, 600)}
    fig = _drawn_figure(monkeypatch, lambda: plots.plot_kv_timeline(tl, tmp_path / "pool.png"))
    ax = fig.axes[0]
    (pool,) = [ln for ln in ax.get_lines() if ln.get_label() == "KV pool: 600 blocks"]
    assert set(pool.get_ydata()) == {100.0} and "% of the worker's blocks" in ax.get_ylabel()  # use as a share of the pool
    # a pool the replay hardly touches: named, not drawn as a line squashing the use to the floor
    tl["kv_pool_blocks"] = np.full(n, 100_000)
    fig = _drawn_figure(monkeypatch, lambda: plots.plot_kv_timeline(tl, tmp_path / "big.png"))
    ax = fig.axes[0]
    assert not [ln for ln in ax.get_lines() if "KV pool" in ln.get_label()]
    assert any("KV pool: 100,000 blocks (off the scale: peak use 0.5 %)" in t.get_text() for t in ax.texts)
    # two workers with their own pools (prefill and decode): one pool line each, in its worker's colour
    two = {k: np.concatenate([v, v]) for k, v in tl.items()}
    two["kv_pool_blocks"] = np.r_[np.full(n, 600), np.full(n, 900)]
    two["worker"] = np.repeat([0, 1], n)
    fig = _drawn_figure(monkeypatch, lambda: plots.plot_kv_timeline(two, tmp_path / "two.png"))
    lines = {ln.get_label(): ln.get_color() for ln in fig.axes[0].get_lines()}
    assert lines["worker 0: KV pool: 600 blocks"] == lines["worker 0: KV blocks in use"]
    assert lines["worker 1: KV pool: 900 blocks"] == lines["worker 1: KV blocks in use"] != lines["worker 0: KV blocks in use"]


def test_kv_timeline(tmp_path):
    n = 300
    rng = np.random.default_rng(2)
    running = np.clip(np.cumsum(rng.integers(-1, 2, n)), 0, None)
    timeline = {
        "end_ms": np.cumsum(rng.uniform(5, 15, n)),
        "kv_blocks_used": running * 40,
        "running": running,
        "waiting": np.clip(running - 5, 0, None),
        "preemptions": (rng.uniform(size=n) > 0.97).astype(np.int64),
    }
    assert_png(plots.plot_kv_timeline(timeline, tmp_path / "tl.png", num_gpu_blocks=int(running.max() * 40)))
    assert_png(plots.plot_kv_timeline(timeline, tmp_path / "tl2.png"))
    two = {k: np.concatenate([v, v]) for k, v in timeline.items()}
    two["config"] = np.repeat(["a", "b"], n)
    assert [label for label, _ in plots._series(two)] == ["config a", "config b"]
    assert_png(plots.plot_kv_timeline(two, tmp_path / "tl4.png"))
    with pytest.raises(QueryError, match="replay timeline"):
        plots.plot_kv_timeline(sweep_columns(), tmp_path / "tl3.png")


def test_cdf_of_a_replay_without_completed_requests_is_refused(tmp_path):
    cols = replay_columns(n=20)
    cols[plots.REPLAY_TERMINAL] = np.full(20, "unfinished")
    cols[plots.REPLAY_STATUS] = np.full(20, "stopped: pass lookup unsupported:prefill_batch_not_measured")
    with pytest.raises(QueryError, match="no completed requests to plot .stopped outside support: prefill_batch_not_measured"):
        plots.plot_latency_cdf(cols, tmp_path / "cdf.png")
    assert not (tmp_path / "cdf.png").exists()


def test_result_figures_reject_wrong_tables(tmp_path):
    with pytest.raises(QueryError, match="missing column"):
        plots.plot_pareto(replay_columns(), tmp_path / "x.png")
    with pytest.raises(QueryError, match="a sweep result table"):
        plots.plot_latency_cdf(sweep_columns(), tmp_path / "x.png")
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(QueryError, match="not a readable parquet"):
        plots.plot_pareto(bad, tmp_path / "x.png")
    with pytest.raises(QueryError, match="use a .png"):
        plots.plot_pareto(sweep_columns(), tmp_path / "x.pdf")
    assert not list(tmp_path.glob("x.*"))


def test_missing_matplotlib_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(JaxsimError) as info:
        plots.plot_pareto(sweep_columns(), tmp_path / "x.png")
    assert str(info.value) == "matplotlib is not installed: pip install -e '.[plot]' (in the jaxsim checkout)"
    from jaxsim.cli.main import app

    r = CliRunner().invoke(app, ["plot", "curves", str(AR), "--output", str(tmp_path / "c.png")])
    assert r.exit_code == 2
    assert r.output.strip() == "error: matplotlib is not installed: pip install -e '.[plot]' (in the jaxsim checkout)"
    assert not list(tmp_path.iterdir())


# --- CLI -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def app():
    from jaxsim.cli.main import app

    return app


def test_cli_profile_plots_and_no_overwrite(tmp_path, app):
    runner = CliRunner()
    out = tmp_path / "support.png"
    r = runner.invoke(app, ["plot", "support", str(SD), "--output", str(out)])
    assert r.exit_code == 0, r.output
    assert_png(out)
    before = out.read_bytes()
    r = runner.invoke(app, ["plot", "curves", str(SD), "--output", str(out)])
    assert r.exit_code == 2
    assert "exists; pass --force" in r.output
    assert out.read_bytes() == before
    r = runner.invoke(app, ["plot", "curves", str(SD), "--output", str(out), "--force", "--quiet"])
    assert r.exit_code == 0 and r.output == ""
    assert out.read_bytes() != before
    assert_png(out)
    r = runner.invoke(app, ["plot", "prefill", str(AR), "--batch", "2", "--output", str(tmp_path / "pre.png")])
    assert r.exit_code == 0, r.output
    assert_png(tmp_path / "pre.png")


def test_cli_result_plots(tmp_path, app):
    import pyarrow as pa
    import pyarrow.parquet as pq

    runner = CliRunner()
    pq.write_table(pa.table(replay_columns()), tmp_path / "replay.parquet")
    pq.write_table(pa.table(sweep_columns()), tmp_path / "sweep.parquet")
    r = runner.invoke(app, ["plot", "cdf", str(tmp_path / "replay.parquet"), "-o", str(tmp_path / "cdf.png")])
    assert r.exit_code == 0, r.output
    assert_png(tmp_path / "cdf.png")
    n = 50
    pq.write_table(pa.table({"end_ms": np.arange(n) * 10.0, "kv_blocks_used": np.arange(n) % 7 * 9, "running": np.arange(n) % 7,
                             "waiting": np.arange(n) % 3}), tmp_path / "tl.parquet")
    r = runner.invoke(app, ["plot", "timeline", str(tmp_path / "tl.parquet"), "--num-gpu-blocks", "60", "-o", str(tmp_path / "tl.png")])
    assert r.exit_code == 0, r.output
    assert_png(tmp_path / "tl.png")
    r = runner.invoke(app, ["plot", "pareto", str(tmp_path / "sweep.parquet"), "-o", str(tmp_path / "p.png")])
    assert r.exit_code == 0, r.output
    assert_png(tmp_path / "p.png")
    r = runner.invoke(app, ["plot", "pareto", str(tmp_path / "sweep.parquet"), "--workload", "long", "-o", str(tmp_path / "q.png")])
    assert r.exit_code == 0, r.output
    assert_png(tmp_path / "q.png")


@pytest.mark.parametrize(
    "args, message",
    [
        (["plot", "pareto", "{tmp}/nope.parquet", "-o", "{tmp}/a.png"], "no such result file"),
        (["plot", "cdf", "{tmp}/sweep.parquet", "-o", "{tmp}/a.png"], "a sweep result table"),
        (["plot", "curves", str(AR), "-o", "{tmp}/a.jpg"], "use a .png"),
        (["plot", "curves", str(AR), "--tp", "8", "-o", "{tmp}/a.png"], "no deployment matches tp=8"),
        (["plot", "curves", "{tmp}/no-such-profile", "-o", "{tmp}/a.png"], "no-such-profile"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, app, args, message):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(sweep_columns()), tmp_path / "sweep.parquet")
    r = CliRunner().invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.output
    assert not (tmp_path / "a.png").exists()


@pytest.mark.slow
def test_cli_subprocess(tmp_path):
    out = tmp_path / "curves.png"
    cmd = [sys.executable, "-m", "jaxsim", "plot", "curves", str(AR), "--output", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stdout
    assert_png(out)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "pass --force" in r.stderr
