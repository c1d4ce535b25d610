"""Benchmark batched trace replay against the reference (aisimulate) in one run.

Measures, on one SYNTHETIC dense FPM profile (made-up smooth latencies, timing only; not a measurement)
and the first 1,000 requests of the bundled Azure conversation excerpt with arrivals x 0.5:

* reference `aisimulate predict` (when its venv is given or $AIS_VENV is set): the engine's own
  wall_time_ms and the whole CLI, one process and two at once (its best per-machine rate);
* jaxsim engine only, in a fresh process per size: `run_replays` on 1, 64, 256 and 1,024
  configurations (max_num_seqs 16..256 x max_num_batched_tokens; 1,024 adds a finer token axis),
  compile time with a cold persistent cache, replay time, and the process's peak RSS;
* jaxsim whole CLI (`jaxsim replay`, `jaxsim replay --sweep`) for 1 and 256 configurations, with a cold
  and a warm persistent compile cache, wall time and peak RSS;
* scheduler passes against loop steps (a loop step runs a decode stretch of several passes and one pass:
  jaxsim.replay.stretch) for every jaxsim run;
* long traces (``--long 10000,100000``): the trace tiled to 10^4 / 10^5 requests (each copy after the
  previous one's last arrival), one configuration, the reference's whole CLI (and its engine time)
  against jaxsim's whole CLI with a cold and a warm cache, side by side, and per-request agreement.

Rates are completed request-replays per second. The reference replays one configuration per process,
so its rate for N configurations is its per-process rate times the processes the machine runs at once.

  python scripts/bench_replay.py [--reference-venv DIR] [--sizes 1,64,256,1024] [--cli-sizes 1,256] [--long 10000,100000]
                                 [--json out.json]

Install the reference in a venv of its own (it pins its own jax; see DEVELOPERS.md):
  python3 -m venv /tmp/ais && /tmp/ais/bin/pip install "aisimulate==0.13.0.dev202610270000000085"
The profile/trace/reference-config writers come from the team's replay comparison harness.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from calendar import timegm
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _synthetic_model import QWEN_CFG  # noqa: E402

MODEL = "bench-ckpt/synthetic-dense-8b"
TRACE_BLOCK = 16  # tokens per hash id in the trace both tools read (write_trace's block); caching is off in both
REVISION = "3b1f0c9d2e4a5b6c7d8e9f00112233445566aabb"
SYSTEM = "h200_sxm"
BACKEND_VERSION = "0.24.0"
CONTEXT = 32768
KV_BYTES_PER_TOKEN = 147456  # 36 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes
GPU_MEMORY_UTILIZATION = 0.9
DECLARED = dict(weights_bytes=16_400_000_000, activations_bytes=2_000_000_000, runtime_overhead_bytes=1_000_000_000,
                comm_overhead_bytes=0)
MAX_SEQS = 256
MAX_TOKENS = 8192
PREFILL_BATCHES = 16
DECODE_PER_REQ_KV = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
PREFILL_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192]
PREFILL_KV = [0, 16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]


def decode_ms(b: int, kv: int) -> float:
    """SYNTHETIC decode pass latency (ms) at batch b and total past KV kv: smooth, made up."""
    return 5.5 + 0.03 * b + 0.35 * math.log1p(b) + 1.8e-5 * kv


def prefill_ms(b: int, t: int, kv: int) -> float:
    """SYNTHETIC prefill pass latency (ms): b requests, t new tokens in total, kv cached tokens read."""
    return 3.0 + 0.15 * b + 0.028 * t + 1.0e-6 * t * t + 1.5e-5 * kv + 4.0e-9 * t * kv


def _row(kind: str, b: int, t: int, kv: int, lat: float) -> dict:
    return dict(
        cell_id="replay-bench-synthetic-cell", model_path=MODEL, system=SYSTEM, backend="vllm",
        backend_version=BACKEND_VERSION, runtime_backend_version=BACKEND_VERSION, weight_quantization="bfloat16",
        gemm_quant_mode="bfloat16", moe_quant_mode="bfloat16", fmha_quant_mode="bfloat16",
        fmha_resolution="checkpoint_native", comm_quant_mode="half", kv_cache_dtype="bfloat16",
        parallel_strategy="pure_tp", tp=1, pp=1, dp=1, moe_tp=1, moe_ep=1, cp=1, moe_backend="auto",
        attention_backend="auto", enable_wideep=False, enable_eplb=False, model_config_sha256="",
        execution_profile="full", engram_residency="none", input_modality="text", partition_policy="balanced_v1",
        kv_seed_regime="n/a" if kind == "prefill" and kv == 0 else "real_kv", global_warmup_iterations=3,
        warmup_repeats=0, measurement_repeats=1, measurement_policy="dynamo_native_single_sample_v1",
        model_support_level="synthetic", model_template_id="synthetic", model_template_version="1",
        aic_database_version="synthetic", source_plan_sha256="0" * 64, collector_attempt_id="replay-bench",
        runtime_run_id="replay-bench", runtime_grid_digest="replay-bench",
        workload_kind=kind, batch_size=b, total_prefill_tokens=t, total_kv_read_tokens=kv, latency_ms=float(lat),
    )


def write_profile(work: Path) -> tuple[Path, dict]:
    """The model dir (for the reference's checkpoint check) and the profile directory; returns (dir, counts)."""
    ck = work / MODEL
    ck.mkdir(parents=True, exist_ok=True)
    (ck / "config.json").write_text(json.dumps(QWEN_CFG, indent=1) + "\n")
    pdir = work / "profile"
    pdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for b in range(1, MAX_SEQS + 1):
        for p in DECODE_PER_REQ_KV:
            rows.append(_row("decode", b, 0, b * p, decode_ms(b, b * p)))
    n_dec = len(rows)
    for b in range(1, PREFILL_BATCHES + 1):
        for t in sorted({b, *[x for x in PREFILL_TOKENS if x >= b]}):
            for kv in PREFILL_KV:
                rows.append(_row("prefill", b, t, kv, prefill_ms(b, t, kv)))
    rows.sort(key=lambda r: (r["workload_kind"], r["batch_size"], r["total_prefill_tokens"], r["total_kv_read_tokens"]))
    pqp = pdir / "fpm_forward_perf.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pqp, compression="zstd")
    meta = {"schema_name": "aic_fpm_forward_perf", "schema_version": 7, "coordinate_system": "iteration_totals_balanced_v1",
            "measurement_policy": "dynamo_native_single_sample_v1", "warmup_repeats": 0, "measurement_repeats": 1,
            "row_count": len(rows), "parquet_sha256": hashlib.sha256(pqp.read_bytes()).hexdigest(), "system": SYSTEM,
            "backend": "vllm", "backend_version": BACKEND_VERSION, "model_paths": [MODEL]}
    (pdir / "fpm_forward_perf.metadata.json").write_text(json.dumps(meta, indent=1) + "\n")
    (pdir / "profile.json").write_text(json.dumps(profile_json(), indent=1) + "\n")
    return pdir, {"rows": len(rows), "decode_rows": n_dec, "prefill_rows": len(rows) - n_dec}


def profile_json() -> dict:
    res = {"cache_layout": "linear", "max_num_tokens": MAX_TOKENS, "max_batch_size": MAX_SEQS,
           "provenance": "SYNTHETIC replay-benchmark profile (made-up latencies, timing only)",
           "kv_bytes_per_token": KV_BYTES_PER_TOKEN, **DECLARED}
    dep = {"system": SYSTEM, "backend": "vllm", "backend_version": BACKEND_VERSION, "tp": 1, "dp": 1, "moe_tp": 1,
           "moe_ep": 1, "gemm_quant_mode": "bfloat16", "moe_quant_mode": "bfloat16", "fmha_quant_mode": "bfloat16",
           "comm_quant_mode": "half", "kv_cache_dtype": "bfloat16", "resources": res}
    return {"schema_version": 1, "model": MODEL, "model_revision": REVISION, "architecture": "Qwen3ForCausalLM",
            "context_length": CONTEXT, "num_experts": 0,
            "provenance": "SYNTHETIC replay-benchmark profile (made-up latencies, timing only)", "deployments": [dep]}


# ----------------------------------------------------------------------------------------------------
# the trace

_AZ = re.compile(r"^(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:\.(\d+))?$")


def bundled_trace(name: str) -> Path:
    spec = importlib.util.find_spec("jaxsim")  # locate the package without importing it (no JAX start-up here)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("jaxsim is not importable from this python (run with the jaxsim venv's python)")
    d = Path(list(spec.submodule_search_locations)[0]) / "data" / "traces"
    for ext in (".csv", ".jsonl"):
        if (d / (name + ext)).is_file():
            return d / (name + ext)
    raise SystemExit(f"no bundled trace {name!r} in {d}")


def read_requests(path: Path, n: int) -> list[tuple[float, int, int]]:
    """(arrival ms from the first request, input, output) of the first n requests in arrival order."""
    out = []
    if path.suffix == ".csv":  # Azure 2023: TIMESTAMP, ContextTokens, GeneratedTokens
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                m = _AZ.match(row["TIMESTAMP"].strip())
                ns = timegm(datetime.fromisoformat(m.group(1)).timetuple()) * 10**9 + int((m.group(2) or "0")[:9].ljust(9, "0"))
                out.append((ns, int(row["ContextTokens"]), int(row["GeneratedTokens"])))
        out = sorted(out, key=lambda r: r[0])[:n]  # stable: ties keep file order
        t0 = out[0][0]
        return [((t - t0) / 1e6, i, o) for t, i, o in out]
    with open(path) as f:  # Mooncake: timestamp (ms), input_length, output_length
        for line in f:
            if line.strip():
                d = json.loads(line)
                out.append((float(d["timestamp"]), int(d["input_length"]), int(d["output_length"])))
    out = sorted(out, key=lambda r: r[0])[:n]
    t0 = out[0][0]
    return [(t - t0, i, o) for t, i, o in out]


def write_trace(path: Path, reqs: list[tuple[float, int, int]], time_scale: float, block: int = 16) -> list[dict]:
    """One Mooncake JSONL both tools read (arrivals rounded to whole microseconds; unique hash ids)."""
    recs, hid = [], 1
    with open(path, "w") as f:
        for a, i, o in reqs:
            ts = round(a * time_scale, 3)
            nb = (i + block - 1) // block
            f.write(json.dumps({"timestamp": ts, "input_length": i, "output_length": o, "hash_ids": list(range(hid, hid + nb))}) + "\n")
            recs.append({"arrival_ms": ts, "input_length": i, "output_length": o})
            hid += nb
    return recs


# ----------------------------------------------------------------------------------------------------
# the reference


def reference_config(pdir: Path, trace: Path, seqs: int, tokens: int, block: int) -> dict:
    eng = {"mode": "aggregated", "model": MODEL, "fpm_profile": profile_json(), "hardware": SYSTEM, "backend": "vllm",
           "backend_version": BACKEND_VERSION, "estimation_mode": "fpm_interpolation",
           "estimator_config": {"fpm_interpolation": {"method": "direct",
                                                      "fpm_parquet_path": str(pdir / "fpm_forward_perf.parquet")}},
           "context_length": CONTEXT,
           "workers": {"aggregated": {"scheduler": {"max_batched_tokens": tokens, "max_sequences": seqs},
                                      "kv_cache": {"prefix_caching": False, "block_size": block,
                                                   "capacity": {"memory_fraction": GPU_MEMORY_UTILIZATION}}}}}
    return {"engine": eng, "traffic": {"source": {"type": "trace", "paths": [str(trace)], "format": "mooncake",
                                                  "block_size": TRACE_BLOCK}, "load": {"type": "trace_timestamps"}}}


def start_reference(cli: str, cfg: Path, out: Path, cwd: Path, log: Path):
    shutil.rmtree(out, ignore_errors=True)
    fh = open(log, "w")
    p = subprocess.Popen([cli, "predict", "-c", str(cfg), "--output-dir", str(out), "--overwrite", "--capture-per-request",
                          "--detail", "memory", "--format", "json"], cwd=cwd, stdout=fh, stderr=subprocess.STDOUT)
    return p, fh


def finish_reference(p, fh, out: Path, log: Path, t0: float) -> dict:
    rc = p.wait(timeout=3600)
    wall = time.perf_counter() - t0
    fh.close()
    if rc != 0 or not (out / "prediction.json").is_file():
        tail = log.read_text()[-1500:]
        raise SystemExit(f"reference replay failed (rc={rc}); log tail:\n{tail}")
    d = json.loads((out / "prediction.json").read_text())
    return {"cli_wall_s": wall, "engine_wall_s": float(d["wall_time_ms"]) / 1e3,
            "completed": int(d.get("completed_requests", 0)), "prediction": d}


def run_reference(cli: str, cfg: Path, out: Path, cwd: Path) -> dict:
    log = out.with_suffix(".log")
    t0 = time.perf_counter()
    p, fh = start_reference(cli, cfg, out, cwd, log)
    return finish_reference(p, fh, out, log, t0)


def run_reference_pair(cli: str, cfg: Path, outs: list[Path], cwd: Path) -> dict:
    t0 = time.perf_counter()
    procs = [start_reference(cli, cfg, o, cwd, o.with_suffix(".log")) for o in outs]
    res = [finish_reference(p, fh, o, o.with_suffix(".log"), t0) for (p, fh), o in zip(procs, outs)]
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "completed": sum(r["completed"] for r in res),
            "engine_wall_s": [r["engine_wall_s"] for r in res], "cli_wall_s": [r["cli_wall_s"] for r in res]}


# ----------------------------------------------------------------------------------------------------
# jaxsim

def jaxsim_config(path: Path, pdir: Path, seqs: int, tokens: int, block: int) -> None:
    path.write_text(f"""# replay benchmark: the SYNTHETIC profile, one aggregated worker
model = "{MODEL}"
system = "{SYSTEM}"
backend = "vllm"
backend_version = "{BACKEND_VERSION}"
profile = "{pdir}"
mode = "aggregated"
block_size = {block}
context_length = {CONTEXT}
method = "direct"
database_mode = "SILICON"
fallback = "deny"

[roles.aggregated]
tp = 1
replicas = 1
max_num_batched_tokens = {tokens}
max_num_seqs = {seqs}
gpu_memory_utilization = {GPU_MEMORY_UTILIZATION}
prefix_caching = false  # off in both tools: this benchmark times the scheduler, not the cache
""")


def sweep_axes(n: int) -> tuple[list[int], list[int]]:
    """max_num_seqs x max_num_batched_tokens grids with about n combinations: 16 x 16 = 256 for n >= 256
    (max_num_seqs 16..256 step 16, max_num_batched_tokens 512..8192 step 512); evenly thinned below."""
    seqs_all = list(range(16, 257, 16))
    toks_all = list(range(512, 8193, 512))
    a = 1
    while a * a < n:
        a += 1
    a = min(a, 16)
    b = min(16, -(-n // a))
    pick = lambda xs, k: [xs[round(i * (len(xs) - 1) / max(k - 1, 1))] for i in range(k)]  # noqa: E731
    return pick(seqs_all, a), pick(toks_all, b)


def sweep_spec(path: Path, pdir: Path, seqs: list[int], toks: list[int], block: int, prefix_caching: bool = False) -> None:
    path.write_text(f"""# replay benchmark sweep: the SYNTHETIC profile, max_num_seqs x max_num_batched_tokens
# (concurrency and workload are required by the spec format but unused by `jaxsim replay --sweep`)
name = "replay-bench"
block_size = {block}

[[profile]]
name = "{pdir}"
label = "synthetic"
prefix_caching = {str(prefix_caching).lower()}

[serving]
mode = ["aggregated"]

[scheduler]
concurrency = [1]
max_num_seqs = {seqs}
max_num_batched_tokens = {toks}

[[workload]]
name = "unused"
isl = 1024
osl = 128
""")




def axes(n: int) -> tuple[list[int], list[int]]:
    """The harness's 16 x 16 grid up to 256 configurations; beyond, max_num_batched_tokens in finer steps."""
    if n <= 256:
        return sweep_axes(n)
    seqs = list(range(16, 257, 16))
    k = -(-n // len(seqs))
    step = max(1, 8192 // k)
    return seqs, [step * (i + 1) for i in range(k)]


def agreement(pred: dict, path: Path, config_part: str | None = None) -> dict:
    """Largest relative TTFT / E2E difference between a jaxsim replay output (rows of the configuration
    whose name contains ``config_part``, or all) and the reference's per-request records (session ids
    request_<line number>); requests completed by both are compared."""
    t = pq.read_table(path, columns=["config", "row", "terminal", "ttft_ms", "e2e_ms"]).to_pydict()
    ref = {r["session_id"]: r for r in pred["per_request"]}
    out = {"compared": 0, "max_rel_ttft": 0.0, "max_rel_e2e": 0.0}
    for i, row in enumerate(t["row"]):
        r = ref.get(f"request_{int(row) + 1}")
        if (config_part is not None and config_part not in t["config"][i]) or r is None:
            continue
        if r.get("terminal_status") != "completed" or t["terminal"][i] != "completed":
            continue
        out["compared"] += 1
        for mk, rk, key in (("ttft_ms", "ttft_ms", "max_rel_ttft"), ("e2e_ms", "e2e_latency_ms", "max_rel_e2e")):
            out[key] = max(out[key], abs(float(t[mk][i]) - float(r[rk])) / max(abs(float(r[rk])), 1e-300))
    return out


def _rss_mb(ru) -> float:
    return ru.ru_maxrss / 1024.0  # Linux: kilobytes


def run_child(cmd: list[str], env: dict) -> dict:
    """Run a process; its wall time, exit status, output and own peak RSS (``wait4``)."""
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, text=True, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0), fe.seek(0)
        return {"wall_s": wall, "rc": p.returncode, "stdout": fo.read(), "stderr": fe.read(), "peak_rss_mb": _rss_mb(ru)}


def worker(spec: Path, trace: Path, out: Path) -> None:
    """Engine-only measurement in this process (started fresh by the parent for each size)."""
    import resource

    from jaxsim.devices import enable_compilation_cache, use_all_cpu_cores

    use_all_cpu_cores()
    enable_compilation_cache()
    from jaxsim.cli.cmd_replay import configs_from_sweep
    from jaxsim.replay.orchestrate import run_replays
    from jaxsim.replay.traces import load_trace

    if os.environ.get("BENCH_LOOKAHEAD"):  # A/B of decode stretches: this lookahead for every group
        from jaxsim.replay import runner

        runner.stretch_lookahead = lambda n_items: int(os.environ["BENCH_LOOKAHEAD"])
    configs = configs_from_sweep(spec)
    tr = load_trace(str(trace), trace_block_size=TRACE_BLOCK)
    first: dict = {}
    outs = run_replays(configs, tr, [0], timings=first)
    again: dict = {}
    outs = run_replays(configs, tr, [0], timings=again)
    done = sum(int(o.summary["completed_requests"] or 0) for o in outs)
    out.write_text(json.dumps({
        "configs": len(configs), "completed": done, "replays_completed": sum(o.status_text == "completed" for o in outs),
        "compile_s": first.get("compile_s", 0.0), "compilations": first.get("compilations", 0),
        "run_cold_s": first.get("run_s", 0.0), "run_s": again.get("run_s", 0.0),
        "passes": again.get("passes", 0), "loop_steps": again.get("loop_steps", 0), "replays_shared": again.get("replays_shared", 0),
        "peak_rss_mb": _rss_mb(resource.getrusage(resource.RUSAGE_SELF)),
    }))


def tiled_requests(reqs: list[tuple[float, int, int]], n: int) -> list[tuple[float, int, int]]:
    """``reqs`` repeated to ``n`` requests, each copy 1 s after the previous copy's last arrival."""
    out = list(reqs)
    while len(out) < n:
        shift = out[-1][0] + 1000.0
        out += [(a + shift, i, o) for a, i, o in reqs[: n - len(out)]]
    return out[:n]


def long_trace(n: int, args, work: Path, pdir: Path, ref_cli: Path | None, jaxsim_cli: str, env0: dict) -> dict:
    """One configuration on the trace tiled to ``n`` requests: the reference's whole CLI and jaxsim's (cold and
    warm cache), side by side."""
    trace = work / f"trace-{n}.jsonl"
    write_trace(trace, tiled_requests(read_requests(bundled_trace(args.trace), args.requests), n), args.time_scale)
    row: dict = {"requests": n}
    if ref_cli is not None:
        cfg = work / f"reference-{n}.yaml"
        cfg.write_text(json.dumps(reference_config(pdir, trace, args.seqs, args.tokens, 16), indent=1))
        r = run_reference(str(ref_cli), cfg, work / f"ref-long-{n}", work)
        pred = r.pop("prediction")
        row["reference"] = {"engine_s": r["engine_wall_s"], "cli_s": r["cli_wall_s"], "completed": r["completed"]}
    cfg = work / "jaxsim-1.toml"
    jaxsim_config(cfg, pdir, args.seqs, args.tokens, 16)
    cache = work / f"cache-long-{n}"
    shutil.rmtree(cache, ignore_errors=True)
    out = work / f"long-{n}.parquet"
    for tag in ("cold", "warm"):
        r = run_child([jaxsim_cli, "replay", str(cfg), "--trace", str(trace), "--output", str(out), "--json", "--no-progress", "--force",
                           "--trace-block-size", str(TRACE_BLOCK)],
                      dict(env0, JAXSIM_CACHE_DIR=str(cache)))
        if r["rc"] != 0:
            row[tag] = {"wall_s": float("nan"), "peak_rss_mb": r["peak_rss_mb"], "timings": {}, "error": r["stderr"][-500:]}
            continue
        js = json.loads(r["stdout"][r["stdout"].index("{"):])
        row[tag] = {"wall_s": r["wall_s"], "peak_rss_mb": r["peak_rss_mb"], "timings": js["timings"]}
    if ref_cli is not None and out.is_file():
        row["agreement"] = agreement(pred, out)
    rr = row.get("reference", {})
    print(f"{n:,} requests, one config: reference CLI {rr.get('cli_s', float('nan')):.1f} s (engine {rr.get('engine_s', float('nan')):.1f} s); "
          f"jaxsim CLI cold {row['cold']['wall_s']:.1f} s, warm {row['warm']['wall_s']:.1f} s (peak RSS {row['warm']['peak_rss_mb']:,.0f} MB, "
          f"{row['warm']['timings'].get('passes', 0):,} passes in {row['warm']['timings'].get('loop_steps', 0):,} loop steps); "
          f"agreement {row.get('agreement')}")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference-venv", default=os.environ.get("AIS_VENV"))
    ap.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    ap.add_argument("--sizes", default="1,64,256,1024", help="engine-only configuration counts")
    ap.add_argument("--cli-sizes", default="1,256", help="whole-CLI configuration counts")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--trace", default="azure_conv_1k")
    ap.add_argument("--time-scale", type=float, default=0.5)
    ap.add_argument("--seqs", type=int, default=128, help="max_num_seqs of the 1-config comparison")
    ap.add_argument("--tokens", type=int, default=8192, help="max_num_batched_tokens of the 1-config comparison")
    ap.add_argument("--long", default="", help="long-trace request counts (the trace tiled), e.g. 10000,100000")
    ap.add_argument("--json", default=None)
    ap.add_argument("--_worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._worker:
        return worker(*map(Path, args._worker))

    work = Path(args.work or tempfile.mkdtemp(prefix="jaxsim-bench-replay-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    jaxsim_cli = str(Path(sys.executable).with_name("jaxsim"))
    report: dict = {"cores": os.cpu_count(), "loadavg_start": os.getloadavg(), "args": {k: v for k, v in vars(args).items() if k != "_worker"}}
    print(f"machine: {os.cpu_count()} cores, load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}; work folder {work}")
    pdir, counts = write_profile(work)
    reqs = read_requests(bundled_trace(args.trace), args.requests)
    trace = work / "trace.jsonl"
    recs = write_trace(trace, reqs, args.time_scale)
    n_req = len(recs)
    print(f"SYNTHETIC profile ({counts['rows']} rows, timing only) and {n_req} requests of {args.trace}, arrivals x{args.time_scale}")

    # the reference
    ref = None
    cli = Path(args.reference_venv or "/nonexistent") / "bin" / "aisimulate"
    if cli.is_file():
        cfg = work / "reference.yaml"  # JSON is YAML
        cfg.write_text(json.dumps(reference_config(pdir, trace, args.seqs, args.tokens, 16), indent=1))
        r1 = run_reference(str(cli), cfg, work / "ref-out", work)
        pred = r1.pop("prediction")
        pair = run_reference_pair(str(cli), cfg, [work / "ref-a", work / "ref-b"], work)
        ref = {
            "engine_s": r1["engine_wall_s"], "cli_s": r1["cli_wall_s"], "completed": r1["completed"],
            "engine_rate": r1["completed"] / r1["engine_wall_s"],
            "engine_rate_machine": pair["completed"] / max(pair["engine_wall_s"]),
            "cli_rate_machine": max(r1["completed"] / r1["cli_wall_s"], pair["completed"] / pair["wall_s"]),
        }
        print(f"reference: engine {ref['engine_s'] * 1e3:.1f} ms, CLI {ref['cli_s']:.2f} s for {ref['completed']}/{n_req}; per machine "
              f"engine {ref['engine_rate_machine']:,.0f}, CLI {ref['cli_rate_machine']:,.0f} request-replays/s")
    else:
        print("reference: not measured (give --reference-venv or set AIS_VENV to a venv with aisimulate)")
    report["reference"] = ref

    def spec_for(n: int) -> Path:
        if n == 1:
            seqs, toks = [args.seqs], [args.tokens]
        else:
            seqs, toks = axes(n)
        p = work / f"sweep-{n}.toml"
        sweep_spec(p, pdir, seqs, toks, 16)
        return p

    env0 = dict(os.environ)
    rows = []
    for n in [int(x) for x in args.sizes.split(",") if x]:
        cache = work / f"cache-engine-{n}"
        shutil.rmtree(cache, ignore_errors=True)
        res = work / f"engine-{n}.json"
        r = run_child([sys.executable, __file__, "--_worker", str(spec_for(n)), str(trace), str(res)],
                      dict(env0, JAXSIM_CACHE_DIR=str(cache)))
        if r["rc"] != 0:
            raise SystemExit(f"engine run ({n} configs) failed: {r['stderr'][-2000:]}")
        e = json.loads(res.read_text())
        e.update(rate=e["completed"] / e["run_s"], process_wall_s=r["wall_s"])
        rows.append(e)
        print(f"jaxsim engine, {e['configs']} configs: {e['replays_completed']}/{e['configs']} completed; compile {e['compile_s']:.1f} s "
              f"({e['compilations']} executables, cold cache), replay {e['run_s']:.2f} s (first {e['run_cold_s']:.2f} s) -> "
              f"{e['rate']:,.0f} request-replays/s; peak RSS {e['peak_rss_mb']:,.0f} MB; {e['passes']:,} passes in {e['loop_steps']:,} loop steps; "
              f"{e['replays_shared']} of {e['configs']} replays took another's result (only max_num_seqs differed, no admission reached it)")
    report["engine"] = rows

    cli_rows = []
    for n in [int(x) for x in args.cli_sizes.split(",") if x]:
        cache = work / f"cache-cli-{n}"
        shutil.rmtree(cache, ignore_errors=True)
        if n == 1:
            cfg = work / "jaxsim-1.toml"
            jaxsim_config(cfg, pdir, args.seqs, args.tokens, 16)
            what = [str(cfg)]
        else:
            what = ["--sweep", str(spec_for(n))]
        row = {"configs": n}
        for tag in ("cold", "warm"):
            r = run_child([jaxsim_cli, "replay", *what, "--trace", str(trace), "--output", str(work / f"cli-{n}.parquet"), "--json",
                           "--no-progress", "--force", "--trace-block-size", str(TRACE_BLOCK)], dict(env0, JAXSIM_CACHE_DIR=str(cache)))
            if r["rc"] != 0:
                raise SystemExit(f"jaxsim replay ({n} configs) failed rc={r['rc']}: {r['stderr'][-2000:]}")
            js = json.loads(r["stdout"][r["stdout"].index("{"):])
            done = sum(int(x["completed_requests"] or 0) for x in js["replays"])
            row[tag] = {"wall_s": r["wall_s"], "peak_rss_mb": r["peak_rss_mb"], "timings": js["timings"], "completed": done,
                        "rate": done / r["wall_s"]}
        cli_rows.append(row)
        print(f"  passes {row['warm']['timings'].get('passes', 0):,} in {row['warm']['timings'].get('loop_steps', 0):,} loop steps; "
              f"{row['warm']['timings'].get('replays_shared', 0)} of {n} replays shared another's result")
        c, w = row["cold"], row["warm"]
        print(f"jaxsim CLI, {n} configs: cold cache {c['wall_s']:.1f} s (compile {c['timings']['compile_s']:.1f} s), warm {w['wall_s']:.1f} s "
              f"(compile {w['timings']['compile_s']:.1f} s, replay {w['timings']['run_s']:.1f} s) -> {c['rate']:,.0f} / {w['rate']:,.0f} "
              f"request-replays/s; peak RSS {c['peak_rss_mb']:,.0f} MB")
    report["cli"] = cli_rows
    if ref is not None:
        for n in [int(x) for x in args.cli_sizes.split(",") if x]:
            ag = agreement(pred, work / f"cli-{n}.parquet", f"seqs={args.seqs} tokens={args.tokens}" if n > 1 else None)
            report.setdefault("agreement", {})[n] = ag
            print(f"per-request agreement with the reference (max_num_seqs {args.seqs}, max_num_batched_tokens {args.tokens}; "
                  f"{'the sweep' if n > 1 else 'one config'}): {ag['compared']} requests, max relative difference TTFT "
                  f"{ag['max_rel_ttft']:.3g}, E2E {ag['max_rel_e2e']:.3g}")

    long_rows = []
    for n in [int(x) for x in args.long.split(",") if x]:
        long_rows.append(long_trace(n, args, work, pdir, cli if cli.is_file() else None, jaxsim_cli, env0))
    report["long"] = long_rows

    # the table
    print("\n| | reference | jaxsim | ratio |\n|---|---:|---:|---:|")
    one = next((e for e in rows if e["configs"] == 1), None)
    if one:
        print(f"| one replay, engine only (s) | {ref['engine_s']:.3f} |" if ref else "| one replay, engine only (s) | – |", end="")
        print(f" {one['run_s']:.3f} | {ref['engine_s'] / one['run_s']:.2f}x |" if ref else f" {one['run_s']:.3f} | |")
    for e in rows:
        r_rate = ref["engine_rate_machine"] if ref else None
        print(f"| {e['configs']:,} configs, engine request-replays/s per machine | {r_rate:,.0f} |" if ref else
              f"| {e['configs']:,} configs, engine request-replays/s | – |", end="")
        print(f" {e['rate']:,.0f} (compile {e['compile_s']:.1f} s, {e['peak_rss_mb']:,.0f} MB) | "
              + (f"{e['rate'] / r_rate:.1f}x |" if ref else "|"))
    for c in cli_rows:
        r_rate = ref["cli_rate_machine"] if ref else None
        for tag in ("cold", "warm"):
            x = c[tag]
            print(f"| {c['configs']:,} configs, whole CLI, {tag} cache: request-replays/s | " + (f"{r_rate:,.0f} |" if ref else "– |")
                  + f" {x['rate']:,.0f} ({x['wall_s']:.1f} s, {x['peak_rss_mb']:,.0f} MB) | " + (f"{x['rate'] / r_rate:.1f}x |" if ref else "|"))
    if ref:
        print(f"| one replay, whole CLI, cold / warm cache (s) | {ref['cli_s']:.2f} |", end="")
        for c in cli_rows:
            if c["configs"] == 1:
                print(f" {c['cold']['wall_s']:.2f} / {c['warm']['wall_s']:.2f} | {c['cold']['wall_s'] / ref['cli_s']:.2f}x / "
                      f"{c['warm']['wall_s'] / ref['cli_s']:.2f}x of the reference |", end="")
        print()
    for lr in long_rows:
        r = lr.get("reference") or {}
        print(f"| {lr['requests']:,} requests, whole CLI (s): reference {r.get('cli_s', float('nan')):.1f} (engine "
              f"{r.get('engine_s', float('nan')):.1f}); jaxsim cold / warm | {lr['cold']['wall_s']:.1f} / {lr['warm']['wall_s']:.1f} "
              f"({lr['warm']['peak_rss_mb']:,.0f} MB; {lr['warm']['timings'].get('passes', 0):,} passes in "
              f"{lr['warm']['timings'].get('loop_steps', 0):,} loop steps) | agreement max rel TTFT {lr.get('agreement', {}).get('max_rel_ttft')} |")
    report["loadavg_end"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
