"""The replay engine: one vLLM-style worker as a JAX state machine (one ``lax.while_loop`` step per
scheduler pass, fixed-capacity arrays, no Python per-pass loop).

Semantics (reverse-engineered from the reference's replay goldens, matched bit for bit):

* Requests arrive into an FCFS waiting queue; requests preempted for recompute go back to its front.
* A pass first walks the running list in order. A decode request uses ``min(K+1, max_model_len -
  length)`` tokens of the ``max_num_batched_tokens`` budget (vLLM's ``max_model_len - 1 - computed``
  cap; 1 when autoregressive) and allocates KV for its dangling token; a request still prefilling
  (or recomputing) takes ``min(remaining, budget)`` tokens (chunked prefill). A preempted request is
  recomputing until it emits again: a recompute that stopped one token short finishes with one
  token, it is not a decode. When the KV pool cannot supply a request's blocks, the tail of the running list is
  preempted (recompute: its KV is dropped) until it fits.
* Without a preemption in the pass, waiting requests are admitted FCFS while ``max_num_seqs``, the
  budget and the free blocks (the whole known sequence must fit) allow.
* Speculative passes then reserve, for every ready request, the blocks to grow by its burst
  (``min(scheduled tokens, remaining)`` for a decode, 1 for a completed prefill), preempting the
  running tail until the reservation fits.
* Pass time = prefill lookup (requests computing prompt tokens: Σ new prompt tokens, Σ prompt tokens
  already cached) + decode lookup (ready requests that have emitted a token: Σ past KV), each rounded
  to whole nanoseconds. A fresh prefill emits the first token at the pass end; a decode round emits
  a burst (chained Bernoulli trials, capped by the remaining output and by the tokens the decode
  was scheduled: a decode given fewer than K+1 budget tokens emits at most that many); a completed
  recompute emits one token. All tokens of a pass are stamped at its end.
* A pass whose lookup is outside measured support stops that replay with the lookup's status code.
"""

from __future__ import annotations

from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float64, Int32, Int64

from jaxsim._jax import ensure_x64, jit_x64
from jaxsim.kernels import status as st
from jaxsim.acceptance import MAX_DRAFT_TOKENS
from jaxsim.kernels.acceptance import sample_burst
from jaxsim.kernels.buckets import pow2_bucket
from jaxsim.kernels.capacity import blocks_for
from jaxsim.kernels.rounds import RoundTable, pass_lookups

# replay status codes (registered in jaxsim.kernels.status, 64–79); a replay stopped by a lookup outside
# measured support keeps the lookup's code (16–31)
RUNNING = st.RUNNING
COMPLETED = st.COMPLETED
STALLED = st.STALLED
PASS_LIMIT = st.PASS_LIMIT
SLOTS_FULL = st.SLOTS_FULL

# per-request terminal codes
UNFINISHED = 0
DONE = 1
REJECTED = 2

TERMINAL_NAMES = {UNFINISHED: "unfinished", DONE: "completed", REJECTED: "rejected"}

TIMELINE_FIELDS = (
    "start_ms", "end_ms", "running", "waiting", "prefill_requests", "prefill_tokens", "prefill_kv_tokens",
    "decode_requests", "decode_kv_tokens", "kv_blocks_used", "preemptions",
)


def status_name(code: int) -> str:
    """The replay status's name (:mod:`jaxsim.kernels.status`); a lookup refusal reads
    ``stopped: pass lookup <the lookup status's name>``."""
    code = int(code)
    if st.FIRST_UNSUPPORTED <= code < st.FAMILY_RANGES["lookup"].stop and code in st.NAMES:
        return f"stopped: pass lookup {st.name(code)}"
    return st.name(code)


class Requests(eqx.Module):
    """A trace as padded arrays, sorted by arrival (ties keep trace order).

    ``materialized`` marks requests whose prompt KV is already present on arrival (the decode worker
    of a disaggregated deployment): they start decoding without a prefill lookup.
    """

    arrival_ms: Float64[Array, " N"]
    input_tokens: Int64[Array, " N"]
    output_tokens: Int64[Array, " N"]
    valid: Bool[Array, " N"]
    materialized: Bool[Array, " N"]

    @property
    def size(self) -> int:
        return int(self.arrival_ms.shape[-1])


class EngineParams(eqx.Module):
    """One worker configuration: its compiled round table plus scheduler and KV settings (all traced,
    so configurations of the same bucket shapes share one compilation and vmap)."""

    table: RoundTable
    max_num_batched_tokens: Int64[Array, ""]
    max_num_seqs: Int64[Array, ""]
    block_size: Int64[Array, ""]
    num_gpu_blocks: Int64[Array, ""]
    num_draft_tokens: Int64[Array, ""]
    accept_rates: Float64[Array, " 5"]
    max_model_len: Int64[Array, ""]
    max_passes: Int64[Array, ""]
    state_blocks: Int64[Array, ""]  # fixed blocks every request holds besides its tokens' (grouped caches; 0 when linear)


class ReplayResult(eqx.Module):
    """Per-request outcome (trace order) and per-replay status. Times are absolute milliseconds."""

    first_token_ms: Float64[Array, " N"]
    second_token_ms: Float64[Array, " N"]
    last_token_ms: Float64[Array, " N"]
    output_tokens: Int64[Array, " N"]
    decode_rounds: Int32[Array, " N"]
    preemptions: Int32[Array, " N"]
    admissions: Int32[Array, " N"]
    token_gap_sq_ms2: Float64[Array, " N"]
    terminal: Int32[Array, " N"]
    status: Int32[Array, ""]
    num_passes: Int64[Array, ""]
    end_ms: Float64[Array, ""]
    failed_query: Int64[Array, " 5"]
    timeline: Float64[Array, "T F"]


class _State(eqx.Module):
    now: Float64[Array, ""]
    passes: Int64[Array, ""]
    status: Int32[Array, ""]
    done_count: Int64[Array, ""]
    n_run: Int64[Array, ""]
    n_stk: Int64[Array, ""]
    admit_ptr: Int64[Array, ""]
    run: Int64[Array, " S"]
    stk: Int64[Array, " S"]
    ri: Int64[Array, "N1 9"]  # per request: _PROMPT.._FLAGS (row N is the padding sentinel)
    rf: Float64[Array, "N1 4"]  # per request: _FIRST, _SECOND, _LAST, _GAPSQ
    failed: Int64[Array, " 5"]
    timeline: Float64[Array, "T F"]


# columns of the packed per-request state (one gather / one scatter per pass instead of one per field)
_PROMPT, _OUT, _GEN, _COMP, _ALLOC, _ROUNDS, _PREEMPT, _ADMITS, _FLAGS = range(9)
_FIRST, _SECOND, _LAST, _GAPSQ = range(4)
_MAT, _DONE, _RECOMP = 1, 2, 4  # flag bits (_RECOMP: preempted, recomputing until it emits again)




def _cumsum_excl(x):
    return jnp.cumsum(x) - x


def _pass_duration_ms(latency_ms: Float64[Array, ""], zero: Int64[Array, ""]) -> Float64[Array, ""]:
    """A lookup latency as the reference's engine clock sees it: rounded to whole nanoseconds
    (``Duration::from_secs_f64``) and read back as ``secs + nanos / 1e9`` seconds.

    ``zero`` is a runtime 0 that keeps the constants opaque: otherwise XLA folds the divisions into
    other constants or reciprocals and the result is no longer the reference's float arithmetic."""
    ms_per_s = _opaque(jnp.float64(1000.0), zero)
    ns_per_s = _opaque(jnp.float64(1e9), zero)
    ns = jnp.round(_opaque(latency_ms / ms_per_s, zero) * 1e9).astype(jnp.int64)
    secs = ns // 1_000_000_000
    nanos = ns - secs * 1_000_000_000
    frac = _opaque(nanos.astype(jnp.float64) / ns_per_s, zero)
    return _opaque(secs.astype(jnp.float64) + frac, zero) * ms_per_s


def _opaque(x, zero):
    """``x`` unchanged, through an integer op the compiler cannot see through (``zero`` is a runtime
    0), so a product is never fused with the sum it feeds: results then match float64 arithmetic
    step by step, batched or not."""
    bits = jax.lax.bitcast_convert_type(x, jnp.int64) + zero
    return jax.lax.bitcast_convert_type(bits, jnp.float64)


def _materialize(x):
    """``x`` unchanged, computed once: XLA:CPU fuses a chain of cheap scalar ops into every element of
    each wide consumer (``optimization_barrier`` is dropped); a scan's first element is not fused."""
    return jnp.cumsum(jnp.stack([x, jnp.zeros_like(x)]), axis=0)[0]


def _push_stack(stk, n_stk, run_req, lo, hi, S):
    """Preempt running slots [lo, hi): LIFO, so slot ``lo`` ends on top of the stack (its end)."""
    slot = jnp.arange(S)
    moved = (slot >= lo) & (slot < hi)
    pos = jnp.where(moved, n_stk + (hi - 1 - slot), S)
    return stk.at[pos].set(run_req, mode="drop"), n_stk + (hi - lo)


def _active(p: EngineParams, s: _State) -> Bool[Array, ""]:
    return (s.status == RUNNING) & (s.passes < p.max_passes)


def _any(pred: Bool[Array, ""], axis_name: str | None) -> Bool[Array, ""]:
    """``pred`` of any replay of the batch (the vmapped axis ``axis_name``; None: this replay alone): a
    batch-wide predicate lets ``lax.cond`` skip work no replay of the batch needs in this pass."""
    return pred if axis_name is None else jax.lax.psum(pred.astype(jnp.int32), axis_name) > 0


def _engine_pass(
    p: EngineParams, arr_sorted, n_acc, key, stochastic: bool, s: _State, axis_name: str | None = None
) -> _State:
    """One scheduler pass; a no-op once the replay is inactive (so a batch of replays can share one
    loop without selecting whole states: the per-request matrices are only touched by scatters).
    ``axis_name``: the vmapped batch axis, when the pass runs vmapped over replays."""
    S = s.run.shape[0]
    N = s.ri.shape[0] - 1
    active = _active(p, s)
    slot = jnp.arange(S)
    B, NB, bs, K = p.max_num_batched_tokens, p.num_gpu_blocks, p.block_size, p.num_draft_tokens
    L, SB = p.max_model_len, p.state_blocks

    # arrivals (sorted; S trailing +inf pads): only the next S are looked at, never the whole trace.
    # An idle engine jumps to the next arrival.
    nxt = arr_sorted[s.admit_ptr]
    idle = (s.n_run == 0) & (s.n_stk == 0) & (nxt > s.now)
    now = jnp.where(idle & (s.admit_ptr < n_acc), nxt, s.now)

    # ---- running list, in order ----------------------------------------------------------------
    in_run = slot < s.n_run
    r = jnp.where(in_run, s.run, N)
    row_r = s.ri[r]
    prompt_r, gen_r, comp_r = row_r[:, _PROMPT], row_r[:, _GEN], row_r[:, _COMP]
    al_r = jnp.where(in_run, row_r[:, _ALLOC], 0)
    len_r = prompt_r + gen_r
    # a recompute that stopped one token short finishes with that token: it is not a decode
    is_dec = in_run & (gen_r > 0) & (comp_r == len_r - 1) & ((row_r[:, _FLAGS] & _RECOMP) == 0)
    # a decode never schedules past the context limit (vLLM: max_model_len - 1 - computed tokens)
    need_tok = jnp.where(in_run, jnp.where(is_dec, jnp.minimum(K + 1, L - len_r), len_r - comp_r), 0)
    bud_before = jnp.maximum(B - _cumsum_excl(need_tok), 0)
    n_tok = jnp.minimum(need_tok, bud_before)
    live = in_run & (bud_before > 0)
    target = jnp.where(is_dec, comp_r + 1, comp_r + n_tok)
    need_blk = jnp.where(live, jnp.maximum(blocks_for(target, bs) + SB - al_r, 0), 0)

    def search():
        # keeping slots [0, t) lets slot i allocate iff Σ_{j<t} alloc_j + Σ_{j<=i} need_j <= pool
        cum_al = jnp.concatenate([jnp.zeros(1, jnp.int64), jnp.cumsum(al_r)])
        cum_al = jnp.where(jnp.arange(S + 1) <= s.n_run, cum_al, jnp.iinfo(jnp.int64).max)
        room = NB - jnp.cumsum(need_blk)
        t = jnp.searchsorted(cum_al, room, side="right", method="compare_all" if S <= 32 else "scan").astype(jnp.int64) - 1
        t = jnp.where(live, jnp.maximum(t, 0), s.n_run)
        return t, jax.lax.cummin(t)

    # every live slot allocates without preempting unless the pool is short by the end of the list
    # (live slots are a prefix; need_blk is 0 after them). Most passes of the whole batch are not:
    # the search then runs in none of them.
    short = jnp.any(live) & (jnp.sum(al_r) + jnp.sum(need_blk) > NB)
    t_fit, keep_upto = jax.lax.cond(_any(short, axis_name), search, lambda: (jnp.full((S,), s.n_run), jnp.full((S,), s.n_run)))
    keep_before = jnp.concatenate([s.n_run[None], keep_upto[:-1]])
    sched_run = live & (slot < keep_before) & (t_fit > slot)
    cut = jnp.minimum(keep_upto[-1], s.n_run)
    preempted_any = cut < s.n_run
    pre1 = in_run & (slot >= cut)
    stk1, n_stk1 = jax.lax.cond(
        _any(preempted_any, axis_name), lambda: _push_stack(s.stk, s.n_stk, r, cut, s.n_run, S), lambda: (s.stk, s.n_stk)
    )
    n_tok = jnp.where(sched_run, n_tok, 0)
    al_r = jnp.where(sched_run, al_r + need_blk, al_r)

    # ---- waiting queue: preempted stack (top first), then fresh arrivals ------------------------
    from_stk = slot < n_stk1
    c = jnp.where(from_stk, stk1[jnp.clip(n_stk1 - 1 - slot, 0, S - 1)], s.admit_ptr + (slot - n_stk1))
    c_ok = from_stk | (arr_sorted[jnp.clip(c, 0, N + S - 1)] <= now)
    c = jnp.where(c_ok, c, N)
    row_c = s.ri[c]
    c_mat = c_ok & ((row_c[:, _FLAGS] & _MAT) > 0)
    c_len = row_c[:, _PROMPT] + row_c[:, _GEN]
    c_need = jnp.where(c_mat, jnp.minimum(K + 1, L - c_len), c_len)
    c_bud = jnp.maximum(B - jnp.sum(n_tok) - _cumsum_excl(c_need), 0)
    c_n = jnp.minimum(c_need, c_bud)
    c_blk = blocks_for(jnp.where(c_mat, c_len, c_n), bs) + SB
    free0 = NB - jnp.sum(jnp.where(slot < cut, al_r, 0))
    c_fit = blocks_for(c_len, bs) + SB <= free0 - _cumsum_excl(c_blk)
    ok = c_ok & c_fit & (cut + slot < jnp.minimum(p.max_num_seqs, S)) & (c_n > 0) & ~preempted_any
    adm = jnp.cumprod(ok.astype(jnp.int32)) > 0
    n_adm = jnp.sum(adm)
    n_from_stk = jnp.minimum(n_adm, n_stk1)
    n_stk2 = n_stk1 - n_from_stk
    admit_ptr = s.admit_ptr + (n_adm - n_from_stk)
    # S slots below max_num_seqs, all taken, and a request still waiting: a larger capacity might have
    # admitted it. The pass is not applied; the replay continues at a larger S (replay.batch).
    full = (cut + n_adm >= S) & (S < p.max_num_seqs) & ~preempted_any & ((n_stk2 > 0) | (arr_sorted[admit_ptr] <= now))
    commit = active & ~full

    # ---- the scheduled list: kept running slots, then admissions --------------------------------
    k = jnp.clip(slot - cut, 0, S - 1)
    is_new = (slot >= cut) & (slot < cut + n_adm)
    n_run2 = cut + n_adm
    in2 = slot < n_run2
    req2 = jnp.where(slot < cut, r, jnp.where(is_new, c[k], N))
    sched2 = jnp.where(slot < cut, sched_run, is_new)
    dec2 = jnp.where(slot < cut, is_dec & sched_run, is_new & c_mat[k])
    row2 = jnp.where((slot < cut)[:, None], row_r, row_c[k])
    prompt2, gen2, out2 = row2[:, _PROMPT], row2[:, _GEN], row2[:, _OUT]
    len2 = prompt2 + gen2
    comp_before = jnp.where(slot < cut, comp_r, jnp.where(c_mat[k], len2 - 1, 0))
    n_comp = jnp.where(slot < cut, jnp.where(is_dec, 0, n_tok), jnp.where(c_mat[k], 0, c_n[k]))
    n_comp = jnp.where(sched2, n_comp, 0)
    n_sched2 = jnp.where(sched2, jnp.where(slot < cut, n_tok, c_n[k]), 0)  # budget tokens of each slot
    alloc2 = jnp.where(slot < cut, al_r, jnp.where(is_new, c_blk[k], 0))

    pb = jnp.minimum(comp_before, prompt2)
    ptok_i = jnp.where(sched2 & ~dec2, jnp.minimum(comp_before + n_comp, prompt2) - pb, 0)
    has_p = ptok_i > 0
    np_ = jnp.sum(has_p).astype(jnp.int64)
    ptok = jnp.sum(ptok_i)
    pkv = jnp.sum(jnp.where(has_p, pb, 0))
    comp2 = comp_before + n_comp

    # ---- speculative reservation for the round's bursts -----------------------------------------
    ready = in2 & sched2 & (gen2 < out2) & (dec2 | (comp2 == len2))

    def reserve():
        rb = jnp.where(dec2, jnp.minimum(n_sched2, out2 - gen2), 1)  # a decode's burst: at most its scheduled tokens
        req_blk = jnp.where(ready, blocks_for(len2 + rb, bs) - blocks_for(len2, bs), 0)
        cr = jnp.concatenate([jnp.zeros(1, jnp.int64), jnp.cumsum(req_blk)])
        ca = jnp.concatenate([jnp.zeros(1, jnp.int64), jnp.cumsum(jnp.where(in2, alloc2, 0))])
        fits = (cr + ca <= NB) & (jnp.arange(S + 1) <= n_run2)
        return jnp.where(K > 0, jnp.sum(fits) - 1, n_run2)

    # autoregressive batches (no replay with K > 0) reserve nothing
    t_star = jax.lax.cond(_any(K > 0, axis_name), reserve, lambda: n_run2)
    pre2 = in2 & (slot >= t_star)
    stk3, n_stk3 = jax.lax.cond(
        _any(t_star < n_run2, axis_name), lambda: _push_stack(stk1, n_stk2, req2, t_star, n_run2, S), lambda: (stk1, n_stk2)
    )
    ready = ready & (slot < t_star)

    dready = ready & (gen2 > 0)
    nd = jnp.sum(dready).astype(jnp.int64)
    dkv = jnp.sum(jnp.where(dready, len2 - 1, 0))

    has_p, has_d, lp, ld, code = pass_lookups(p.table, np_, ptok, pkv, nd, dkv)
    code = _materialize(code)  # read by every per-slot update: computed once, not once per element
    bad = code >= st.FIRST_UNSUPPORTED
    # the reference's clock adds two rounded durations: no fused multiply-add may form here
    zero = jnp.minimum(s.passes, 0)
    p_ms = jnp.where(has_p & ~bad, _pass_duration_ms(jnp.where(bad, 0.0, lp), zero), 0.0)
    d_ms = jnp.where(has_d & ~bad, _pass_duration_ms(jnp.where(bad, 0.0, ld), zero), 0.0)
    p_ms, d_ms = _opaque(p_ms, zero), _opaque(d_ms, zero)
    end = (now + p_ms) + d_ms
    end = _materialize(end)  # read by every per-slot and per-request update


    # ---- emission: all tokens of the pass are stamped at its end --------------------------------
    ready = ready & ~bad
    firsts = ready & (gen2 == 0)
    if stochastic:
        pass_key = jax.random.fold_in(key, s.passes)
        keys = jax.vmap(lambda i: jax.random.fold_in(pass_key, i))(req2)
        sampled = jax.vmap(sample_burst, in_axes=(0, None, None, 0))(keys, p.accept_rates, K, out2 - gen2)
    else:  # every rate is 0 or 1: the chained trials are certain
        certain = (p.accept_rates >= 1.0) & (jnp.arange(MAX_DRAFT_TOKENS) < K)
        sampled = jnp.minimum(1 + jnp.sum(jnp.cumprod(certain.astype(jnp.int64))), out2 - gen2)
    # a decode emits at most the tokens it was scheduled (fewer than K+1 when the budget ran short)
    burst = jnp.where(firsts | (comp2 == len2), 1, jnp.minimum(sampled, n_sched2))
    gen3 = gen2 + jnp.where(ready, burst, 0)
    comp3 = jnp.where(ready, prompt2 + gen3 - 1, comp2)
    alloc3 = jnp.where(ready & (K > 0), jnp.maximum(alloc2, blocks_for(prompt2 + gen3, bs) + SB), alloc2)
    done = ready & (gen3 >= out2)
    alloc3 = jnp.where(done, 0, alloc3)
    rf2 = s.rf[req2]
    prev_first, prev_second, prev_last = rf2[:, _FIRST], rf2[:, _SECOND], rf2[:, _LAST]
    seen = ~jnp.isnan(prev_first)
    gap = _opaque(jnp.where(ready & seen, end - prev_last, 0.0), zero)
    first3 = jnp.where(ready & ~seen, end, prev_first)
    second3 = jnp.where(ready & seen & jnp.isnan(prev_second), end, prev_second)
    last3 = jnp.where(ready, end, prev_last)

    # slots [0, n_run3) stay scheduled; preempted slots lose their KV and are recomputed later
    pre = jnp.concatenate([pre1, pre2])
    live2 = in2 & ~pre2
    # new rows: scheduled slots (kept or preempted by the reservation), then running-loop preemptions
    new2 = jnp.stack([
        prompt2, out2, gen3, jnp.where(pre2, 0, comp3), jnp.where(pre2, 0, alloc3), row2[:, _ROUNDS] + dready,
        row2[:, _PREEMPT] + pre2, row2[:, _ADMITS] + is_new,
        (jnp.where(is_new | pre2, row2[:, _FLAGS] & ~_MAT, row2[:, _FLAGS]) & jnp.where(ready, ~_RECOMP, -1))
        | jnp.where(done, _DONE, 0) | jnp.where(pre2, _RECOMP, 0),
    ], axis=1)
    new1 = row_r.at[:, _COMP].set(0).at[:, _ALLOC].set(0).at[:, _PREEMPT].add(1).at[:, _FLAGS].set((row_r[:, _FLAGS] & ~_MAT) | _RECOMP)
    out_of_range = N + 1
    idx_i = jnp.concatenate([jnp.where(in2 & commit, req2, out_of_range), jnp.where(pre1 & commit, r, out_of_range)])
    ri = s.ri.at[idx_i].set(jnp.concatenate([new2, new1]), mode="drop")
    gap_sq = rf2[:, _GAPSQ] + _opaque(gap * gap, zero)
    rf = s.rf.at[jnp.where(live2 & commit, req2, out_of_range)].set(jnp.stack([first3, second3, last3, gap_sq], axis=1), mode="drop")

    keep = live2 & ~done
    pos = jnp.where(keep, jnp.cumsum(keep) - 1, S)
    run = jnp.full((S,), N, jnp.int64).at[pos].set(req2, mode="drop")
    n_run = jnp.sum(keep).astype(jnp.int64)

    # the head of the running list preempting itself can never fit (its needs only grow): stop
    head_lost = ((s.n_run > 0) & (cut == 0)) | ((n_run2 > 0) & (t_star == 0))
    progress = (jnp.sum(pre) > 0) | (n_adm > 0) | jnp.any(sched2) | jnp.any(ready)
    stalled = head_lost | ~progress
    status = jnp.where(bad, code, jnp.where(stalled, STALLED, RUNNING)).astype(jnp.int32)
    failed = jnp.where(bad, jnp.stack([np_, ptok, pkv, nd, dkv]), s.failed)
    done_count = s.done_count + jnp.sum(done)
    status = jnp.where((status == RUNNING) & (done_count >= n_acc), COMPLETED, status).astype(jnp.int32)

    timeline = s.timeline
    if timeline.shape[0] > 0:
        row = jnp.stack([
            now, end, n_run.astype(jnp.float64), (n_stk3 + jnp.sum(arr_sorted <= now) - admit_ptr).astype(jnp.float64),
            np_.astype(jnp.float64), ptok.astype(jnp.float64), pkv.astype(jnp.float64), nd.astype(jnp.float64),
            dkv.astype(jnp.float64), jnp.sum(jnp.where(keep, alloc3, 0)).astype(jnp.float64),
            jnp.sum(pre).astype(jnp.float64),
        ])
        timeline = timeline.at[jnp.where(commit, s.passes, timeline.shape[0])].set(row, mode="drop")

    small = dict(
        now=jnp.where(bad, now, end), passes=s.passes + 1, status=status, done_count=done_count,
        n_run=n_run, n_stk=n_stk3, admit_ptr=admit_ptr, run=run, stk=stk3, failed=failed,
    )
    small = {k: jnp.where(commit, v, getattr(s, k)) for k, v in small.items()}
    small["status"] = jnp.where(active & full, SLOTS_FULL, small["status"]).astype(jnp.int32)
    return _State(ri=ri, rf=rf, timeline=timeline, **small)


def accepted_mask(p: EngineParams, rq: Requests) -> Bool[Array, " N"]:
    """Requests the worker can ever run: a prompt shorter than max_model_len whose blocks fit the pool
    (the reference rejects the others when they reach the queue head)."""
    return rq.valid & (rq.input_tokens < p.max_model_len) & (blocks_for(rq.input_tokens, p.block_size) + p.state_blocks <= p.num_gpu_blocks)


def _prepare(p: EngineParams, rq: Requests, slots: int, timeline_len: int):
    """Initial state plus the per-replay constants (accepted requests first, in arrival order)."""
    N = rq.arrival_ms.shape[0]
    acc = accepted_mask(p, rq)
    order = jnp.argsort(~acc, stable=True)
    n_acc = jnp.sum(acc).astype(jnp.int64)
    S = int(slots)
    arr_sorted = jnp.concatenate([jnp.where(acc[order], rq.arrival_ms[order], jnp.inf), jnp.full((S,), jnp.inf)])
    pad1 = lambda a, v: jnp.concatenate([a, jnp.full((1,), v, a.dtype)])  # noqa: E731
    prompt = pad1(rq.input_tokens[order].astype(jnp.int64), 0)
    room = jnp.maximum(p.max_model_len - prompt, 0)
    out = jnp.minimum(pad1(rq.output_tokens[order].astype(jnp.int64), 0), room)
    mat = pad1(rq.materialized[order] & acc[order], False)
    z64 = jnp.zeros((N + 1,), jnp.int64)
    ri = jnp.stack([prompt, out, jnp.where(mat, 1, z64), jnp.where(mat, prompt, z64), z64, z64, z64, z64,
                    jnp.where(mat, _MAT, 0).astype(jnp.int64)], axis=1)
    rf = jnp.concatenate([jnp.full((N + 1, 3), jnp.nan), jnp.zeros((N + 1, 1))], axis=1)
    s0 = _State(
        now=jnp.asarray(0.0), passes=jnp.asarray(0, jnp.int64),
        status=jnp.where(n_acc == 0, COMPLETED, RUNNING).astype(jnp.int32),
        done_count=jnp.asarray(0, jnp.int64), n_run=jnp.asarray(0, jnp.int64), n_stk=jnp.asarray(0, jnp.int64),
        admit_ptr=jnp.asarray(0, jnp.int64), run=jnp.full((S,), N, jnp.int64), stk=jnp.full((S,), N, jnp.int64),
        ri=ri, rf=rf, failed=jnp.zeros((5,), jnp.int64), timeline=jnp.full((int(timeline_len), len(TIMELINE_FIELDS)), jnp.nan),
    )
    return s0, (arr_sorted, n_acc, order, acc)


def _result(rq: Requests, s: _State, aux) -> ReplayResult:
    N = rq.arrival_ms.shape[0]
    _, _, order, acc = aux
    status = jnp.where(s.status == RUNNING, PASS_LIMIT, s.status).astype(jnp.int32)
    inv = jnp.zeros((N,), jnp.int64).at[order].set(jnp.arange(N))
    terminal = jnp.where((s.ri[:N, _FLAGS] & _DONE) > 0, DONE, UNFINISHED)
    terminal = jnp.where(acc[order], terminal, REJECTED)[inv]
    terminal = jnp.where(rq.valid, terminal, REJECTED).astype(jnp.int32)
    gi = lambda c: s.ri[:N, c][inv]  # noqa: E731
    gf = lambda c: s.rf[:N, c][inv]  # noqa: E731
    return ReplayResult(
        first_token_ms=gf(_FIRST), second_token_ms=gf(_SECOND), last_token_ms=gf(_LAST),
        output_tokens=gi(_GEN), decode_rounds=gi(_ROUNDS).astype(jnp.int32), preemptions=gi(_PREEMPT).astype(jnp.int32),
        admissions=gi(_ADMITS).astype(jnp.int32), token_gap_sq_ms2=gf(_GAPSQ), terminal=terminal, status=status,
        num_passes=s.passes, end_ms=jnp.nanmax(jnp.where(terminal == DONE, gf(_LAST), jnp.nan), initial=0.0),
        failed_query=s.failed, timeline=s.timeline,
    )


def replay(
    p: EngineParams, rq: Requests, key: jax.Array, *, slots: int, stochastic: bool = True, timeline_len: int = 0
) -> ReplayResult:
    """Replay one trace on one worker configuration (pure; see :func:`replay_stack` for many at once).

    Static: ``slots`` running-list slots (at least ``max_num_seqs``: fewer can end the replay with
    ``SLOTS_FULL``, which :mod:`jaxsim.replay.batch` continues at a larger capacity); ``stochastic=False`` is allowed when every acceptance
    rate is 0 or 1 (bursts are then certain and no random numbers are drawn); ``timeline_len`` keeps
    that many passes of per-pass records (0: none).
    """
    ensure_x64()
    s0, aux = _prepare(p, rq, slots, timeline_len)
    body = partial(_engine_pass, p, aux[0], aux[1], key, bool(stochastic))
    s = jax.lax.while_loop(partial(_active, p), body, s0)
    return _result(rq, s, aux)


def param_axes(p: EngineParams, shared_table: bool):
    """``vmap`` axes of stacked parameters: every leaf along axis 0, or the table unmapped (one table
    for the whole stack: no copy per item)."""
    axes = jax.tree.map(lambda _: 0, p)
    if shared_table:
        axes = eqx.tree_at(lambda q: q.table, axes, jax.tree.map(lambda _: None, p.table))
    return axes


def start_stack(p: EngineParams, rq: Requests, *, slots: int, timeline_len: int = 0, shared_table: bool = False):
    """Initial states and per-replay constants of a stack of items at ``slots`` running-list slots."""
    ensure_x64()
    ax = param_axes(p, shared_table)
    return jax.vmap(lambda pp, r: _prepare(pp, r, slots, timeline_len), in_axes=(ax, 0))(p, rq)


_BATCH = "replays"


def advance_stack(
    p: EngineParams, arr_sorted: Float64[Array, "I M"], n_acc: Int64[Array, " I"], keys: jax.Array, s: _State, *,
    stochastic: bool = True, shared_table: bool = False,
) -> _State:
    """Run a stack of replays until none is active (finished, stopped, or out of slots: ``SLOTS_FULL``).
    One loop runs while any item is active, over the vmapped pass (a vmapped ``while_loop`` would select
    every item's whole state at every pass)."""
    ensure_x64()
    ax = param_axes(p, shared_table)
    step = jax.vmap(
        lambda pp, a0, a1, k, s: _engine_pass(pp, a0, a1, k, bool(stochastic), s, _BATCH), in_axes=(ax, 0, 0, 0, 0), axis_name=_BATCH
    )

    def cond(s):
        return jnp.any(jax.vmap(_active, in_axes=(ax, 0))(p, s))

    return jax.lax.while_loop(cond, lambda s: step(p, arr_sorted, n_acc, keys, s), s)


def finish_stack(rq: Requests, s: _State, aux) -> ReplayResult:
    """Per-request results of a stack of finished replays."""
    ensure_x64()
    return jax.vmap(_result)(rq, s, aux)


def widen_stack(s: _State, aux, slots: int):
    """Host-side (numpy): a stack's states and constants at ``slots`` (≥ the current) running-list slots;
    replays that ran out of slots (``SLOTS_FULL``) are running again. Nothing else changes, so a replay
    continued this way is the replay run at ``slots`` from the start. ``slots=0`` empties the slot
    arrays of finished replays (:func:`finish_stack` never reads them: one finishing executable serves
    every capacity)."""
    if slots == 0:  # shapes only are read: works on ShapeDtypeStructs too
        empty = lambda a: np.zeros(a.shape[:-1] + (0,), a.dtype)  # noqa: E731
        return eqx.tree_at(lambda t: (t.run, t.stk), s, (empty(s.run), empty(s.stk))), (empty(aux[0]), *aux[1:])
    n = s.ri.shape[-2] - 1
    pad = int(slots) - s.run.shape[-1]
    if pad < 0:
        raise ValueError(f"cannot narrow {s.run.shape[-1]} slots to {slots}")
    ext = lambda a, v: np.concatenate([np.asarray(a), np.full(a.shape[:-1] + (pad,), v, np.asarray(a).dtype)], axis=-1)  # noqa: E731
    status = np.where(np.asarray(s.status) == SLOTS_FULL, RUNNING, np.asarray(s.status)).astype(np.int32)
    s = eqx.tree_at(lambda t: (t.run, t.stk, t.status), s, (ext(s.run, n), ext(s.stk, n), status))
    return s, (ext(aux[0], np.inf), *aux[1:])


def replay_stack(
    p: EngineParams, rq: Requests, keys: jax.Array, *, slots: int, stochastic: bool = True, timeline_len: int = 0,
    shared_table: bool = False,
) -> ReplayResult:
    """Replays of a stack of (configuration, trace, key) items (leading axis of every argument), equal
    item by item to :func:`replay`.

    ``shared_table``: ``p.table`` has no leading axis and serves every item."""
    s0, aux = start_stack(p, rq, slots=slots, timeline_len=timeline_len, shared_table=shared_table)
    s = advance_stack(p, aux[0], aux[1], keys, s0, stochastic=stochastic, shared_table=shared_table)
    return finish_stack(rq, s, aux)


replay_jit = jit_x64(replay, static_argnames=("slots", "stochastic", "timeline_len"))


def make_params(
    table: RoundTable,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    block_size: int,
    num_gpu_blocks: int,
    num_draft_tokens: int = 0,
    accept_rates=None,
    max_model_len: int,
    max_passes: int = 10_000_000,
    state_blocks: int = 0,
) -> EngineParams:
    """Validated :class:`EngineParams` for one worker (plain Python checks before any jit)."""
    ints = dict(
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, block_size=block_size,
        num_gpu_blocks=num_gpu_blocks, max_model_len=max_model_len, max_passes=max_passes,
    )
    for name, v in ints.items():
        if isinstance(v, bool) or int(v) != v or int(v) < 1:
            raise ValueError(f"{name}={v!r} must be an integer >= 1")
    if isinstance(state_blocks, bool) or int(state_blocks) != state_blocks or int(state_blocks) < 0:
        raise ValueError(f"state_blocks={state_blocks!r} must be an integer >= 0")
    k = int(num_draft_tokens)
    if not 0 <= k <= MAX_DRAFT_TOKENS:
        raise ValueError(f"num_draft_tokens={num_draft_tokens!r} must be within 0..{MAX_DRAFT_TOKENS}")
    rates = np.zeros(MAX_DRAFT_TOKENS) if accept_rates is None else np.asarray(accept_rates, dtype=np.float64).reshape(-1)
    if rates.shape != (MAX_DRAFT_TOKENS,) or not np.all((rates >= 0) & (rates <= 1)):
        raise ValueError(f"accept_rates must be {MAX_DRAFT_TOKENS} probabilities in [0, 1] (pad with acceptance.pad_rates)")
    rates = np.where(np.arange(MAX_DRAFT_TOKENS) < k, rates, 0.0)
    i64 = lambda v: jnp.asarray(int(v), jnp.int64)
    return EngineParams(
        table=table, max_num_batched_tokens=i64(max_num_batched_tokens), max_num_seqs=i64(max_num_seqs),
        block_size=i64(block_size), num_gpu_blocks=i64(num_gpu_blocks), num_draft_tokens=i64(k),
        accept_rates=jnp.asarray(rates), max_model_len=i64(max_model_len), max_passes=i64(max_passes),
        state_blocks=i64(state_blocks),
    )


def is_stochastic(accept_rates) -> bool:
    """True when some acceptance rate is strictly between 0 and 1 (bursts must be sampled)."""
    r = np.asarray(accept_rates, dtype=np.float64)
    return bool(np.any((r > 0) & (r < 1)))


def slot_bucket(max_num_seqs: int) -> int:
    """Static running-list capacity for ``max_num_seqs`` (powers of two, at least 8)."""
    return pow2_bucket(max_num_seqs, 8)
