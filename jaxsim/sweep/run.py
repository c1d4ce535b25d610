"""Streaming sweep runner: fixed-size chunks, sharded over local devices, resumable, bounded memory.

Each chunk of configurations is decoded from its index range (:class:`~jaxsim.sweep.spec.SweepPlan`),
evaluated by ONE ahead-of-time compiled :func:`~jaxsim.sweep.evaluate.evaluate_chunk` with the config
axis split over every local device (``NamedSharding`` over a 1-D mesh), and written as its own Arrow IPC
file in ``<output>.work/``. A rerun after a kill skips the finished chunks whose checksums match, if
the spec and every input are unchanged (:mod:`jaxsim.sweep.resume`). When all chunks exist they
are streamed into the final parquet (and CSV) with an ``on_pareto`` column; the result is byte-identical
however many times the sweep was interrupted. Memory is bounded by the chunk size: only the per-chunk
Pareto candidates and top rows are kept.

Multi-host: after ``jax.distributed.initialize()`` every process evaluates the chunks k with
k mod process_count == process_index into a shared work directory; process 0 then merges
(``docs/sweep.md``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

import jaxsim
from jaxsim._jax import compile_cached, ensure_x64, jit_x64
from jaxsim.cost import usd_per_million_tokens
from jaxsim.devices import batch_sharding, replicated
from jaxsim.errors import JaxsimError
from jaxsim.kernels import status as st
from jaxsim.kernels.buckets import pow2_bucket
from jaxsim.kernels.rounds import stack_round_tables
from jaxsim.outputs import MARKER, atomic_file, is_jaxsim_dir, write_marker
from jaxsim.progress import ProgressLines
from jaxsim.sla import LATENCY_KEYS
from jaxsim.sweep import evaluate as ev
from jaxsim.sweep import report
from jaxsim.sweep import resume as rs
from jaxsim.sweep.frontier import pareto_mask
from jaxsim.sweep.replayed import METHODS, PointReplays
from jaxsim.sweep.spec import SpecError, SweepPlan, SweepSpec, load_spec, plan_sweep

DEFAULT_CHUNK_SIZE = 1 << 16
REPLAY_CHUNK_SIZE = 4096
"""At most this many configs per chunk when points are evaluated by replay (each keeps its requests until
its chunk is written)."""
MIN_CHUNK_SIZE = 256
WORK_SUFFIX = ".work"
FORMAT = "jaxsim-sweep-v1"
METRIC_COLUMNS = (
    "status", "status_name", "limit", "concurrency", "kv_preemption", "decode_batch", "round_ms", "pass_ms", "prefill_chunks",
    "prefill_queue_ms", "rounds", "tokens_per_round", "request_rate_per_s", "output_tokens_per_s_per_gpu", "tokens_per_s_per_user",
    "total_output_tokens_per_s", *LATENCY_KEYS, "sla_ok",
)
COST_COLUMNS = ("usd_per_gpu_hour", "usd_per_hour_per_unit", "usd_per_1m_output_tokens")
"""Per row: the GPU's price (bundled list price or the spec's / --price), one serving unit's cost per hour,
and US dollars per million output tokens at the row's throughput (NaN without a price or a throughput)."""
GOODPUT_COLUMN = "goodput_req_per_s"
"""Per row: the largest SLA-feasible request rate of one serving unit of the row's deployment (binding) on
its workload, over the swept concurrencies (NaN when no concurrency meets the SLA)."""
_STATUS_DICT = pa.array(st.name_table(), pa.string())
_LIMIT_DICT = pa.array(list(ev.LIMIT_NAMES), pa.string())
X_COL = "tokens_per_s_per_user"
Y_COL = "output_tokens_per_s_per_gpu"


class OutputExistsError(JaxsimError):
    """The results file (or a foreign work directory) exists and --force was not given."""


@dataclass
class SweepResult:
    """What a finished (or partial, on a non-zero process) sweep produced."""

    output: Path
    csv: Path | None
    summary: dict
    top: pa.Table
    pareto: pa.Table
    compile_s: float
    eval_s: float
    wall_s: float
    plan_s: float
    finalize_s: float
    chunks_run: int
    chunks_reused: int
    num_devices: int
    finished: bool = True
    plan: SweepPlan | None = field(default=None, repr=False)
    replay_timings: dict = field(default_factory=dict)  # evaluate = "replay": compile_s, run_s, compilations, ...
    best: list[dict] = field(default_factory=list)  # best SLA-feasible row per (workload, profile, TP): report.best_per_profile_tp
    speculation: list = field(default_factory=list)  # report.SpeculationVerdict per speculative variant with a K=0 twin

    @property
    def configs_per_s(self) -> float:
        n = self.summary.get("configs_evaluated_this_run", 0)
        return n / self.eval_s if self.eval_s > 0 else float("nan")


# ----------------------------------------------------------------------------------------------------
# device placement


def chunk_size_for(plan: SweepPlan, requested: int, num_devices: int) -> int:
    """Effective chunk size: the requested one, shrunk (power of two ≥ 256) for small sweeps, a multiple
    of the device count."""
    if requested < 1:
        raise SpecError(f"chunk size must be >= 1 (got {requested})")
    largest = max((hi - lo for lo, hi, *_ in plan.groups), default=1)
    size = min(pow2_bucket(min(requested, largest), MIN_CHUNK_SIZE), max(requested, 1))
    return max(num_devices, -(-size // num_devices) * num_devices)


class Evaluator:
    """The sweep's single compiled chunk function, with its replicated constants placed once."""

    def __init__(self, plan: SweepPlan, chunk_size: int, devices: Sequence | None = None):
        self.plan = plan
        self.size = chunk_size
        self.rep = replicated(devices)
        self.split = batch_sharding(devices)
        put = lambda x: jax.device_put(x, self.rep)  # noqa: E731
        self.stack = put(stack_round_tables(plan.tables)) if plan.tables else None
        self.rounds = put(plan.rounds_table()) if plan.tables else None
        self.sla = put(ev.SLABounds.of(plan.spec.sla))
        self.compiled = None
        self.compile_s = 0.0
        self.compiles = 0

    def _args(self, group: int, idx: np.ndarray):
        _, _, p, d, disagg = self.plan.groups[group]
        cfg = jax.device_put(self.plan.inputs(idx), self.split)
        scal = [jax.device_put(v, self.rep) for v in (np.int64(p), np.int64(d), np.bool_(disagg))]
        return (self.stack, *scal, self.rounds, self.sla, cfg)

    def dispatch(self, group: int, start: int, stop: int):
        """Start evaluating configs [start, stop) (padded to the chunk size); returns device arrays."""
        ensure_x64()  # before the inputs are put on the device (the compiled executable is called directly)
        idx = np.arange(start, stop, dtype=np.int64)
        idx = np.concatenate([idx, np.full(self.size - idx.size, stop - 1, np.int64)])
        args = self._args(group, idx)
        if self.compiled is None:
            t0 = time.perf_counter()
            self.compiled = compile_cached("sweep-evaluate-chunk", jit_x64(ev.evaluate_chunk), args)
            self.compile_s = time.perf_counter() - t0
            self.compiles += 1
        return self.compiled(*args)


# ----------------------------------------------------------------------------------------------------
# arrow tables


def _dict_col(codes: np.ndarray, labels: Sequence[str] | pa.Array) -> pa.DictionaryArray:
    dictionary = labels if isinstance(labels, pa.Array) else pa.array(list(labels), pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), dictionary)


def per_worker(met: dict, cols: dict, method: np.ndarray | None) -> dict:
    """An attention-DP worker's metrics from one rank's (each rank an engine at 1/dp of the concurrency, every rank
    alike): the reached concurrency x dp (at most the target) and, for steady-state rows (one engine), the request
    rate x dp; throughput per GPU and latencies are the rank's (a replay already ran every rank)."""
    dp = np.asarray(cols["dp"], np.int64)
    if not np.any(dp > 1):
        return met
    steady = np.ones(dp.shape, bool) if method is None else np.asarray(method)[: dp.size] == 0
    out = dict(met)
    conc = np.asarray(met["concurrency"])
    out["concurrency"] = np.minimum(conc * dp, cols["concurrency_target"]).astype(conc.dtype)
    out["request_rate_per_s"] = np.where(steady, met["request_rate_per_s"] * dp, met["request_rate_per_s"])
    return out


def chunk_table(plan: SweepPlan, start: int, stop: int, m: ev.Metrics | dict, method: np.ndarray | None = None) -> pa.Table:
    """Inputs + metrics (a batched :class:`~jaxsim.sweep.evaluate.Metrics`, or its columns) of configs
    [start, stop) as an arrow table (label columns dictionary-encoded);
    ``method``: per row, the index into :data:`~jaxsim.sweep.replayed.METHODS` of the evaluation that
    produced it (default: all steady state)."""
    n = stop - start
    cols = plan.input_columns(np.arange(start, stop, dtype=np.int64))
    out: dict[str, pa.Array] = {}
    for k, v in cols.items():
        out[k] = _dict_col(v, plan.labels[k]) if k in ("profile", "data_source", "system", "mode", "acceptance", "workload") else pa.array(v)
    met = {k: np.asarray(v)[:n] for k, v in (m.items() if isinstance(m, dict) else ((k, getattr(m, k)) for k in m.__dataclass_fields__))}
    met = per_worker(met, cols, method)
    out["status"] = pa.array(met["status"].astype(np.int32))
    out["status_name"] = _dict_col(met["status"], _STATUS_DICT)
    out["limit"] = _dict_col(met["limit"], _LIMIT_DICT)
    out["kv_preemption"] = pa.array(np.asarray(met["kv_preemption"]).astype(bool))
    for k in METRIC_COLUMNS:
        if k in met and k not in out:
            out[k] = pa.array(met[k])
    out["total_output_tokens_per_s"] = pa.array(met["output_tokens_per_s_per_gpu"] * cols["gpus"] * cols["replicas"])
    out["sla_ok"] = pa.array(met["sla_ok"].astype(bool))
    out["method"] = _dict_col(np.zeros(n, np.int32) if method is None else np.asarray(method)[:n], METHODS)
    price = plan.gpu_hour_prices()[cols["system"]] if plan.labels["system"] else np.full(n, np.nan)
    out["usd_per_gpu_hour"] = pa.array(price)
    out["usd_per_hour_per_unit"] = pa.array(price * cols["gpus"])
    out["usd_per_1m_output_tokens"] = pa.array(usd_per_million_tokens(price, met["output_tokens_per_s_per_gpu"]))
    return pa.table(out)


def goodput_per_s(config_id: np.ndarray, sla_ok: np.ndarray, rate: np.ndarray, inner: int, num_workloads: int) -> np.ndarray:
    """Per row: the largest ``rate`` among the SLA-feasible rows of its (binding, workload) in these rows
    (NaN when none is feasible). Config i is binding i // inner, workload i % num_workloads."""
    key = (config_id // inner) * num_workloads + config_id % num_workloads
    uniq, inv = np.unique(key, return_inverse=True)
    best = np.full(uniq.size, -np.inf)
    np.maximum.at(best, inv, np.where(sla_ok & np.isfinite(rate), rate, -np.inf))
    out = best[inv]
    return np.where(np.isfinite(out), out, np.nan)


def top_mask(y: np.ndarray, ids: np.ndarray, groups: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` largest y per group (ties: smallest id)."""
    order = np.lexsort((ids, -y, groups))
    g = groups[order]
    first = np.r_[0, np.flatnonzero(g[1:] != g[:-1]) + 1]
    rank = np.arange(g.size) - np.repeat(first, np.diff(np.r_[first, g.size]))
    keep = np.zeros(y.size, bool)
    keep[order[rank < n]] = True
    return keep


def _xyg(t: pa.Table):
    return (
        t.column(X_COL).to_numpy(),
        t.column(Y_COL).to_numpy(),
        t.column("config_id").to_numpy(),
        t.column("workload").combine_chunks().indices.to_numpy(),
    )


def _best_rows(t: pa.Table, top: int) -> pa.Table:
    """A chunk's Pareto candidates and top rows per workload (SLA-feasible only): all finalization needs."""
    ok = t.column("sla_ok").to_numpy(zero_copy_only=False)
    sub = t.filter(pa.array(ok))
    if not sub.num_rows:
        return sub
    x, y, ids, g = _xyg(sub)
    return sub.filter(pa.array(pareto_mask(x, y, ids, g) | top_mask(y, ids, g, top)))


# ----------------------------------------------------------------------------------------------------
# files


def work_dir_for(output: Path) -> Path:
    return output.with_name(output.name + WORK_SUFFIX)


def _manifest(plan: SweepPlan, size: int, top: int) -> dict:
    return {
        "format": FORMAT,
        "jaxsim": jaxsim.__version__,
        "spec_digest": plan.spec.digest(),
        "inputs_digest": rs.plan_digest(plan),
        "chunk_size": size,
        "configs": plan.num_configs,
        "top": top,
    }


def _read_manifest(mpath: Path) -> dict | None:
    try:
        return json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _is_sweep_work_dir(work: Path, old: dict | None) -> bool:
    """Written by jaxsim: its marker, or (work directories of earlier versions) a sweep manifest."""
    return is_jaxsim_dir(work) or (not work.is_symlink() and isinstance(old, dict) and old.get("format") == FORMAT)


def _prepare_work_dir(work: Path, manifest: dict, force: bool) -> None:
    """Reuse ``work`` only when its manifest (the resume key: spec, inputs, code, chunk size, top) is this
    run's; otherwise refuse in one line, or with ``force`` discard it (only if jaxsim wrote it)."""
    mpath = work / "manifest.json"
    if os.path.lexists(work):
        old = _read_manifest(mpath)
        if not _is_sweep_work_dir(work, old):
            raise OutputExistsError(f"{work}: exists and is not a sweep work directory jaxsim wrote (no {MARKER} file); "
                                    "refusing to use or remove it")
        if old != manifest:
            if not force:
                raise OutputExistsError(
                    f"{work}: work directory of a different sweep (the spec, an input profile table, trace or acceptance "
                    "preset, --chunk-size, --top or jaxsim changed); pass --force to discard it and start again"
                )
            shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    if not is_jaxsim_dir(work):
        write_marker(work)
    if not mpath.exists():
        with atomic_file(mpath, "w", encoding="utf-8") as f:
            f.write(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def _chunks_to_run(work: Path, mine: list[int]) -> list[int]:
    """The chunks of ``mine`` not finished intact; a finished chunk whose files no longer match their
    checksums (truncated, edited) is discarded and run again, with one line on stderr."""
    todo = []
    for k in mine:
        if rs.chunk_intact(work, k):
            continue
        if rs.chunk_written(work, k):
            print(f"note: {rs.chunk_path(work, k)}: truncated or changed since it was written; recomputing it", file=sys.stderr)
        rs.discard_chunk(work, k)
        todo.append(k)
    return todo


# ----------------------------------------------------------------------------------------------------
# the run


class _Bar:
    """Sweep progress: a rich bar on a terminal (``"bar"``), plain lines on stderr every 10 s (``"lines"``,
    :class:`~jaxsim.progress.ProgressLines`), or nothing (None)."""

    def __init__(self, kind: str | None, total: int, done: int):
        if kind not in (None, "bar", "lines"):
            raise ValueError(f"progress must be None, 'bar' or 'lines' (got {kind!r})")
        self.kind, self.prog, self.task = kind, None, None
        self.lines = ProgressLines("sweep", total, "configs", done=done) if kind == "lines" else None
        if kind == "bar":
            from rich.console import Console  # noqa: PLC0415
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.prog = Progress(
                TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("configs"),
                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                console=Console(stderr=True), transient=True,
            )
            self.task = self.prog.add_task("sweep", total=total, completed=done, rate="")

    def __enter__(self):
        if self.prog is not None:
            self.prog.__enter__()
        return self

    def __exit__(self, *exc):
        if self.prog is not None:
            self.prog.__exit__(*exc)

    def advance(self, k: int, rate: str) -> None:
        if self.prog is not None:
            self.prog.update(self.task, advance=k, rate=rate)
        elif self.lines is not None:
            self.lines.advance(k, rate)


def _checked_plan(spec: SweepSpec, plan: SweepPlan, strict: bool) -> SweepPlan:
    """``plan``, refused (:class:`SpecError`) when it has nothing to evaluate, or any invalid binding under ``strict``."""
    if strict and plan.invalid:
        raise SpecError(
            f"{spec.source}: {plan.num_invalid_configs} configs in {sum(i.bindings for i in plan.invalid)} invalid bindings "
            f"(--strict); first: {plan.invalid[0].example}"
        )
    if plan.num_configs == 0:
        why = f"; first problem: {plan.invalid[0].example}" if plan.invalid else ""
        raise SpecError(f"{spec.source}: no valid configuration to evaluate{why}")
    return plan


def run_sweep(
    spec: SweepSpec | str | os.PathLike,
    output: str | os.PathLike,
    *,
    csv: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    force: bool = False,
    strict: bool = False,
    top: int = 10,
    progress: str | None = None,
    devices: Sequence | None = None,
    process_index: int = 0,
    process_count: int = 1,
    plan: SweepPlan | None = None,
    on_chunk: Callable[[int], None] | None = None,
) -> SweepResult:
    """Evaluate every valid configuration of ``spec`` into ``output`` (parquet; ``csv``: also ``.csv``).

    Refuses (:class:`OutputExistsError`) to overwrite existing results unless ``force``; with ``strict``
    refuses (:class:`SpecError`) a spec with invalid bindings. ``progress``: ``"bar"`` (a rich bar on
    stderr), ``"lines"`` (a plain line on stderr every 10 s) or None. ``on_chunk(k)`` is called after
    chunk k is written (tests use it to interrupt a run).
    """
    ensure_x64()
    t_wall = time.perf_counter()
    spec = spec if isinstance(spec, SweepSpec) else load_spec(spec)
    output = Path(output)
    csv_path = output.with_suffix(".csv") if csv else None
    for p in (output, csv_path):
        if p is not None and p.exists() and not force:
            raise OutputExistsError(f"{p}: exists; pass --force to overwrite")
    t_plan = time.perf_counter()
    plan = _checked_plan(spec, plan or plan_sweep(spec), strict)
    plan_s = time.perf_counter() - t_plan
    mesh_devices = list(devices or jax.local_devices())
    if spec.evaluate != "steady":
        chunk_size = min(chunk_size, REPLAY_CHUNK_SIZE)
    size = chunk_size_for(plan, chunk_size, len(mesh_devices))
    work = work_dir_for(output)
    _prepare_work_dir(work, _manifest(plan, size, top), force)
    chunks = plan.chunks(size)
    mine = [k for k in range(len(chunks)) if k % process_count == process_index]
    todo = _chunks_to_run(work, mine)
    evaluator = Evaluator(plan, size, mesh_devices)
    replays = PointReplays(plan) if spec.evaluate != "steady" else None
    total = sum(chunks[k][2] - chunks[k][1] for k in mine)
    done0 = total - sum(chunks[k][2] - chunks[k][1] for k in todo)
    t_eval = time.perf_counter()
    evaluated = 0
    with _Bar(progress, total, done0) as bar:
        pending = None
        for k in todo + [None]:
            nxt = None
            if k is not None:
                g, s, e = chunks[k]
                nxt = (k, s, e, evaluator.dispatch(g, s, e))
                if pending is None:
                    t_eval = time.perf_counter()  # configs/s excludes the one compilation
            if pending is not None:
                pk, ps, pe, res = pending
                method = None
                if replays is not None:
                    res, method = replays.metrics(res, ps, pe)
                table = chunk_table(plan, ps, pe, res, method)
                rs.write_chunk(work, pk, table, _best_rows(table, top))
                evaluated += pe - ps
                dt = time.perf_counter() - t_eval
                bar.advance(pe - ps, f"{evaluated / dt:,.0f} configs/s" if dt > 0 else "")
                if on_chunk is not None:
                    on_chunk(pk)
            pending = nxt
    eval_s = time.perf_counter() - t_eval if evaluated else 0.0
    summary = plan.summary()
    summary["configs_evaluated_this_run"] = evaluated
    summary["chunk_size"] = size
    summary["chunks"] = len(chunks)
    base = dict(
        output=output, csv=csv_path, compile_s=evaluator.compile_s, eval_s=eval_s, chunks_run=len(todo),
        chunks_reused=len(mine) - len(todo), num_devices=len(mesh_devices), plan=plan, plan_s=plan_s,
        replay_timings=dict(replays.timings) if replays is not None else {},
    )
    if process_index != 0:
        return SweepResult(summary=summary, top=pa.table({}), pareto=pa.table({}), wall_s=time.perf_counter() - t_wall,
                           finalize_s=0.0, finished=False, **base)
    _wait_for(work, len(chunks))
    t_fin = time.perf_counter()
    top_t, pareto_t, counts = _finalize(plan, work, len(chunks), output, csv_path, top)
    summary.update(counts)
    shutil.rmtree(work, ignore_errors=True)
    best, speculation = report.best_per_profile_tp(output), report.speculation_verdicts(output, plan.profile_models)
    return SweepResult(summary=summary, top=top_t, pareto=pareto_t, wall_s=time.perf_counter() - t_wall,
                       finalize_s=time.perf_counter() - t_fin, best=best, speculation=speculation, **base)


def _wait_for(work: Path, n: int, poll_s: float = 0.5) -> None:
    """Block until every chunk is written (other processes may still be writing theirs)."""
    while True:
        missing = [k for k in range(n) if not rs.chunk_written(work, k)]
        if not missing:
            return
        time.sleep(poll_s)


class _Counts:
    """Status and SLA counts of the written rows, per workload (by integer code: no string sorting)."""

    def __init__(self):
        self.status: dict[str, int] = {}
        self.per_workload: dict[int, dict] = {}
        self.feasible = 0
        self.methods: dict[str, int] = {}
        self.kv_preemption_steady = 0  # steady-state rows whose in-flight requests at their peak outgrow the pool

    def add(self, t: pa.Table) -> None:
        st_col = t.column("status").to_numpy().astype(np.int64)
        wl_idx = t.column("workload").combine_chunks().indices.to_numpy().astype(np.int64)
        sla_col = t.column("sla_ok").to_numpy(zero_copy_only=False)
        self.feasible += int(sla_col.sum())
        nc = max(st.NUM_CODES, int(st_col.max()) + 1 if st_col.size else 0)
        nw = int(wl_idx.max()) + 1 if wl_idx.size else 0
        by = np.bincount(wl_idx * nc + st_col, minlength=nw * nc).reshape(nw, nc)
        sla_by = np.bincount(wl_idx, weights=sla_col, minlength=nw)
        for c in np.flatnonzero(by.sum(axis=0)):
            self.status[st.name(c)] = self.status.get(st.name(c), 0) + int(by[:, c].sum())
        answers = np.zeros(nc, bool)
        answers[: st.NUM_CODES] = st.ANSWERS  # replayed rows answer with replay codes (completed)
        for wi in np.flatnonzero(by.sum(axis=1)):
            d = self.per_workload.setdefault(int(wi), {"configs": 0, "supported": 0, "sla_feasible": 0, "refusals": {}})
            d["configs"] += int(by[wi].sum())
            d["supported"] += int(by[wi, answers].sum())
            d["sla_feasible"] += int(sla_by[wi])
            for c in np.flatnonzero(by[wi] * ~answers):
                d["refusals"][st.name(c)] = d["refusals"].get(st.name(c), 0) + int(by[wi, c])
        methods = t.column("method").combine_chunks().indices.to_numpy()
        flag = t.column("kv_preemption").to_numpy(zero_copy_only=False)
        self.kv_preemption_steady += int(np.sum(flag & (methods == METHODS.index("steady"))))
        for mi, count in enumerate(np.bincount(methods, minlength=len(METHODS))):
            if count:
                self.methods[METHODS[mi]] = self.methods.get(METHODS[mi], 0) + int(count)

    def result(self, names: Sequence[str], pareto_points: int) -> dict:
        return {
            "workloads": {names[i]: {**d, "refusals": dict(sorted(d["refusals"].items(), key=lambda kv: -kv[1]))}
                          for i, d in sorted(self.per_workload.items())},
            "status_counts": dict(sorted(self.status.items())),
            "methods": self.methods,
            "kv_preemption_steady_rows": self.kv_preemption_steady,
            "sla_feasible": self.feasible,
            "pareto_points": pareto_points,
        }


class _Goodput:
    """Adds :data:`GOODPUT_COLUMN` to the rows of whole bindings: chunk rows are held back while their
    binding may go on in the next chunk (config ids ascend across chunks), then written with its value."""

    def __init__(self, plan: SweepPlan):
        self.inner, self.nw, self.grid = plan.inner, len(plan.spec.workloads), plan.grid_index
        self.carry: pa.Table | None = None
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []

    def complete(self, t: pa.Table, last: bool) -> pa.Table:
        """The rows of ``t`` (after any held back) whose bindings are complete, with the goodput column."""
        if self.carry is not None:
            t = pa.concat_tables([self.carry, t])
        ids = self.grid(t.column("config_id").to_numpy())
        b = ids // self.inner
        cut = t.num_rows if last or not ids.size else int(np.searchsorted(b, b[-1]))
        t, self.carry = t.slice(0, cut), t.slice(cut)
        ids = ids[:cut]
        gp = goodput_per_s(ids, t.column("sla_ok").to_numpy(zero_copy_only=False),
                           t.column("request_rate_per_s").to_numpy(), self.inner, self.nw)
        self.keys.append(self._key(ids))
        self.values.append(gp)
        return t.append_column(GOODPUT_COLUMN, pa.array(gp, pa.float64()))

    def _key(self, ids: np.ndarray) -> np.ndarray:
        return (ids // self.inner) * self.nw + ids % self.nw

    def lookup(self, t: pa.Table) -> pa.Table:
        """``t`` (rows already written) with the goodput column."""
        keys = np.concatenate(self.keys) if self.keys else np.zeros(0, np.int64)
        vals = np.concatenate(self.values) if self.values else np.zeros(0)
        want = self._key(self.grid(t.column("config_id").to_numpy())) if t.num_rows else np.zeros(0, np.int64)
        order = np.argsort(keys, kind="stable")
        pos = order[np.searchsorted(keys[order], want)] if want.size else np.zeros(0, np.int64)
        return t.append_column(GOODPUT_COLUMN, pa.array(vals[pos] if want.size else np.zeros(0), pa.float64()))


def _plain(t: pa.Table) -> pa.Table:
    """Dictionary columns as strings (CSV)."""
    return pa.table({c: (pc.cast(t.column(c), pa.string()) if pa.types.is_dictionary(t.column(c).type) else t.column(c))
                     for c in t.column_names})


def _finalize(plan: SweepPlan, work: Path, n: int, output: Path, csv_path: Path | None, top: int):
    """Merge chunk files into the final results (``on_pareto``: on its workload's SLA-feasible frontier;
    ``goodput_req_per_s``); return the top rows and the frontier per workload, and counts."""
    best = pa.concat_tables([rs.read_chunk(work, k, best=True) for k in range(n)])
    if best.num_rows:
        x, y, ids, g = _xyg(best)
        on = pareto_mask(x, y, ids, g)
        front = best.take(pa.array(np.flatnonzero(on)[np.lexsort((-x[on], g[on]))]))
        tm = top_mask(y, ids, g, top)
        top_t = best.take(pa.array(np.flatnonzero(tm)[np.lexsort((ids[tm], -y[tm], g[tm]))]))
        front_ids = front.column("config_id").to_numpy()
    else:
        front = top_t = best
        front_ids = np.zeros(0, np.int64)
    meta = {"format": FORMAT, "summary": plan.summary()}
    counts, goodput = _Counts(), _Goodput(plan)
    writer = None
    csv_writer = None
    with contextlib.ExitStack() as files:  # temporary files, renamed onto output (and csv_path) once complete
        tmp = files.enter_context(atomic_file(output))
        tmp_csv = files.enter_context(atomic_file(csv_path)) if csv_path else None
        try:
            for k in range(n):
                t = rs.read_chunk(work, k)
                on = np.isin(t.column("config_id").to_numpy(), front_ids)
                t = goodput.complete(t.append_column("on_pareto", pa.array(on)), last=k == n - 1)
                if not t.num_rows:
                    continue
                if writer is None:
                    schema = t.schema.with_metadata({"jaxsim.sweep": json.dumps(meta, sort_keys=True)})
                    labels = [f.name for f in schema if pa.types.is_dictionary(f.type)]
                    writer = pq.ParquetWriter(tmp, schema, compression="lz4", use_dictionary=labels)
                writer.write_table(t)
                if tmp_csv is not None:
                    plain = _plain(t)
                    if csv_writer is None:
                        csv_writer = pacsv.CSVWriter(tmp_csv, plain.schema)
                    csv_writer.write_table(plain)
                counts.add(t)
        finally:
            if writer is not None:
                writer.close()
            if csv_writer is not None:
                csv_writer.close()
    return goodput.lookup(top_t), goodput.lookup(front), counts.result(plan.labels["workload"], int(front.num_rows))
