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
# # 01 · Measured profiles and round timings
#
# A **profile** is a set of measured forward passes (one row per engine iteration) for one model on one
# system, backend version and parallel layout. jaxsim compiles the rows of one deployment into JAX
# arrays and answers "how long does one iteration take?" with **no extrapolation**: a query outside
# the measured support gets `NaN` and a status code saying why.
#
# This notebook looks at the bundled, measured Qwen3-32B BF16 profile (vLLM 0.20.1; the GPU is
# inferred as B300, the logs do not name it):
#
# 1. the measured decode curves per batch size,
# 2. the prefill measurements and the kernel's answers between them,
# 3. a support map: where decode queries are answered, and why not elsewhere.
#
# Figures go to `$JAXSIM_NOTEBOOK_OUT` (default `./out/`).

# %%
import os
from pathlib import Path

import numpy as np

from jaxsim import plots
from jaxsim.data.registry import list_bundled
from jaxsim.kernels import status as st
from jaxsim.kernels.batched import support_grid

OUT = Path(os.environ.get("JAXSIM_NOTEBOOK_OUT", "out"))
OUT.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## The bundled profiles
# `measured` profiles come from real forward-pass logs; `derived` ones are computed from measured
# tables by a documented model (see notebook 02 and `docs/data-provenance.md`).

# %%
for p in list_bundled():
    k = f" K={p.num_draft_tokens}" if p.num_draft_tokens else ""
    print(f"{p.name:32s} {p.kind:9s} {p.system:9s} TP{','.join(map(str, p.tps)):6s}{k}  {p.model}")

# %% [markdown]
# ## One deployment
# A profile can hold several deployments (here TP1, TP2 and TP4); `load_view` picks one by its
# identity and compiles its measured rows into a `RoundTable`.

# %%
view = plots.load_view("qwen3-32b-bf16-b300", tp=2)
cell, d = view.cell, view.deployment
print(d.describe())
print(f"decode rows: {cell.num_decode_rows}, batch sizes {int(cell.decode_batch.min())}..{int(cell.decode_batch.max())}, "
      f"total past KV up to {int(cell.decode_kv.max()):,} tokens")
print(f"prefill rows: {cell.num_prefill_rows}, batch sizes {sorted(set(cell.prefill_batch.tolist()))}")
rm = d.resources.runtime_memory
print(f"recorded KV pool: {rm.kv_cache_bytes:,} B = {rm.kv_cache_bytes // d.resources.kv_bytes_per_token:,} tokens "
      f"at gpu_memory_utilization={rm.gpu_memory_utilization}")

# %% [markdown]
# ## 1. Decode curves
# Each line is one batch size: iteration latency against the total past KV of the batch (the sum of
# the requests' cached tokens). The measured `real` segment ran 128 requests at concurrency 32, so
# most rows sit at batch 25–32.

# %%
plots.plot_decode_curves(view, OUT / "01_decode_curves.png")

# %% [markdown]
# Single queries go through the compiled kernel (`jaxsim.kernels.rounds.decode_batch`). A query at a
# measured batch interpolates along that batch's curve; between batches it interpolates at the same
# total KV; anything else is refused with a reason.

# %%
queries = [(32, 120_000), (32, 250_000), (31, 100_000), (20, 60_000), (3, 9_000), (40, 100_000)]
for b, kv in queries:
    lat, code = support_grid(view.table, [b], [kv])
    value = "—" if np.isnan(lat[0, 0]) else f"{lat[0, 0]:.3f} ms"
    print(f"batch {b:3d}, total KV {kv:>8,}: {value:>11s}  {st.name(int(code[0, 0]))}")

# %% [markdown]
# ## 2. Prefill
# Prefill rows are interpolated within one measured batch only (token-first, then KV-first). This
# profile measured few prefill-only passes (128 … 8192 new tokens), so panel (a) is a line; the
# Llama-3.1-8B profile (from a Dynamo planner sweep) has 17 prompt lengths.

# %%
plots.plot_prefill_surface(view, OUT / "01_prefill_surface.png")
llama = plots.load_view("llama-3.1-8b-fp8-h200")
plots.plot_prefill_surface(llama, OUT / "01_prefill_llama.png")

# %% [markdown]
# ## 3. Support map
# The grid below is every (batch, total KV) pair on a regular lattice, evaluated by the kernel and
# coloured by status code: greens are answered, the other colours say why a query is refused.
# Measured rows are the black dots.

# %%
plots.plot_support_map(view, OUT / "01_support_map.png")

# %%
batches = np.arange(1, 41)
kv = np.linspace(0, 1.1 * view.table.max_decode_kv, 221).astype(np.int64)
latency_ms, codes = support_grid(view.table, batches, kv)
print(f"{'status':58s} {'share':>7s}  why")
for code, name, count, share, why in plots.support_summary(codes):
    print(f"{name:58s} {100 * share:6.1f} %  {why}")

# %% [markdown]
# Reading the map: a query at a measured batch is answered from that batch's own curve wherever the
# curve covers the queried total KV. Otherwise the kernel needs a lower and an upper batch whose curves
# both cover that KV, within one capture regime, at most 4× apart in batch and among the 4 nearest
# covering batches — the reference's rules, reproduced from its goldens. This profile measured every
# batch size 1–32, each over a short KV range, so bracketing across neighbouring batches is refused
# (capture-regime status) and most of the plane has no answer: jaxsim says so instead of guessing.
# To widen support, measure each batch size over a wider KV range (see `docs/byo-data.md`).
#
# The same map for each TP of the profile:

# %%
for tp in (1, 4):
    plots.plot_support_map(plots.load_view("qwen3-32b-bf16-b300", tp=tp), OUT / f"01_support_map_tp{tp}.png")
print(sorted(p.name for p in OUT.glob("01_*.png")))
