# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Replaying a real request trace
#
# A replay runs a request trace through a vLLM-style continuous-batching engine written in JAX (one
# `lax.while_loop` step per scheduler pass): chunked prefill under the token budget, KV blocks with
# preemption, measured speculative rounds. Every pass is priced by one lookup in the measured table. A
# pass whose lookup lies outside the measured support **stops that replay** with the lookup's status;
# nothing is guessed.
#
# Here: the bundled excerpt of the Azure LLM inference trace 2023 (conversation, first 1,000 requests;
# CC-BY-4.0, Microsoft Azure — Patel et al., "Splitwise", ISCA 2024) on three bundled deployments in one
# call; where each replay stops and why; then latency CDFs and KV use over time.
#
# Figures go to `$JAXSIM_NOTEBOOK_OUT` (default `./out/`).

# %%
import os
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from jaxsim import plots
from jaxsim.deploy.binding import bind
from jaxsim.replay import load_trace
from jaxsim.replay.deployment import config_from_binding
from jaxsim.replay.orchestrate import run_replays
from jaxsim.replay.traces import make_trace
from jaxsim.rules.config import parse_config_text

OUT = Path(os.environ.get("JAXSIM_NOTEBOOK_OUT", "out"))
OUT.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## The trace

# %%
trace = load_trace("azure_conv_1k")
isl, osl, t_s = trace.input_tokens, trace.output_tokens, trace.arrival_ms / 1000.0
print(f"{len(trace)} requests over {trace.duration_ms / 1000:.0f} s ({len(trace) / (trace.duration_ms / 1000):.1f} req/s); "
      f"ISL median {int(np.median(isl))} (max {isl.max()}), OSL median {int(np.median(osl))} (max {osl.max()}) tokens")
same_ms = int(np.sum(np.diff(trace.arrival_ms) == 0))
print(f"{same_ms} requests arrive in the same millisecond as the one before")

fig = Figure(figsize=(13, 4), dpi=110, layout="constrained")
a1, a2, a3 = fig.subplots(1, 3)
a1.hist(t_s, bins=np.arange(0, t_s.max() + 10, 10), color="#6baed6")
a1.set_xlabel("arrival time (s)")
a1.set_ylabel("requests per 10 s")
a2.hist(isl, bins=40, color="#74c476")
a2.set_xlabel("input length (tokens)")
a2.set_ylabel("requests")
a3.hist(osl, bins=40, color="#fd8d3c")
a3.set_xlabel("output length (tokens)")
a3.set_ylabel("requests")
fig.suptitle("Azure LLM inference trace 2023, conversation (first 1,000 requests)", fontsize=10)
fig.savefig(OUT / "04_trace.png")

# %% [markdown]
# ## Three bundled deployments, one compiled call
# Deployment configs are TOML (see `configs/`); here they are written inline. Each is validated against
# its profile (`bind`) before anything is compiled.

# %%
DEPLOYMENTS = {
    "Qwen3-32B TP2 (measured)": """
        model = "Qwen/Qwen3-32B"
        system = "b300_sxm"
        backend_version = "0.20.1"
        profile = "qwen3-32b-bf16-b300"
        block_size = 16
        [roles.aggregated]
        tp = 2
    """,
    "Qwen3-32B TP2 EAGLE-3 K=3 (derived rounds)": """
        model = "Qwen/Qwen3-32B"
        system = "b300_sxm"
        backend_version = "0.20.1"
        profile = "qwen3-32b-bf16-b300-eagle3-k3"
        nextn = 3
        acceptance_preset = "eagle3-mtbench-qwen3-8b"
        block_size = 16
        [roles.aggregated]
        tp = 2
    """,
    "Llama-3.1-8B FP8 TP1 (measured, planner)": """
        model = "nvidia/Llama-3.1-8B-Instruct-FP8"
        system = "h200_sxm"
        backend_version = "dynamo-1.6.1"
        profile = "llama-3.1-8b-fp8-h200"
        block_size = 16
        [roles.aggregated]
        tp = 1
    """,
}
configs = []
for name, text in DEPLOYMENTS.items():
    b = bind(parse_config_text(text, source=f"{name}.toml"))
    configs.append(config_from_binding(b, name=name))
    pool = configs[-1].aggregated
    print(f"{name}: {pool.num_gpu_blocks:,} KV blocks of {pool.block_size} tokens, max_num_seqs {pool.max_num_seqs}, "
          f"max_num_batched_tokens {pool.max_num_batched_tokens}")

outcomes = run_replays(configs, trace, seeds=[0], timeline=True)
for o in outcomes:
    done = int(o.summary["completed_requests"])
    where = f" at {o.failure}" if o.failure else ""
    print(f"{o.config.name}: {done}/{len(trace)} completed; {o.status_text}{where}")

# %% [markdown]
# ## Where the measured data ends
# Each replay above stops at the first scheduler pass it cannot price. The bundled profiles measured
# prefill almost only **one request at a time** (batch 1, prompts from ~100 to 4–16 k tokens, no cached
# prefix) and decode over limited per-request context ranges, while a real trace brings bursts: two
# prompts admitted in the same pass form a prefill of batch 2, a prompt longer than the token budget is
# chunked and its second chunk reads cached KV, and a short prompt at batch 1 has less past KV than any
# measured point. The measured prefill support of each deployment:

# %%
for name, text in DEPLOYMENTS.items():
    b = bind(parse_config_text(text, source=f"{name}.toml"))
    cell = b.aggregated.cell
    for pb in np.unique(cell.prefill_batch):
        m = cell.prefill_batch == pb
        print(f"{name}: prefill batch {pb}: {m.sum()} rows, tokens {cell.prefill_tokens[m].min()}–{cell.prefill_tokens[m].max()}, "
              f"cached KV {sorted(set(cell.prefill_kv[m].tolist()))}")

# %% [markdown]
# A replay can only be as complete as the measurements under it. To widen support, measure prefill at
# several batch sizes and with cached prefixes (`docs/byo-data.md`); the same notebook then replays the
# whole trace.
#
# ## Latency CDFs and KV use over time
# To see the rest of the pipeline, replay on the Llama deployment only the trace's requests whose
# prompts lie inside its measured support: the batch-1 prefill range (no cached prefix, within the token
# budget) and at least the smallest measured batch-1 decode context. Real bursts still bring passes that
# prefill two prompts at once; the replay stops at the first one, and the figures say so: they cover
# the requests completed until then, a small and early sample, not the trace's steady state.

# %%
llama = configs[2]
lcell = bind(parse_config_text(DEPLOYMENTS["Llama-3.1-8B FP8 TP1 (measured, planner)"], source="llama.toml")).aggregated.cell
one = (lcell.prefill_batch == 1) & (lcell.prefill_kv == 0)
lo = max(int(lcell.prefill_tokens[one].min()), int(lcell.decode_kv[lcell.decode_batch == 1].min()))
hi = min(int(lcell.prefill_tokens[one].max()), llama.aggregated.max_num_batched_tokens)
keep = (isl >= lo) & (isl <= hi)
inside = make_trace("azure_conv_1k (prompts inside measured support)", trace.arrival_ms[keep], isl[keep], osl[keep])
print(f"{len(inside)} of {len(trace)} requests have prompts within {lo}–{hi} tokens")
o = run_replays([llama], inside, seeds=[0], timeline=True)[0]
print(f"{int(o.summary['completed_requests'])}/{len(inside)} completed; {o.status_text}" + (f" at {o.failure}" if o.failure else ""))

# %%
req = dict(o.requests)
req["config"] = np.full(len(inside), llama.name, dtype=object)
req["status"] = np.full(len(inside), o.status_text, dtype=object)
plots.plot_latency_cdf(req, OUT / "04_latency_cdf.png")
plots.plot_kv_timeline(o.timeline[0], OUT / "04_kv_timeline.png", num_gpu_blocks=llama.aggregated.num_gpu_blocks,
                       title=f"{llama.name}, {len(inside)} Azure requests inside measured support: {o.status_text}")
for k in ("completed_requests", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_e2e_ms", "output_throughput_tok_s"):
    print(f"{k:24s} {o.summary[k]:12.2f}")

# %% [markdown]
# The same from the command line (the CDF needs completed requests):
#
# ```bash
# jaxsim replay CONFIG.toml --trace azure_conv_1k --timeline --output replay.parquet
# jaxsim plot cdf replay.parquet --output cdf.png
# jaxsim plot timeline replay.timeline.parquet --output kv.png
# ```

# %%
print(sorted(p.name for p in OUT.glob("04_*.png")))
