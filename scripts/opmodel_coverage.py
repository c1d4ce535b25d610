"""Coverage of aiconfigurator-core's silicon sample: `jaxsim import op-model` + `jaxsim sweep`, beside aiconfigurator's
own estimator, row by row (issue #23).

The sample is ``systems/silicon_sample.csv`` inside the installed aiconfigurator-core package (located with importlib):
measured TTFT/TPOT of real serving runs, each with its model, system, precision label, parallel layout, ISL/OSL and
concurrency. For every vLLM aggregated row:

* jaxsim, as a user would: ``jaxsim import op-model MODEL --system S`` with the row's layout (``--tp N``, or ``--layout
  tpN:epE:moetpM[:dpD]`` for expert-parallel, attention-DP or inconsistent rows, which the importer then judges),
  ``--max-num-seqs`` = the largest concurrency among the rows of that (model, system, precision, layout) cell,
  ``--max-model-len`` = its longest ISL + OSL rounded up to 1,024, defaults otherwise (gpu_memory_utilization 0.9,
  max_num_batched_tokens 8,192, the checkpoint's KV dtype), imported once per cell (cached in the work folder); then
  one ``jaxsim sweep`` per cell whose concurrency axis and workloads are the cell's rows. A row is *evaluated* when its
  configuration is inside the profile's support; otherwise it is refused with the first reason (import refusal, binding
  refusal, or the sweep's status).
  Precision: the row's gemm/moe labels first (``--gemm-quant-mode``, and ``--moe-quant-mode`` for MoE models); when the
  importer refuses them for a precision reason (a quantised checkpoint that has no such weights, or no silicon data for
  that precision), the NVFP4 checkpoint the op model ships for ``nvfp4`` labels (``nvidia/<name>-NVFP4``), else the
  checkpoint's own precisions, then (MoE) those with ``--precision-fallback`` (a block-quantised MoE precision the op
  model cannot price at the layout priced with its per-tensor data, stated in the profile), and the row says which it
  used. Attention-DP rows (``--layout tpT:dpD:epE``): the sample's batch_size is per DP rank, so the sweep's
  concurrency per worker is batch_size x D. Model ids the op model ships under another name are
  mapped as aiconfigurator's own InferenceX adapter maps them (meta-llama/Llama-3.1-70B -> meta-llama/Meta-Llama-3.1-70B).
* aiconfigurator: its vLLM aggregated estimate of the row (``cli_estimate(mode="agg")`` -> ``VLLMBackend.run_agg``),
  re-implemented with the core wheel as its accuracy harness calls it (tools/accuracy_regression_testing/
  predict_silicon_sample.py: the row's quant labels and layout; a measured backend version without a database falls back
  to the latest one; ``check_oom`` refuses), the same model-id map; then, for rows the labels fail, once more with the
  same precision fallback jaxsim uses.

Resumable: per-row results are appended to WORK/rows.jsonl and skipped on a rerun; imported profiles (or their
refusal) and sweep results are cached per cell under WORK/. ``--limit N`` / ``--models SUBSTR,...`` restrict the rows.

  PYTHONPATH=$PWD python scripts/opmodel_coverage.py --work /tmp/coverage [--limit 50] [--models gpt-oss,Qwen3-32B]
      [--systems h200_sxm] [--attention-dp] [--report docs_table.md] [--no-aic]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.util
import io
import json
import logging
import math
import re
import sys
import time
import traceback
from collections import Counter, defaultdict
from contextlib import redirect_stdout
from pathlib import Path

ALIASES = {"meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B"}  # aiconfigurator's InferenceX adapter MODEL_PATHS
PARALLEL = ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")
BENCHMARK: dict | None = None
"""A sweep spec ``[benchmark]`` table for every cell's sweep (None: the default closed loop, fixed lengths)."""
EVALUATE = "steady"
"""How a BENCHMARK sweep evaluates its points: the steady state, or a replay of each point's benchmark."""
SERVER_KV_CACHE_DTYPE: dict[str, str] = {}
"""Model id -> the KV-cache dtype its benchmark's server ran with (``--kv-cache-dtype``); a model not listed is imported
with its checkpoint's. Set by scripts/benchmark_accuracy.py to the sample's protocol (:data:`benchmark_accuracy.SERVER_KV`)."""
SERVER_ASYNC_SCHEDULING = False
"""Whether the benchmark's servers schedule asynchronously (vLLM's ``--async-scheduling``): every cell's ``[[profile]]``
gets ``async_scheduling = true`` (its sweeps are cached apart). Set by scripts/benchmark_accuracy.py to the sample's
protocol (:data:`benchmark_accuracy.SERVER_ASYNC_SCHEDULING`)."""
BLOCK_GEMM_DATA: str | None = None
"""``jaxsim import op-model --block-gemm-data`` for checkpoints whose dense GEMMs are fp8_block, always passed for them
so the import cache tells the two apart (other imports and their cache keys are unchanged). None: the importer's
default. scripts/benchmark_accuracy.py --block-gemm-data sets it."""
QUANT_REASONS = ("checkpoint is quantised", "perf data missing", "data missing for", "quant mode", "MissingSystemFlops",
                 "--gemm-quant-mode", "--moe-quant-mode", "--precision-fallback")


def server_profile_keys() -> dict:
    """The ``[[profile]]`` keys every cell's sweep gets from the benchmark's server config (:data:`SERVER_ASYNC_SCHEDULING`)."""
    return {"async_scheduling": True} if SERVER_ASYNC_SCHEDULING else {}


def sample_path() -> Path:
    """``systems/silicon_sample.csv`` of the installed aiconfigurator-core."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or spec.origin is None:
        sys.exit("aiconfigurator-core is not installed: pip install -e '.[opmodel]'")
    return Path(spec.origin).parent / "systems" / "silicon_sample.csv"


def _int(v) -> int | None:
    return int(float(v)) if v not in ("", None) else None


def agg_rows() -> list[dict]:
    with sample_path().open() as f:
        return [r for r in csv.DictReader(f) if r["backend"] == "vllm" and r["mode"] == "agg"]


# ----------------------------------------------------------------------------------------------------
# cells: (model, system, precision label, layout) -> one import and one sweep


def layout_of(row: dict, moe: bool) -> tuple[int, int, int, int]:
    """(tp, dp, moe_tp, moe_ep) of a row (dense: moe 1, 1)."""
    p = {k: _int(row.get(k, "")) for k in PARALLEL}
    tp, dp = p["tp_size"] or 1, p["attention_dp_size"] or 1
    if not moe:
        return tp, dp, 1, 1
    return tp, dp, p["moe_tp_size"] or tp * dp // max(p["moe_ep_size"] or 1, 1), p["moe_ep_size"] or 1


def layout_args(lay: tuple[int, int, int, int], moe: bool) -> list[str]:
    tp, dp, mtp, mep = lay
    if dp == 1 and (not moe or (mtp == tp and mep == 1)):
        return ["--tp", str(tp)]
    return ["--layout", f"tp{tp}" + (f":dp{dp}" if dp != 1 else "") + f":ep{mep}:moetp{mtp}"]


def worker_concurrency(row: dict) -> int:
    """Clients per worker: the sample's batch_size is per attention-DP rank (its silicon_concurrency / dp), jaxsim's
    sweep concurrency per worker (dp ranks)."""
    return int(_int(row["batch_size"])) * (_int(row.get("attention_dp_size", "")) or 1)


def cell_key(row: dict, moe: bool) -> tuple:
    return (row["model_path"], row["system"], row["gemm_quant_mode"], row["moe_quant_mode"], layout_of(row, moe))


def slug(*parts) -> str:
    text = json.dumps(parts, default=str)
    name = re.sub(r"[^A-Za-z0-9]+", "-", "-".join(str(p) for p in parts)).strip("-")[:80]
    return f"{name}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def quant_candidates(model: str, gemm: str, moe_label: str, moe: bool) -> list[tuple[str, str, list[str]]]:
    """(how, model id, quant options) in the order they are tried."""
    from jaxsim.importers.op_model import known_models

    out = []
    opts = (["--gemm-quant-mode", gemm] if gemm else []) + (["--moe-quant-mode", moe_label] if moe and moe_label else [])
    if opts:
        out.append(("label", model, opts))
    if "nvfp4" in (gemm, moe_label):
        sib = f"nvidia/{model.split('/')[-1]}-NVFP4"
        if sib in known_models():
            out.append(("nvfp4 checkpoint", sib, []))
    out.append(("checkpoint", model, []))
    if moe:  # a block-quantised MoE precision the op model cannot price at the layout: its stated per-tensor fallback
        out.append(("checkpoint + precision fallback", model, ["--precision-fallback"]))
    return out


# ----------------------------------------------------------------------------------------------------
# jaxsim: import (cached), sweep (cached)


def _import(work: Path, model: str, system: str, args: list[str]) -> tuple[Path | None, str, float]:
    """(profile dir or None, refusal, seconds) of ``jaxsim import op-model`` run in-process (the CLI's own calls)."""
    from typer.testing import CliRunner

    from jaxsim.cli.main import app

    key = slug(model, system, *args)
    out = work / "profiles" / key
    refused = work / "profiles" / f"{key}.refused.json"
    if (out / "profile.json").is_file():
        meta = json.loads((work / "profiles" / f"{key}.json").read_text())
        return out, "", meta["seconds"]
    if refused.is_file():
        meta = json.loads(refused.read_text())
        return None, meta["error"], meta["seconds"]
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    r = CliRunner().invoke(app, ["import", "op-model", model, "--system", system, "--output", str(out), "--json", *args])
    dt = time.perf_counter() - t0
    if r.exit_code != 0:
        err = " ".join(r.output.split()).removeprefix("error: ")
        refused.write_text(json.dumps({"error": err, "seconds": dt, "args": args}))
        return None, err, dt
    summary = json.loads(r.output[r.output.index("{"):])
    (work / "profiles" / f"{key}.json").write_text(json.dumps({"seconds": dt, "args": args, "summary": summary}, indent=1))
    return out, "", dt


def _sweep(work: Path, profile: Path, rows: list[dict], lay: tuple, name: str) -> tuple[dict, str]:
    """{(concurrency, isl, osl): (status name, supported, ttft, tpot)} of one sweep over the cell's rows, or a refusal."""
    import pyarrow.parquet as pq

    from jaxsim.kernels import status as st
    from jaxsim.sweep.run import run_sweep
    from jaxsim.sweep.spec import spec_from_dict

    tp, dp, mtp, mep = lay
    pairs = sorted({(int(r["isl"]), int(r["osl"])) for r in rows})
    spec = {
        "name": name, "block_size": 16,
        "profile": [{"name": str(profile), "tp": [tp], "dp": [dp], "moe_tp": [mtp], "moe_ep": [mep], "label": name[:40],
                     **server_profile_keys()}],
        "scheduler": {"concurrency": sorted({worker_concurrency(r) for r in rows})},
        "workload": [{"name": f"i{i}o{o}", "isl": i, "osl": o} for i, o in pairs],
    }
    folder = "sweeps"
    if BENCHMARK is not None:  # the sample's own benchmark protocol (scripts/benchmark_accuracy.py), its own cache
        spec["benchmark"] = dict(BENCHMARK)
        spec["evaluate"] = EVALUATE
        folder = "sweeps-" + slug(json.dumps([BENCHMARK, EVALUATE], sort_keys=True))[-8:] + ("-async" if SERVER_ASYNC_SCHEDULING else "")
    out = work / folder / f"{name}.parquet"
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.is_file():
        try:
            res = run_sweep(spec_from_dict(spec, source=f"{name}.toml"), out, force=True)
        except Exception as e:  # noqa: BLE001 - a refused sweep is a row outcome
            return {}, " ".join(str(e).split())
        if res.summary.get("configs_evaluated", 0) == 0:
            return {}, "sweep evaluated nothing"
    t = pq.read_table(out)
    wl = t.column("workload").to_pylist()
    got = {}
    for c, w, code, ttft, tpot in zip(t.column("concurrency_target").to_pylist(), wl, t.column("status").to_pylist(),
                                      t.column("mean_ttft_ms").to_pylist(), t.column("mean_tpot_ms").to_pylist()):
        i, o = (int(x) for x in re.match(r"i(\d+)o(\d+)", w).groups())
        got[(int(c), i, o)] = (st.name_table()[int(code)], bool(st.is_supported(int(code)) or int(code) == st.COMPLETED), ttft, tpot)
    return got, ""


_GEMM_MODES: dict[str, str] = {}


def _checkpoint_gemm(model: str) -> str:
    """The checkpoint's own GEMM precision as the op model reads it ("" where it cannot)."""
    from jaxsim.importers.op_model import checkpoint_modes

    if model not in _GEMM_MODES:
        try:
            _GEMM_MODES[model] = checkpoint_modes(model)["gemm_quant_mode"]
        except Exception:  # noqa: BLE001 - the import itself reports the refusal
            _GEMM_MODES[model] = ""
    return _GEMM_MODES[model]


def cell_profile(work: Path, key: tuple, rows: list[dict]) -> tuple[Path | None, tuple, dict, str]:
    """(imported profile dir or None, layout, per-row base fields, refusal) of one cell (import cached)."""
    from jaxsim.importers.op_model import _model_config  # the catalogue the importer reads

    model_row, system, gemm, moe_label, lay = key
    model = ALIASES.get(model_row, model_row)
    try:
        cfg, _ = _model_config(model)
        text = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
        moe = bool(text.get("num_experts") or text.get("num_local_experts") or text.get("n_routed_experts"))
    except Exception as e:  # noqa: BLE001 - an unknown model is a refusal of every row of the cell
        return None, lay, {"jaxsim_quant": ""}, " ".join(str(e).split())
    lay = layout_of(rows[0], moe)
    seqs = min(max(int(_int(r["batch_size"])) for r in rows), 1024)
    mml = int(math.ceil(max(int(r["isl"]) + int(r["osl"]) for r in rows) / 1024) * 1024)
    ctx = int(text.get("max_position_embeddings") or 0)
    mml = min(mml, ctx) if ctx else mml
    env = ["--max-num-seqs", str(seqs), "--max-model-len", str(mml)]
    if model_row in SERVER_KV_CACHE_DTYPE:  # the benchmark's server config (imports of another KV dtype are cached apart)
        env += ["--kv-cache-dtype", SERVER_KV_CACHE_DTYPE[model_row]]
    reasons, profile, how, seconds = [], None, "", 0.0
    for how_, model_, quant in quant_candidates(model, gemm, moe_label, moe):
        extra = []
        if "--gemm-quant-mode" not in quant and _checkpoint_gemm(model_) == "fp8_block":
            from jaxsim.importers.op_model import DEFAULT_BLOCK_GEMM_DATA

            extra = ["--block-gemm-data", BLOCK_GEMM_DATA or DEFAULT_BLOCK_GEMM_DATA]
        profile, err, seconds = _import(work, model_, system, layout_args(lay, moe) + env + quant + extra)
        if profile is not None:
            how = how_ if how_ == "label" else f"{how_} ({model_})"
            break
        reasons.append(err)
        if not any(q in err for q in QUANT_REASONS):
            break  # not a precision refusal: the fallback precisions would not change it
    base = {"jaxsim_quant": how, "import_s": round(seconds, 2), "max_num_seqs": seqs, "max_model_len": mml,
            "layout_args": " ".join(layout_args(lay, moe))}
    return profile, lay, base, "" if profile is not None else f"import: {reasons[-1]}"


def jaxsim_cell(work: Path, key: tuple, rows: list[dict]) -> dict[str, dict]:
    """Per row id: evaluated, reason, quant used, ttft/tpot, import seconds."""
    profile, lay, base, why = cell_profile(work, key, rows)
    if profile is None:
        return {r["id"]: {**base, "jaxsim": False, "jaxsim_reason": why} for r in rows}
    got, err = _sweep(work, profile, rows, lay, profile.name)
    out = {}
    for r in rows:
        k = (worker_concurrency(r), int(r["isl"]), int(r["osl"]))
        if k not in got:
            out[r["id"]] = {**base, "jaxsim": False, "jaxsim_reason": f"sweep: {err or 'no configuration'}"}
            continue
        name, ok, ttft, tpot = got[k]
        out[r["id"]] = {**base, "jaxsim": ok, "jaxsim_reason": "" if ok else f"sweep status {name}",
                        "jaxsim_status": name, "jaxsim_ttft_ms": ttft, "jaxsim_tpot_ms": tpot}
    return out


# ----------------------------------------------------------------------------------------------------
# aiconfigurator's estimate (what its accuracy harness calls)


def aic_estimate(row: dict, *, checkpoint_quant: bool = False, model: str | None = None) -> tuple[float, float]:
    """(ttft_ms, tpot_ms) of aiconfigurator's vLLM agg estimate of ``row``; raises what it refuses with."""
    from aiconfigurator_core.sdk.backends.factory import get_backend
    from aiconfigurator_core.sdk.config import ModelConfig, RuntimeConfig
    from aiconfigurator_core.sdk.config_builders import apply_nextn, build_model_config
    from aiconfigurator_core.sdk.models import (
        check_is_moe,
        get_model,
        resolve_context_fmha_by_data,
        resolve_dsv4_moe_arch,
        resolve_nvfp4_for_system,
    )
    from aiconfigurator_core.sdk.perf_database import get_database_view, get_latest_database_version

    model_path = model or ALIASES.get(row["model_path"], row["model_path"])
    system, isl, osl, b = row["system"], int(row["isl"]), int(row["osl"]), _int(row["batch_size"])
    p = {k: _int(row.get(k, "")) for k in PARALLEL}
    tp, pp, dp = p["tp_size"] or 1, p["pp_size"] or 1, p["attention_dp_size"] or 1
    gemm = None if checkpoint_quant else (row["gemm_quant_mode"] or None)
    moe = None if checkpoint_quant else (row["moe_quant_mode"] or None)
    version = row["backend_version"] or None

    def run(ver):
        ver = ver or get_latest_database_version(system=system, backend="vllm")
        db = get_database_view(system, "vllm", ver, allow_missing_data=False, database_mode="SILICON")
        if db is None:
            raise ValueError(f"Failed to load perf database for system={system}, backend=vllm, version={ver}.")
        mtp, mep = p["moe_tp_size"], p["moe_ep_size"]
        if check_is_moe(model_path):
            mtp, mep = ModelConfig(tp_size=tp, attention_dp_size=dp, moe_tp_size=mtp, moe_ep_size=mep).resolve_moe_parallelism()
        mc = build_model_config(tp, pp, dp, mtp, mep, gemm, None, None, moe, None)
        apply_nextn(mc, 0)
        resolve_context_fmha_by_data(mc, model_path, db, "vllm", is_context_role=True)
        resolve_dsv4_moe_arch(mc, model_path, system_name=system, backend_name="vllm")
        resolve_nvfp4_for_system(mc, system, model_path)
        m = get_model(model_path, mc, "vllm")
        summary = get_backend("vllm").run_agg(m, db, RuntimeConfig(isl=isl, osl=osl, batch_size=b), ctx_tokens=isl)
        if summary.check_oom():
            raise RuntimeError(f"OOM: the model '{model_path}' does not fit in GPU memory on system '{system}' (tp={tp}, pp={pp}, dp={dp})")
        r = summary.get_result_dict()
        if r is None:
            raise RuntimeError("Estimation produced no results.")
        return float(r["ttft"]), float(r["tpot"])

    with redirect_stdout(io.StringIO()):
        try:
            return run(version)
        except ValueError as e:
            missing = "Failed to load perf database" in str(e) or "old-style raw version query" in str(e)
            if version is None or not missing:
                raise
            return run(None)


def aic_row(row: dict) -> dict:
    """aiconfigurator with the harness's arguments, then (when those fail) with the checkpoint's precisions."""
    def attempt(**kw):
        try:
            ttft, tpot = aic_estimate(row, **kw)
            return True, "", ttft, tpot
        except Exception as e:  # noqa: BLE001 - the harness records every failure the same way
            return False, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}", float("nan"), float("nan")

    ok, why, ttft, tpot = attempt()
    out = {"aic": ok, "aic_reason": why, "aic_ttft_ms": ttft, "aic_tpot_ms": tpot}
    if ok:
        out.update(aic_fallback=True, aic_fallback_ttft_ms=ttft, aic_fallback_tpot_ms=tpot)
        return out
    from jaxsim.importers.op_model import known_models

    model = ALIASES.get(row["model_path"], row["model_path"])
    sib = f"nvidia/{model.split('/')[-1]}-NVFP4"
    tries = [dict(checkpoint_quant=True, model=sib)] if "nvfp4" in (row["gemm_quant_mode"], row["moe_quant_mode"]) and sib in known_models() else []
    for kw in tries + [dict(checkpoint_quant=True)]:
        ok2, why2, ttft2, tpot2 = attempt(**kw)
        if ok2:
            break
    out.update(aic_fallback=ok2, aic_fallback_reason=why2, aic_fallback_ttft_ms=ttft2, aic_fallback_tpot_ms=tpot2)
    return out


# ----------------------------------------------------------------------------------------------------
# report


def _ape(pred, meas):
    return [abs(p / m - 1) * 100 for p, m in zip(pred, meas) if p == p and m and p is not None]


def _med(xs):
    xs = sorted(xs)
    return float("nan") if not xs else xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def _reason_class(text: str) -> str:
    t = re.sub(r"\d[\d,]*", "N", text)
    t = re.sub(r"(/tmp|/work)[^ ]*", "PATH", t)
    return t[:150]


def report(results: dict[str, dict], rows: list[dict]) -> str:
    by = {r["id"]: r for r in rows}
    res = [dict(by[i], **v) for i, v in results.items() if i in by]
    nodp = [r for r in res if (_int(r["attention_dp_size"]) or 1) == 1]
    lines = ["| rows | count | aiconfigurator (harness labels) | aiconfigurator (+ checkpoint precision) | jaxsim import + sweep |"
             " jaxsim evaluates of aiconfigurator's (labels) |", "|---|---:|---:|---:|---:|---:|"]
    for name, sel in (("all vLLM aggregated", res), ("without attention DP (the issue's 1,231)", nodp)):
        n = len(sel)
        a = sum(r.get("aic", False) for r in sel)
        af = sum(r.get("aic_fallback", False) for r in sel)
        j = sum(r.get("jaxsim", False) for r in sel)
        both = sum(r.get("jaxsim", False) and r.get("aic", False) for r in sel)
        pct = lambda k: f"{k:,} ({100 * k / n:.1f} %)" if n else "-"  # noqa: E731
        lines.append(f"| {name} | {n:,} | {pct(a)} | {pct(af)} | {pct(j)} | {both:,} of {a:,} |")
    lines += ["", "| model | system | rows | aic (labels) | aic (+ckpt) | jaxsim | jaxsim precision used |", "|---|---|---:|---:|---:|---:|---|"]
    groups = defaultdict(list)
    for r in res:
        groups[(r["model_path"], r["system"])].append(r)
    for (m, s), g in sorted(groups.items()):
        q = Counter(r.get("jaxsim_quant") or "-" for r in g if r.get("jaxsim"))
        lines.append(f"| {m} | {s} | {len(g)} | {sum(r.get('aic', False) for r in g)} | {sum(r.get('aic_fallback', False) for r in g)} | "
                     f"{sum(r.get('jaxsim', False) for r in g)} | {', '.join(f'{k} {v}' for k, v in q.most_common()) or '-'} |")
    refused = Counter(_reason_class(r.get("jaxsim_reason", "")) for r in res if not r.get("jaxsim"))
    lines += ["", "| jaxsim refusal (one line each; numbers as N) | rows | of which aiconfigurator prices |", "|---|---:|---:|"]
    for why, n in refused.most_common():
        k = sum(1 for r in res if not r.get("jaxsim") and _reason_class(r.get("jaxsim_reason", "")) == why and r.get("aic"))
        lines.append(f"| {why} | {n} | {k} |")
    both = [r for r in nodp if r.get("jaxsim") and r.get("aic")]
    if both:
        lines += ["", f"Error against the measured runs on the {len(both)} rows both price (median absolute % error):", "",
                  "| | TTFT | TPOT |", "|---|---:|---:|"]
        for who, tt, tp in (("aiconfigurator", "aic_ttft_ms", "aic_tpot_ms"), ("jaxsim", "jaxsim_ttft_ms", "jaxsim_tpot_ms")):
            e1 = _ape([r[tt] for r in both], [float(r["silicon_ttft_ms"]) for r in both])
            e2 = _ape([r[tp] for r in both], [float(r["silicon_tpot_ms"]) for r in both])
            lines.append(f"| {who} | {_med(e1):.1f} % | {_med(e2):.1f} % |")
    secs = {}
    for r in res:
        if r.get("import_s") is not None and r.get("jaxsim_quant"):
            secs[(r["model_path"], r["system"], r.get("layout_args"), r.get("max_num_seqs"))] = (r["import_s"], r.get("max_num_seqs", 0))
    small = [s for s, n in secs.values() if n <= 256]
    if secs:
        lines += [
            "",
            f"Import wall time per cell (in-process, incl. writing; {len(secs)} cells): median {_med([s for s, _ in secs.values()]):.1f} s, "
            f"max {max(s for s, _ in secs.values()):.1f} s; cells with max_num_seqs <= 256: median {_med(small):.1f} s, "
            f"max {max(small, default=float('nan')):.1f} s.",
        ]
    return "\n".join(lines)


def is_moe(model: str) -> bool:
    """Whether the op model's config of ``model`` has routed experts (False when it has no config)."""
    from jaxsim.importers.op_model import _model_config

    try:
        cfg, _ = _model_config(ALIASES.get(model, model))
    except Exception:  # noqa: BLE001
        return False
    text = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
    return bool(text.get("num_experts") or text.get("num_local_experts") or text.get("n_routed_experts"))


def collect(work: Path, todo: list[dict], results: dict[str, dict], *, no_aic: bool = False) -> None:
    """Evaluate ``todo`` cell by cell (jaxsim import + sweep, and aiconfigurator's estimate unless ``no_aic``),
    appending each row's result to WORK/rows.jsonl and to ``results``."""
    done_path = work / "rows.jsonl"
    cells = defaultdict(list)
    for r in todo:
        cells[cell_key(r, is_moe(r["model_path"]))].append(r)
    t_all = time.perf_counter()
    with done_path.open("a") as out:
        for n, (key, cell_rows) in enumerate(sorted(cells.items(), key=lambda kv: str(kv[0]))):
            t0 = time.perf_counter()
            try:
                jx = jaxsim_cell(work, key, cell_rows)
            except Exception as e:  # noqa: BLE001 - a bug here must not lose the other cells
                traceback.print_exc()
                jx = {r["id"]: {"jaxsim": False, "jaxsim_reason": f"coverage script error: {type(e).__name__}: {e}"} for r in cell_rows}
            for r in cell_rows:
                res = dict(jx[r["id"]])
                if not no_aic:
                    res.update(aic_row(r))
                out.write(json.dumps({"id": r["id"], "result": res}, default=float) + "\n")
                out.flush()
                results[r["id"]] = res
            ok = sum(jx[r["id"]].get("jaxsim", False) for r in cell_rows)
            print(f"[{n + 1}/{len(cells)}] {key}: {ok}/{len(cell_rows)} evaluated, {time.perf_counter() - t0:.1f} s "
                  f"({time.perf_counter() - t_all:.0f} s total)", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/jaxsim-opmodel-coverage"))
    ap.add_argument("--limit", type=int, default=0, help="only the first N rows")
    ap.add_argument("--models", default="", help="comma-separated substrings of model ids to keep")
    ap.add_argument("--systems", default="", help="comma-separated systems to keep (e.g. h200_sxm)")
    ap.add_argument("--attention-dp", action="store_true", help="only the rows with attention data parallelism (dp > 1)")
    ap.add_argument("--no-aic", action="store_true", help="skip aiconfigurator's estimate")
    ap.add_argument("--report", type=Path, help="write the Markdown tables here too")
    ap.add_argument("--csv", type=Path, help="write the per-row results as CSV")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    rows = agg_rows()
    if args.models:
        keep = [m.strip().lower() for m in args.models.split(",") if m.strip()]
        rows = [r for r in rows if any(k in r["model_path"].lower() for k in keep)]
    if args.systems:
        rows = [r for r in rows if r["system"] in {x.strip() for x in args.systems.split(",")}]
    if args.attention_dp:
        rows = [r for r in rows if (_int(r["attention_dp_size"]) or 1) > 1]
    if args.limit:
        rows = rows[: args.limit]
    args.work.mkdir(parents=True, exist_ok=True)
    done_path = args.work / "rows.jsonl"
    results: dict[str, dict] = {}
    if done_path.is_file():
        for line in done_path.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                results[d["id"]] = d["result"]
    todo = [r for r in rows if r["id"] not in results]
    print(f"{len(rows)} rows ({len(rows) - len(todo)} cached); work folder {args.work}", file=sys.stderr)
    collect(args.work, todo, results, no_aic=args.no_aic)
    text = report(results, rows)
    print(text)
    if args.report:
        args.report.write_text(text + "\n")
    if args.csv:
        by = {r["id"]: r for r in rows}
        keys = sorted({k for v in results.values() for k in v})
        with args.csv.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["id", "model", "system", "precision", "tp", "dp", "moe_tp", "moe_ep", "isl", "osl", "concurrency",
                        "silicon_ttft_ms", "silicon_tpot_ms", *keys])
            for i, v in results.items():
                if i in by:
                    r = by[i]
                    w.writerow([i, r["model_path"], r["system"], r["precision"], r["tp_size"], r["attention_dp_size"], r["moe_tp_size"],
                                r["moe_ep_size"], r["isl"], r["osl"], r["batch_size"], r["silicon_ttft_ms"], r["silicon_tpot_ms"],
                                *[v.get(k, "") for k in keys]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
