"""Validation on real runs held out by GPU (issue 27, Deliver 4): aiconfigurator-core's silicon sample, vLLM aggregated.

For every vLLM aggregated row without attention DP of ``systems/silicon_sample.csv`` (inside the installed
aiconfigurator-core; ``pip install -e '.[opmodel]'``) this evaluates, as :mod:`scripts.opmodel_coverage` does and with
its cache (WORK/rows.jsonl for aiconfigurator's estimates, WORK/profiles; its own WORK/bench-rows.jsonl and sweeps):
jaxsim (``jaxsim import op-model`` of the row's cell, then ``jaxsim sweep`` at its concurrency and lengths: the steady
state with its closed-loop benchmark's prompt waves, all C sent at once) and aiconfigurator's own estimate of the same
row (``VLLMBackend.run_agg``, as its accuracy harness calls it), each row's sweep under the sample's own benchmark protocol (:data:`BENCHMARK`,
InferenceX's: 10 prompts per client, lengths U{0.8 L .. L}; its servers' KV-cache dtype where its launch scripts fix one,
:data:`SERVER_KV`). Then:

* the serving overhead (:mod:`jaxsim.overhead`: TTFT + fixed + per prompt token × ISL, TPOT + per output token) is
  fitted ONLY on the h100_sxm and h200_sxm rows jaxsim evaluates (:func:`jaxsim.overhead.fit_overhead`);
* the b200_sxm, b300_sxm and gb200 rows (never fitted) that both tools evaluate are scored: median and p90 absolute
  % error of mean TTFT and TPOT for aiconfigurator, jaxsim without the overhead and jaxsim with it, per model family
  and overall, measured in the same run.

It prints one summary line (and, with ``--report``, writes the Markdown tables). ``--models`` restricts the model
families (substrings of model ids; the default is every model) and ``--cells-per-system N`` keeps the N cells
(precision × TP) with the most rows per (model, system), so a run on 2 CPU cores can be a stated subsample.

  PYTHONPATH=$PWD python scripts/benchmark_accuracy.py --work /tmp/cov [--models Llama-3.1-70B,gpt-oss-120b] [--report part.md]

``--one-sweep`` evaluates every row again in ONE ``jaxsim sweep`` CLI run (a subprocess; each cell's cached import a
``[[profile]]`` restricted to its own rows' concurrencies and workloads) and prints its wall time, configs/s and the
load average before and after: with ``--evaluate replay`` the issue's "whole sample replay-evaluated" timing.

  PYTHONPATH=$PWD python scripts/benchmark_accuracy.py --work /tmp/cov --evaluate replay --one-sweep --report replay.md
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opmodel_coverage as cov  # noqa: E402

from jaxsim.importers.op_model import BLOCK_GEMM_DATA, DEFAULT_BLOCK_GEMM_DATA  # noqa: E402
from jaxsim.overhead import fit_overhead  # noqa: E402

FIT_SYSTEMS = ("h100_sxm", "h200_sxm")
HELD_OUT_SYSTEMS = ("b200_sxm", "b300_sxm", "gb200", "gb200_sxm")


BENCHMARK = {"prompts_per_client": 10, "range_ratio": 0.8, "length_rule": "inferencex"}
"""The sample's benchmark protocol, InferenceX's (its README's client configuration: ``benchmark_serving.py --dataset-name
random --random-range-ratio 0.8 --num-prompts $((CONC * 10)) --max-concurrency $CONC --request-rate inf --ignore-eos``;
the rows' ISL/OSL/concurrency grid, (1024, 1024), (1024, 8192), (8192, 1024) at 4-64, is InferenceX's)."""


SERVER_KV = {"meta-llama/Llama-3.1-70B": "fp8"}
"""The KV-cache dtype of the sample's servers where InferenceX's launch scripts set one for every GPU of a model:
its vLLM Llama-3.1-70B configs on H100, H200 and B200 (``benchmarks/70b_fp8_{h100,h200}_slurm.sh``,
``70b_fp8_b200_docker.sh``: ``kv-cache-dtype: fp8`` beside ``max-num-batched-tokens: 8192``). Other models keep their
checkpoint's KV dtype: their scripts differ by GPU and version (gpt-oss-120b: none on H100/H200, fp8 on B200), and the
sample does not say which script version ran a row."""


SERVER_ASYNC_SCHEDULING = True
"""The sample's servers schedule asynchronously: InferenceX's vLLM launch configs set ``async-scheduling: true`` (beside
the KV dtype above), and vLLM turns it on by default since its async-scheduling plan landed (vllm-project/vllm#27679,
#27614). Every cell is swept with ``async_scheduling = true`` (docs/benchmark-loads.md#async-scheduling); a protocol
fact, applied to fitted and held-out GPUs alike, nothing fitted. ``--async-scheduling off``: the synchronous scheduler
(cached apart)."""


def _load(path: Path) -> dict[str, dict]:
    out = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                out[d["id"]] = d["result"]
    return out


def _known_aic(work: Path) -> dict[str, dict]:
    """aiconfigurator's estimates computed before, per row id (opmodel_coverage's rows.jsonl and every run's cache)."""
    known = {}
    for f in ("rows.jsonl", *(p.name for p in sorted(work.glob("bench-rows*.jsonl")))):
        known.update({k: v for k, v in _load(work / f).items() if "aic" in v})
    return known


def collect(work: Path, todo: list[dict], results: dict[str, dict], name: str = "bench-rows.jsonl") -> None:
    """jaxsim (import cached by opmodel_coverage, sweep under :data:`BENCHMARK`) and aiconfigurator (from
    opmodel_coverage's WORK/rows.jsonl or an earlier run's cache when there, else computed) per row, appended to
    WORK/bench-rows.jsonl."""
    import time

    known = _known_aic(work)
    cells = defaultdict(list)
    for r in todo:
        cells[cov.cell_key(r, cov.is_moe(r["model_path"]))].append(r)
    t_all = time.perf_counter()
    with (work / name).open("a") as out:
        for n, (key, cell_rows) in enumerate(sorted(cells.items(), key=lambda kv: str(kv[0]))):
            t0 = time.perf_counter()
            try:
                jx = cov.jaxsim_cell(work, key, cell_rows)
            except Exception as e:  # noqa: BLE001 - a bug here must not lose the other cells
                jx = {r["id"]: {"jaxsim": False, "jaxsim_reason": f"script error: {type(e).__name__}: {e}"} for r in cell_rows}
            for r in cell_rows:
                res = dict(jx[r["id"]])
                old = known.get(r["id"])
                res.update({k: v for k, v in old.items() if k.startswith("aic")} if old and "aic" in old else cov.aic_row(r))
                out.write(json.dumps({"id": r["id"], "result": res}, default=float) + "\n")
                out.flush()
                results[r["id"]] = res
            print(f"[{n + 1}/{len(cells)}] {key}: {sum(jx[r['id']].get('jaxsim', False) for r in cell_rows)}/{len(cell_rows)} evaluated, "
                  f"{time.perf_counter() - t0:.1f} s ({time.perf_counter() - t_all:.0f} s total)", file=sys.stderr)


def _toml(spec: dict) -> str:
    """A sweep spec dict as TOML (strings, numbers and flat arrays only)."""
    val = lambda v: json.dumps(v)  # noqa: E731 - JSON strings, numbers and arrays of them are TOML
    top = [f"{k} = {val(v)}" for k, v in spec.items() if not isinstance(v, (dict, list)) or k == "evaluate"]
    out = ["\n".join(top)]
    for sec in ("scheduler", "benchmark"):
        out.append(f"[{sec}]\n" + "\n".join(f"{k} = {val(v)}" for k, v in spec[sec].items()))
    for arr in ("profile", "workload"):
        for d in spec[arr]:
            out.append(f"[[{arr}]]\n" + "\n".join(f"{k} = {val(v)}" for k, v in d.items()))
    return "\n\n".join(out) + "\n"


def one_sweep(work: Path, todo: list[dict], evaluate: str) -> tuple[dict[str, dict], dict]:
    """Every row of ``todo`` in ONE ``jaxsim sweep`` (a subprocess: the whole CLI): each cell's imported profile
    (cached; imports are not timed) swept at its own rows' concurrencies and workloads (``[[profile]]
    concurrency / workloads``) under :data:`BENCHMARK`, evaluated by ``evaluate``. Per row id its jaxsim
    fields; and the run's timing (wall seconds of the CLI, configs, its JSON summary's timings)."""
    import os
    import re
    import subprocess
    import time

    import pyarrow.parquet as pq

    from jaxsim.kernels import status as st

    cells = defaultdict(list)
    for r in todo:
        cells[cov.cell_key(r, cov.is_moe(r["model_path"]))].append(r)
    out: dict[str, dict] = {}
    profiles: dict[str, dict] = {}  # profile dir -> [[profile]] entry
    row_of: dict[str, tuple] = {}
    for key, rows in sorted(cells.items(), key=lambda kv: str(kv[0])):
        profile, lay, base, why = cov.cell_profile(work, key, rows)
        if profile is None:
            out.update({r["id"]: {**base, "jaxsim": False, "jaxsim_reason": why} for r in rows})
            continue
        tp, _, mtp, mep = lay
        entry = profiles.setdefault(str(profile), {"name": str(profile), "label": f"c{len(profiles)}", "tp": [tp], "moe_tp": [mtp],
                                                   "moe_ep": [mep], "concurrency": [], "workloads": [],
                                                   **cov.server_profile_keys()})
        for r in rows:
            c, w = int(cov._int(r["batch_size"])), f"i{int(r['isl'])}o{int(r['osl'])}"
            entry["concurrency"] = sorted(set(entry["concurrency"]) | {c})
            entry["workloads"] = sorted(set(entry["workloads"]) | {w})
            row_of[r["id"]] = (entry["label"], c, w)
            out[r["id"]] = dict(base)
    if not profiles:  # no cell imports: nothing to sweep
        return out, {"wall_s": 0.0, "cpu_s": 0.0, "configs": 0, "rows": 0, "profiles": 0, "load_before": os.getloadavg(),
                     "load_after": os.getloadavg(), "command": "", "plan_s": 0.0, "compile_s": 0.0, "eval_s": 0.0, "finalize_s": 0.0,
                     "replay": {}}
    names = sorted({w for e in profiles.values() for w in e["workloads"]})
    spec = {"name": f"silicon-sample-{evaluate}", "block_size": 16, "evaluate": evaluate,
            "profile": list(profiles.values()),
            "scheduler": {"concurrency": sorted({c for e in profiles.values() for c in e["concurrency"]})},
            "benchmark": dict(BENCHMARK),
            "workload": [{"name": n, "isl": int(re.match(r"i(\d+)o(\d+)", n)[1]), "osl": int(re.match(r"i(\d+)o(\d+)", n)[2])}
                         for n in names]}
    path = work / f"sample-{evaluate}.toml"
    path.write_text(_toml(spec))
    res_path = work / f"sample-{evaluate}.parquet"
    cmd = [sys.executable, "-m", "jaxsim", "sweep", str(path), "-o", str(res_path), "--force", "--json", "--quiet"]
    import resource

    load0 = os.getloadavg()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    load1 = os.getloadavg()
    cpu_s = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    if run.returncode != 0:
        sys.exit(f"error: jaxsim sweep {path} failed (exit {run.returncode}): {run.stderr.strip().splitlines()[-1:]}")
    summary = json.loads(run.stdout[run.stdout.index("{"):])
    t = pq.read_table(res_path).to_pydict()
    got = {}
    for lab, c, w, code, ttft, tpot in zip(t["profile"], t["concurrency_target"], t["workload"], t["status"], t["mean_ttft_ms"], t["mean_tpot_ms"]):
        got[(lab, int(c), w)] = (st.name_table()[int(code)], bool(st.is_supported(int(code)) or int(code) == st.COMPLETED), ttft, tpot)
    for rid, k in row_of.items():
        if k not in got:
            out[rid].update(jaxsim=False, jaxsim_reason="sweep: no configuration")
            continue
        name, ok, ttft, tpot = got[k]
        out[rid].update(jaxsim=ok, jaxsim_reason="" if ok else f"sweep status {name}", jaxsim_status=name,
                        jaxsim_ttft_ms=ttft, jaxsim_tpot_ms=tpot)
    timing = {"wall_s": wall, "cpu_s": cpu_s, "configs": int(summary["configs_evaluated"]), "rows": len(row_of), "profiles": len(profiles),
              "load_before": load0, "load_after": load1, "command": " ".join(cmd),
              **{k: summary.get(k) for k in ("plan_s", "compile_s", "eval_s", "finalize_s")},
              "replay": summary.get("replay_timings") or {}}
    return out, timing


def family(model: str) -> str:
    return model.split("/")[-1]


def _pct(e: list[float]) -> tuple[float, float]:
    if not e:
        return float("nan"), float("nan")
    a = np.asarray(e, np.float64) * 100
    return float(np.percentile(a, 50)), float(np.percentile(a, 90))


def _err(pred, meas) -> float:
    return abs(pred / meas - 1.0)


def score(rows: list[dict], ov, aic: str = "aic") -> dict:
    """Per group: rows, TTFT/TPOT (median, p90) % for aiconfigurator (``aic``: its estimate with the harness's
    labels; ``aic_fallback``: else with the checkpoint's precision), jaxsim and jaxsim + overhead."""
    out = {}
    for r in rows:
        mt, mp = float(r["silicon_ttft_ms"]), float(r["silicon_tpot_ms"])
        jt, jp = float(r["jaxsim_ttft_ms"]), float(r["jaxsim_tpot_ms"])
        e = {
            "aiconfigurator": (_err(float(r[f"{aic}_ttft_ms"]), mt), _err(float(r[f"{aic}_tpot_ms"]), mp)),
            "jaxsim": (_err(jt, mt), _err(jp, mp)),
            "jaxsim + overhead": (_err(jt + float(ov.ttft_ms(int(r["isl"]))), mt), _err(jp + ov.per_output_token_ms, mp)),
        }
        for g in (family(r["model_path"]), "overall"):
            d = out.setdefault(g, defaultdict(lambda: ([], [])))
            for who, (a, b) in e.items():
                d[who][0].append(a)
                d[who][1].append(b)
    return {g: {who: {"n": len(v[0]), "ttft": _pct(v[0]), "tpot": _pct(v[1])} for who, v in d.items()} for g, d in out.items()}


def table(scores: dict) -> str:
    lines = ["| model family | rows | who | TTFT median / p90 abs error | TPOT median / p90 abs error |", "|---|---:|---|---:|---:|"]
    for g in sorted(scores, key=lambda k: (k == "overall", k)):
        for who, s in scores[g].items():
            lines.append(f"| {'**overall**' if g == 'overall' else g} | {s['n']} | {who} | {s['ttft'][0]:.1f} % / {s['ttft'][1]:.1f} % | "
                         f"{s['tpot'][0]:.1f} % / {s['tpot'][1]:.1f} % |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/jaxsim-opmodel-coverage"), help="cache folder (shared with opmodel_coverage.py)")
    ap.add_argument("--models", default="", help="comma-separated substrings of model ids to keep (a subsample)")
    ap.add_argument("--cells-per-system", type=int, default=0,
                    help="keep only the N cells (precision x TP) with the most rows per (model, system): a subsample; 0 = all")
    ap.add_argument("--evaluate", choices=("steady", "replay", "auto"), default="steady",
                    help="how jaxsim evaluates each row: the steady state (default), a replay of its benchmark (slower), or auto (the "
                         "steady state, and a replay of the rows it flags kv_preemption)")
    ap.add_argument("--cached-only", action="store_true", help="score only the rows already in WORK/rows.jsonl (evaluate nothing new)")
    ap.add_argument("--one-sweep", action="store_true",
                    help="evaluate every row again in ONE jaxsim sweep (a CLI subprocess over every cell's cached import, each profile at its "
                         "own rows' concurrencies and workloads) and print its wall time and configs/s")
    ap.add_argument("--per-family", action="store_true",
                    help="with --one-sweep: one jaxsim sweep per model family (times summed): a sweep holds every profile's padded tables, "
                         "about 0.2 GB each, so the whole sample in one sweep needs about 16 GB")
    ap.add_argument("--block-gemm-data", choices=BLOCK_GEMM_DATA, default=DEFAULT_BLOCK_GEMM_DATA,
                    help="jaxsim import op-model --block-gemm-data for the fp8_block checkpoints (the importer's default, per-tensor; "
                         "collected: their results are cached apart)")
    ap.add_argument("--async-scheduling", choices=("on", "off"), default="on" if SERVER_ASYNC_SCHEDULING else "off",
                    help="the servers' scheduler: async (on, the sample's protocol) or synchronous (off: results cached apart)")
    ap.add_argument("--report", type=Path, help="write the Markdown tables here")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    rows = [r for r in cov.agg_rows() if (cov._int(r["attention_dp_size"]) or 1) == 1]
    if args.models:
        keep = [m.strip().lower() for m in args.models.split(",") if m.strip()]
        rows = [r for r in rows if any(k in r["model_path"].lower() for k in keep)]
    if args.cells_per_system:
        cells = defaultdict(list)
        for r in rows:
            cells[(r["model_path"], r["system"], r["gemm_quant_mode"], r["tp_size"])].append(r)
        best = defaultdict(list)
        for k, v in sorted(cells.items(), key=lambda kv: (-len(kv[1]), str(kv[0]))):
            if len(best[k[:2]]) < args.cells_per_system:
                best[k[:2]].append(k)
        keep_cells = {k for ks in best.values() for k in ks}
        rows = [r for r in rows if (r["model_path"], r["system"], r["gemm_quant_mode"], r["tp_size"]) in keep_cells]
    args.work.mkdir(parents=True, exist_ok=True)
    cov.BENCHMARK, cov.EVALUATE, cov.SERVER_KV_CACHE_DTYPE = BENCHMARK, args.evaluate, SERVER_KV
    cov.BLOCK_GEMM_DATA = args.block_gemm_data
    cov.SERVER_ASYNC_SCHEDULING = args.async_scheduling == "on"
    tag = "" if args.block_gemm_data == DEFAULT_BLOCK_GEMM_DATA else f"-block-gemm-{args.block_gemm_data}"
    tag += "" if cov.SERVER_ASYNC_SCHEDULING == SERVER_ASYNC_SCHEDULING else "-sync"
    name = "bench-rows.jsonl" if args.evaluate == "steady" else f"bench-rows-{args.evaluate}.jsonl"
    name = name.replace(".jsonl", f"{tag}.jsonl")
    results = _load(args.work / name)
    todo = [r for r in rows if r["id"] not in results]
    if args.one_sweep:
        name = f"bench-rows-{args.evaluate}-one-sweep{tag}.jsonl"
        groups = defaultdict(list)
        for r in rows:
            groups[family(r["model_path"]) if args.per_family else "all"].append(r)
        jx, timing = {}, {}
        for g, grows in sorted(groups.items()):
            part, t = one_sweep(args.work, grows, args.evaluate)
            jx.update(part)
            print(f"  {g}: {t['rows']} rows, {t['configs']} configs, {t['profiles']} profiles, {t['wall_s']:.0f} s wall, {t['cpu_s']:.0f} s CPU, "
                  f"replay run {t['replay'].get('run_s', 0):.1f} s, load {t['load_before'][0]:.1f}", file=sys.stderr)
            for k, v in t.items():
                if isinstance(v, (int, float)):
                    timing[k] = timing.get(k, 0) + v
                elif k == "replay":
                    timing.setdefault("replay", {})
                    for kk, vv in v.items():
                        timing["replay"][kk] = timing["replay"].get(kk, 0) + vv
                else:
                    timing.setdefault(k, t[k] if k != "load_after" else None)
            timing["load_after"] = t["load_after"]
        known = _known_aic(args.work)
        results = {}
        with (args.work / name).open("w") as f:
            for r in rows:
                old = known.get(r["id"])
                res = dict(jx[r["id"]], **({k: v for k, v in old.items() if k.startswith("aic")} if old and "aic" in old else cov.aic_row(r)))
                results[r["id"]] = res
                f.write(json.dumps({"id": r["id"], "result": res}, default=float) + "\n")
        rep_ = timing["replay"]
        print(f"{len(groups)} sweep(s) ({args.evaluate}): {timing['rows']} rows of {len(rows)}, {timing['configs']} configs, "
              f"{timing['profiles']} profiles: "
              f"{timing['wall_s']:.0f} s wall (CLI; plan {timing['plan_s']:.1f} s, compile {timing['compile_s']:.1f} s, eval "
              f"{timing['eval_s']:.1f} s; replay compile {rep_.get('compile_s', 0):.1f} s / {rep_.get('compilations', 0)} executables, run "
              f"{rep_.get('run_s', 0):.1f} s, {rep_.get('passes', 0):,} passes), {timing['configs'] / timing['wall_s']:.2f} configs/s; "
              f"CPU {timing['cpu_s']:.0f} s (user + system; "
              f"{timing['cpu_s'] / 2:.0f} s on 2 idle cores); "
              f"load average {timing['load_before'][0]:.1f} before, {timing['load_after'][0]:.1f} after", file=sys.stderr)
        print(f"command: {timing['command']}", file=sys.stderr)
        (args.work / f"one-sweep-{args.evaluate}-timing.json").write_text(json.dumps(timing, indent=1, default=float))
    elif todo and not args.cached_only:
        print(f"{len(rows)} rows, {len(todo)} to evaluate ({args.evaluate}); work folder {args.work}", file=sys.stderr)
        collect(args.work, todo, results, name)
    rows = [dict(r, **results[r["id"]]) for r in rows if r["id"] in results]
    fit_rows = [r for r in rows if r["system"] in FIT_SYSTEMS and r.get("jaxsim")]
    if len(fit_rows) < 4:
        sys.exit(f"error: {len(fit_rows)} h100/h200 rows evaluated by jaxsim: too few to fit the overhead")
    ov = fit_overhead([int(r["isl"]) for r in fit_rows], [r["jaxsim_ttft_ms"] for r in fit_rows], [r["jaxsim_tpot_ms"] for r in fit_rows],
                      [float(r["silicon_ttft_ms"]) for r in fit_rows], [float(r["silicon_tpot_ms"]) for r in fit_rows],
                      f"fitted from aiconfigurator-core systems/silicon_sample.csv, {len(fit_rows)} vLLM aggregated rows on h100_sxm/h200_sxm")
    held = [r for r in rows if r["system"] in HELD_OUT_SYSTEMS]
    both = [r for r in held if r.get("jaxsim") and r.get("aic")]
    fams = sorted({family(r["model_path"]) for r in rows})
    fit_scores = score([r for r in fit_rows if r.get("aic")], ov)
    held_scores = score(both, ov)
    both_fb = [r for r in held if r.get("jaxsim") and r.get("aic_fallback")]
    fb_scores = score(both_fb, ov, "aic_fallback")
    o = held_scores.get("overall")
    cover = (f"held-out rows (b200/b300/gb200): {len(held)}; jaxsim evaluates {sum(bool(r.get('jaxsim')) for r in held)}, "
             f"aiconfigurator {sum(bool(r.get('aic')) for r in held)}, both {len(both)}")
    text = "\n".join([
        f"jaxsim method: {args.evaluate}.",
        "",
        f"Rows: {len(rows)} vLLM aggregated rows without attention DP of the model families {', '.join(fams)}; {cover}.",
        "",
        f"Serving overhead fitted on the h100_sxm / h200_sxm rows only ({len(fit_rows)} rows jaxsim evaluates): {ov.describe()}.",
        "",
        "Held out (b200_sxm, b300_sxm, gb200; never fitted), rows both tools evaluate:",
        "",
        table(held_scores),
        "",
        f"Held out, with aiconfigurator's estimate at the checkpoint's precision where the harness's labels fail ({len(both_fb)} rows):",
        "",
        table(fb_scores),
        "",
        "For comparison, the fitted rows (h100_sxm / h200_sxm) both evaluate (harness labels):",
        "",
        table(fit_scores),
    ])
    if args.report:
        args.report.write_text(text + "\n")
    else:
        print(text)
    if o:
        j, a, jo = o["jaxsim + overhead"], o["aiconfigurator"], o["jaxsim"]
        print(f"held-out b200/b300/gb200, {j['n']} rows both evaluate: TTFT median/p90 jaxsim+overhead {j['ttft'][0]:.1f}/{j['ttft'][1]:.1f} % "
              f"(no overhead {jo['ttft'][0]:.1f}/{jo['ttft'][1]:.1f}, aiconfigurator {a['ttft'][0]:.1f}/{a['ttft'][1]:.1f}); TPOT "
              f"{j['tpot'][0]:.1f}/{j['tpot'][1]:.1f} % (no overhead {jo['tpot'][0]:.1f}/{jo['tpot'][1]:.1f}, aiconfigurator "
              f"{a['tpot'][0]:.1f}/{a['tpot'][1]:.1f}); overhead {ov.fixed_ms:.1f} ms + {ov.per_prompt_token_ms:.4f} ms/prompt token + "
              f"{ov.per_output_token_ms:.3f} ms/output token from {len(fit_rows)} h100/h200 rows")
    else:
        print(f"held-out: no row both tools evaluate ({cover})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
