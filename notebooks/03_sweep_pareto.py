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
# # 03 · A deployment sweep and its SLA-constrained Pareto frontier
#
# A sweep evaluates every combination of profiles, parallel layouts, serving mode, speculative depth
# and acceptance, concurrency and workload with one compiled steady-state model (`jaxsim.sweep`, model
# in `docs/sweep.md`). Each configuration gets TTFT, TPOT, output tokens/s per GPU and per user, and a
# status: configurations that need a lookup outside measured support are flagged, never extrapolated.
#
# Here: Qwen3-32B on (inferred) B300, autoregressive (measured) against EAGLE-3 K = 1…3 (**derived**
# round tables, see notebook 02), aggregated and disaggregated, under a latency SLA. Then: the
# SLA-feasible frontier, how it moves with a tighter SLA, and the best configuration per GPU budget.
#
# Figures and results go to `$JAXSIM_NOTEBOOK_OUT` (default `./out/`).

# %%
import os
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from jaxsim import plots
from jaxsim.sweep import load_spec, pareto_mask, run_sweep

OUT = Path(os.environ.get("JAXSIM_NOTEBOOK_OUT", "out"))
OUT.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## The sweep spec
# A spec is TOML (`configs/quickstart.toml` is the README's example). Lists are axes; the cartesian
# product is expanded lazily and every binding is validated before anything is compiled.

# %%
SPEC = """
name = "notebook-03"
block_size = 16          # vLLM KV block of the measured runs
gpu_budget = 8           # replicas = budget // GPUs per serving unit
kv_transfer_gbps = 50    # disaggregated KV hand-off (GB/s per GPU)

[[profile]]
name = "qwen3-32b-bf16-b300"
label = "autoregressive"
tp = [1, 2, 4]

[[profile]]
name = "qwen3-32b-bf16-b300-eagle3-k1"
label = "eagle3-k1"
tp = [1, 2, 4]

[[profile]]
name = "qwen3-32b-bf16-b300-eagle3-k3"
label = "eagle3-k3"
tp = [1, 2, 4]

[serving]
mode = ["aggregated", "disaggregated"]
ratios = ["1:1", "1:2"]

[speculation]
nextn = ["profile"]
acceptance = ["eagle3-mtbench-qwen3-8b", "eagle3-mtbench-llama-3.1-8b-instruct"]

[scheduler]
concurrency = [1, 2, 4, 8, 16, 24, 32, 48]
max_num_seqs = ["recorded"]
max_num_batched_tokens = ["recorded"]

[[workload]]
name = "chat"
isl = [2048, 4096]
osl = [512]

[sla]
mean_ttft_ms = 2000
mean_tpot_ms = 50
"""
spec_path = OUT / "03_sweep.toml"
spec_path.write_text(SPEC, encoding="utf-8")
results_path = OUT / "03_sweep.parquet"
res = run_sweep(load_spec(spec_path), results_path, force=True, top=10)
s = res.summary
print(f"{s['configs_total']:,} configs: {s['configs_evaluated']:,} evaluated, {s['configs_invalid']:,} invalid; "
      f"{s['sla_feasible']:,} meet the SLA; compile {res.compile_s:.1f} s, evaluate {res.eval_s:.2f} s")
for inv in s["invalid"]:
    print(f"  invalid: {inv['rule']} ({inv['configs']:,} configs), e.g. {inv['example']}")
for name, count in s["status_counts"].items():
    print(f"  {count:6,d}  {name}")

# %% [markdown]
# ## The results table
# One row per configuration: its inputs, metrics and status (`jaxsim.plots.read_columns` reads any
# parquet/CSV result into numpy columns).

# %%
cols = plots.read_columns(results_path)
ok = cols["sla_ok"].astype(bool)
per_user = cols["tokens_per_s_per_user"]
per_gpu = cols["output_tokens_per_s_per_gpu"]


def describe(i: int) -> str:
    mode = "agg" if cols["mode"][i] == "aggregated" else f"disagg {cols['prefill_workers'][i]}:{cols['decode_workers'][i]}"
    acc = f" {cols['acceptance'][i]}" if cols["nextn"][i] else ""
    return (f"{cols['profile'][i]:15s} {mode:11s} TP{cols['tp'][i]} conc {cols['concurrency'][i]:3d} {cols['workload'][i]:14s}"
            f" TTFT {cols['mean_ttft_ms'][i]:7.1f} ms  TPOT {cols['mean_tpot_ms'][i]:6.2f} ms  {per_user[i]:6.1f} tok/s/user"
            f"  {per_gpu[i]:7.1f} tok/s/GPU{acc}")


# `on_pareto` marks each workload's SLA-feasible frontier (configs of different workloads are not comparable)
for w in dict.fromkeys(cols["workload"].tolist()):
    front = np.flatnonzero(cols["on_pareto"] & (cols["workload"] == w))
    print(f"{w}: SLA-feasible Pareto frontier ({front.size} configs), by tokens/s per user:")
    for i in front[np.argsort(per_user[front])]:
        print(" ", describe(int(i)))

# %%
plots.plot_pareto(results_path, OUT / "03_pareto.png",
                  title="Qwen3-32B (B300, inferred): throughput vs interactivity, SLA TTFT ≤ 2 s, TPOT ≤ 50 ms")

# %% [markdown]
# ## A tighter SLA
# The SLA is a filter on the computed metrics, so other SLAs can be applied to the same results
# without re-running the sweep. For one workload, with TPOT ≤ 10 ms (≥ 100 tokens/s per user) the
# high-throughput end of the frontier disappears:

# %%
WORKLOAD = "chat-4096x512"
same_workload = cols["workload"] == WORKLOAD
finite = np.isfinite(per_user) & np.isfinite(per_gpu) & same_workload
tight = finite & (cols["mean_ttft_ms"] <= 1000) & (cols["mean_tpot_ms"] <= 10)
fig = Figure(figsize=(9, 5.6), dpi=110, layout="constrained")
ax = fig.subplots()
ax.scatter(per_user[finite], per_gpu[finite], s=5, c="#d9d9d9", label=f"all evaluated {WORKLOAD} configs", rasterized=True)
for mask, colour, lw, label in (
    (ok & same_workload, "#fdae6b", 5, "SLA TTFT ≤ 2 s, TPOT ≤ 50 ms"),
    (tight, "#08519c", 1.5, "SLA TTFT ≤ 1 s, TPOT ≤ 10 ms"),
):
    f = pareto_mask(np.where(mask, per_user, np.nan), np.where(mask, per_gpu, np.nan))
    o = np.argsort(per_user[f])
    ax.plot(per_user[f][o], per_gpu[f][o], "o-", color=colour, lw=lw, ms=lw + 2, label=f"frontier under {label} ({int(f.sum())} configs)")
ax.set_xlabel("output tokens/s per user")
ax.set_ylabel("output tokens/s per GPU")
ax.set_title(f"The SLA-constrained frontier under two SLAs ({WORKLOAD})", fontsize=10)
ax.grid(True, alpha=0.3)
ax.legend(fontsize=8)
fig.savefig(OUT / "03_frontier_by_sla.png")

# %% [markdown]
# ## Best configuration per GPU budget
# With B GPUs, a serving unit of g GPUs runs ⌊B / g⌋ replicas; total output tokens/s =
# (tokens/s per GPU) · g · ⌊B / g⌋. Without an interactivity target the answer is always the unit with
# the best tokens/s per GPU, replicated; with one (a floor on tokens/s per user) small budgets run out
# of options (same workload):

# %%
budgets = [1, 2, 4, 8]
targets = [0, 100, 200, 300]  # minimum output tokens/s per user
best = {}
for target in targets:
    for budget in budgets:
        units = np.where(cols["gpus"] <= budget, budget // np.maximum(cols["gpus"], 1), 0)
        fits = ok & finite & same_workload & (units > 0) & (per_user >= target)
        total = np.where(fits, per_gpu * cols["gpus"] * units, -np.inf)
        i = int(np.argmax(total))
        best[target, budget] = (float(total[i]), i, int(units[i])) if fits.any() else (np.nan, -1, 0)
    print(f"at ≥ {target} tok/s per user:")
    for budget in budgets:
        total, i, units = best[target, budget]
        print(
            f"  {budget} GPU(s): " + (f"{total:8.1f} output tok/s with {units} × [{describe(i)}]" if i >= 0 else "no SLA-feasible configuration fits")
        )

fig = Figure(figsize=(10, 5.2), dpi=110, layout="constrained")
ax = fig.subplots()
width = 0.8 / len(targets)
for j, target in enumerate(targets):
    x = np.arange(len(budgets)) + (j - (len(targets) - 1) / 2) * width
    heights = [best[target, b][0] for b in budgets]
    bars = ax.bar(x, np.nan_to_num(heights), width, label=f"≥ {target} tok/s per user" if target else "no per-user target")
    for bar, b in zip(bars, budgets):
        total, i, units = best[target, b]
        text = "none fits" if i < 0 else f"{units}×TP{cols['tp'][i]}\nK={cols['nextn'][i]}"
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, 0 if i < 0 else total), ha="center", va="bottom", fontsize=6)
ax.set_xticks(np.arange(len(budgets)), [f"{b} GPU" + ("s" if b > 1 else "") for b in budgets])
ax.set_xlabel("GPU budget")
ax.set_ylabel("best total output tokens/s under the SLA")
ax.set_title(f"Best SLA-feasible configuration per GPU budget and interactivity target ({WORKLOAD})", fontsize=10)
ax.grid(True, axis="y", alpha=0.3)
ax.legend(fontsize=8)
fig.savefig(OUT / "03_best_per_budget.png")

# %% [markdown]
# The same sweep from the command line, with the plot:
#
# ```bash
# jaxsim sweep configs/quickstart.toml --output results.parquet --plot pareto.png
# jaxsim plot pareto results.parquet --output pareto.png     # or re-plot any results file
# ```

# %%
print(sorted(p.name for p in OUT.glob("03_*")))
