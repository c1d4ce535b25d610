"""Steady-state evaluator: one deployment configuration → throughput and latency, vmapped over configs.

:func:`evaluate_config` is written for ONE configuration (its scheduler, pool, acceptance and workload as
arrays) against one prefill and one decode :class:`~jaxsim.kernels.rounds.RoundTable`; :func:`evaluate_chunk`
vmaps it over a chunk whose configurations share their tables, which it slices by integer index from one
stacked pytree (:func:`~jaxsim.kernels.rounds.stack_round_tables`), so a whole sweep compiles once. Every latency comes from the
compiled round kernels; a configuration that needs a lookup outside measured support gets that lookup's
refusal status code (:mod:`jaxsim.kernels.status`) and NaN metrics, never an extrapolated value. The model is written down in
``docs/sweep.md``.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float64, Int32, Int64

from jaxsim._jax import ensure_x64, jit_x64
from jaxsim.acceptance import MAX_DRAFT_TOKENS, tail_probabilities
from jaxsim.kernels import capacity
from jaxsim.kernels import status as st
from jaxsim.kernels.rounds import (
    RoundTable,
    decode_latency_ms,
    scheduler_pass_latency_ms,
)
from jaxsim.kernels.status import (  # the sweep's own refusals (registered there, 48–63)
    PROMPT_EXCEEDS_PREFILL_POOL,
    REQUEST_EXCEEDS_CONTEXT,
    REQUEST_EXCEEDS_KV_POOL,
    TOKEN_BUDGET_TOO_SMALL,
)
from jaxsim.overhead import added_latency_ms
from jaxsim.sla import LATENCY_KEYS, LATENCY_METRICS, LIMIT_QUANTILES, LIMIT_STATS, SLA

# What bounds the effective concurrency.
LIMIT_NAMES = ("concurrency", "max_num_seqs", "kv_pool", "token_budget")

# Gauss-Legendre nodes/weights on [0, 1]: 3 points along the decode trajectory, 2 over prefill chunks.
GL_NODES = (np.array([-np.sqrt(0.6), 0.0, np.sqrt(0.6)]) + 1.0) / 2.0
GL_WEIGHTS = np.array([5.0, 8.0, 5.0]) / 18.0
CHUNK_NODES = (np.array([-1.0, 1.0]) / np.sqrt(3.0) + 1.0) / 2.0
CHUNK_WEIGHTS = np.array([0.5, 0.5])
NUM_CHUNK_POINTS = CHUNK_NODES.size


# ----------------------------------------------------------------------------------------------------
# pytrees


class ConfigInputs(eqx.Module):
    """One configuration (leading axes ``*c`` = configs when batched; numpy on the host, jax on the device). Workload classes are padded to W with
    weight 0. Pools and budgets are rank-local; ``*_workers`` count engine replicas inside one serving
    unit (aggregated: 0 prefill, 1 decode/aggregated worker)."""

    prefill_workers: Int64[ArrayLike, "*c"]
    decode_workers: Int64[ArrayLike, "*c"]
    prefill_gpus: Int64[ArrayLike, "*c"]
    decode_gpus: Int64[ArrayLike, "*c"]
    nextn: Int64[ArrayLike, "*c"]
    acceptance_id: Int64[ArrayLike, "*c"]
    max_num_seqs: Int64[ArrayLike, "*c"]
    max_num_batched_tokens: Int64[ArrayLike, "*c"]
    prefill_max_num_batched_tokens: Int64[ArrayLike, "*c"]
    kv_blocks: Int64[ArrayLike, "*c"]
    prefill_kv_blocks: Int64[ArrayLike, "*c"]
    block_size: Int64[ArrayLike, "*c"]
    max_model_len: Int64[ArrayLike, "*c"]
    kv_bytes_per_token: Int64[ArrayLike, "*c"]
    kv_transfer_bytes_per_s: Float64[ArrayLike, "*c"]
    concurrency: Int64[ArrayLike, "*c"]
    isl: Int64[ArrayLike, "*c W"]
    osl: Int64[ArrayLike, "*c W"]
    weight: Float64[ArrayLike, "*c W"]
    kv_state_blocks: Int64[ArrayLike, "*c"] = 0  # fixed blocks every request holds (grouped caches; 0 when linear)
    prefix_hit_ratio: Float64[ArrayLike, "*c"] | None = None  # expected share of prompt tokens read from the prefix cache (None: 0)
    prompts_per_client: Float64[ArrayLike, "*c"] = 0.0  # closed-loop benchmark: prompts per client (0: no waves, pure steady state)
    equal_lengths: Bool[ArrayLike, "*c"] = False  # every request the same ISL/OSL (one class, range ratio 0): waves stay in step
    overhead_fixed_ms: Float64[ArrayLike, "*c"] = 0.0  # serving overhead (jaxsim.overhead): TTFT + fixed + per prompt token × ISL
    overhead_per_prompt_token_ms: Float64[ArrayLike, "*c"] = 0.0
    overhead_per_output_token_ms: Float64[ArrayLike, "*c"] = 0.0  # ... and TPOT + per output token
    async_scheduling: Bool[ArrayLike, "*c"] = False  # vLLM's async scheduling: a prompt sent to a busy engine waits the passes scheduled before it


class SLABounds(eqx.Module):
    """A :class:`~jaxsim.sla.SLA` as traced float64 scalars, field for field (``inf``, or 0 for the
    minimum per-user rate, where the SLA states no limit). Percentile limits are over the workload mix."""

    mean_ttft_ms: Float64[Array, ""]
    median_ttft_ms: Float64[Array, ""]
    p90_ttft_ms: Float64[Array, ""]
    p99_ttft_ms: Float64[Array, ""]
    mean_tpot_ms: Float64[Array, ""]
    median_tpot_ms: Float64[Array, ""]
    p90_tpot_ms: Float64[Array, ""]
    p99_tpot_ms: Float64[Array, ""]
    mean_e2e_ms: Float64[Array, ""]
    median_e2e_ms: Float64[Array, ""]
    p90_e2e_ms: Float64[Array, ""]
    p99_e2e_ms: Float64[Array, ""]
    min_tokens_per_s_per_user: Float64[Array, ""]

    @staticmethod
    def of(sla: SLA | None = None) -> SLABounds:
        """The bounds of ``sla`` (None: no limit at all)."""
        sla = SLA() if sla is None else sla
        unset = lambda k: 0.0 if k == "min_tokens_per_s_per_user" else float("inf")  # noqa: E731
        return SLABounds(**{k: jnp.float64(unset(k) if v is None else v) for k, v in vars(sla).items()})

    def latency_ms(self) -> Float64[Array, "3 4"]:
        """The latency limits as ``[metric, stat]`` (metrics ttft/tpot/e2e × mean/median/p90/p99)."""
        return jnp.stack([getattr(self, k) for k in LATENCY_KEYS]).reshape(len(LATENCY_METRICS), len(LIMIT_STATS))


AGREEMENT = {"mean_ttft_ms": 0.15, "mean_tpot_ms": 0.08, "output_tokens_per_s_per_gpu": 0.08}
"""Stated agreement of the steady state with the replay of the same point under its closed-loop benchmark
(relative to the replay), where docs/sweep.md says they should agree: aggregated closed loops of >= 16
clients per worker with equal lengths, and spread lengths at any concurrency."""

PERCENTILES = tuple(LIMIT_QUANTILES.values())
"""The percentiles of the mix the sweep reports (median, p90, p99)."""


def weighted_percentiles(values: Float64[Array, " W"], weights: Float64[Array, " W"]) -> Float64[Array, " 3"]:
    """Median/p90/p99 of a discrete distribution: value ``values[i]`` with probability ``weights[i]``
    (normalised here; zero-weight entries ignored). The p-th percentile is the smallest value whose
    cumulative probability reaches p: the inverse CDF, no interpolation between classes. It is the limit
    of NumPy's ``"linear"`` percentile (:data:`jaxsim.stats.PERCENTILE_METHOD`) of a large sample drawn
    from the mix (docs/sweep.md)."""
    v = jnp.where(weights > 0, values, jnp.inf)
    order = jnp.argsort(v)
    cw = jnp.cumsum(jnp.maximum(weights, 0.0)[order])
    total = jnp.maximum(cw[-1], 1e-300)
    q = jnp.asarray(PERCENTILES, jnp.float64) / 100.0
    idx = jnp.searchsorted(cw / total, q - 1e-12, side="left")
    return v[order][jnp.clip(idx, 0, v.shape[0] - 1)]


class Metrics(eqx.Module):
    """Steady-state metrics of one configuration (NaN when unsupported): latency statistics over its
    workload mix, named as :mod:`jaxsim.stats` names them (``mean_ttft_ms``, ``p90_ttft_ms``, ...)."""

    status: Int32[Array, ""]
    limit: Int32[Array, ""]
    concurrency: Int64[Array, ""]
    kv_preemption: Bool[Array, ""]
    decode_batch: Float64[Array, ""]
    round_ms: Float64[Array, ""]
    pass_ms: Float64[Array, ""]
    prefill_chunks: Float64[Array, ""]
    prefill_queue_ms: Float64[Array, ""]
    rounds: Float64[Array, ""]
    tokens_per_round: Float64[Array, ""]
    request_rate_per_s: Float64[Array, ""]
    output_tokens_per_s_per_gpu: Float64[Array, ""]
    tokens_per_s_per_user: Float64[Array, ""]
    mean_ttft_ms: Float64[Array, ""]
    median_ttft_ms: Float64[Array, ""]
    p90_ttft_ms: Float64[Array, ""]
    p99_ttft_ms: Float64[Array, ""]
    mean_tpot_ms: Float64[Array, ""]
    median_tpot_ms: Float64[Array, ""]
    p90_tpot_ms: Float64[Array, ""]
    p99_tpot_ms: Float64[Array, ""]
    mean_e2e_ms: Float64[Array, ""]
    median_e2e_ms: Float64[Array, ""]
    p90_e2e_ms: Float64[Array, ""]
    p99_e2e_ms: Float64[Array, ""]
    sla_ok: Bool[Array, ""]


# ----------------------------------------------------------------------------------------------------
# tables


def take_table(stack: RoundTable, index: Int64[Array, ""]) -> RoundTable:
    """Table ``index`` of a stack (a dynamic slice; index unbatched)."""
    return jax.tree.map(lambda a: a[index], stack)


# ----------------------------------------------------------------------------------------------------
# acceptance → rounds


def expected_rounds(rates: Float64[Array, " 5"], nextn: Int64[Array, ""], max_tokens: int) -> Float64[Array, " N"]:
    """Exact E[rounds to emit m tokens], m = 0..max_tokens, for chained conditional acceptance.

    A round emits T = 1 + accepted drafts (P(T ≥ j+1) = p_1···p_j, j ≤ K), capped by the remaining
    output; the cap ends the last round early but never changes the count, so
    f(m) = 1 + Σ_t P(T = t) f(m − t), f(m ≤ 0) = 0. K = 0 gives f(m) = m.
    """
    ge = tail_probabilities(rates, nextn, jnp)  # P(T ≥ t), t = 1..6
    p_t = ge - jnp.concatenate([ge[1:], jnp.zeros(1)])

    def step(carry, _):
        f = 1.0 + jnp.dot(p_t, carry)
        return jnp.concatenate([f[None], carry[:-1]]), f

    _, fs = jax.lax.scan(step, jnp.zeros(MAX_DRAFT_TOKENS + 1), None, length=max_tokens)
    return jnp.concatenate([jnp.zeros(1), fs])


expected_rounds_table = jit_x64(jax.vmap(expected_rounds, in_axes=(0, 0, None)), static_argnums=2)
"""[A, 5] rates × [A] nextn → [A, max_tokens + 1] expected rounds (one row per acceptance setting)."""


# ----------------------------------------------------------------------------------------------------
# per-quantity pieces (one configuration)


def decode_round_ms_at(
    t: RoundTable, batch: Int64[Array, ""], kv_per_request: Float64[Array, " Q"], pool_tokens: Int64[ArrayLike, ""] | None = None,
) -> tuple[Float64[Array, ""], Int32[Array, ""]]:
    """Mean decode-pass (round) time of an integer ``batch`` of decoding requests over the trajectory:
    total KV = batch × ``kv_per_request[q]`` at each progress node q, Gauss-Legendre weighted, never more
    than the KV pool holds (``pool_tokens``: vLLM preempts rather than exceed it)."""
    kv = jnp.round(batch.astype(jnp.float64) * kv_per_request).astype(jnp.int64)
    if pool_tokens is not None:
        kv = jnp.minimum(kv, pool_tokens)
    lat, code = jax.vmap(decode_latency_ms, in_axes=(None, None, 0))(t, batch, kv)
    return jnp.sum(GL_WEIGHTS * lat), st.worst_of(code, xp=jnp)


def cached_prompt_tokens(cfg: ConfigInputs) -> Int64[Array, " W"]:
    """Prompt tokens per class read from the prefix cache in the steady state: the workload's expected
    hit ratio of ISL in whole KV blocks, at most ⌊(ISL − 1)/block⌋ blocks (vLLM computes at least one
    token of every prompt)."""
    bs = jnp.maximum(cfg.block_size, 1)
    isl = jnp.asarray(cfg.isl)
    if cfg.prefix_hit_ratio is None:
        return jnp.zeros_like(isl)
    hit_blocks = jnp.floor(jnp.asarray(cfg.prefix_hit_ratio, jnp.float64) * isl.astype(jnp.float64) / bs).astype(jnp.int64)
    return jnp.minimum(hit_blocks, (isl - 1) // bs) * bs


def prompt_prefill_ms(
    t: RoundTable,
    isl: Int64[Array, " W"],
    chunk_tokens: Int64[Array, ""],
    num_decode: Int64[Array, ""],
    decode_kv_tokens: Int64[Array, ""],
    live: Bool[Array, " W"],
    cached: Int64[Array, " W"] | int = 0,
) -> tuple[Float64[Array, " W"], Int32[Array, ""]]:
    """Time of all the scheduler passes that carry one prompt's prefill chunks, per workload class.

    ``cached`` prompt tokens per class are read from the prefix cache, not computed: the ISL − cached
    computed tokens are split into c = ⌈(ISL − cached) / chunk⌉ chunks; chunk j computes min(chunk,
    ISL − cached − j·chunk) tokens reading cached + j·chunk past tokens, in a pass beside ``num_decode`` decoding requests holding
    ``decode_kv_tokens`` past KV in total. Up to 2 full chunks are priced one by one; more are integrated
    with 2-point Gauss-Legendre over their KV read (exact where the latency is linear in the KV read);
    the last (partial) chunk is always priced exactly.
    """
    chunk = jnp.maximum(chunk_tokens, 1)
    cached = jnp.broadcast_to(jnp.asarray(cached, jnp.int64), isl.shape)
    isl = isl - cached  # computed tokens
    c = (isl + chunk - 1) // chunk  # [W]
    full = c - 1
    q = jnp.arange(NUM_CHUNK_POINTS)
    few = (full <= NUM_CHUNK_POINTS)[:, None]
    pos = jnp.where(few, q[None, :].astype(jnp.float64), CHUNK_NODES[None, :] * jnp.maximum(full - 1, 0)[:, None])
    wts = jnp.where(few, (q[None, :] < full[:, None]).astype(jnp.float64), CHUNK_WEIGHTS[None, :] * full[:, None])
    kv_read = jnp.round(pos * chunk).astype(jnp.int64) + cached[:, None]  # [W, 2]
    toks = jnp.concatenate([jnp.broadcast_to(chunk, kv_read.shape), (isl - full * chunk)[:, None]], axis=1)
    kvs = jnp.concatenate([kv_read, (cached + full * chunk)[:, None]], axis=1)
    wts = jnp.concatenate([wts, jnp.ones_like(wts[:, :1])], axis=1)  # [W, 3]
    one = jnp.ones(toks.size, jnp.int64)
    flat = jax.vmap(scheduler_pass_latency_ms, in_axes=(None, 0, 0, 0, None, None))
    lat, code = flat(t, one, toks.ravel(), kvs.ravel(), num_decode, decode_kv_tokens)
    lat, code = lat.reshape(toks.shape), code.reshape(toks.shape)
    used = (wts > 0) & live[:, None]
    return jnp.sum(jnp.where(used, wts * lat, 0.0), axis=1), st.worst_of(code, used, jnp)


def _share(w, x):
    s = w * x
    return s / jnp.maximum(jnp.sum(s), 1e-300)


def _decode_kv_per_request(cfg: ConfigInputs, share, nodes) -> Float64[Array, " Q"]:
    """Mean past KV per decoding request at trajectory progress u: Σ_w share_w (ISL_w + u·(OSL_w − 1))."""
    isl = cfg.isl.astype(jnp.float64)
    osl1 = jnp.maximum(cfg.osl - 1, 0).astype(jnp.float64)
    return jnp.sum(share[None, :] * (isl[None, :] + nodes[:, None] * osl1[None, :]), axis=1)


def effective_concurrency(cfg: ConfigInputs, rounds_w, w, live):
    """Requests in flight per decode (or aggregated) worker, which limit binds, a capacity status, and whether those
    requests at their longest together outgrow the KV pool (``kv_preemption``).

    min(target concurrency, max_num_seqs, KV pool ÷ blocks a request holds, token budget ÷ (nextn + 1)).
    vLLM allocates a request's blocks as its tokens arrive (and preempts when the pool runs dry), so a
    request in flight holds on average ⌈(ISL + OSL/2 + lookahead)/block⌉ blocks over its decode (+ the
    fixed blocks of a grouped cache's window and state groups), averaged over the mix weighted by
    residence; a request must still fit whole at its peak, ⌈(ISL + OSL + lookahead)/block⌉ ≤ the pool.
    """
    step = cfg.nextn + 1
    la = jnp.where(cfg.nextn > 0, cfg.nextn + 1, 0)
    blocks_w = capacity.request_blocks(cfg.isl, cfg.osl, la, cfg.block_size) + cfg.kv_state_blocks
    held_w = capacity.request_blocks(cfg.isl, cfg.osl // 2, la, cfg.block_size) + cfg.kv_state_blocks
    occ = _share(w, rounds_w + 1.0)
    mean_blocks = jnp.ceil(jnp.sum(occ * held_w)).astype(jnp.int64)
    n_kv = capacity.max_concurrency(cfg.kv_blocks, mean_blocks, cfg.max_num_seqs)
    n_budget = cfg.max_num_batched_tokens // step
    n = jnp.minimum(jnp.minimum(cfg.concurrency, n_kv), n_budget)
    limit = jnp.where(n == cfg.concurrency, 0, jnp.where(n == cfg.max_num_seqs, 1, jnp.where(n == n_kv, 2, 3)))
    peak_blocks = jnp.ceil(jnp.sum(occ * blocks_w)).astype(jnp.int64)
    preemption = jnp.maximum(n, 1) * peak_blocks > cfg.kv_blocks
    code = jnp.where(n_budget < 1, TOKEN_BUDGET_TOO_SMALL, st.EXACT)
    code = jnp.where(jnp.any(live & (blocks_w > cfg.kv_blocks)) | (n_kv < 1), REQUEST_EXCEEDS_KV_POOL, code)
    code = jnp.where(jnp.any(live & (cfg.isl + cfg.osl > cfg.max_model_len)), REQUEST_EXCEEDS_CONTEXT, code)
    return jnp.maximum(n, 1), limit.astype(jnp.int32), code, preemption


class Mix(eqx.Module):
    """One configuration's workload mix: class weights normalised to 1, the live classes (weight > 0),
    expected decode rounds per class and their mean."""

    w: Float64[Array, " W"]
    live: Bool[Array, " W"]
    rounds_w: Float64[Array, " W"]
    r_bar: Float64[Array, ""]


def workload_mix(cfg: ConfigInputs, rounds_table: Float64[Array, "A M"]) -> Mix:
    """Weights and expected rounds of the mix (``rounds_table[a, m]``: rounds to emit m tokens)."""
    w = jnp.maximum(cfg.weight, 0.0)
    w = w / jnp.maximum(jnp.sum(w), 1e-300)
    m_max = rounds_table.shape[1] - 1
    rounds_w = rounds_table[cfg.acceptance_id, jnp.clip(cfg.osl - 1, 0, m_max)]
    return Mix(w=w, live=cfg.weight > 0, rounds_w=rounds_w, r_bar=jnp.sum(w * rounds_w))


class Passes(eqx.Module):
    """The engine's pass structure at ``n`` decoding requests: decodes are scheduled first and prompts
    are chunked into the rest of the token budget (disaggregated: the prefill worker's whole budget)."""

    chunk: Int64[Array, ""]  # prefill tokens per chunk
    c_bar: Float64[Array, ""]  # mean prefill chunks per request
    passes: Float64[Array, ""]  # engine passes per completed request
    frac_mixed: Float64[Array, ""]  # share of passes that carry a prefill chunk
    prefill_bound: Bool[Array, ""]  # every pass carries a chunk
    n_mixed: Int64[Array, ""]  # decoders beside a prefill chunk (0 when disaggregated)


def pass_structure(cfg: ConfigInputs, disagg: Bool[Array, ""], mix: Mix, n: Int64[Array, ""]) -> Passes:
    nf = n.astype(jnp.float64)
    step = cfg.nextn + 1  # scheduler tokens per decoding request per pass
    chunk = jnp.where(disagg, cfg.prefill_max_num_batched_tokens, cfg.max_num_batched_tokens - (n - 1) * step)
    computed = cfg.isl - cached_prompt_tokens(cfg)  # the prefix cache serves the rest
    chunks_w = ((computed + chunk - 1) // chunk).astype(jnp.float64)
    c_bar = jnp.sum(mix.w * chunks_w)
    passes = jnp.maximum((mix.r_bar + c_bar) / nf, c_bar)
    frac_mixed = c_bar / passes
    prefill_bound = frac_mixed >= 1.0
    # nearest integer when prefill-bound
    n_mixed = jnp.where(prefill_bound, jnp.round(mix.r_bar / passes), nf - 1.0).astype(jnp.int64)
    return Passes(chunk=chunk, c_bar=c_bar, passes=passes, frac_mixed=frac_mixed, prefill_bound=prefill_bound,
                  n_mixed=jnp.where(disagg, 0, n_mixed))


class Lookups(eqx.Module):
    """The round-time lookups of one configuration: the decode round of ``n`` requests over the decode
    trajectory, and per class the passes carrying its prompt's prefill chunks (with their statuses)."""

    kv_q: Float64[Array, " Q"]  # mean past KV per decoding request at the trajectory nodes
    kv_mid: Float64[Array, ""]  # mean past KV per decoding request halfway along the trajectory
    round_ms: Float64[Array, ""]
    round_code: Int32[Array, ""]
    prompt_ms: Float64[Array, " W"]
    prompt_code: Int32[Array, ""]


def price_lookups(prefill_table: RoundTable, decode_table: RoundTable, cfg: ConfigInputs, mix: Mix,
                  n: Int64[Array, ""], p: Passes) -> Lookups:
    share = _share(mix.w, mix.rounds_w)
    kv_q = _decode_kv_per_request(cfg, share, jnp.asarray(GL_NODES))
    kv_mid = _decode_kv_per_request(cfg, share, jnp.full(1, 0.5))[0]
    round_ms, round_code = decode_round_ms_at(decode_table, n, kv_q, cfg.kv_blocks * cfg.block_size)
    mixed_kv = jnp.minimum(jnp.round(p.n_mixed.astype(jnp.float64) * kv_mid).astype(jnp.int64), cfg.kv_blocks * cfg.block_size)
    prompt_ms, prompt_code = prompt_prefill_ms(prefill_table, cfg.isl, p.chunk, p.n_mixed, mixed_kv, mix.live,
                                               cached_prompt_tokens(cfg))
    return Lookups(kv_q=kv_q, kv_mid=kv_mid, round_ms=round_ms, round_code=round_code, prompt_ms=prompt_ms, prompt_code=prompt_code)


class Served(eqx.Module):
    """What one serving mode gives one configuration: its request rate, the round a decoding request sees,
    the mean pass, TTFT per class, the decode batch and the mode's own status."""

    rate: Float64[Array, ""]  # completed requests per ms (one serving unit)
    round_ms: Float64[Array, ""]
    pass_ms: Float64[Array, ""]
    ttft_w: Float64[Array, " W"]  # mean TTFT per class
    decode_batch: Float64[Array, ""]
    code: Int32[Array, ""]
    wait_ms: Float64[Array, ""]  # queueing for a place among the requests in flight
    prefill_queue_ms: Float64[Array, ""] = 0.0  # the mean TTFT the benchmark's prompt waves add (aggregated)
    ttft_points: Float64[Array, "W K"] | None = None  # TTFT points per class (percentiles; None: ttft_w alone)
    ttft_weights: Float64[Array, "W K"] | None = None  # their probabilities within the class
    decode_shift_w: Float64[Array, " W"] | float = 0.0  # decode time per class moved into TTFT (async scheduling, waves in step)


def serve_aggregated(cfg: ConfigInputs, mix: Mix, n: Int64[Array, ""], p: Passes, lk: Lookups) -> Served:
    """One engine, a closed loop of ``concurrency`` clients: the mean pass sets throughput; a decoding
    request sees passes weighted by its peers."""
    nf = n.astype(jnp.float64)
    mixed_bar = jnp.sum(mix.w * lk.prompt_ms) / jnp.maximum(p.c_bar, 1e-300)
    only_ms = jnp.where(p.prefill_bound, 0.0, lk.round_ms)  # decode-only passes never happen when prefill-bound
    pass_ms = p.frac_mixed * mixed_bar + (1.0 - p.frac_mixed) * only_ms
    dec_mixed = p.frac_mixed * p.n_mixed
    dec_only = (1.0 - p.frac_mixed) * nf
    round_ms = (dec_mixed * mixed_bar + dec_only * only_ms) / jnp.maximum(dec_mixed + dec_only, 1e-300)
    rate = 1.0 / (p.passes * pass_ms)
    wait = jnp.maximum(nf * p.passes - mix.r_bar - p.c_bar, 0.0) * pass_ms + (cfg.concurrency - n) / rate
    return Served(rate=rate, round_ms=round_ms, pass_ms=pass_ms, ttft_w=wait + lk.prompt_ms,
                  decode_batch=mix.r_bar / p.passes, code=jnp.where(p.prefill_bound, st.EXACT, lk.round_code), wait_ms=wait)


FIRST_WAVE_POINTS = 8
"""Points (quantiles of the client position) that stand for a closed loop's first wave in the percentiles."""


class PrefillQueue(eqx.Module):
    """TTFT of an aggregated closed-loop benchmark with its prompt waves: per class the mean over the
    benchmark's requests and a few TTFT points with their probabilities (first wave, waves in step, waves
    spread), for the percentiles."""

    ttft_w: Float64[Array, " W"]
    points_ms: Float64[Array, "W K"]
    point_weights: Float64[Array, "W K"]
    code: Int32[Array, ""]
    ahead_w: Float64[Array, " W"]  # the mean TTFT async scheduling adds per class (the passes scheduled before a send)
    in_step_ahead_w: Float64[Array, " W"]  # ... of it, to prompts in step with a saturated wave


def queue_pass_ms(t: RoundTable, cfg: ConfigInputs, mix: Mix, n: Int64[Array, ""], kv_mid: Float64[Array, ""]
                  ) -> tuple[Float64[Array, ""], Int64[Array, ""], Bool[Array, ""], Int32[Array, ""]]:
    """One pass of a prompt wave: the token budget left beside the decoders filled with prompt chunks (or
    all ``n`` prompts when they fit in it); its time, its prefill tokens and whether the wave saturates
    the budget."""
    step = cfg.nextn + 1
    cached = cached_prompt_tokens(cfg).astype(jnp.float64)  # read from the prefix cache, not computed
    isl_bar = jnp.sum(mix.w * (cfg.isl.astype(jnp.float64) - cached))  # computed prompt tokens
    cached_bar = jnp.sum(mix.w * cached)
    wave = n.astype(jnp.float64) * isl_bar
    budget0 = cfg.max_num_batched_tokens
    saturated = wave > budget0
    num_p = jnp.where(saturated, jnp.minimum(n, (budget0 // jnp.maximum(jnp.round(isl_bar), 1.0)).astype(jnp.int64) + 1), n)
    num_d = jnp.maximum(n - num_p, 0)
    # priced as the replay prices it (num_p prompts' chunks); where the profile has no such lookup (prefill measured
    # one prompt at a time), as one prompt of all the pass's tokens
    budget = jnp.maximum(budget0 - num_d * step, 1)
    toks = jnp.where(saturated, budget, jnp.round(wave).astype(jnp.int64))
    kv = jnp.round(jnp.where(saturated, isl_bar / 2.0, 0.0) + cached_bar).astype(jnp.int64)  # prefix carried over + prefix cache
    dkv = jnp.minimum(jnp.round(num_d.astype(jnp.float64) * kv_mid).astype(jnp.int64), cfg.kv_blocks * cfg.block_size)
    lat, code = scheduler_pass_latency_ms(t, num_p, toks, kv, num_d, dkv)
    lat1, code1 = scheduler_pass_latency_ms(t, jnp.ones_like(num_p), toks, kv, num_d, dkv)
    one = code >= st.FIRST_UNSUPPORTED
    return jnp.where(one, lat1, lat), budget, saturated, jnp.where(one, code1, code)


def prefill_queue(t: RoundTable, cfg: ConfigInputs, mix: Mix, n: Int64[Array, ""], kv_mid: Float64[Array, ""],
                  steady_ttft_w: Float64[Array, " W"], wait: Float64[Array, ""], pass_ms: Float64[Array, ""]) -> PrefillQueue:
    """TTFT per class under a closed-loop benchmark of ``n`` clients and ``cfg.prompts_per_client`` waves.

    All n prompts are sent at t = 0 and queue for the chunked-prefill budget B (beside the decoders): the
    client in position k gets its first token after ⌈(k·ISL̄ + ISL)/B⌉ full passes (the first wave). A
    client sends its next prompt when its previous request completes, so with equal lengths the later waves
    come back in step, in the passes the first wave was prefilled in, and keep every such pass full: a
    prompt then spans 1 + ISL/B full passes on average (⌊ISL/B⌋ + 1 or + 2), or, when all n prompts fit
    in one pass, that one pass. The leftover chunk of a wave moves one client out of step per wave (seen in
    the replay), and a client out of step sees the steady state's TTFT; with unequal lengths every later
    wave is spread. ``prompts_per_client`` 0: no waves (the steady state's TTFT).

    With async scheduling (``cfg.async_scheduling``) the pass after the running one is scheduled before a prompt
    sent during it or at its start (:func:`jaxsim.replay.engine._visible_ms`). A closed loop's later prompt is sent
    at a pass boundary, by its client's completion: it waits two passes more, two mean passes (``pass_ms``) out of
    step, two wave passes in step when a wave spans several passes (a wave that fits in one pass completes together
    and finds the engine idle); an open loop's prompt (``prompts_per_client`` 0: sent at random) waits one mean pass
    more on average; the first wave is sent to an idle engine, and so is a lone client's every prompt."""
    lat, budget, saturated, code = queue_pass_ms(t, cfg, mix, n, kv_mid)
    has_waves = cfg.prompts_per_client > 0
    lat = jnp.where(has_waves, lat, 0.0)  # no waves: the wave pass is never run (its lookup may lie outside support: no NaN leaks)
    nf = n.astype(jnp.float64)
    bf = budget.astype(jnp.float64)
    isl = (cfg.isl - cached_prompt_tokens(cfg)).astype(jnp.float64)  # the prompt tokens a wave computes
    isl_bar = jnp.sum(mix.w * isl)

    def first_passes(k):  # [W] passes until the client in position k has its first token
        return jnp.where(saturated, jnp.ceil((k * isl_bar + isl) / bf - 1e-9), 1.0)

    first_mean = jax.lax.fori_loop(0, n, lambda k, acc: acc + first_passes(k.astype(jnp.float64)), jnp.zeros_like(isl)) / nf
    qk = jnp.floor((jnp.arange(FIRST_WAVE_POINTS) + 0.5) / FIRST_WAVE_POINTS * nf)
    first_pts = jax.vmap(first_passes, out_axes=1)(qk)  # [W, K]
    x = isl / bf
    span_lo = jnp.where(saturated, jnp.floor(x) + 1.0, 1.0)
    frac = jnp.where(saturated, x - jnp.floor(x), 0.0)
    waves = jnp.maximum(cfg.prompts_per_client, 0.0)
    later = jnp.maximum(waves - 1.0, 0.0)  # later waves
    j = jnp.minimum(later, nf)  # later waves with a client still in step: Σ_{i<j} (1 − i/n)
    in_step = jnp.where(saturated, jnp.where(later > 0, (j - j * (j - 1.0) / (2.0 * nf)) / jnp.maximum(later, 1.0), 1.0), 1.0)
    in_step = jnp.where(cfg.equal_lengths & has_waves, in_step, 0.0)
    p_first = jnp.where(has_waves, 1.0 / jnp.maximum(waves, 1.0), 0.0)
    p_later = 1.0 - p_first
    sync_mean = lat * (span_lo + frac)
    ahead = jnp.asarray(cfg.async_scheduling, bool) & (n > 1)  # one client alone finds the engine idle at its send
    passes_ahead = jnp.where(has_waves, 2.0, 1.0)  # async: passes scheduled before a closed loop's send (an open loop's: 1 on average)
    in_step_ahead_ms = jnp.where(ahead & saturated, passes_ahead * lat, 0.0)  # ... wave passes
    spread_ms = steady_ttft_w + jnp.where(ahead, passes_ahead * pass_ms, 0.0)  # ... or mean passes
    ttft_w = p_first * (wait + lat * first_mean) + p_later * (in_step * (wait + sync_mean + in_step_ahead_ms) + (1.0 - in_step) * spread_ms)
    W = isl.shape[0]
    pts = jnp.concatenate([wait + lat * first_pts, (wait + lat * span_lo + in_step_ahead_ms)[:, None],
                           (wait + lat * (span_lo + 1.0) + in_step_ahead_ms)[:, None], spread_ms[:, None]], axis=1)
    wts = jnp.concatenate([
        jnp.full((W, FIRST_WAVE_POINTS), p_first / FIRST_WAVE_POINTS),
        (p_later * in_step * (1.0 - frac))[:, None], (p_later * in_step * frac)[:, None],
        jnp.full((W, 1), p_later * (1.0 - in_step)),
    ], axis=1)
    return PrefillQueue(ttft_w=ttft_w, points_ms=pts, point_weights=wts, code=jnp.where(has_waves, code, st.EXACT).astype(jnp.int32),
                        ahead_w=p_later * (in_step * in_step_ahead_ms + (1.0 - in_step) * (spread_ms - steady_ttft_w)),
                        in_step_ahead_w=jnp.broadcast_to(p_later * in_step * in_step_ahead_ms, isl.shape))


def serve_disaggregated(decode_table: RoundTable, cfg: ConfigInputs, disagg: Bool[Array, ""], mix: Mix,
                        n: Int64[Array, ""], lk: Lookups) -> Served:
    """x prefill and y decode workers, rate-matched: decode workers run at the batch the prefill pool can
    feed; the first token reaches the client with the decode worker's first round."""
    nf = n.astype(jnp.float64)
    x = cfg.prefill_workers.astype(jnp.float64)
    y = cfg.decode_workers.astype(jnp.float64)
    rate_decode = y * nf / ((mix.r_bar + 1.0) * lk.round_ms)  # + the round that delivers the first token
    rate_prefill = x / jnp.sum(mix.w * lk.prompt_ms)
    feed_bound = disagg & (rate_prefill < rate_decode)
    n_eff = jnp.where(feed_bound, jnp.clip(jnp.round(nf * rate_prefill / rate_decode), 1.0, nf), nf)
    round_eff, code_eff = jax.lax.cond(
        disagg, lambda: decode_round_ms_at(decode_table, n_eff.astype(jnp.int64), lk.kv_q, cfg.kv_blocks * cfg.block_size),
        lambda: (lk.round_ms, lk.round_code)
    )
    round_ms = jnp.where(feed_bound, round_eff, lk.round_ms)
    rate = jnp.minimum(rate_prefill, rate_decode)
    xfer_w = capacity.kv_transfer_ms(cfg.isl, cfg.kv_bytes_per_token, cfg.kv_transfer_bytes_per_s)
    wait = y * (cfg.concurrency - n_eff) / rate
    prompt_blocks = capacity.blocks_for(cfg.isl, jnp.maximum(cfg.block_size, 1))
    code = st.worse(
        jnp.where(feed_bound, code_eff, lk.round_code),
        jnp.where(jnp.any(mix.live & (prompt_blocks > cfg.prefill_kv_blocks)), PROMPT_EXCEEDS_PREFILL_POOL, st.EXACT),
        jnp,
    )
    # async scheduling: the decode worker (always running requests) admits an arriving KV one round later
    ahead_ms = jnp.where(jnp.asarray(cfg.async_scheduling, bool), round_ms, 0.0)
    return Served(rate=rate, round_ms=round_ms, pass_ms=round_ms, ttft_w=wait + lk.prompt_ms + xfer_w + round_ms + ahead_ms,
                  decode_batch=n_eff, code=code, wait_ms=wait)


def serving_gpus(cfg: ConfigInputs, disagg: Bool[Array, ""]) -> Float64[Array, ""]:
    """GPUs of one serving unit."""
    x = cfg.prefill_workers.astype(jnp.float64)
    y = cfg.decode_workers.astype(jnp.float64)
    return jnp.where(disagg, x * cfg.prefill_gpus + y * cfg.decode_gpus, cfg.decode_gpus).astype(jnp.float64)


def mix_percentiles(ttft_pts: Float64[Array, "W K"], pts_w: Float64[Array, "W K"], tpot_w: Float64[Array, " W"],
                    decode_w: Float64[Array, " W"], w: Float64[Array, " W"], generates: Bool[Array, " W"]) -> Float64[Array, "3 3"]:
    """``[metric, p]`` percentiles over the workload mix: each class's latency with its weight (TPOT over
    the classes that generate past their first token), its TTFT (and E2E) at the points ``ttft_pts`` with
    their probabilities ``pts_w`` within the class (a closed loop's prompt waves; otherwise one point, the
    mean with the queueing wait as its constant: docs/sweep.md)."""
    pw = (w[:, None] * pts_w).ravel()
    return jnp.stack([
        weighted_percentiles(ttft_pts.ravel(), pw),
        weighted_percentiles(tpot_w, w * generates),
        weighted_percentiles((ttft_pts + decode_w[:, None]).ravel(), pw),
    ])


def steady_state_metrics(cfg: ConfigInputs, disagg: Bool[Array, ""], sla: SLABounds, mix: Mix, n: Int64[Array, ""],
                         limit: Int32[Array, ""], p: Passes, served: Served, status: Int32[Array, ""],
                         kv_preemption: Bool[Array, ""]) -> Metrics:
    """Means and percentiles over the mix, throughput per GPU and the SLA judgment (NaN when unsupported)."""
    w = mix.w
    out_tok = jnp.sum(w * cfg.osl)
    gen = jnp.maximum(cfg.osl - 1, 0).astype(jnp.float64)
    # the serving overhead outside the forward passes (zero unless set): TTFT + fixed + per prompt token, each later token + per output token
    extra_w, later_w = added_latency_ms(cfg.overhead_fixed_ms, cfg.overhead_per_prompt_token_ms, cfg.overhead_per_output_token_ms,
                                        cfg.isl.astype(jnp.float64), gen)
    served = eqx.tree_at(lambda v: (v.ttft_w, v.ttft_points), served,
                         (served.ttft_w + extra_w, served.ttft_points + extra_w[:, None]))
    decode_w = jnp.maximum(mix.rounds_w * served.round_ms - served.decode_shift_w, 0.0) + later_w
    tpot_w = jnp.where(gen > 0, decode_w / jnp.maximum(gen, 1.0), 0.0)
    tpot = jnp.sum(_share(w, (gen > 0).astype(jnp.float64)) * tpot_w)
    ttft = jnp.sum(w * served.ttft_w)
    e2e = jnp.sum(w * (served.ttft_w + decode_w))
    rate_s = served.rate * 1e3
    tps_user = jnp.where(tpot > 0, 1e3 / tpot, jnp.inf)
    ok = status < st.FIRST_UNSUPPORTED

    def nan(v):
        return jnp.where(ok, v, jnp.nan)

    pts, pts_w = served.ttft_points, served.ttft_weights
    pct = mix_percentiles(pts, pts_w, tpot_w, decode_w, w, gen > 0)
    lat = jnp.concatenate([jnp.stack([ttft, tpot, e2e])[:, None], pct], axis=1)  # [metric, stat] as LATENCY_KEYS
    sla_ok = ok & (tps_user >= sla.min_tokens_per_s_per_user) & jnp.all(lat <= sla.latency_ms())
    return Metrics(
        status=status,
        limit=limit,
        concurrency=n,
        kv_preemption=kv_preemption & ok,
        decode_batch=nan(served.decode_batch),
        round_ms=nan(served.round_ms),
        pass_ms=nan(served.pass_ms),
        prefill_chunks=p.c_bar,
        prefill_queue_ms=nan(served.prefill_queue_ms),
        rounds=mix.r_bar,
        tokens_per_round=jnp.sum(w * gen) / jnp.maximum(mix.r_bar, 1e-300),
        request_rate_per_s=nan(rate_s),
        output_tokens_per_s_per_gpu=nan(rate_s * out_tok / serving_gpus(cfg, disagg)),
        tokens_per_s_per_user=nan(tps_user),
        **{k: nan(lat[i // len(LIMIT_STATS), i % len(LIMIT_STATS)]) for i, k in enumerate(LATENCY_KEYS)},
        sla_ok=sla_ok,
    )


def evaluate_config(
    prefill_table: RoundTable,
    decode_table: RoundTable,
    disaggregated: Bool[Array, ""],
    rounds_table: Float64[Array, "A M"],
    sla: SLABounds,
    cfg: ConfigInputs,
) -> Metrics:
    """Steady-state metrics of ONE configuration (the model is in docs/sweep.md).

    Aggregated (both tables are the engine's): one engine serves a closed loop of ``concurrency``
    clients and chunked prefill shares passes with decode rounds. ``disaggregated``: x prefill and
    y decode workers, rate-matched. ``rounds_table[a, m]`` is the expected number of rounds to emit
    m tokens under acceptance setting a (:func:`expected_rounds`).
    """
    ensure_x64()
    mix = workload_mix(cfg, rounds_table)
    n, limit, capacity_code, kv_preemption = effective_concurrency(cfg, mix.rounds_w, mix.w, mix.live)
    passes = pass_structure(cfg, disaggregated, mix, n)
    lookups = price_lookups(prefill_table, decode_table, cfg, mix, n, passes)
    aggregated = serve_aggregated(cfg, mix, n, passes, lookups)
    queue = prefill_queue(prefill_table, cfg, mix, n, lookups.kv_mid, aggregated.ttft_w, aggregated.wait_ms, aggregated.pass_ms)
    # async scheduling with waves in step: a wave fills the budget and sets every client's cycle, so the passes a prompt
    # waits ahead of its admission come out of its decode (the replay's E2E stays: docs/benchmark-loads.md)
    shift_w = queue.in_step_ahead_w
    aggregated = eqx.tree_at(
        lambda s: (s.ttft_w, s.code, s.prefill_queue_ms, s.ttft_points, s.ttft_weights, s.decode_shift_w),
        aggregated,
        (queue.ttft_w, st.worse(aggregated.code, queue.code, jnp), jnp.sum(mix.w * (queue.ttft_w - queue.ahead_w - aggregated.ttft_w)),
         queue.points_ms, queue.point_weights, shift_w),
        is_leaf=lambda x: x is None,
    )
    disagg = serve_disaggregated(decode_table, cfg, disaggregated, mix, n, lookups)
    one = (jnp.arange(queue.points_ms.shape[1]) == 0).astype(jnp.float64)
    disagg = eqx.tree_at(lambda s: (s.prefill_queue_ms, s.ttft_points, s.ttft_weights, s.decode_shift_w), disagg,
                         (jnp.float64(0.0), jnp.broadcast_to(disagg.ttft_w[:, None], queue.points_ms.shape),
                          jnp.broadcast_to(one, queue.points_ms.shape), jnp.zeros_like(shift_w)), is_leaf=lambda x: x is None)
    served = jax.tree.map(lambda d, a: jnp.where(disaggregated, d, a), disagg, aggregated)
    status = st.worse(st.worse(capacity_code, lookups.prompt_code, jnp), served.code, jnp)
    return steady_state_metrics(cfg, disaggregated, sla, mix, n, limit, passes, served, status, kv_preemption)


def evaluate_chunk(
    stack: RoundTable,
    prefill_index: Int64[Array, ""],
    decode_index: Int64[Array, ""],
    disaggregated: Bool[Array, ""],
    rounds_table: Float64[Array, "A M"],
    sla: SLABounds,
    cfgs: ConfigInputs,
) -> Metrics:
    """:func:`evaluate_config` over a chunk of configurations that share their tables and serving mode."""
    ensure_x64()
    pt = take_table(stack, prefill_index)
    dt = take_table(stack, decode_index)
    axes = jax.tree.map(lambda x: 0 if jnp.ndim(x) >= 1 else None, cfgs)  # a field left at its scalar default: shared
    fn = jax.vmap(evaluate_config, in_axes=(None, None, None, None, None, axes))
    return fn(pt, dt, disaggregated, rounds_table, sla, cfgs)
