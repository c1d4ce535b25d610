"""Decode stretches: up to ``lookahead`` decode-only scheduler passes advanced in one loop step.

Most passes of a replay change nothing the scheduler decides on: every running request decodes, no
prefill chunk runs, nobody is admitted or preempted, nobody finishes. Such a pass's batch is known in
advance and its past-KV total grows by the bursts of the passes before it, so a stretch of them is
priced with one vectorised lookup (one row per candidate pass) and a chain of additions of the rounded
durations (the reference's clock, addition by addition). The stretch ends before the first pass where

* a request would finish (known from its remaining tokens; sampled speculative bursts are drawn ahead
  from the same key stream the pass would use, ``fold_in(fold_in(key, pass), request)``),
* a waiting request could be admitted (an arrival lands while a seat is free, unless the queue head
  already cannot fit the pool: the free pool only shrinks along a stretch),
* the running list or the speculative reservation needs KV blocks that are not free (a preemption),
* a lookup leaves measured support, or the pass limit is reached.

That pass, whatever it is, is then run by the ordinary pass (:func:`jaxsim.replay.engine.engine_pass`),
so a loop step is ``stretch of n <= lookahead decode passes, then one pass``
(:func:`engine_step`). Every pass of a stretch is exactly the pass the pass-by-pass engine would run:
the same lookups, per-request times, token counts, KV blocks and timeline rows, bit for bit
(``tests/test_replay_stretch.py`` checks stretch == pass by pass on random traces; ``lookahead=0`` is
the pass-by-pass engine itself).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float64, Int64

from jaxsim.acceptance import MAX_DRAFT_TOKENS
from jaxsim.kernels import status as st
from jaxsim.kernels.acceptance import sample_burst
from jaxsim.kernels.capacity import blocks_for
from jaxsim.kernels.rounds import decode_latency_ms
from jaxsim.replay import engine as eng

DEFAULT_LOOKAHEAD = 16


def lookahead_or_default(lookahead: int | None) -> int:
    """The static lookahead of a replay (None: :data:`DEFAULT_LOOKAHEAD`)."""
    if lookahead is None:
        return DEFAULT_LOOKAHEAD
    if isinstance(lookahead, bool) or int(lookahead) != lookahead or int(lookahead) < 0:
        raise ValueError(f"lookahead={lookahead!r} must be an integer >= 0 (0: pass by pass)")
    return int(lookahead)


class StretchPlan(eqx.Module):
    """The candidate passes of a stretch (``J = lookahead`` rows) over the running slots (``S``)."""

    requests: Int64[Array, " S"]  # rows of the running slots (the padding row past the list)
    listed: Bool[Array, " S"]
    generated: Int64[Array, "K S"]  # K = J + 1 rows: generated tokens entering candidate pass j (row J: after the last)
    allocated_blocks: Int64[Array, "K S"]  # KV blocks held after candidate pass j's emission (row J unused)
    decode_kv_tokens: Int64[Array, " J"]
    start_ms: Float64[Array, " J"]
    end_ms: Float64[Array, " J"]
    length: Int64[Array, ""]  # passes [0, length) of the stretch are run


def _blocks(tokens, block_size):
    """``blocks_for`` (⌈tokens / block_size⌉) for the stretch's wide arrays without an integer division per
    element (slow on CPUs, not vectorised): a float quotient, then corrected by at most one either way,
    so the result is the exact integer one for any tokens < 2**52."""
    n = tokens + block_size - 1
    q = jnp.floor(n.astype(jnp.float64) / block_size.astype(jnp.float64)).astype(jnp.int64)
    q = q - (q * block_size > n)
    return q + ((q + 1) * block_size <= n)


def eligible(p: eng.EngineParams, s: eng.EngineState, listed, rows: eng.RequestState) -> Bool[Array, ""]:
    """Every running request decodes within the budget and nothing is preempted or waiting to resume."""
    length = rows.length
    decode = (rows.generated > 0) & (rows.computed == length - 1) & ~rows.recomputing
    tokens = jnp.where(listed, jnp.minimum(p.num_draft_tokens + 1, p.max_model_len - length), 0)
    return (
        eng._active(p, s) & (s.num_running > 0) & (s.num_preempted == 0) & jnp.all(decode | ~listed)
        & (jnp.sum(tokens) <= p.max_num_batched_tokens)
    )


def _raw_bursts(p: eng.EngineParams, key, stochastic: bool, passes, requests, lookahead: int) -> Int64[Array, "J S"]:
    """Tokens each slot's decode round would emit at each candidate pass before the remaining-output cap
    (the draws :func:`jaxsim.replay.engine._bursts` makes at that pass, from the same keys)."""
    k1 = p.num_draft_tokens + 1
    if stochastic:
        def one_pass(j):
            pass_key = jax.random.fold_in(key, passes + j)
            keys = jax.vmap(lambda i: jax.random.fold_in(pass_key, i))(requests)
            return jax.vmap(sample_burst, in_axes=(0, None, None, None))(keys, p.accept_rates, p.num_draft_tokens, k1)
        return jax.vmap(one_pass)(jnp.arange(lookahead, dtype=jnp.int64))
    certain = (p.accept_rates >= 1.0) & (jnp.arange(MAX_DRAFT_TOKENS) < p.num_draft_tokens)
    burst = 1 + jnp.sum(jnp.cumprod(certain.astype(jnp.int64)))
    return jnp.full((lookahead, requests.shape[0]), burst, jnp.int64)


def plan_stretch(
    p: eng.EngineParams, consts: eng.ReplayConstants, key, stochastic: bool, s: eng.EngineState, lookahead: int,
) -> StretchPlan:
    """The candidate passes from ``s`` and how many of them run as a stretch."""
    num_slots = s.running.shape[0]
    slot = jnp.arange(num_slots)
    listed = slot < s.num_running
    requests = jnp.where(listed, s.running, eng._padding_row(s))
    rows = s.requests.rows(requests)
    ok_start = eligible(p, s, listed, rows)

    raw = jnp.where(listed, _raw_bursts(p, key, stochastic, s.passes, requests, lookahead), 0)
    generated = jnp.concatenate([rows.generated[None], rows.generated + jnp.cumsum(raw, axis=0)])  # [J+1, S]
    length = rows.prompt_tokens + generated  # entering each candidate pass
    remaining = rows.output_tokens - generated[:-1]
    finishes = jnp.any(listed & (raw >= remaining), axis=1)  # burst reaches the output: the request finishes

    # KV: the running list allocates each decode's dangling token; a speculative pass also reserves
    # every burst's growth and keeps the blocks its emission fills
    held0 = jnp.where(listed, rows.allocated_blocks, 0)
    need = jnp.where(listed, _blocks(length, p.block_size) + p.state_blocks, 0)
    scheduled_blocks = jnp.maximum(held0, need[:-1])  # after the running list's allocation
    held = jnp.sum(scheduled_blocks, axis=1)
    short = held > p.num_gpu_blocks
    tokens = jnp.minimum(p.num_draft_tokens + 1, p.max_model_len - length[:-1])
    reserved = jnp.minimum(tokens, remaining)
    wanted = jnp.where(listed, _blocks(length[:-1] + reserved, p.block_size) - _blocks(length[:-1], p.block_size), 0)
    short = short | ((p.num_draft_tokens > 0) & (held + jnp.sum(wanted, axis=1) > p.num_gpu_blocks))
    after = jnp.where(p.num_draft_tokens > 0, jnp.maximum(scheduled_blocks, need[1:]), scheduled_blocks)

    # admission: a free seat and a waiting head that fits the pool admits (the pool only shrinks here)
    head = s.next_arrival
    next_sent_ms = s.sent_ms[head]
    waiting = next_sent_ms <= s.now_ms
    head_len = s.requests.rows(jnp.minimum(head, eng._padding_row(s))[None]).length[0]  # one row, not every row's length
    head_fits = blocks_for(head_len, p.block_size) + p.state_blocks <= p.num_gpu_blocks - held[0]
    seats_full = s.num_running >= p.max_num_seqs
    head_blocked = waiting & (s.num_running < num_slots) & ~head_fits
    ok_start = ok_start & (seats_full | head_blocked | ~waiting)

    # price every candidate pass (decode only), then chain the clock addition by addition
    decode_kv_tokens = jnp.sum(jnp.where(listed, length[:-1] - 1, 0), axis=1)
    start_ms, end_ms, unsupported = price_candidates(p, s.passes, s.now_ms, s.num_running, decode_kv_tokens)

    arrives = ~(seats_full | head_blocked) & (next_sent_ms <= start_ms)
    within = s.passes + jnp.arange(lookahead) < p.max_passes
    ok = ok_start & within & ~finishes & ~short & ~arrives & ~unsupported
    n = jnp.sum(jnp.cumprod(ok.astype(jnp.int64)))
    return StretchPlan(
        requests=requests, listed=listed, generated=generated, allocated_blocks=jnp.concatenate([after, after[-1:]]),
        decode_kv_tokens=decode_kv_tokens, start_ms=start_ms, end_ms=end_ms, length=n,
    )


def price_candidates(p: eng.EngineParams, passes, now_ms, num_running, decode_kv_tokens: Int64[Array, " J"]):
    """Decode-only candidate passes of ``num_running`` requests from ``now_ms``, with these past-KV totals: (start_ms,
    end_ms, unsupported) per pass; each duration rounded as the pass rounds it, the clock chained addition by addition."""
    lookahead = decode_kv_tokens.shape[0]
    zeros = jnp.zeros((lookahead,), jnp.int64)
    has_d, decode_ms, code = _decode_lookups(p, zeros, num_running, decode_kv_tokens)
    unsupported = code >= st.FIRST_UNSUPPORTED
    # one runtime 0 per candidate pass: a divisor broadcast from one scalar is hoisted into a reciprocal
    # by XLA:CPU (a multiplication, not the reference's division); one per element keeps the division
    zero = jax.vmap(eng._runtime_zero)(passes + jnp.arange(lookahead, dtype=jnp.int64))
    rounded_ms = jax.vmap(eng._pass_duration_ms)(jnp.where(unsupported, 0.0, decode_ms), zero)
    duration_ms = eng._opaque(jnp.where(has_d & ~unsupported, rounded_ms, 0.0), zero)
    starts, ends = [], []
    t = now_ms
    for j in range(lookahead):
        starts.append(t)
        t = t + duration_ms[j]
        ends.append(t)
    return jnp.stack(starts), jnp.stack(ends), unsupported


def _decode_lookups(p: eng.EngineParams, zeros, num_decode, decode_kv_tokens):
    """The lookups of decode-only candidate passes: (has_decode, decode_ms, code) per pass, as
    :func:`~jaxsim.kernels.rounds.pass_lookups` gives them without prefill work (no prefill lookup)."""
    decode_ms, code = jax.vmap(lambda kv: decode_latency_ms(p.table, num_decode, kv))(decode_kv_tokens)
    return zeros + num_decode > 0, decode_ms, code


def commit_stretch(p: eng.EngineParams, s: eng.EngineState, plan: StretchPlan) -> eng.EngineState:
    """The state after the stretch's passes [0, n): each running request's row, the clock, the pass count
    and the timeline rows."""
    n = plan.length
    last = jnp.maximum(n - 1, 0)
    rows = s.requests.rows(plan.requests)
    allocated = jnp.where(n > 0, plan.allocated_blocks[last], rows.allocated_blocks)
    advanced = advanced_rows(rows, plan.listed, plan.generated[n], allocated, plan.end_ms, n, eng._runtime_zero(s.passes))
    timeline = stretch_timeline(s, plan.start_ms, plan.end_ms, n, plan.decode_kv_tokens, jnp.sum(plan.allocated_blocks[:-1], axis=1))
    return write_stretch(s, plan.requests, plan.listed, advanced, plan.start_ms, plan.end_ms, n, timeline)


def advanced_rows(rows: eng.RequestState, listed, generated, allocated_blocks, end_ms, n, zero) -> eng.RequestState:
    """The running slots' rows after ``n`` decode passes ending at ``end_ms[:n]`` (``generated`` tokens and
    ``allocated_blocks`` after them)."""
    ran = n > 0
    last = jnp.maximum(n - 1, 0)
    gap_sq, previous = rows.token_gap_sq_ms2, rows.last_token_ms
    for j in range(end_ms.shape[0]):  # Σ squared gaps, emission by emission (each pass's gap from the previous emission)
        gap_ms = eng._opaque(jnp.where(listed, end_ms[j] - previous, 0.0), zero)
        gap_sq = jnp.where(j < n, gap_sq + eng._opaque(gap_ms * gap_ms, zero), gap_sq)
        previous = end_ms[j]
    return rows.replace(
        generated=generated, computed=rows.prompt_tokens + generated - 1, allocated_blocks=allocated_blocks,
        decode_rounds=rows.decode_rounds + n,
        second_token_ms=jnp.where(ran & jnp.isnan(rows.second_token_ms), end_ms[0], rows.second_token_ms),
        last_token_ms=jnp.where(ran, end_ms[last], rows.last_token_ms), token_gap_sq_ms2=gap_sq,
    )


def write_stretch(s: eng.EngineState, requests, listed, advanced: eng.RequestState, start_ms, end_ms, n, timeline) -> eng.EngineState:
    """``s`` with the running rows ``advanced``, the clock at the last pass's end (and its start), ``n`` more passes
    and ``timeline``."""
    index = jnp.where(listed & (n > 0), requests, s.requests.num_rows)
    last = jnp.maximum(n - 1, 0)
    return eqx.tree_at(
        lambda t: (t.requests, t.now_ms, t.last_start_ms, t.passes, t.timeline), s,
        (s.requests.write(index, advanced), jnp.where(n > 0, end_ms[last], s.now_ms), jnp.where(n > 0, start_ms[last], s.last_start_ms),
         s.passes + n, timeline),
    )


def stretch_timeline(s: eng.EngineState, start_ms, end_ms, n, decode_kv_tokens, kv_blocks_used) -> Float64[Array, "T F"]:
    """The timeline with the stretch's passes [0, n) recorded (decode only; nobody preempted or waiting to resume)."""
    timeline = s.timeline
    if timeline.shape[0] == 0:
        return timeline
    lookahead = start_ms.shape[0]
    j = jnp.arange(lookahead)
    arrived = jnp.sum(s.sent_ms[None, :] <= start_ms[:, None], axis=1)
    zeros = jnp.zeros((lookahead,))
    fields = dict(
        start_ms=start_ms, end_ms=end_ms, running=zeros + s.num_running, waiting=zeros + (arrived - s.next_arrival),
        prefill_requests=zeros, prefill_tokens=zeros, prefill_kv_tokens=zeros, decode_requests=zeros + s.num_running,
        decode_kv_tokens=decode_kv_tokens, kv_blocks_used=kv_blocks_used, preemptions=zeros,
    )
    rows = jnp.stack([jnp.asarray(fields[name]).astype(jnp.float64) for name in eng.TIMELINE_FIELDS], axis=1)
    return timeline.at[jnp.where(j < n, s.passes + j, timeline.shape[0])].set(rows, mode="drop")


def decode_stretch(
    p: eng.EngineParams, consts: eng.ReplayConstants, key, stochastic: bool, s: eng.EngineState, lookahead: int,
    axis_name: str | None = None,
) -> eng.EngineState:
    """Run the decode-only passes ahead of ``s`` (up to ``lookahead``), when some replay of the batch can."""
    slot = jnp.arange(s.running.shape[0])
    listed = slot < s.num_running
    rows = s.requests.rows(jnp.where(listed, s.running, eng._padding_row(s)))
    can = eligible(p, s, listed, rows)
    # only the plan (lookahead x slots) goes through the cond: a branch returning the whole state would
    # copy every request row at every step; a plan of length 0 commits nothing
    plan = lambda: plan_stretch(p, consts, key, stochastic, s, lookahead)  # noqa: E731
    nothing = lambda: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(plan))  # noqa: E731
    return commit_stretch(p, s, jax.lax.cond(eng._any(can, axis_name), plan, nothing))


def engine_step(
    p: eng.EngineParams, consts: eng.ReplayConstants, key, stochastic: bool, lookahead: int, s: eng.EngineState,
    axis_name: str | None = None, closed_loop: bool = True,
) -> eng.EngineState:
    """One loop step: a decode stretch (none when ``lookahead`` is 0), then one ordinary pass (static ``closed_loop``:
    :func:`jaxsim.replay.engine.engine_pass`)."""
    counted = s.steps + eng._active(p, s)
    if lookahead > 0:
        s = decode_stretch(p, consts, key, stochastic, s, lookahead, axis_name)
    s = eng.engine_pass(p, consts, key, stochastic, s, axis_name, closed_loop)
    return eqx.tree_at(lambda t: t.steps, s, counted)
