#!/usr/bin/env python
"""Randomized replay comparison: `jaxsim replay` against the reference CLI `aisimulate predict`, per request,
bit for bit, on random tables, scheduler settings and traces.

    PYTHONPATH=$PWD /work/venv/bin/python scripts/diff_replay_vs_reference.py REFERENCE_VENV WORKDIR \
        [--seeds 0:120] [--timeout 60] [--keep-agreeing]

REFERENCE_VENV is a virtual environment with the public `aisimulate` package (its `bin/aisimulate` is run
as a subprocess; jaxsim never imports it). For every seed, under WORKDIR/seed-<n>/ (the layout of
tests/data/replay_cases/):

* ``profile/``: one dense FPM profile (schema 7) with SYNTHETIC, made-up latencies (smooth functions of
  batch, tokens and KV times random coefficients, plus random per-row noise; timing only, not a
  measurement of anything): autoregressive or an EAGLE-3 speculative round with K = 1..3 draft tokens;
  decode rows over a batch ladder x total-KV ladder, prefill rows over batch x new tokens x cached KV, both
  wide enough that every lookup of the replay lies inside measured support;
* random scheduler settings, biased to the tight corners: ``max_num_batched_tokens`` down to 2,
  ``max_num_seqs`` 1..8, block size 16/32/64, a KV pool of a few blocks more than the longest prompt
  (or a large one), short contexts (64..1024 tokens, sometimes 16384); integer expected acceptance
  (0..K accepted drafts per round), so both tools are deterministic;
* a random Mooncake trace (2..14 requests in bursts; prompts and outputs up to the context);
* ``jaxsim.toml`` and ``reference.yaml`` (the same settings for both tools).

The reference runs under ``--timeout`` seconds; jaxsim replays the config in this process
(``jaxsim replay`` through its CLI entry point). Each seed is classified:

* ``identical``: both complete, and for every request terminal status, TTFT, E2E, admissions and
  preemptions are equal (floats compared with ==);
* ``agreed stop``: the reference never finishes (killed at the timeout) or aborts with its
  "effect-free zero-duration pass" error, and jaxsim reports ``stalled`` (a request whose prompt fits the
  KV pool but whose next token never can: the reference's memory grows without end; jaxsim stops with an
  explicit status, see docs/concepts.md); or both refuse the same lookup outside measured support (the reference
  aborts naming the FPM query, jaxsim stops at the same decode/prefill batch and KV, with its finer reason code);
* ``DIFFERENT``: anything else (first differing request printed); the seed's folder is kept.

Agreeing seeds' folders are deleted unless ``--keep-agreeing``. Exit 0 when no seed is DIFFERENT.

``--prefix``: prefix caching ON in the reference (``kv_cache.prefix_caching: true``), on traces with real
sharing: every request draws one of 1..3 shared prefixes of random length (in trace hash blocks of 8, 16,
32 or 64 tokens, the reference's ``traffic.source.block_size``) and a unique tail; the pools are drawn as
above, so most seeds are tight and evict. Autoregressive tables only. The jaxsim side is the compiled engine
with prefix caching (``jaxsim.replay.cache_engine``; ``--oracle``: its plain-Python specification
``oracle_replay(..., block_keys=...)`` in tests/replay_support.py) with the keys of
``jaxsim.replay.prefix_cache.block_keys``; besides TTFT/E2E/admissions/preemptions, the first-admission
and last-admission cache-hit tokens (``first_admission_reused_input_tokens``, ``reused_input_tokens``)
must be equal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _synthetic_model import QWEN_CFG  # noqa: E402

MODEL = "golden-ckpt/rfuzz-dense-8b"
REVISION = "4d6f8a0c2e4b6d8f0a2c4e6b8d0f2a4c6e8b0d2f"
SYSTEM = "h200_sxm"
BACKEND_VERSION = "0.24.0"
KV_BYTES_PER_TOKEN = 65536
GPU_MEMORY_UTILIZATION = 0.9
DRAFT_REVISION = "1b2c3d4e5f60718293a4b5c6d7e8f9011a2b3c4d"
STOP_MESSAGES = ("effect-free zero-duration pass",)


# ----------------------------------------------------------------------------------------------------
# one random case


def draw_case(seed: int) -> dict:
    """Scheduler settings, profile ladders and trace of one seed (plain numbers, JSON-able)."""
    g = np.random.default_rng(seed)
    k = int(g.choice([0, 1, 2, 3], p=[0.15, 0.3, 0.3, 0.25]))
    accepted = int(g.integers(0, k + 1)) if k else 0
    ctx = int(g.choice([64, 128, 256, 512, 1024, 16384], p=[0.15, 0.2, 0.2, 0.2, 0.15, 0.1]))
    bs = int(g.choice([16, 32, 64]))
    seqs = int(g.integers(1, 9))
    tokens = int(g.choice([2, 3, 4, 5, 8, 16, 23, 32, 64, 100, 256, 512]))
    n = int(g.integers(2, 15))
    gaps = g.choice([0.0, 0.0, 0.5, 2.5, 7.0, 30.0], size=n)
    gaps[0] = float(g.uniform(0.0, 40.0))
    arrivals = np.round(np.cumsum(gaps), 3)
    short = g.random() < 0.6
    top_in = max(2, min(ctx - 1, 80 if short else ctx - 1))
    inputs = g.integers(1, top_in + 1, size=n)
    outputs = g.integers(1, int(g.choice([8, 30, 100])) + 1, size=n)
    if g.random() < 0.3:  # some requests run into the context limit
        for i in g.choice(n, size=max(1, n // 3), replace=False):
            inputs[i] = int(g.integers(max(1, ctx - 12), ctx))
            outputs[i] = int(g.integers(1, 40))
    need = max(-(-int(x) // bs) for x in inputs)
    blocks = int(g.integers(need, need + 4)) if g.random() < 0.7 else int(need + g.integers(20, 400))
    decode_batches = sorted({*range(1, int(g.integers(1, seqs + 1)) + 1), seqs, *g.integers(1, 17, size=2).tolist()})
    return {
        "seed": seed, "k": k, "accepted": accepted, "context": ctx, "block_size": bs, "max_num_seqs": seqs,
        "max_num_batched_tokens": tokens, "blocks": blocks, "decode_batches": [int(b) for b in decode_batches],
        "coef": {"d0": float(g.uniform(4, 16)), "db": float(g.uniform(0.01, 0.4)), "dkv": float(g.uniform(2e-5, 2e-4)),
                 "p0": float(g.uniform(1.5, 4)), "pt": float(g.uniform(0.005, 0.05)), "pkv": float(g.uniform(5e-6, 5e-5)),
                 "pb": float(g.uniform(0.02, 0.3)), "spec": float(g.uniform(1.05, 1.6)), "noise": float(g.uniform(0, 0.04))},
        "requests": [{"timestamp": float(a), "input_length": int(i), "output_length": int(o)}
                     for a, i, o in zip(arrivals, inputs, outputs)],
    }


def draw_prefix_case(seed: int) -> dict:
    """A :func:`draw_case` seed made autoregressive, with shared-prefix ``hash_ids``."""
    case = draw_case(seed)
    case.update(k=0, accepted=0)
    g = np.random.default_rng(seed + 777)
    tbs = int(g.choice([8, 16, 32, 64]))
    ngroups = int(g.integers(1, 4))
    groups = [list(range(1000 * (k + 1), 1000 * (k + 1) + 200)) for k in range(ngroups)]
    fresh = 100_000
    hashes = []
    for r in case["requests"]:
        nb = -(-r["input_length"] // tbs)
        h = groups[int(g.integers(0, ngroups))][: int(g.integers(0, nb + 1))]
        while len(h) < nb:
            h.append(fresh)
            fresh += 1
        hashes.append(h)
    case["trace_block_size"], case["hash_ids"] = tbs, hashes
    return case


def mooncake_case(n: int, blocks: int) -> dict:
    """The first ``n`` requests of the bundled ``mooncake_conversation_1k`` (its own hash_ids, 512 tokens per
    hash) on one autoregressive worker with a dense SYNTHETIC table: block 16, context 131072, 64 sequences,
    8192 batched tokens, ``blocks`` KV blocks."""
    from jaxsim.replay.traces import bundled_trace_path

    rows = [json.loads(x) for x in bundled_trace_path("mooncake_conversation_1k").read_text().splitlines() if x.strip()][:n]
    return {
        "seed": 0, "k": 0, "accepted": 0, "context": 131072, "block_size": 16, "max_num_seqs": 64, "max_num_batched_tokens": 8192,
        "blocks": blocks, "decode_batches": [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64],
        "coef": {"d0": 8.0, "db": 0.1, "dkv": 2e-5, "p0": 3.0, "pt": 0.02, "pkv": 2e-6, "pb": 0.1, "spec": 1.0, "noise": 0.02},
        "requests": [{"timestamp": float(r["timestamp"]), "input_length": int(r["input_length"]), "output_length": int(r["output_length"])}
                     for r in rows],
        "trace_block_size": 512, "hash_ids": [r["hash_ids"] for r in rows],
    }


def _row(case: dict, kind: str, b: int, t: int, kv: int, lat: float) -> dict:
    ep = execution_profile(case)
    native = {"timing_scope": "model_step_cuda", "timing_boundary": "model_step_cuda", "measurement_reduction": "single_sample",
              "source_sample_count": 1} if ep else {}
    return dict(
        cell_id=f"rfuzz-seed-{case['seed']}-cell",
        model_path=MODEL,
        system=SYSTEM,
        backend="vllm",
        backend_version=BACKEND_VERSION,
        runtime_backend_version=BACKEND_VERSION,
        weight_quantization="bfloat16",
        gemm_quant_mode="bfloat16",
        moe_quant_mode="bfloat16",
        fmha_quant_mode="bfloat16",
        fmha_resolution="checkpoint_native",
        comm_quant_mode="half",
        kv_cache_dtype="bfloat16",
        parallel_strategy="pure_tp",
        tp=1,
        pp=1,
        dp=1,
        moe_tp=1,
        moe_ep=1,
        cp=1,
        moe_backend="auto",
        attention_backend="auto",
        enable_wideep=False,
        enable_eplb=False,
        model_config_sha256="",
        execution_profile=("speculative_round_v1:" + json.dumps({"model_revision": REVISION, "execution_profile": ep}, separators=(",", ":")))
        if ep
        else "full",
        engram_residency="none",
        input_modality="text",
        partition_policy="balanced_v1",
        kv_seed_regime="n/a" if kind == "prefill" and kv == 0 else "real_kv",
        global_warmup_iterations=3,
        warmup_repeats=0,
        measurement_repeats=1,
        measurement_policy=policy(case),
        model_support_level="synthetic",
        model_template_id="synthetic",
        model_template_version="1",
        aic_database_version="synthetic",
        source_plan_sha256="0" * 64,
        collector_attempt_id="rfuzz",
        runtime_run_id="rfuzz",
        runtime_grid_digest="rfuzz",
        **native,
        workload_kind=kind,
        batch_size=b,
        total_prefill_tokens=t,
        total_kv_read_tokens=kv,
        latency_ms=float(lat),
    )


def policy(case: dict) -> str:
    """A speculative round is timed natively by CUDA events; an autoregressive table by Dynamo's FPM."""
    return "vllm_native_fpm_model_step_cuda_v1" if case["k"] else "dynamo_native_single_sample_v1"


def execution_profile(case: dict) -> dict | None:
    k = case["k"]
    if not k:
        return None
    return {"kind": "speculative_round", "method": "eagle3", "num_draft_tokens": k,
            "draft_model": f"golden-ckpt/rfuzz-eagle3-k{k}", "draft_revision": DRAFT_REVISION, "timing_scope": "model_step_cuda"}


def profile_json(case: dict) -> dict:
    res = {"cache_layout": "linear", "max_num_tokens": case["max_num_batched_tokens"], "max_batch_size": case["max_num_seqs"],
           "provenance": "SYNTHETIC replay-fuzz profile (made-up latencies)",
           "runtime_memory": {"kv_cache_bytes": case["blocks"] * case["block_size"] * KV_BYTES_PER_TOKEN,
                              "gpu_memory_utilization": GPU_MEMORY_UTILIZATION, "max_model_len": case["context"],
                              "provenance": "SYNTHETIC runtime observation"},
           "kv_bytes_per_token": KV_BYTES_PER_TOKEN}
    dep = {"system": SYSTEM, "backend": "vllm", "backend_version": BACKEND_VERSION, "tp": 1, "dp": 1, "moe_tp": 1,
           "moe_ep": 1, "gemm_quant_mode": "bfloat16", "moe_quant_mode": "bfloat16", "fmha_quant_mode": "bfloat16",
           "comm_quant_mode": "half", "kv_cache_dtype": "bfloat16", "resources": res}
    ep = execution_profile(case)
    if ep:
        dep["execution_profile"] = ep
    return {"schema_version": 1, "model": MODEL, "model_revision": REVISION, "architecture": "Qwen3ForCausalLM",
            "context_length": case["context"], "num_experts": 0,
            "provenance": "SYNTHETIC replay-fuzz profile (made-up latencies)", "deployments": [dep]}


def write_profile(case: dict, pdir: Path) -> int:
    """Rows covering every lookup the replay can make (decode: every batch of the ladder up to max_num_seqs x
    total KV 1..max_num_seqs*context; prefill: batch 1..max_num_seqs x tokens b..budget x KV 0..seqs*context)."""
    c, g = case["coef"], np.random.default_rng(case["seed"] + 10_000)
    spec = c["spec"] if case["k"] else 1.0
    seqs, ctx, budget = case["max_num_seqs"], case["context"], case["max_num_batched_tokens"]
    kv_top = seqs * ctx + 1
    dkv = sorted({1, 3, 12, 74, 143, 975, 3361, 8302, kv_top, *[int(x) for x in g.integers(1, kv_top, size=3)]})
    noise = lambda: 1.0 + c["noise"] * float(g.uniform(-1, 1))  # noqa: E731
    rows = []
    for b in case["decode_batches"]:
        for kv in dkv:
            rows.append(_row(case, "decode", b, 0, kv, spec * (c["d0"] + c["db"] * b + c["dkv"] * kv) * noise()))
    pt_levels = sorted({1, 2, 5, 9, budget, *[int(x) for x in g.integers(1, budget + 1, size=3)]})
    pkv = sorted({0, 8, 55, kv_top, *[int(x) for x in g.integers(1, kv_top, size=2)]})
    for b in range(1, seqs + 1):
        for t in sorted({b, *[x for x in pt_levels if x >= b]}):
            if t > max(budget, b):
                continue
            for kv in pkv:
                lat = c["p0"] + c["pb"] * b + c["pt"] * t + c["pkv"] * kv + 1e-7 * t * kv
                rows.append(_row(case, "prefill", b, t, kv, lat * noise()))
    rows.sort(key=lambda r: (r["workload_kind"], r["batch_size"], r["total_prefill_tokens"], r["total_kv_read_tokens"]))
    pdir.mkdir(parents=True, exist_ok=True)
    pqp = pdir / "fpm_forward_perf.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pqp, compression="zstd")
    meta = {"schema_name": "aic_fpm_forward_perf", "schema_version": 7, "coordinate_system": "iteration_totals_balanced_v1",
            "measurement_policy": policy(case), "warmup_repeats": 0, "measurement_repeats": 1,
            "row_count": len(rows), "parquet_sha256": hashlib.sha256(pqp.read_bytes()).hexdigest(), "system": SYSTEM,
            "backend": "vllm", "backend_version": BACKEND_VERSION, "model_paths": [MODEL]}
    if case["k"]:
        meta["timing_scope"] = "model_step_cuda"
    (pdir / "fpm_forward_perf.metadata.json").write_text(json.dumps(meta, indent=1) + "\n")
    (pdir / "profile.json").write_text(json.dumps(profile_json(case), indent=1) + "\n")
    return len(rows)


def write_case(case: dict, d: Path) -> None:
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    (d / MODEL).mkdir(parents=True)
    (d / MODEL / "config.json").write_text(json.dumps(QWEN_CFG, indent=1) + "\n")
    write_profile(case, d / "profile")
    hid = 1
    with open(d / "trace.jsonl", "w") as f:
        for i, r in enumerate(case["requests"]):
            nb = -(-r["input_length"] // 16)
            hashes = case["hash_ids"][i] if "hash_ids" in case else list(range(hid, hid + nb))
            f.write(json.dumps({**r, "hash_ids": hashes}) + "\n")
            hid += nb
    k = case["k"]
    spec = f"nextn = {k}\naccepted_tokens = {float(case['accepted'])}\n" if k else ""
    (d / "jaxsim.toml").write_text(f"""# replay fuzz seed {case['seed']} (SYNTHETIC profile)
model = "{MODEL}"
system = "{SYSTEM}"
backend = "vllm"
backend_version = "{BACKEND_VERSION}"
profile = "profile"
mode = "aggregated"
block_size = {case['block_size']}
context_length = {case['context']}
method = "direct"
database_mode = "SILICON"
fallback = "deny"
{spec}
[roles.aggregated]
tp = 1
replicas = 1
max_num_batched_tokens = {case['max_num_batched_tokens']}
max_num_seqs = {case['max_num_seqs']}
gpu_memory_utilization = {GPU_MEMORY_UTILIZATION}
prefix_caching = {"true" if "hash_ids" in case else "false"}
""")
    eng = {"mode": "aggregated", "model": MODEL, "fpm_profile": profile_json(case), "hardware": SYSTEM, "backend": "vllm",
           "backend_version": BACKEND_VERSION, "estimation_mode": "fpm_interpolation",
           "estimator_config": {"fpm_interpolation": {"method": "direct", "fpm_parquet_path": "profile/fpm_forward_perf.parquet"}},
           "context_length": case["context"],
           "workers": {"aggregated": {"scheduler": {"max_batched_tokens": case["max_num_batched_tokens"],
                                                    "max_sequences": case["max_num_seqs"]},
                                      "kv_cache": {"prefix_caching": "hash_ids" in case, "block_size": case["block_size"],
                                                   "capacity": {"memory_fraction": GPU_MEMORY_UTILIZATION}}}}}
    if k:
        eng["nextn"], eng["nextn_accepted"] = k, float(case["accepted"])
    tbs = case.get("trace_block_size", 16)
    cfg = {"engine": eng, "traffic": {"source": {"type": "trace", "paths": ["trace.jsonl"], "format": "mooncake", "block_size": tbs},
                                      "load": {"type": "trace_timestamps"}}}
    (d / "reference.yaml").write_text(json.dumps(cfg, indent=1) + "\n")  # JSON is YAML
    (d / "case.json").write_text(json.dumps(case, indent=1) + "\n")


# ----------------------------------------------------------------------------------------------------
# the two tools


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (read from /proc; Linux)."""
    out = []
    for st in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = st.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(st.parent.name))
    return out


def _kill_tree(p: subprocess.Popen) -> None:
    """Kill the reference CLI and every process it started (its worker runs in a session of its own, so
    killing the CLI alone would leave it running, with its memory growing)."""
    todo, seen = [p.pid], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo.extend(_children(pid))
    for pid in reversed(seen):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()


def run_reference(cli: str, d: Path, timeout_s: float) -> dict:
    """{"state": "completed"|"timeout"|"stopped"|"failed", "per_request": {row: record}, "message": str}."""
    out = d / "ref-out"
    log = d / "reference.log"
    with open(log, "w") as fh:
        p = subprocess.Popen([cli, "predict", "-c", "reference.yaml", "--output-dir", str(out), "--overwrite",
                              "--capture-per-request", "--format", "json"], cwd=d, stdout=fh, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            rc = p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_tree(p)
            return {"state": "timeout", "per_request": {}, "message": f"no result within {timeout_s:g} s"}
    text = log.read_text(errors="replace")
    if rc != 0 or not (out / "prediction.json").is_file():
        hit = next((m for m in STOP_MESSAGES if m in text), None)
        last = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or [""]
        refused = re.search(r"FPM direct (decode|prefill) query \(batch_size=(\d+), total_kv_read_tokens=(\d+)\) is unsupported", text)
        lookup = f"{refused.group(1)}(batch={refused.group(2)}, kv={refused.group(3)})" if refused else None
        return {"state": "stopped" if hit else "failed", "per_request": {}, "message": hit or f"rc={rc}: {last[0][:300]}",
                "refused_lookup": lookup}
    pred = json.loads((out / "prediction.json").read_text())
    recs = {int(r["session_id"].removeprefix("request_")) - 1: r for r in pred.get("per_request", [])}
    return {"state": "completed", "per_request": recs, "message": ""}


def run_jaxsim(d: Path) -> dict:
    from typer.testing import CliRunner

    from jaxsim.cli.main import app

    out = d / "jaxsim.parquet"
    tbs = json.loads((d / "reference.yaml").read_text())["traffic"]["source"]["block_size"]
    r = CliRunner().invoke(app, ["replay", str(d / "jaxsim.toml"), "--trace", str(d / "trace.jsonl"), "--output", str(out),
                                 "--trace-block-size", str(tbs), "--force", "--no-progress", "--json", "--allow-incomplete"])
    if r.exit_code != 0:
        return {"status": f"cli exit {r.exit_code}: {r.output.strip().splitlines()[-1:] or ''}", "rows": {}}
    rows = pq.read_table(out).to_pylist()
    summary = json.loads(pq.read_schema(out).metadata[b"jaxsim.replay.summary"])
    return {"status": rows[0]["status"] if rows else "empty", "rows": {int(x["row"]): x for x in rows},
            "stopped_at": summary[0].get("stopped_at") if summary else None}


def _prefix_inputs(case: dict, d: Path):
    """A prefix-caching case as the engines take it: table, trace (arrival order), block keys, settings, order."""
    from jaxsim.kernels.rounds import compile_round_table
    from jaxsim.profile import load_profile_dir
    from jaxsim.replay.prefix_cache import block_keys
    from jaxsim.replay.traces import make_trace

    bundle = load_profile_dir(d / "profile")
    table = compile_round_table(bundle.cell(bundle.profile.deployments[0]))
    reqs = case["requests"]
    t0 = min(r["timestamp"] for r in reqs)
    order = sorted(range(len(reqs)), key=lambda i: reqs[i]["timestamp"])
    trace = make_trace("fuzz", [reqs[i]["timestamp"] - t0 for i in order], [reqs[i]["input_length"] for i in order],
                       [reqs[i]["output_length"] for i in order], rebase=False)
    keys, num_keys = block_keys([case["hash_ids"][i] for i in order], [reqs[i]["input_length"] for i in order],
                                case["trace_block_size"], case["block_size"])
    kw = dict(max_num_batched_tokens=case["max_num_batched_tokens"], max_num_seqs=case["max_num_seqs"],
              block_size=case["block_size"], num_gpu_blocks=case["blocks"], num_draft_tokens=0, accept_rates=np.zeros(5),
              max_model_len=case["context"])
    return table, trace, keys, num_keys, kw, order


def run_oracle(case: dict, d: Path) -> dict:
    """The prefix-caching specification (``oracle_replay`` with block keys) on one case, as run_jaxsim's dict."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from replay_support import oracle_replay

    table, trace, keys, _, kw, order = _prefix_inputs(case, d)
    out, _, status = oracle_replay(table, trace, **kw, block_keys=keys)
    rows = {}
    for r in out:
        a = trace.arrival_ms[r.i]
        done = r.gen >= r.out and r.last is not None
        rows[order[r.i]] = {"terminal": "completed" if done else "unfinished", "ttft_ms": r.first - a if done else None,
                            "e2e_ms": r.last - a if done else None, "admissions": r.admits, "preemptions": r.preempt,
                            "first_hit_tokens": r.first_hit or 0, "hit_tokens": r.hit}
    return {"status": status if isinstance(status, str) else f"lookup {status}", "rows": rows}


def run_cached(case: dict, d: Path) -> dict:
    """The compiled engine with prefix caching (``jaxsim.replay.cache_engine``) on one case, as run_jaxsim's dict."""
    import jax

    from jaxsim.kernels import status as st
    from jaxsim.kernels.buckets import pow2_bucket
    from jaxsim.replay import cache_engine as ce
    from jaxsim.replay.engine import DONE, make_params
    from jaxsim.replay.runner import stretch_lookahead

    table, trace, keys, num_keys, kw, order = _prefix_inputs(case, d)
    pad = int(pow2_bucket(len(trace), 16))
    pk, capacity = ce.prompt_keys(keys, num_keys, pad)
    shapes = ce.shapes_for(trace.input_tokens, trace.output_tokens, num_keys=capacity, **{
        k: kw[k] for k in ("max_num_seqs", "block_size", "num_gpu_blocks", "max_model_len")})
    # decode stretches as jaxsim replay runs them (jaxsim.replay.cache_runner; the slot ladder is checked by the tests)
    out = jax.tree.map(np.asarray, ce.cached_replay_jit(make_params(table, **kw), trace.requests(pad), pk, shapes,
                                                        lookahead=stretch_lookahead(1)))
    res = out.result
    rows = {}
    for i in range(len(trace)):
        a = trace.arrival_ms[i]
        done = res.terminal[i] == DONE
        rows[order[i]] = {"terminal": "completed" if done else "unfinished",
                          "ttft_ms": float(res.first_token_ms[i] - a) if done else None,
                          "e2e_ms": float(res.last_token_ms[i] - a) if done else None, "admissions": int(res.admissions[i]),
                          "preemptions": int(res.preemptions[i]), "first_hit_tokens": int(out.first_hit_tokens[i]),
                          "hit_tokens": int(out.hit_tokens[i])}
    code = int(res.status)
    status = {st.COMPLETED: "completed", st.STALLED: "stalled"}.get(code, st.REGISTRY[code].name if code >= 64 else f"lookup {code}")
    return {"status": status, "rows": rows}


def compare(ref: dict, mine: dict) -> tuple[str, str]:
    """(class, detail) of one seed."""
    js = mine["status"]
    if ref["state"] in ("timeout", "stopped") and js.startswith("stalled"):
        why = "reference does not finish" if ref["state"] == "timeout" else f"reference aborts ({ref['message']})"
        return "agreed stop", f"{why} / jaxsim stalled"
    if ref.get("refused_lookup") and js.startswith("stopped: pass lookup unsupported:") and mine.get("stopped_at") == ref["refused_lookup"]:
        return "agreed stop", f"both refuse the lookup {ref['refused_lookup']} (jaxsim: {js.split(':', 2)[-1]})"
    if ref["state"] != "completed" or js != "completed":
        return "DIFFERENT", f"reference {ref['state']} {ref['message']!r}; jaxsim {js!r}"
    if sorted(ref["per_request"]) != sorted(mine["rows"]):
        return "DIFFERENT", f"request sets differ: {len(ref['per_request'])} vs {len(mine['rows'])}"
    for i in sorted(mine["rows"]):
        g, m = ref["per_request"][i], mine["rows"][i]
        if g["terminal_status"] != m["terminal"]:
            return "DIFFERENT", f"request {i}: terminal {g['terminal_status']} vs {m['terminal']}"
        if g["terminal_status"] != "completed":
            continue
        pairs = (("ttft_ms", g["ttft_ms"], m["ttft_ms"]), ("e2e_ms", g["e2e_latency_ms"], m["e2e_ms"]),
                 ("admissions", g["admission_count"], m["admissions"]), ("preemptions", g["readmission_count"], m["preemptions"]))
        if "hit_tokens" in m:
            pairs += (("first-admission hit tokens", g["first_admission_reused_input_tokens"], m["first_hit_tokens"]),
                      ("hit tokens", g["reused_input_tokens"], m["hit_tokens"]))
        for name, a, b in pairs:
            if a != b:
                return "DIFFERENT", f"request {i}: {name} reference {a!r} vs jaxsim {b!r}"
    n = len(mine["rows"])
    hits = f", {sum(r['hit_tokens'] for r in mine['rows'].values())} hit tokens" if any("hit_tokens" in r for r in mine["rows"].values()) else ""
    return "identical", f"{n} requests, {sum(r['preemptions'] for r in mine['rows'].values())} preemptions{hits}"


def describe(case: dict) -> str:
    k = case["k"]
    sd = f"sd K={k} a={case['accepted']}" if k else "ar"
    pre = f"tbs {case['trace_block_size']}, " if "trace_block_size" in case else ""
    return (f"{pre}{sd}, seqs {case['max_num_seqs']}, tokens {case['max_num_batched_tokens']}, block {case['block_size']}, "
            f"ctx {case['context']}, {case['blocks']} blocks, {len(case['requests'])} req")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference_venv")
    ap.add_argument("work")
    ap.add_argument("--seeds", default="0:120", help="START:STOP (STOP exclusive) or a comma list")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds the reference may take per seed")
    ap.add_argument("--keep-agreeing", action="store_true")
    ap.add_argument("--prefix", action="store_true", help="prefix caching on, shared-prefix traces (see the docstring)")
    ap.add_argument("--oracle", action="store_true",
                    help="with --prefix/--mooncake: compare the plain-Python specification instead of the compiled engine")
    ap.add_argument("--mooncake", type=int, default=0, metavar="N",
                    help="instead of seeds: the first N requests of mooncake_conversation_1k, prefix caching on (mooncake_case)")
    ap.add_argument("--blocks", type=int, default=100_000, help="KV blocks for --mooncake (16 tokens each)")
    args = ap.parse_args()
    if ":" in args.seeds:
        a, b = args.seeds.split(":")
        seeds = list(range(int(a), int(b)))
    else:
        seeds = [int(x) for x in args.seeds.split(",") if x]
    cli = str(Path(args.reference_venv) / "bin" / "aisimulate")
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {os.cpu_count()} cores, load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{len(seeds)} seeds; reference timeout {args.timeout:g} s", flush=True)
    if args.mooncake:
        case = mooncake_case(args.mooncake, args.blocks)
        d = work / f"mooncake-{args.mooncake}-{args.blocks}"
        write_case(case, d)
        t = time.perf_counter()
        ref = run_reference(cli, d, args.timeout)
        t_ref = time.perf_counter() - t
        t = time.perf_counter()
        mine = run_oracle(case, d) if args.oracle else run_cached(case, d)
        t_mine = time.perf_counter() - t
        cls, detail = compare(ref, mine)
        rows = mine["rows"].values()
        ttft = [r["ttft_ms"] for r in rows if r["ttft_ms"] is not None]
        hit = sum(r["hit_tokens"] for r in rows) / max(sum(x["input_length"] for x in case["requests"]), 1)
        print(f"mooncake_conversation_1k first {args.mooncake}, {args.blocks} blocks: {cls}: {detail}; mean TTFT "
              f"{np.mean(ttft) / 1e3:.2f} s, hit tokens {hit:.1%} of prompt tokens; reference {t_ref:.0f} s, "
              f"{'oracle' if args.oracle else 'jaxsim cache engine'} {t_mine:.0f} s")
        sys.exit(0 if cls != "DIFFERENT" else 1)
    counts: dict[str, int] = {}
    stops: dict[str, int] = {}
    different = []
    t0 = time.perf_counter()
    for seed in seeds:
        case = draw_prefix_case(seed) if args.prefix else draw_case(seed)
        d = work / f"seed-{seed}"
        write_case(case, d)
        ref = run_reference(cli, d, args.timeout)
        if ref["state"] == "completed":
            with open(d / "reference_requests.jsonl", "w") as fh:
                for i in sorted(ref["per_request"]):
                    fh.write(json.dumps(ref["per_request"][i]) + "\n")
        mine = (run_oracle(case, d) if args.oracle else run_cached(case, d)) if args.prefix else run_jaxsim(d)
        cls, detail = compare(ref, mine)
        counts[cls] = counts.get(cls, 0) + 1
        if cls == "agreed stop":
            stops[detail] = stops.get(detail, 0) + 1
        if cls == "DIFFERENT":
            different.append(seed)
        elif not args.keep_agreeing:
            shutil.rmtree(d, ignore_errors=True)
        print(f"seed {seed:4d} [{describe(case)}]: {cls}: {detail}", flush=True)
    (work / "summary.json").write_text(json.dumps({"seeds": seeds, "counts": counts, "agreed_stops": stops,
                                                   "different": different}, indent=1) + "\n")
    print(f"{len(seeds)} seeds in {time.perf_counter() - t0:.0f} s: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for k, v in sorted(stops.items()):
        print(f"  agreed stop: {k}: {v}")
    if different:
        print(f"DIFFERENT seeds (folders kept under {work}): {different}")
    sys.exit(1 if different else 0)


if __name__ == "__main__":
    main()
