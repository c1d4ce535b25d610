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
# # 02 · Speculative decoding: what if?
#
# With EAGLE-3 speculative decoding a **round** drafts K tokens per request (K = `nextn`) and verifies
# K+1 positions; the request then emits 1 + (accepted drafts) tokens. Two things decide the payoff:
#
# * **acceptance**: per-position conditional rates p₁…p_K (draft i is accepted only if drafts 1…i−1
#   were), so the expected tokens per round are 1 + p₁ + p₁p₂ + … — not 1 + α·K;
# * **round cost**: the latency of one whole draft+verify round, looked up once at the actual number
#   of requests and their total past KV (never batch × (K+1), never an added draft cost).
#
# > **Caveat — derived round tables.** No public measured speculative-round table exists. The bundled
# > `qwen3-32b-bf16-b300-eagle3-k{1,2,3}` profiles are **derived** from the measured Qwen3-32B decode
# > passes by an explicit model (round = decode × (1 + 0.05·K) + K·batch·μ, μ the measured marginal cost
# > of a query token; see `docs/data-provenance.md`). The acceptance rates are measured, but for
# > other models (no EAGLE-3 acceptance for Qwen3-32B is public; Qwen3-8B's is the closest). Read the
# > numbers below as the consequences of those inputs, not as measurements of speculative serving.
#
# Figures go to `$JAXSIM_NOTEBOOK_OUT` (default `./out/`).

# %%
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

from jaxsim import plots
from jaxsim.acceptance import MAX_DRAFT_TOKENS, list_presets, pad_rates, preset_rates, rates_from_accepted
from jaxsim.kernels import status as st
from jaxsim.kernels.acceptance import expected_tokens_per_round
from jaxsim.kernels.batched import decode_points

OUT = Path(os.environ.get("JAXSIM_NOTEBOOK_OUT", "out"))
OUT.mkdir(parents=True, exist_ok=True)
expected = jax.jit(jax.vmap(expected_tokens_per_round, in_axes=(0, 0, 0)))

# %% [markdown]
# ## 1. Acceptance × nextn → expected tokens per round
# Measured acceptance presets (vLLM EAGLE-3 baselines on MT-Bench, greedy, K = 3):

# %%
NO_CAP = 1e9  # remaining output tokens: large = a request far from its end
for p in list_presets():
    tag = "" if p.verified else "  (unverified upstream)"
    rates = ", ".join(f"{r:.3f}" for r in p.conditional_rates)
    print(f"{p.name:46s} K={p.num_spec_tokens}  p=[{rates}]  mean length {p.mean_acceptance_length}{tag}")

# %% [markdown]
# Expected tokens per round for a constant conditional rate p at each depth K (solid), against the
# naive 1 + p·K (dashed), and the presets evaluated at K = 1, 2, 3 (their rates truncated).

# %%
p_grid = np.linspace(0.0, 1.0, 101)
fig = Figure(figsize=(12, 4.6), dpi=110, layout="constrained")
ax, ax2 = fig.subplots(1, 2)
for k in range(1, MAX_DRAFT_TOKENS + 1):
    rates = np.where(np.arange(MAX_DRAFT_TOKENS) < k, p_grid[:, None], 0.0)
    e = expected(jnp.asarray(rates), jnp.full(p_grid.size, k), jnp.full(p_grid.size, NO_CAP))
    line, = ax.plot(p_grid, np.asarray(e), lw=1.8, label=f"K={k}")
    ax.plot(p_grid, 1 + p_grid * k, "--", lw=0.8, color=line.get_color())
ax.set_xlabel("conditional acceptance rate per draft position, p")
ax.set_ylabel("expected tokens emitted per round")
ax.set_title("Chained acceptance (solid) vs naive 1 + p·K (dashed)", fontsize=9)
ax.grid(True, alpha=0.3)
ax.legend(title="draft depth", fontsize=8)

presets = [p for p in list_presets() if p.method == "eagle3"]
width = 0.25
for j, k in enumerate((1, 2, 3)):
    rates = np.stack([pad_rates(preset_rates(p.name, k)) for p in presets])
    e = np.asarray(expected(jnp.asarray(rates), jnp.full(len(presets), k), jnp.full(len(presets), NO_CAP)))
    ax2.bar(np.arange(len(presets)) + (j - 1) * width, e, width, label=f"K={k}")
ax2.set_xticks(np.arange(len(presets)), [p.target_model.split("/")[-1] for p in presets], rotation=15, fontsize=7)
ax2.set_ylabel("expected tokens emitted per round")
ax2.set_title("Measured EAGLE-3 acceptance (MT-Bench) at depths 1–3", fontsize=9)
ax2.legend(title="draft depth", fontsize=8)
ax2.grid(True, axis="y", alpha=0.3)
fig.savefig(OUT / "02_tokens_per_round.png")

# %% [markdown]
# A mean accepted-draft count *a* (what many benchmarks report) is lowered to rates
# [1]·⌊a⌋ + [a − ⌊a⌋] + zeros, so its expectation is exactly 1 + a. Near the end of a request the burst
# is capped by the remaining output:

# %%
rates = pad_rates(preset_rates("eagle3-mtbench-qwen3-8b", 3))
for remaining in (1, 2, 3, 4, 100):
    e = float(expected_tokens_per_round(jnp.asarray(rates), 3, remaining))
    print(f"remaining output {remaining:3d} tokens: E[tokens this round] = {e:.4f}")
print("a = 1.5, K = 3 →", rates_from_accepted(1.5, 3), "→",
      float(expected_tokens_per_round(jnp.asarray(pad_rates(rates_from_accepted(1.5, 3))), 3, NO_CAP)))

# %% [markdown]
# ## 2. Round cost, TPOT and throughput
# For each measured batch size b we take that batch's median measured total KV and look the round up
# once in each table (autoregressive K = 0 and the derived K = 1, 2, 3; the derived tables keep the
# measured coordinates, so these are exact lookups). With E_K tokens per request per round:
#
# * TPOT ≈ round_ms / E_K (steady decode; notebook 03's sweep adds prefill interference and queueing),
# * output tokens/s per GPU = b · E_K / round_ms · 1000 / TP.

# %%
TP = 2
ACCEPT = "eagle3-mtbench-qwen3-8b"
ar = plots.load_view("qwen3-32b-bf16-b300", tp=TP)
views = {0: ar} | {k: plots.load_view(f"qwen3-32b-bf16-b300-eagle3-k{k}", tp=TP) for k in (1, 2, 3)}
batches = np.unique(ar.cell.decode_batch)
kv_at = np.array([int(np.median(ar.cell.decode_kv[ar.cell.decode_batch == b])) for b in batches])
# the median may fall between measured points; snap to the nearest measured KV of that batch
kv_at = np.array([ar.cell.decode_kv[ar.cell.decode_batch == b][np.argmin(np.abs(ar.cell.decode_kv[ar.cell.decode_batch == b] - k))]
                  for b, k in zip(batches, kv_at)])

rows = {}
for k, view in views.items():
    lat, code = decode_points(view.table, batches, kv_at)
    assert np.all(code < st.FIRST_UNSUPPORTED), "every lookup here is on measured coordinates"
    e_k = 1.0 if k == 0 else float(expected_tokens_per_round(jnp.asarray(pad_rates(preset_rates(ACCEPT, k))), k, NO_CAP))
    tpot = lat / e_k
    rows[k] = dict(round_ms=lat, tokens=e_k, tpot_ms=tpot, per_gpu=batches * e_k / lat * 1000.0 / TP)

print(f"batch 32, total KV {kv_at[-1]:,} tokens, TP{TP}, acceptance {ACCEPT}:")
print(f"{'K':>2s} {'round ms':>9s} {'tok/round':>9s} {'TPOT ms':>8s} {'tok/s/user':>10s} {'tok/s/GPU':>10s}")
for k, r in rows.items():
    print(f"{k:2d} {r['round_ms'][-1]:9.3f} {r['tokens']:9.3f} {r['tpot_ms'][-1]:8.3f} {1000 / r['tpot_ms'][-1]:10.1f} {r['per_gpu'][-1]:10.1f}")

# %%
fig = Figure(figsize=(12, 4.6), dpi=110, layout="constrained")
ax, ax2 = fig.subplots(1, 2)
for k, r in rows.items():
    label = "autoregressive (measured)" if k == 0 else f"EAGLE-3 K={k} (derived round)"
    ax.plot(batches, r["tpot_ms"], "o-", ms=3, lw=1.0, label=label)
    ax2.plot(1000.0 / r["tpot_ms"], r["per_gpu"], "o-", ms=3, lw=0.6, label=label)
ax.set_xlabel("batch (decoding requests)")
ax.set_ylabel("TPOT: time per output token (ms)")
ax.set_title(f"Qwen3-32B TP{TP}: TPOT at each batch's median measured KV", fontsize=9)
ax2.set_xlabel("output tokens/s per user")
ax2.set_ylabel("output tokens/s per GPU")
ax2.set_title("Throughput vs interactivity (points: batch 1 … 32)", fontsize=9)
for a in (ax, ax2):
    a.grid(True, alpha=0.3)
    a.legend(fontsize=8)
fig.suptitle(f"Speculative what-if with acceptance {ACCEPT} — DERIVED round tables, not measurements", fontsize=10)
fig.savefig(OUT / "02_tpot_throughput.png")

# %% [markdown]
# Under the derived cost model each draft position adds ~5 % of a decode step plus the verification of
# one more query token per request, while the chained acceptance makes each extra position worth less
# than the one before (p₁, then p₁p₂, …). The gain of each step in depth, at every measured batch:

# %%
for k in (1, 2, 3):
    gain = rows[k - 1]["tpot_ms"] / rows[k]["tpot_ms"]
    print(f"K={k - 1} → K={k}: TPOT divided by {gain.min():.3f} … {gain.max():.3f} (median {np.median(gain):.3f})")

# %% [markdown]
# Replace the derived tables with measured speculative rounds (`docs/byo-data.md`) to answer this for
# real; the rest of the pipeline is unchanged.

# %%
print(sorted(p.name for p in OUT.glob("02_*.png")))
