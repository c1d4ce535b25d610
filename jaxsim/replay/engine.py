"""The replay engine: one vLLM-style worker as a JAX state machine (one ``lax.while_loop`` step per
scheduler pass, fixed-capacity arrays, no Python per-pass loop).

The specification is the plain-Python oracle ``oracle_replay`` in ``tests/replay_support.py``: the same
scheduler rules written one request at a time with lists and loops (read it first). This module is its
vectorized transcription, checked against it on random traces (``tests/test_replay_engine.py``) and
against the reference's replay goldens (matched bit for bit).

Semantics:

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
* Closed loop (``max_concurrency`` C > 0), as ``vllm bench serve --max-concurrency C`` (an
  ``asyncio.Semaphore(C)`` with FIFO wake-ups): requests are sent in arrival order, request i at
  ``max(arrival_i, the (i-C+1)-th completion)`` for i >= C, the first C at their arrival; only sent
  requests reach the waiting queue. Rejected requests hold no slot. C = 0 is the open loop.

One pass (:func:`engine_pass`) is a sequence of phases, each a pure function from small typed Modules
to a small typed Module: :func:`schedule_running` (:class:`RunningSchedule`), :func:`admit`
(:class:`Admission`), :func:`scheduled_list` (:class:`ScheduledList`), :func:`reserve`
(:class:`Reservation`), :func:`price` (:class:`PassPrice`), :func:`emit` (:class:`Emission`) and
:func:`commit` (the next :class:`EngineState`). Per-slot arrays have ``S`` entries (the running-list
capacity); per-request arrays have ``N + 1`` rows, accepted requests first in arrival order, and a
padding row ``N`` that empty slots read and no pass writes.
"""

from __future__ import annotations

from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float64, Int32, Int64

from jaxsim._jax import ensure_x64, jit_x64
from jaxsim.acceptance import MAX_DRAFT_TOKENS
from jaxsim.kernels import status as st
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
    max_concurrency: Int64[Array, ""]  # closed loop: at most this many requests in flight (0: open loop)
    # vLLM's async scheduling: a pass is scheduled while the previous one runs (:func:`_visible_ms`); False: synchronous
    async_scheduling: Bool[Array, ""]


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
    sent_ms: Float64[Array, " N"]  # when the request was sent (its arrival in an open loop; nan: never sent)
    status: Int32[Array, ""]
    num_passes: Int64[Array, ""]
    num_steps: Int64[Array, ""]  # loop steps (a decode stretch and a pass each: jaxsim.replay.stretch)
    end_ms: Float64[Array, ""]
    failed_query: Int64[Array, " 5"]
    timeline: Float64[Array, "T F"]



# ----------------------------------------------------------------------------------------------------
# engine state: per-request rows, the running list and the preempted stack, per-replay constants


# The packed per-request store: integers in one array, times in another (columns below), so that a pass
# reads and writes every field of a request with one gather and one scatter. Only RequestState reads
# or writes these columns and flag bits; everything else uses its named fields.
_PROMPT, _OUTPUT, _GENERATED, _COMPUTED, _ALLOCATED, _DECODE_ROUNDS, _PREEMPTIONS, _ADMISSIONS, _FLAGS = range(9)
_FIRST, _SECOND, _LAST, _GAP_SQ = range(4)
_MATERIALIZED, _DONE, _RECOMPUTING = 1, 2, 4  # flag bits


class RequestState(eqx.Module):
    """Every request's progress, one row per request (accepted requests first, in arrival order; the
    last row is the padding row that empty slots read); or the rows of a pass's slots (:meth:`rows`).

    Fields (read-only properties): ``prompt_tokens``; ``output_tokens`` (the tokens it will emit,
    capped by the context limit); ``generated`` (emitted so far); ``computed`` (tokens whose KV is
    computed); ``allocated_blocks`` (KV blocks held); ``decode_rounds``; ``preemptions``;
    ``admissions``; the flags ``materialized`` (its prompt KV is present on arrival; cleared once
    admitted), ``done`` and ``recomputing`` (preempted: recomputing until it emits again); and the
    times ``first_token_ms``, ``second_token_ms``, ``last_token_ms`` (nan until emitted) and
    ``token_gap_sq_ms2`` (Σ squared gaps between emissions). Build rows with :meth:`pack` or
    :meth:`replace`.

    Stored packed, for speed: one array per field made a pass about 20 % slower on a 64-replay batch
    and twice as slow on one replay (a gather and a scatter per field instead of one per array).
    """

    counts: Int64[Array, "R 9"]
    times: Float64[Array, "R 4"]

    @classmethod
    def pack(
        cls, *, prompt_tokens, output_tokens, generated, computed, allocated_blocks, decode_rounds, preemptions,
        admissions, materialized, done, recomputing, first_token_ms, second_token_ms, last_token_ms, token_gap_sq_ms2,
    ) -> RequestState:
        flags = jnp.where(materialized, _MATERIALIZED, 0) | jnp.where(done, _DONE, 0) | jnp.where(recomputing, _RECOMPUTING, 0)
        counts = jnp.stack([
            prompt_tokens, output_tokens, generated, computed, allocated_blocks, decode_rounds, preemptions, admissions, flags,
        ], axis=-1).astype(jnp.int64)
        times = jnp.stack([first_token_ms, second_token_ms, last_token_ms, token_gap_sq_ms2], axis=-1)
        return cls(counts=counts, times=times)

    def replace(self, **fields) -> RequestState:
        """These rows with some fields replaced."""
        return RequestState.pack(**{name: fields.get(name, getattr(self, name)) for name in _REQUEST_FIELDS})

    prompt_tokens = property(lambda self: self.counts[..., _PROMPT])
    output_tokens = property(lambda self: self.counts[..., _OUTPUT])
    generated = property(lambda self: self.counts[..., _GENERATED])
    computed = property(lambda self: self.counts[..., _COMPUTED])
    allocated_blocks = property(lambda self: self.counts[..., _ALLOCATED])
    decode_rounds = property(lambda self: self.counts[..., _DECODE_ROUNDS])
    preemptions = property(lambda self: self.counts[..., _PREEMPTIONS])
    admissions = property(lambda self: self.counts[..., _ADMISSIONS])
    materialized = property(lambda self: (self.counts[..., _FLAGS] & _MATERIALIZED) != 0)
    done = property(lambda self: (self.counts[..., _FLAGS] & _DONE) != 0)
    recomputing = property(lambda self: (self.counts[..., _FLAGS] & _RECOMPUTING) != 0)
    first_token_ms = property(lambda self: self.times[..., _FIRST])
    second_token_ms = property(lambda self: self.times[..., _SECOND])
    last_token_ms = property(lambda self: self.times[..., _LAST])
    token_gap_sq_ms2 = property(lambda self: self.times[..., _GAP_SQ])

    @property
    def num_rows(self) -> int:
        return self.counts.shape[-2]

    @property
    def length(self) -> Int64[Array, " R"]:
        """Known sequence length: prompt plus emitted tokens."""
        return self.prompt_tokens + self.generated

    @property
    def emitted_any(self) -> Bool[Array, " R"]:
        return ~jnp.isnan(self.first_token_ms)

    def rows(self, index: Int64[Array, " S"]) -> RequestState:
        """The rows ``index``."""
        return jax.tree.map(lambda a: a[index], self)

    def write(self, index: Int64[Array, " W"], rows: RequestState) -> RequestState:
        """``rows`` written at ``index``; an index past the last row writes nothing."""
        return jax.tree.map(lambda a, v: a.at[index].set(v, mode="drop"), self, rows)


_REQUEST_FIELDS = (
    "prompt_tokens", "output_tokens", "generated", "computed", "allocated_blocks", "decode_rounds", "preemptions",
    "admissions", "materialized", "done", "recomputing", "first_token_ms", "second_token_ms", "last_token_ms",
    "token_gap_sq_ms2",
)


class EngineState(eqx.Module):
    """The loop state of one replay: the clock, the running list, the stack of preempted requests
    waiting to resume (top first, ahead of fresh arrivals), the next arrival, every request's row,
    and the per-pass timeline."""

    now_ms: Float64[Array, ""]
    last_start_ms: Float64[Array, ""]  # when the last pass started (-inf: none yet); async scheduling's cut-off
    seen_ms: Float64[Array, ""]  # the latest send time the scheduler has seen (-inf: none; _visible_ms)
    passes: Int64[Array, ""]
    steps: Int64[Array, ""]  # loop steps taken (jaxsim.replay.stretch.engine_step)
    status: Int32[Array, ""]
    num_done: Int64[Array, ""]
    num_running: Int64[Array, ""]
    # the most requests a pass's list held after its admissions: a replay whose peak is at most M' admits exactly
    # the same requests with max_num_seqs M' (a seat never stopped an admission above it; jaxsim.replay.runner)
    peak_running: Int64[Array, ""]
    num_preempted: Int64[Array, ""]
    next_arrival: Int64[Array, ""]  # row of the next fresh request to admit (rows are in arrival order)
    sent_ms: Float64[Array, " M"]  # per row: when it is sent (+inf: not yet); S trailing +inf pads
    running: Int64[Array, " S"]  # rows of the running list, in order (padding row past num_running)
    preempted: Int64[Array, " S"]  # stack of preempted rows (the top, at num_preempted - 1, resumes first)
    requests: RequestState
    failed_query: Int64[Array, " 5"]  # the lookup of a pass outside measured support (PassPrice.query)
    timeline: Float64[Array, "T F"]  # one row per pass, TIMELINE_FIELDS


class ReplayConstants(eqx.Module):
    """What a replay's passes read but never change."""

    arrival_sorted_ms: Float64[Array, " M"]  # per row: accepted arrivals, then +inf; S trailing +inf pads
    num_accepted: Int64[Array, ""]
    order: Int64[Array, " N"]  # trace index of each row
    accepted: Bool[Array, " N"]  # per trace request: the worker can ever run it (accepted_mask)


# ----------------------------------------------------------------------------------------------------
# what each phase of a pass hands to the next (per-slot arrays: S entries)


class RunningSchedule(eqx.Module):
    """The running list walked in order: what each request is scheduled, and the tail preempted when
    the pool runs short."""

    requests: Int64[Array, " S"]  # row of each slot (the padding row past the list)
    rows: RequestState  # their rows at the start of the pass
    listed: Bool[Array, " S"]  # slot holds a running request
    decode: Bool[Array, " S"]  # a decode (not a prefill or a recompute)
    scheduled: Bool[Array, " S"]
    budget_tokens: Int64[Array, " S"]  # budget tokens scheduled (0 unless scheduled)
    allocated_blocks: Int64[Array, " S"]  # after allocating for this pass
    num_kept: Int64[Array, ""]  # slots [num_kept, num_running) are preempted
    any_preempted: Bool[Array, ""]
    preempted: Bool[Array, " S"]
    stack: Int64[Array, " S"]  # the preempted stack with this phase's preemptions pushed
    stack_size: Int64[Array, ""]


class Admission(eqx.Module):
    """Waiting requests (the preempted stack top first, then fresh arrivals) admitted FCFS."""

    candidates: Int64[Array, " S"]  # row of the i-th waiting request (the padding row past the queue)
    materialized: Bool[Array, " S"]
    budget_tokens: Int64[Array, " S"]
    allocated_blocks: Int64[Array, " S"]  # blocks allocated on admission
    num_admitted: Int64[Array, ""]  # candidates [0, num_admitted) are admitted
    stack_size: Int64[Array, ""]  # the preempted stack after resuming its top
    next_arrival: Int64[Array, ""]
    slots_full: Bool[Array, ""]  # every slot taken while requests still wait: a larger capacity may differ
    visible_ms: Float64[Array, ""]  # the latest send time the pass's scheduling saw (:func:`_visible_ms`)


class ScheduledList(eqx.Module):
    """The pass's list: the kept running slots, then the admitted requests."""

    requests: Int64[Array, " S"]
    rows: RequestState  # their rows at the start of the pass
    size: Int64[Array, ""]
    listed: Bool[Array, " S"]
    admitted: Bool[Array, " S"]  # admitted in this pass
    scheduled: Bool[Array, " S"]
    decode: Bool[Array, " S"]
    budget_tokens: Int64[Array, " S"]
    computed_before: Int64[Array, " S"]
    computed: Int64[Array, " S"]  # after this pass's prefill chunk
    allocated_blocks: Int64[Array, " S"]


class Reservation(eqx.Module):
    """Speculative passes: blocks reserved for every ready request's burst, the tail preempted until
    they fit (autoregressive passes keep every slot)."""

    num_kept: Int64[Array, ""]  # slots [num_kept, size) of the scheduled list are preempted
    preempted: Bool[Array, " S"]
    ready: Bool[Array, " S"]  # emits this pass (unless the pass leaves measured support)
    decode_ready: Bool[Array, " S"]  # ready after a first token: a decode round
    stack: Int64[Array, " S"]
    stack_size: Int64[Array, ""]


class PassPrice(eqx.Module):
    """The pass's lookups and when it ends."""

    prefill_requests: Int64[Array, ""]
    prefill_tokens: Int64[Array, ""]
    prefill_kv_tokens: Int64[Array, ""]
    decode_requests: Int64[Array, ""]
    decode_kv_tokens: Int64[Array, ""]
    status: Int32[Array, ""]  # the lookups' status
    unsupported: Bool[Array, ""]  # outside measured support: the replay stops here
    end_ms: Float64[Array, ""]

    @property
    def query(self) -> Int64[Array, " 5"]:
        return jnp.stack([self.prefill_requests, self.prefill_tokens, self.prefill_kv_tokens, self.decode_requests,
                          self.decode_kv_tokens])


class Emission(eqx.Module):
    """Tokens emitted at the pass end, per slot of the scheduled list."""

    ready: Bool[Array, " S"]
    generated: Int64[Array, " S"]
    computed: Int64[Array, " S"]
    allocated_blocks: Int64[Array, " S"]  # 0 once done
    done: Bool[Array, " S"]
    first_token_ms: Float64[Array, " S"]
    second_token_ms: Float64[Array, " S"]
    last_token_ms: Float64[Array, " S"]
    token_gap_sq_ms2: Float64[Array, " S"]


class PassRecord(eqx.Module):
    """Every phase of one pass, as :func:`commit` writes them back."""

    now_ms: Float64[Array, ""]  # the pass start
    running: RunningSchedule
    admission: Admission
    scheduled: ScheduledList
    reservation: Reservation
    price: PassPrice
    emission: Emission


# ----------------------------------------------------------------------------------------------------
# helpers: exact float arithmetic, stacks, batch-wide predicates


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


def _runtime_zero(passes: Int64[Array, ""]) -> Int64[Array, ""]:
    """A 0 the compiler cannot know (for :func:`_opaque`)."""
    return jnp.minimum(passes, 0)


def _materialize(x):
    """``x`` unchanged, computed once: XLA:CPU fuses a chain of cheap scalar ops into every element of
    each wide consumer (``optimization_barrier`` is dropped); a scan's first element is not fused."""
    return jnp.cumsum(jnp.stack([x, jnp.zeros_like(x)]), axis=0)[0]


def _push_preempted(stack, stack_size, requests, lo, hi):
    """Preempt the requests of slots [lo, hi): LIFO, so slot ``lo`` ends on top of the stack (its end)."""
    num_slots = stack.shape[0]
    slot = jnp.arange(num_slots)
    moved = (slot >= lo) & (slot < hi)
    pos = jnp.where(moved, stack_size + (hi - 1 - slot), num_slots)
    return stack.at[pos].set(requests, mode="drop"), stack_size + (hi - lo)


def _drop_kv(rows: RequestState, preempted: Bool[Array, " S"]) -> RequestState:
    """``rows`` with the ``preempted`` ones preempted for recompute: their KV dropped, recomputing until
    they emit again."""
    return rows.replace(
        computed=jnp.where(preempted, 0, rows.computed), allocated_blocks=jnp.where(preempted, 0, rows.allocated_blocks),
        preemptions=rows.preemptions + preempted, materialized=rows.materialized & ~preempted,
        recomputing=rows.recomputing | preempted,
    )


def _padding_row(s: EngineState) -> int:
    return s.requests.num_rows - 1


def _active(p: EngineParams, s: EngineState) -> Bool[Array, ""]:
    return (s.status == RUNNING) & (s.passes < p.max_passes)


def _any(pred: Bool[Array, ""], axis_name: str | None) -> Bool[Array, ""]:
    """``pred`` of any replay of the batch (the vmapped axis ``axis_name``; None: this replay alone): a
    batch-wide predicate lets ``lax.cond`` skip work no replay of the batch needs in this pass."""
    return pred if axis_name is None else jax.lax.psum(pred.astype(jnp.int32), axis_name) > 0


def _clock(consts: ReplayConstants, s: EngineState) -> Float64[Array, ""]:
    """The pass start: an idle engine jumps to the next send (send times are non-decreasing in row
    order, with S trailing +inf pads: only the next S are ever looked at, never the whole trace)."""
    next_ms = s.sent_ms[s.next_arrival]
    idle = (s.num_running == 0) & (s.num_preempted == 0) & (next_ms > s.now_ms)
    return jnp.where(idle & (s.next_arrival < consts.num_accepted), next_ms, s.now_ms)


def _visible_ms(p: EngineParams, s: EngineState, now_ms: Float64[Array, ""]) -> Float64[Array, ""]:
    """The latest send time the scheduler sees when it schedules the pass starting at ``now_ms``.

    Synchronous (the reference, vLLM without async scheduling): the pass is scheduled when it starts, so every
    request sent by ``now_ms`` may be admitted. Async scheduling (vLLM's ``--async-scheduling``; vLLM's engine
    core keeps two batches in flight, ``EngineCore.step_with_batch_queue``): the pass is scheduled while the
    previous one runs, right after the outputs of the one before came back, i.e. just after the previous pass
    started. It sees the requests sent before that start, not one sent at it: a closed loop's next request, sent
    when its previous one's last pass ends, is sent by those very outputs, so it cannot reach that scheduling.
    An engine with nothing running (idle, or every request finished in the last pass) had nothing to schedule
    ahead and schedules when the pass starts, as the synchronous one. A request once seen waits in the scheduler's
    queue: the cut-off never goes back (after a pass that started idle, the sends at its start stay seen)."""
    ahead = p.async_scheduling & (s.num_running > 0)
    return jnp.maximum(s.seen_ms, jnp.where(ahead, jnp.nextafter(s.last_start_ms, -jnp.inf), now_ms))


# ----------------------------------------------------------------------------------------------------
# phase 1: schedule the running list, in order


def schedule_running(p: EngineParams, s: EngineState, axis_name: str | None) -> RunningSchedule:
    """Budget tokens and KV blocks for every running request, in list order; when the pool cannot
    supply a request's blocks, the tail of the list is preempted until it fits (``tests/replay_support.py``,
    the running-list loop of ``oracle_replay``)."""
    slot = jnp.arange(s.running.shape[0])
    listed = slot < s.num_running
    requests = jnp.where(listed, s.running, _padding_row(s))
    rows = s.requests.rows(requests)
    length = rows.length
    allocated = jnp.where(listed, rows.allocated_blocks, 0)
    # a recompute that stopped one token short finishes with that token: it is not a decode
    decode = listed & (rows.generated > 0) & (rows.computed == length - 1) & ~rows.recomputing
    # a decode never schedules past the context limit (vLLM: max_model_len - 1 - computed tokens)
    decode_tokens = jnp.minimum(p.num_draft_tokens + 1, p.max_model_len - length)
    wanted = jnp.where(listed, jnp.where(decode, decode_tokens, length - rows.computed), 0)
    budget_left = jnp.maximum(p.max_num_batched_tokens - _cumsum_excl(wanted), 0)
    tokens = jnp.minimum(wanted, budget_left)
    live = listed & (budget_left > 0)
    target = jnp.where(decode, rows.computed + 1, rows.computed + tokens)
    new_blocks = jnp.where(live, jnp.maximum(blocks_for(target, p.block_size) + p.state_blocks - allocated, 0), 0)

    fits_keeping, keep_upto = _preemption_cut(p, s.num_running, allocated, new_blocks, live, axis_name)
    keep_before = jnp.concatenate([s.num_running[None], keep_upto[:-1]])
    scheduled = live & (slot < keep_before) & (fits_keeping > slot)
    num_kept = jnp.minimum(keep_upto[-1], s.num_running)
    any_preempted = num_kept < s.num_running
    stack, stack_size = jax.lax.cond(
        _any(any_preempted, axis_name),
        lambda: _push_preempted(s.preempted, s.num_preempted, requests, num_kept, s.num_running),
        lambda: (s.preempted, s.num_preempted),
    )
    return RunningSchedule(
        requests=requests, rows=rows, listed=listed, decode=decode, scheduled=scheduled,
        budget_tokens=jnp.where(scheduled, tokens, 0),
        allocated_blocks=jnp.where(scheduled, allocated + new_blocks, allocated),
        num_kept=num_kept, any_preempted=any_preempted, preempted=listed & (slot >= num_kept),
        stack=stack, stack_size=stack_size,
    )


def _preemption_cut(p: EngineParams, num_running, allocated, new_blocks, live, axis_name: str | None):
    """Per slot ``i``: the longest list prefix [0, t) that, kept, lets slot ``i`` allocate
    (``Σ_{j<t} allocated_j + Σ_{j<=i} new_blocks_j <= pool``), and its running minimum (where the tail
    is cut)."""
    num_slots = allocated.shape[0]

    def search():
        held = jnp.concatenate([jnp.zeros(1, jnp.int64), jnp.cumsum(allocated)])
        held = jnp.where(jnp.arange(num_slots + 1) <= num_running, held, jnp.iinfo(jnp.int64).max)
        room = p.num_gpu_blocks - jnp.cumsum(new_blocks)
        method = "compare_all" if num_slots <= 32 else "scan"
        t = jnp.searchsorted(held, room, side="right", method=method).astype(jnp.int64) - 1
        t = jnp.where(live, jnp.maximum(t, 0), num_running)
        return t, jax.lax.cummin(t)

    # every live slot allocates without preempting unless the pool is short by the end of the list
    # (live slots are a prefix; new_blocks is 0 after them). Most passes of the whole batch are not:
    # the search then runs in none of them.
    short = jnp.any(live) & (jnp.sum(allocated) + jnp.sum(new_blocks) > p.num_gpu_blocks)
    nobody = lambda: (jnp.full((num_slots,), num_running), jnp.full((num_slots,), num_running))  # noqa: E731
    return jax.lax.cond(_any(short, axis_name), search, nobody)


# ----------------------------------------------------------------------------------------------------
# phase 2: admit waiting requests


def admit(
    p: EngineParams, consts: ReplayConstants, s: EngineState, now_ms: Float64[Array, ""], running: RunningSchedule
) -> Admission:
    """Without a preemption in the pass, waiting requests (the preempted stack top first, then fresh
    arrivals) are admitted FCFS while ``max_num_seqs``, the budget and the free blocks (the whole known
    sequence must fit) allow."""
    num_slots = s.running.shape[0]
    pad = _padding_row(s)
    slot = jnp.arange(num_slots)
    from_stack = slot < running.stack_size
    stack_top_down = running.stack[jnp.clip(running.stack_size - 1 - slot, 0, num_slots - 1)]
    candidates = jnp.where(from_stack, stack_top_down, s.next_arrival + (slot - running.stack_size))
    visible_ms = _visible_ms(p, s, now_ms)
    arrived = from_stack | (s.sent_ms[jnp.clip(candidates, 0, pad + num_slots - 1)] <= visible_ms)
    candidates = jnp.where(arrived, candidates, pad)
    rows = s.requests.rows(candidates)
    materialized = arrived & rows.materialized
    length = rows.length
    wanted = jnp.where(materialized, jnp.minimum(p.num_draft_tokens + 1, p.max_model_len - length), length)
    budget_left = jnp.maximum(p.max_num_batched_tokens - jnp.sum(running.budget_tokens) - _cumsum_excl(wanted), 0)
    tokens = jnp.minimum(wanted, budget_left)
    blocks = blocks_for(jnp.where(materialized, length, tokens), p.block_size) + p.state_blocks
    free_blocks = p.num_gpu_blocks - jnp.sum(jnp.where(slot < running.num_kept, running.allocated_blocks, 0))
    fits = blocks_for(length, p.block_size) + p.state_blocks <= free_blocks - _cumsum_excl(blocks)
    seat = running.num_kept + slot < jnp.minimum(p.max_num_seqs, num_slots)
    ok = arrived & fits & seat & (tokens > 0) & ~running.any_preempted
    num_admitted = jnp.sum(jnp.cumprod(ok.astype(jnp.int32)) > 0)
    resumed = jnp.minimum(num_admitted, running.stack_size)
    stack_size = running.stack_size - resumed
    next_arrival = s.next_arrival + (num_admitted - resumed)
    # S slots below max_num_seqs, all taken, and a request still waiting: a larger capacity might have
    # admitted it. The pass is not applied; the replay continues at a larger S (replay.runner).
    waiting = (stack_size > 0) | (s.sent_ms[next_arrival] <= visible_ms)
    taken = running.num_kept + num_admitted >= num_slots
    slots_full = taken & (num_slots < p.max_num_seqs) & ~running.any_preempted & waiting
    return Admission(
        candidates=candidates, materialized=materialized, budget_tokens=tokens, allocated_blocks=blocks,
        num_admitted=num_admitted, stack_size=stack_size, next_arrival=next_arrival, slots_full=slots_full, visible_ms=visible_ms,
    )


def scheduled_list(s: EngineState, running: RunningSchedule, admission: Admission) -> ScheduledList:
    """The pass's list: the kept running slots, then the admitted requests (admitted: prefill from
    scratch, or decode at once when materialized)."""
    num_slots = s.running.shape[0]
    slot = jnp.arange(num_slots)
    kept = slot < running.num_kept
    nth = jnp.clip(slot - running.num_kept, 0, num_slots - 1)  # the admission a slot holds
    admitted = ~kept & (slot < running.num_kept + admission.num_admitted)
    requests = jnp.where(kept, running.requests, jnp.where(admitted, admission.candidates[nth], _padding_row(s)))
    rows = s.requests.rows(requests)
    materialized = admission.materialized[nth]
    scheduled = jnp.where(kept, running.scheduled, admitted)
    computed_before = jnp.where(kept, rows.computed, jnp.where(materialized, rows.length - 1, 0))
    admitted_new = jnp.where(materialized, 0, admission.budget_tokens[nth])
    new_computed = jnp.where(scheduled, jnp.where(kept, jnp.where(running.decode, 0, running.budget_tokens), admitted_new), 0)
    size = running.num_kept + admission.num_admitted
    return ScheduledList(
        requests=requests, rows=rows, size=size, listed=slot < size, admitted=admitted, scheduled=scheduled,
        decode=jnp.where(kept, running.decode & running.scheduled, admitted & materialized),
        budget_tokens=jnp.where(scheduled, jnp.where(kept, running.budget_tokens, admission.budget_tokens[nth]), 0),
        computed_before=computed_before, computed=computed_before + new_computed,
        allocated_blocks=jnp.where(kept, running.allocated_blocks, jnp.where(admitted, admission.allocated_blocks[nth], 0)),
    )


# ----------------------------------------------------------------------------------------------------
# phase 3: reserve KV for the speculative bursts


def reserve(
    p: EngineParams, batch: ScheduledList, running: RunningSchedule, admission: Admission, axis_name: str | None
) -> Reservation:
    """Speculative passes reserve, for every ready request, the blocks to grow by its burst
    (``min(scheduled tokens, remaining)`` for a decode, 1 for a completed prefill), preempting the tail
    of the list until the reservation fits."""
    slot = jnp.arange(batch.requests.shape[0])
    rows = batch.rows
    length = rows.length
    ready = batch.listed & batch.scheduled & (rows.generated < rows.output_tokens) & (batch.decode | (batch.computed == length))

    def fit():
        burst = jnp.where(batch.decode, jnp.minimum(batch.budget_tokens, rows.output_tokens - rows.generated), 1)
        wanted = jnp.where(ready, blocks_for(length + burst, p.block_size) - blocks_for(length, p.block_size), 0)
        cum_wanted = jnp.concatenate([jnp.zeros(1, jnp.int64), jnp.cumsum(wanted)])
        cum_held = jnp.concatenate([jnp.zeros(1, jnp.int64), jnp.cumsum(jnp.where(batch.listed, batch.allocated_blocks, 0))])
        fits = (cum_wanted + cum_held <= p.num_gpu_blocks) & (jnp.arange(slot.shape[0] + 1) <= batch.size)
        return jnp.where(p.num_draft_tokens > 0, jnp.sum(fits) - 1, batch.size)

    # autoregressive batches (no replay with K > 0) reserve nothing
    num_kept = jax.lax.cond(_any(p.num_draft_tokens > 0, axis_name), fit, lambda: batch.size)
    stack, stack_size = jax.lax.cond(
        _any(num_kept < batch.size, axis_name),
        lambda: _push_preempted(running.stack, admission.stack_size, batch.requests, num_kept, batch.size),
        lambda: (running.stack, admission.stack_size),
    )
    ready = ready & (slot < num_kept)
    return Reservation(
        num_kept=num_kept, preempted=batch.listed & (slot >= num_kept), ready=ready,
        decode_ready=ready & (rows.generated > 0), stack=stack, stack_size=stack_size,
    )


# ----------------------------------------------------------------------------------------------------
# phase 4: price the pass


def price(
    p: EngineParams, now_ms: Float64[Array, ""], passes: Int64[Array, ""], batch: ScheduledList, reservation: Reservation
) -> PassPrice:
    """Prefill lookup (requests computing prompt tokens: Σ new prompt tokens, Σ prompt tokens already
    cached) + decode lookup (ready requests that have emitted a token: Σ past KV), each rounded to whole
    nanoseconds. Requests the reservation preempted still count their prompt chunk."""
    rows = batch.rows
    cached = jnp.minimum(batch.computed_before, rows.prompt_tokens)
    new_prompt = jnp.where(batch.scheduled & ~batch.decode, jnp.minimum(batch.computed, rows.prompt_tokens) - cached, 0)
    prefilling = new_prompt > 0
    prefill_requests = jnp.sum(prefilling).astype(jnp.int64)
    prefill_tokens = jnp.sum(new_prompt)
    prefill_kv_tokens = jnp.sum(jnp.where(prefilling, cached, 0))
    decode_requests = jnp.sum(reservation.decode_ready).astype(jnp.int64)
    decode_kv_tokens = jnp.sum(jnp.where(reservation.decode_ready, rows.length - 1, 0))

    return price_lookups(p, now_ms, passes, prefill_requests, prefill_tokens, prefill_kv_tokens, decode_requests, decode_kv_tokens)


def price_lookups(
    p: EngineParams, now_ms: Float64[Array, ""], passes: Int64[Array, ""], prefill_requests: Int64[Array, ""],
    prefill_tokens: Int64[Array, ""], prefill_kv_tokens: Int64[Array, ""], decode_requests: Int64[Array, ""],
    decode_kv_tokens: Int64[Array, ""],
) -> PassPrice:
    """A pass's two lookups and its end on the reference's clock (each lookup rounded to whole nanoseconds)."""
    has_prefill, has_decode, prefill_ms, decode_ms, code = pass_lookups(
        p.table, prefill_requests, prefill_tokens, prefill_kv_tokens, decode_requests, decode_kv_tokens
    )
    code = _materialize(code)  # read by every per-slot update: computed once, not once per element
    unsupported = code >= st.FIRST_UNSUPPORTED
    # the reference's clock adds two rounded durations: no fused multiply-add may form here
    zero = _runtime_zero(passes)
    prefill_ms = jnp.where(has_prefill & ~unsupported, _pass_duration_ms(jnp.where(unsupported, 0.0, prefill_ms), zero), 0.0)
    decode_ms = jnp.where(has_decode & ~unsupported, _pass_duration_ms(jnp.where(unsupported, 0.0, decode_ms), zero), 0.0)
    prefill_ms, decode_ms = _opaque(prefill_ms, zero), _opaque(decode_ms, zero)
    end_ms = _materialize((now_ms + prefill_ms) + decode_ms)  # read by every per-slot and per-request update
    return PassPrice(
        prefill_requests=prefill_requests, prefill_tokens=prefill_tokens, prefill_kv_tokens=prefill_kv_tokens,
        decode_requests=decode_requests, decode_kv_tokens=decode_kv_tokens, status=code, unsupported=unsupported,
        end_ms=end_ms,
    )


# ----------------------------------------------------------------------------------------------------
# phase 5: emit tokens


def emit(
    p: EngineParams, key: jax.Array, stochastic: bool, passes: Int64[Array, ""], batch: ScheduledList,
    reservation: Reservation, cost: PassPrice,
) -> Emission:
    """All tokens of the pass are stamped at its end: a fresh prefill emits its first token, a decode
    round a burst (capped by the remaining output and by the tokens it was scheduled), a completed
    recompute one token. Nothing is emitted when the pass left measured support."""
    rows = batch.rows
    ready = reservation.ready & ~cost.unsupported
    firsts = ready & (rows.generated == 0)
    sampled = _bursts(p, key, stochastic, passes, batch.requests, rows.output_tokens - rows.generated)
    # a decode emits at most the tokens it was scheduled (fewer than K+1 when the budget ran short)
    burst = jnp.where(firsts | (batch.computed == rows.length), 1, jnp.minimum(sampled, batch.budget_tokens))
    generated = rows.generated + jnp.where(ready, burst, 0)
    computed = jnp.where(ready, rows.prompt_tokens + generated - 1, batch.computed)
    grown = jnp.maximum(batch.allocated_blocks, blocks_for(rows.prompt_tokens + generated, p.block_size) + p.state_blocks)
    allocated = jnp.where(ready & (p.num_draft_tokens > 0), grown, batch.allocated_blocks)
    done = ready & (generated >= rows.output_tokens)
    zero = _runtime_zero(passes)
    end_ms = cost.end_ms
    seen = rows.emitted_any
    gap_ms = _opaque(jnp.where(ready & seen, end_ms - rows.last_token_ms, 0.0), zero)
    return Emission(
        ready=ready, generated=generated, computed=computed, allocated_blocks=jnp.where(done, 0, allocated), done=done,
        first_token_ms=jnp.where(ready & ~seen, end_ms, rows.first_token_ms),
        second_token_ms=jnp.where(ready & seen & jnp.isnan(rows.second_token_ms), end_ms, rows.second_token_ms),
        last_token_ms=jnp.where(ready, end_ms, rows.last_token_ms),
        token_gap_sq_ms2=rows.token_gap_sq_ms2 + _opaque(gap_ms * gap_ms, zero),
    )


def _bursts(p: EngineParams, key, stochastic: bool, passes, requests, remaining) -> Int64[Array, " S"]:
    """Tokens each slot would emit in a decode round: 1 + accepted drafts (chained Bernoulli trials keyed
    by pass and request), capped by the remaining output."""
    if stochastic:
        pass_key = jax.random.fold_in(key, passes)
        keys = jax.vmap(lambda i: jax.random.fold_in(pass_key, i))(requests)
        return jax.vmap(sample_burst, in_axes=(0, None, None, 0))(keys, p.accept_rates, p.num_draft_tokens, remaining)
    # every rate is 0 or 1: the chained trials are certain
    certain = (p.accept_rates >= 1.0) & (jnp.arange(MAX_DRAFT_TOKENS) < p.num_draft_tokens)
    return jnp.minimum(1 + jnp.sum(jnp.cumprod(certain.astype(jnp.int64))), remaining)


# ----------------------------------------------------------------------------------------------------
# phase 6: commit the pass


def commit(p: EngineParams, consts: ReplayConstants, s: EngineState, record: PassRecord, closed_loop: bool = True) -> EngineState:
    """The state after the pass: request rows, running list, stack, clock, status and timeline (and, with the
    static ``closed_loop``, the send times a closed loop's completions release: :func:`_release_slots`). A pass
    that found its slots full (``SLOTS_FULL``) or a replay already inactive changes nothing but the
    status, so a batch of replays shares one loop without selecting whole states (the per-request
    arrays are only touched by scatters)."""
    active = _active(p, s)
    applied = active & ~record.admission.slots_full
    cost = record.price
    running, num_running = _next_running_list(s, record)
    num_done = s.num_done + jnp.sum(record.emission.done)
    small = dict(
        now_ms=jnp.where(cost.unsupported, record.now_ms, cost.end_ms), last_start_ms=record.now_ms,
        seen_ms=record.admission.visible_ms, passes=s.passes + 1,
        status=_pass_status(consts, s, record, num_done), num_done=num_done, num_running=num_running,
        peak_running=jnp.maximum(s.peak_running, record.scheduled.size), num_preempted=record.reservation.stack_size,
        next_arrival=record.admission.next_arrival, running=running,
        preempted=record.reservation.stack, failed_query=jnp.where(cost.unsupported, cost.query, s.failed_query),
    )
    small = {k: jnp.where(applied, v, getattr(s, k)) for k, v in small.items()}
    small["status"] = jnp.where(active & record.admission.slots_full, SLOTS_FULL, small["status"]).astype(jnp.int32)
    return EngineState(
        requests=_write_requests(s, record, applied), timeline=_write_timeline(consts, s, record, num_running, applied),
        sent_ms=_release_slots(p, consts, s, jnp.sum(record.emission.done), cost.end_ms, applied) if closed_loop else s.sent_ms,
        steps=s.steps, **small,
    )


def _release_slots(
    p: EngineParams, consts: ReplayConstants, s: EngineState, completions: Int64[Array, ""], end_ms: Float64[Array, ""],
    applied: Bool[Array, ""],
) -> Float64[Array, " M"]:
    """Closed loop (``max_concurrency`` C > 0, vLLM's ``asyncio.Semaphore(C)``, FIFO wake-ups): the k-th
    completion (0-based, in time order) releases the slot that row ``k + C`` acquires, so that row is
    sent at ``max(its arrival, end_ms)``; rows [0, C) are sent at their arrival (:func:`_start`). Send
    times stay non-decreasing in row order. Open loop: nothing is written.

    Any write into the send times (a row per request) makes XLA copy the whole array twice per loop step, so
    a step's cost grows with the trace's length: a stack of open loops (static ``closed_loop`` False in
    :func:`commit`) leaves them untouched."""
    slot = jnp.arange(s.running.shape[0])
    row = s.num_done + p.max_concurrency + slot
    acquire = applied & (p.max_concurrency > 0) & (slot < completions) & (row < consts.num_accepted)
    arrival_ms = consts.arrival_sorted_ms[jnp.clip(row, 0, consts.arrival_sorted_ms.shape[0] - 1)]
    return s.sent_ms.at[jnp.where(acquire, row, s.sent_ms.shape[0])].set(jnp.maximum(arrival_ms, end_ms), mode="drop")


def _write_requests(s: EngineState, record: PassRecord, applied: Bool[Array, ""]) -> RequestState:
    """Rows of the scheduled list (advanced by the emission; those the reservation preempted lose
    their KV) and of the running-loop preemptions, written when the pass is applied."""
    batch, reservation, emission = record.scheduled, record.reservation, record.emission
    rows = batch.rows
    advanced = rows.replace(
        generated=emission.generated, computed=emission.computed, allocated_blocks=emission.allocated_blocks,
        decode_rounds=rows.decode_rounds + reservation.decode_ready, admissions=rows.admissions + batch.admitted,
        materialized=rows.materialized & ~batch.admitted, done=rows.done | emission.done,
        recomputing=rows.recomputing & ~emission.ready, first_token_ms=emission.first_token_ms,
        second_token_ms=emission.second_token_ms, last_token_ms=emission.last_token_ms,
        token_gap_sq_ms2=emission.token_gap_sq_ms2,
    )
    scheduled_rows = _drop_kv(advanced, reservation.preempted)
    preempted_rows = _drop_kv(record.running.rows, record.running.preempted)
    nowhere = s.requests.num_rows
    index = jnp.concatenate([
        jnp.where(batch.listed & applied, batch.requests, nowhere),
        jnp.where(record.running.preempted & applied, record.running.requests, nowhere),
    ])
    rows = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), scheduled_rows, preempted_rows)
    return s.requests.write(index, rows)


def _next_running_list(s: EngineState, record: PassRecord):
    """The scheduled list without the preempted and finished requests, in order."""
    num_slots = s.running.shape[0]
    keep = record.scheduled.listed & ~record.reservation.preempted & ~record.emission.done
    pos = jnp.where(keep, jnp.cumsum(keep) - 1, num_slots)
    running = jnp.full((num_slots,), _padding_row(s), jnp.int64).at[pos].set(record.scheduled.requests, mode="drop")
    return running, jnp.sum(keep).astype(jnp.int64)


def _pass_status(consts: ReplayConstants, s: EngineState, record: PassRecord, num_done) -> Int32[Array, ""]:
    """Running, completed, stalled (no progress, or the head of the list preempting itself: it can
    never fit, its needs only grow) or the lookups' status outside measured support."""
    running, reservation = record.running, record.reservation
    head_lost = ((s.num_running > 0) & (running.num_kept == 0)) | ((record.scheduled.size > 0) & (reservation.num_kept == 0))
    progress = (
        jnp.any(running.preempted) | jnp.any(reservation.preempted) | (record.admission.num_admitted > 0)
        | jnp.any(record.scheduled.scheduled) | jnp.any(record.emission.ready)
    )
    stalled = head_lost | ~progress
    status = jnp.where(record.price.unsupported, record.price.status, jnp.where(stalled, STALLED, RUNNING)).astype(jnp.int32)
    return jnp.where((status == RUNNING) & (num_done >= consts.num_accepted), COMPLETED, status).astype(jnp.int32)


def _write_timeline(consts: ReplayConstants, s: EngineState, record: PassRecord, num_running, applied) -> Float64[Array, "T F"]:
    """The pass's row of the timeline (:data:`TIMELINE_FIELDS`), when the replay keeps one."""
    timeline = s.timeline
    if timeline.shape[0] == 0:
        return timeline
    cost, emission, reservation = record.price, record.emission, record.reservation
    arrived = jnp.sum(s.sent_ms <= record.now_ms)
    keep = record.scheduled.listed & ~reservation.preempted & ~emission.done
    fields = dict(
        start_ms=record.now_ms, end_ms=cost.end_ms, running=num_running,
        waiting=reservation.stack_size + arrived - record.admission.next_arrival,
        prefill_requests=cost.prefill_requests, prefill_tokens=cost.prefill_tokens, prefill_kv_tokens=cost.prefill_kv_tokens,
        decode_requests=cost.decode_requests, decode_kv_tokens=cost.decode_kv_tokens,
        kv_blocks_used=jnp.sum(jnp.where(keep, emission.allocated_blocks, 0)),
        preemptions=jnp.sum(record.running.preempted) + jnp.sum(reservation.preempted),
    )
    row = jnp.stack([jnp.asarray(fields[name]).astype(jnp.float64) for name in TIMELINE_FIELDS])
    return timeline.at[jnp.where(applied, s.passes, timeline.shape[0])].set(row, mode="drop")


# ----------------------------------------------------------------------------------------------------
# one pass


def engine_pass(
    p: EngineParams, consts: ReplayConstants, key: jax.Array, stochastic: bool, s: EngineState,
    axis_name: str | None = None, closed_loop: bool = True,
) -> EngineState:
    """One scheduler pass, as named phases (the specification: ``oracle_replay`` in
    ``tests/replay_support.py``); a no-op once the replay is inactive. ``axis_name``: the vmapped batch
    axis, when the pass runs vmapped over replays (a phase no replay of the batch needs is skipped). Static
    ``closed_loop`` False: every replay is an open loop (``max_concurrency`` 0; its send times never change)."""
    now_ms = _clock(consts, s)
    running = schedule_running(p, s, axis_name)
    admission = admit(p, consts, s, now_ms, running)
    batch = scheduled_list(s, running, admission)
    reservation = reserve(p, batch, running, admission, axis_name)
    cost = price(p, now_ms, s.passes, batch, reservation)
    emission = emit(p, key, stochastic, s.passes, batch, reservation, cost)
    return commit(p, consts, s, PassRecord(now_ms, running, admission, batch, reservation, cost, emission), closed_loop)


# ----------------------------------------------------------------------------------------------------
# a whole replay: start, loop, finish


def accepted_mask(p: EngineParams, rq: Requests) -> Bool[Array, " N"]:
    """Requests the worker can ever run: a prompt shorter than max_model_len whose blocks fit the pool
    (the reference rejects the others when they reach the queue head)."""
    return rq.valid & (rq.input_tokens < p.max_model_len) & (blocks_for(rq.input_tokens, p.block_size) + p.state_blocks <= p.num_gpu_blocks)


def _start(p: EngineParams, rq: Requests, slots: int, timeline_len: int) -> tuple[EngineState, ReplayConstants]:
    """Initial state plus the per-replay constants (accepted requests first, in arrival order)."""
    n = rq.arrival_ms.shape[0]
    accepted = accepted_mask(p, rq)
    order = jnp.argsort(~accepted, stable=True)
    num_accepted = jnp.sum(accepted).astype(jnp.int64)
    arrival_sorted_ms = jnp.concatenate([
        jnp.where(accepted[order], rq.arrival_ms[order], jnp.inf), jnp.full((int(slots),), jnp.inf)
    ])
    row = jnp.arange(arrival_sorted_ms.shape[0])
    # closed loop: the first C accepted requests are sent at their arrival, the others when a slot frees
    sent_ms = jnp.where((p.max_concurrency == 0) | (row < p.max_concurrency), arrival_sorted_ms, jnp.inf)
    with_padding_row = lambda a, v: jnp.concatenate([a, jnp.full((1,), v, a.dtype)])  # noqa: E731
    prompt = with_padding_row(rq.input_tokens[order].astype(jnp.int64), 0)
    room = jnp.maximum(p.max_model_len - prompt, 0)
    output = jnp.minimum(with_padding_row(rq.output_tokens[order].astype(jnp.int64), 0), room)
    materialized = with_padding_row(rq.materialized[order] & accepted[order], False)
    # a materialized request arrives with its prompt's KV and the prefill worker's token; its first decode round
    # emits the next. One whose output is a single token (asked for, or cut by max_model_len) has no next token:
    # its decode round computes the dangling last prompt token and emits its one token (else it never finishes)
    carried = materialized & (output > 1)
    zeros = jnp.zeros((n + 1,), jnp.int64)
    no = jnp.zeros((n + 1,), bool)
    never = jnp.full((n + 1,), jnp.nan)
    requests = RequestState.pack(
        prompt_tokens=prompt, output_tokens=output, generated=jnp.where(carried, 1, zeros),
        computed=jnp.where(carried, prompt, jnp.where(materialized, prompt - 1, zeros)), allocated_blocks=zeros, decode_rounds=zeros,
        preemptions=zeros, admissions=zeros, materialized=materialized, done=no, recomputing=no,
        first_token_ms=never, second_token_ms=never, last_token_ms=never, token_gap_sq_ms2=jnp.zeros((n + 1,)),
    )
    state = EngineState(
        now_ms=jnp.asarray(0.0), last_start_ms=jnp.asarray(-jnp.inf), seen_ms=jnp.asarray(-jnp.inf), passes=jnp.asarray(0, jnp.int64),
        steps=jnp.asarray(0, jnp.int64),
        status=jnp.where(num_accepted == 0, COMPLETED, RUNNING).astype(jnp.int32),
        num_done=jnp.asarray(0, jnp.int64), num_running=jnp.asarray(0, jnp.int64),
        peak_running=jnp.asarray(0, jnp.int64), num_preempted=jnp.asarray(0, jnp.int64), next_arrival=jnp.asarray(0, jnp.int64),
        sent_ms=sent_ms, running=jnp.full((int(slots),), n, jnp.int64),
        preempted=jnp.full((int(slots),), n, jnp.int64), requests=requests, failed_query=jnp.zeros((5,), jnp.int64),
        timeline=jnp.full((int(timeline_len), len(TIMELINE_FIELDS)), jnp.nan),
    )
    return state, ReplayConstants(arrival_sorted_ms=arrival_sorted_ms, num_accepted=num_accepted, order=order, accepted=accepted)


def _finish(rq: Requests, s: EngineState, consts: ReplayConstants) -> ReplayResult:
    """Per-request results in trace order."""
    n = rq.arrival_ms.shape[0]
    status = jnp.where(s.status == RUNNING, PASS_LIMIT, s.status).astype(jnp.int32)
    inverse = jnp.zeros((n,), jnp.int64).at[consts.order].set(jnp.arange(n))
    rows = jax.tree.map(lambda a: a[:n][inverse], s.requests)
    terminal = jnp.where(rows.done, DONE, UNFINISHED)
    terminal = jnp.where(rq.valid & consts.accepted, terminal, REJECTED).astype(jnp.int32)
    sent = s.sent_ms[:n][inverse]
    # rejected requests hold no semaphore slot: sent at their arrival
    sent_ms = jnp.where(consts.accepted, jnp.where(jnp.isinf(sent), jnp.nan, sent), rq.arrival_ms)
    return ReplayResult(
        first_token_ms=rows.first_token_ms, second_token_ms=rows.second_token_ms, last_token_ms=rows.last_token_ms,
        output_tokens=rows.generated, decode_rounds=rows.decode_rounds.astype(jnp.int32),
        preemptions=rows.preemptions.astype(jnp.int32), admissions=rows.admissions.astype(jnp.int32),
        token_gap_sq_ms2=rows.token_gap_sq_ms2, terminal=terminal, sent_ms=sent_ms, status=status, num_passes=s.passes,
        num_steps=s.steps,        end_ms=jnp.nanmax(jnp.where(terminal == DONE, rows.last_token_ms, jnp.nan), initial=0.0),
        failed_query=s.failed_query, timeline=s.timeline,
    )


def replay(
    p: EngineParams, rq: Requests, key: jax.Array, *, slots: int, stochastic: bool = True, timeline_len: int = 0,
    lookahead: int | None = None, closed_loop: bool = True,
) -> ReplayResult:
    """Replay one trace on one worker configuration (pure; see :func:`replay_stack` for many at once).

    Static: ``slots`` running-list slots (at least ``max_num_seqs``: fewer can end the replay with
    ``SLOTS_FULL``, which :mod:`jaxsim.replay.runner` continues at a larger capacity); ``stochastic=False`` is allowed when every acceptance
    rate is 0 or 1 (bursts are then certain and no random numbers are drawn); ``timeline_len`` keeps
    that many passes of per-pass records (0: none); ``lookahead``: the longest decode stretch a loop
    step advances (:mod:`jaxsim.replay.stretch`; None: its default; 0: pass by pass); ``closed_loop=False``
    is allowed when ``max_concurrency`` is 0 (no send time changes: a faster loop on long traces).
    """
    from jaxsim.replay.stretch import engine_step, lookahead_or_default

    ensure_x64()
    s0, consts = _start(p, rq, slots, timeline_len)
    body = partial(engine_step, p, consts, key, bool(stochastic), lookahead_or_default(lookahead), closed_loop=bool(closed_loop))
    s = jax.lax.while_loop(partial(_active, p), body, s0)
    return _finish(rq, s, consts)


# ----------------------------------------------------------------------------------------------------
# stacks of replays (leading item axis): start, advance, widen, finish


def param_axes(p: EngineParams, shared_table: bool):
    """``vmap`` axes of stacked parameters: every leaf along axis 0, or the table unmapped (one table
    for the whole stack: no copy per item)."""
    axes = jax.tree.map(lambda _: 0, p)
    if shared_table:
        axes = eqx.tree_at(lambda q: q.table, axes, jax.tree.map(lambda _: None, p.table))
    return axes


def start_stack(
    p: EngineParams, rq: Requests, *, slots: int, timeline_len: int = 0, shared_table: bool = False
) -> tuple[EngineState, ReplayConstants]:
    """Initial states and per-replay constants of a stack of items at ``slots`` running-list slots."""
    ensure_x64()
    ax = param_axes(p, shared_table)
    return jax.vmap(lambda pp, r: _start(pp, r, slots, timeline_len), in_axes=(ax, 0))(p, rq)


_BATCH = "replays"


def advance_stack(
    p: EngineParams, consts: ReplayConstants, keys: jax.Array, s: EngineState, max_steps=None, *,
    stochastic: bool = True, shared_table: bool = False, lookahead: int | None = None, closed_loop: bool = True,
) -> EngineState:
    """Run a stack of replays until none is active (finished, stopped, or out of slots: ``SLOTS_FULL``).
    One loop runs while any item is active, over the vmapped pass (a vmapped ``while_loop`` would select
    every item's whole state at every pass). A step runs a decode stretch of up to ``lookahead`` passes
    and one pass (:func:`jaxsim.replay.stretch.engine_step`). ``max_steps`` (optional, an int64 scalar:
    not static) ends the call after that many loop steps; calling again on the state it returns goes on
    exactly where it stopped (a step is a function of the state alone), so a long replay runs in chunks
    and reports its progress between them (:mod:`jaxsim.replay.runner`)."""
    from jaxsim.replay.stretch import engine_step, lookahead_or_default

    ensure_x64()
    ax = param_axes(p, shared_table)
    ahead = lookahead_or_default(lookahead)
    step = jax.vmap(
        lambda pp, c, k, s: engine_step(pp, c, k, bool(stochastic), ahead, s, _BATCH, bool(closed_loop)), in_axes=(ax, 0, 0, 0),
        axis_name=_BATCH,
    )

    def cond(s):
        return jnp.any(jax.vmap(_active, in_axes=(ax, 0))(p, s))

    if max_steps is None:
        return jax.lax.while_loop(cond, lambda s: step(p, consts, keys, s), s)
    limit = jnp.asarray(max_steps, jnp.int64)
    return jax.lax.while_loop(lambda sk: cond(sk[0]) & (sk[1] < limit), lambda sk: (step(p, consts, keys, sk[0]), sk[1] + 1),
                              (s, jnp.zeros((), jnp.int64)))[0]


def advance_until_stack(
    p: EngineParams, consts: ReplayConstants, keys: jax.Array, s: EngineState, stop_ms: Float64[Array, " B"],
    stop_done: Int64[Array, " B"] | None = None, *, stochastic: bool = True, shared_table: bool = False, closed_loop: bool = True,
) -> EngineState:
    """Run a stack of replays pass by pass (no decode stretch), each only while it is active and its next
    pass would start before its ``stop_ms``: a pass that starts at or after a request's arrival would see it,
    so a router in the loop (:mod:`jaxsim.replay.online`) stops every replica there, decides, adds the request
    to one of them and calls again; the passes are those of one uninterrupted replay of the same requests.
    ``stop_done`` (optional): a replay also stops right after the pass that takes its completed requests above
    it (multi-turn sessions, :mod:`jaxsim.replay.sessions`: a completion sends the session's next turn)."""
    from jaxsim.replay.stretch import engine_step

    ensure_x64()
    ax = param_axes(p, shared_table)
    step = jax.vmap(lambda pp, c, k, s: engine_step(pp, c, k, bool(stochastic), 0, s, _BATCH, bool(closed_loop)), in_axes=(ax, 0, 0, 0),
                    axis_name=_BATCH)
    limit = jnp.full_like(s.num_done, jnp.iinfo(jnp.int64).max) if stop_done is None else stop_done
    going = jax.vmap(lambda pp, c, s, stop, done: _active(pp, s) & (_clock(c, s) < stop) & (s.num_done <= done),
                     in_axes=(ax, 0, 0, 0, 0))

    def body(s):
        go = going(p, consts, s, stop_ms, limit)
        new = step(p, consts, keys, s)
        return jax.tree.map(lambda a, b: jnp.where(go.reshape(go.shape + (1,) * (a.ndim - 1)), a, b), new, s)

    return jax.lax.while_loop(lambda s: jnp.any(going(p, consts, s, stop_ms, limit)), body, s)


def fresh_row(prompt_tokens: Int64[Array, ""], output_tokens: Int64[Array, ""], max_model_len: Int64[Array, ""],
              materialized: Bool[Array, ""] | bool = False) -> RequestState:
    """A one-row RequestState: an accepted request of an open loop as the engine's start lays it out (its output
    capped by the context limit), before any pass; ``materialized``: it arrives with its prompt's KV and the prefill
    worker's token (a decode pool's request, laid out as :func:`_start` lays one out)."""
    one = lambda x, dtype: jnp.full((1,), x, dtype)  # noqa: E731
    zero, nan = one(0, jnp.int64), one(jnp.nan, jnp.float64)
    no = one(False, bool)
    output = jnp.minimum(output_tokens, jnp.maximum(max_model_len - prompt_tokens, 0))
    carried = materialized & (output > 1)
    return RequestState.pack(
        prompt_tokens=one(prompt_tokens, jnp.int64), output_tokens=one(output, jnp.int64),
        generated=one(jnp.where(carried, 1, 0), jnp.int64),
        computed=one(jnp.where(carried, prompt_tokens, jnp.where(materialized, prompt_tokens - 1, 0)), jnp.int64),
        allocated_blocks=zero, decode_rounds=zero, preemptions=zero, admissions=zero,
        materialized=one(materialized, bool), done=no, recomputing=no, first_token_ms=nan, second_token_ms=nan, last_token_ms=nan,
        token_gap_sq_ms2=one(0.0, jnp.float64),
    )


def insert_request_stack(
    s: EngineState, consts: ReplayConstants, rq: Requests, replica: Int64[Array, ""], row: Int64[Array, ""], sent_ms: Float64[Array, ""],
    prompt_tokens: Int64[Array, ""], output_tokens: Int64[Array, ""], max_model_len: Int64[Array, ""],
    materialized: Bool[Array, ""] | bool = False,
) -> tuple[EngineState, ReplayConstants, Requests]:
    """A stack of replays (:func:`start_stack` of empty traces) with request (``prompt_tokens``, ``output_tokens``)
    sent at ``sent_ms`` as replica ``replica``'s engine row ``row``: the next row after its accepted ones, laid out as
    the engine's start lays out an accepted request of an open loop (its output capped by the context limit; ``materialized``:
    a decode pool's request, :func:`fresh_row`). Rows
    must be added in send order; a replica that had completed runs again. Engines driven from the host one event at
    a time use it (a router in the loop: :mod:`jaxsim.replay.online`; sessions: :mod:`jaxsim.replay.sessions`)."""
    w, r = replica, row
    new = fresh_row(prompt_tokens, output_tokens, max_model_len, materialized)
    status = s.status.at[w].set(jnp.where(s.status[w] == COMPLETED, RUNNING, s.status[w]).astype(s.status.dtype))
    s = eqx.tree_at(lambda x: (x.sent_ms, x.requests.counts, x.requests.times, x.status), s,
                    (s.sent_ms.at[w, r].set(sent_ms), s.requests.counts.at[w, r].set(new.counts[0]),
                     s.requests.times.at[w, r].set(new.times[0]), status))
    consts = eqx.tree_at(
        lambda c: (c.arrival_sorted_ms, c.num_accepted, c.accepted), consts,
        (consts.arrival_sorted_ms.at[w, r].set(sent_ms), consts.num_accepted.at[w].set(r + 1), consts.accepted.at[w, r].set(True)),
    )
    rq = eqx.tree_at(
        lambda q: (q.arrival_ms, q.input_tokens, q.output_tokens, q.valid, q.materialized), rq,
        (rq.arrival_ms.at[w, r].set(sent_ms), rq.input_tokens.at[w, r].set(prompt_tokens), rq.output_tokens.at[w, r].set(output_tokens),
         rq.valid.at[w, r].set(True), rq.materialized.at[w, r].set(materialized)),
    )
    return s, consts, rq


def finish_stack(rq: Requests, s: EngineState, consts: ReplayConstants) -> ReplayResult:
    """Per-request results of a stack of finished replays."""
    ensure_x64()
    return jax.vmap(_finish)(rq, s, consts)


def widen_stack(s: EngineState, consts: ReplayConstants, slots: int) -> tuple[EngineState, ReplayConstants]:
    """Host-side (numpy): a stack's states and constants at ``slots`` (≥ the current) running-list slots;
    replays that ran out of slots (``SLOTS_FULL``) are running again. Nothing else changes, so a replay
    continued this way is the replay run at ``slots`` from the start. ``slots=0`` empties the slot
    arrays of finished replays (:func:`finish_stack` never reads them: one finishing executable serves
    every capacity; send times keep their N request rows)."""
    if slots == 0:  # works on ShapeDtypeStructs too
        empty = lambda a: np.zeros(a.shape[:-1] + (0,), a.dtype)  # noqa: E731
        n = s.requests.num_rows - 1
        if isinstance(s.sent_ms, jax.ShapeDtypeStruct):
            sent = jax.ShapeDtypeStruct(s.sent_ms.shape[:-1] + (n,), s.sent_ms.dtype)
        else:
            sent = np.asarray(s.sent_ms)[..., :n]
        s = eqx.tree_at(lambda t: (t.running, t.preempted, t.sent_ms), s, (empty(s.running), empty(s.preempted), sent))
        return s, eqx.tree_at(lambda c: c.arrival_sorted_ms, consts, empty(consts.arrival_sorted_ms))
    pad_row = s.requests.num_rows - 1
    pad = int(slots) - s.running.shape[-1]
    if pad < 0:
        raise ValueError(f"cannot narrow {s.running.shape[-1]} slots to {slots}")
    ext = lambda a, v: np.concatenate([np.asarray(a), np.full(a.shape[:-1] + (pad,), v, np.asarray(a).dtype)], axis=-1)  # noqa: E731
    status = np.where(np.asarray(s.status) == SLOTS_FULL, RUNNING, np.asarray(s.status)).astype(np.int32)
    s = eqx.tree_at(lambda t: (t.running, t.preempted, t.sent_ms, t.status), s,
                    (ext(s.running, pad_row), ext(s.preempted, pad_row), ext(s.sent_ms, np.inf), status))
    return s, eqx.tree_at(lambda c: c.arrival_sorted_ms, consts, ext(consts.arrival_sorted_ms, np.inf))


def replay_stack(
    p: EngineParams, rq: Requests, keys: jax.Array, *, slots: int, stochastic: bool = True, timeline_len: int = 0,
    shared_table: bool = False, lookahead: int | None = None, closed_loop: bool = True,
) -> ReplayResult:
    """Replays of a stack of (configuration, trace, key) items (leading axis of every argument), equal
    item by item to :func:`replay`.

    ``shared_table``: ``p.table`` has no leading axis and serves every item."""
    s0, consts = start_stack(p, rq, slots=slots, timeline_len=timeline_len, shared_table=shared_table)
    s = advance_stack(p, consts, keys, s0, stochastic=stochastic, shared_table=shared_table, lookahead=lookahead,
                      closed_loop=closed_loop)
    return finish_stack(rq, s, consts)


replay_jit = jit_x64(replay, static_argnames=("slots", "stochastic", "timeline_len", "lookahead", "closed_loop"))


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
    max_concurrency: int = 0,
    state_blocks: int = 0,
    async_scheduling: bool = False,
) -> EngineParams:
    """Validated :class:`EngineParams` for one worker (plain Python checks before any jit)."""
    ints = dict(
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, block_size=block_size,
        num_gpu_blocks=num_gpu_blocks, max_model_len=max_model_len, max_passes=max_passes,
    )
    for name, v in ints.items():
        if isinstance(v, bool) or int(v) != v or int(v) < 1:
            raise ValueError(f"{name}={v!r} must be an integer >= 1")
    if isinstance(max_concurrency, bool) or int(max_concurrency) != max_concurrency or int(max_concurrency) < 0:
        raise ValueError(f"max_concurrency={max_concurrency!r} must be an integer >= 0 (0: open loop)")
    if isinstance(state_blocks, bool) or int(state_blocks) != state_blocks or int(state_blocks) < 0:
        raise ValueError(f"state_blocks={state_blocks!r} must be an integer >= 0")
    if not isinstance(async_scheduling, (bool, np.bool_)):
        raise ValueError(f"async_scheduling={async_scheduling!r} must be true or false")
    k = int(num_draft_tokens)
    if not 0 <= k <= MAX_DRAFT_TOKENS:
        raise ValueError(f"num_draft_tokens={num_draft_tokens!r} must be within 0..{MAX_DRAFT_TOKENS}")
    rates = np.zeros(MAX_DRAFT_TOKENS) if accept_rates is None else np.asarray(accept_rates, dtype=np.float64).reshape(-1)
    if rates.shape != (MAX_DRAFT_TOKENS,) or not np.all((rates >= 0) & (rates <= 1)):
        raise ValueError(f"accept_rates must be {MAX_DRAFT_TOKENS} probabilities in [0, 1] (pad with acceptance.pad_rates)")
    rates = np.where(np.arange(MAX_DRAFT_TOKENS) < k, rates, 0.0)
    i64 = lambda v: jax.device_put(np.int64(int(v)))  # not jnp.asarray: no small jitted conversion per field
    return EngineParams(
        table=table, max_num_batched_tokens=i64(max_num_batched_tokens), max_num_seqs=i64(max_num_seqs),
        block_size=i64(block_size), num_gpu_blocks=i64(num_gpu_blocks), num_draft_tokens=i64(k),
        accept_rates=jax.device_put(np.asarray(rates, np.float64)), max_model_len=i64(max_model_len), max_passes=i64(max_passes),
        max_concurrency=i64(max_concurrency), state_blocks=i64(state_blocks),
        async_scheduling=jax.device_put(np.bool_(async_scheduling)),
    )


def is_stochastic(accept_rates) -> bool:
    """True when some acceptance rate is strictly between 0 and 1 (bursts must be sampled)."""
    r = np.asarray(accept_rates, dtype=np.float64)
    return bool(np.any((r > 0) & (r < 1)))


def slot_bucket(max_num_seqs: int) -> int:
    """Static running-list capacity for ``max_num_seqs`` (powers of two, at least 8)."""
    return pow2_bucket(max_num_seqs, 8)
