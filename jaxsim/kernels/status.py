"""The one status registry: every status code of jaxsim, its stable name and what it means.

Compiled results carry a status code (an int32 array, so that it can live inside jit); outputs carry the
code's NAME. Every code is defined here once, in a range of its own per family, so a code means one thing
wherever it appears:

========  =======  =========================================================================
range     family   produced by
========  =======  =========================================================================
0–15      lookup   round-time lookups that answer (:mod:`jaxsim.kernels.rounds`)
16–31     lookup   round-time lookups outside measured support (latency NaN, never extrapolated)
32–47     capacity KV capacity of one pool for one request shape (:mod:`jaxsim.kernels.capacity`)
48–63     sweep    steady-state sweep refusals (:mod:`jaxsim.sweep.evaluate`)
64–79     replay   replay outcomes (:mod:`jaxsim.replay.engine`); a replay stopped by a lookup
                   keeps the lookup's code (16–31)
========  =======  =========================================================================

Lookup codes 0–29 are the codes of the reference's lookup resolutions and are compared by the parity
tests: never renumber them. Where several statuses combine into one (a sweep configuration uses many
lookups), the worst is chosen by the explicit order :data:`SEVERITY` (:func:`worst`; on arrays, NumPy or
``jax.numpy``: :func:`worse`, :func:`worst_of`), never by comparing the numbers. Plain Python + NumPy:
importing this module imports no JAX.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Status:
    """One registered status: ``answer`` is True where the result holds a usable value."""

    code: int
    name: str
    family: str
    answer: bool
    explain: str


FAMILY_RANGES: dict[str, range] = {
    "lookup": range(0, 32),
    "capacity": range(32, 48),
    "sweep": range(48, 64),
    "replay": range(64, 80),
}
NUM_CODES = 80  # every code is below this (tables indexed by code have this length)

REGISTRY: dict[int, Status] = {}


def _define(code: int, name: str, family: str, answer: bool, explain: str) -> int:
    if code in REGISTRY or code not in FAMILY_RANGES[family]:
        raise AssertionError(f"status code {code} ({name}) is taken or outside the {family} range")
    if any(s.name == name for s in REGISTRY.values()):
        raise AssertionError(f"status name {name!r} is defined twice")
    REGISTRY[code] = Status(code, name, family, answer, explain)
    return code


# ---- lookup answers (0–15) ----------------------------------------------------------------------
EXACT = _define(0, "exact_lookup", "lookup", True, "a measured row")
WITHIN_CURVE = _define(1, "within_curve_interpolation", "lookup", True, "interpolated along the measured batch's curve")
CROSS_BATCH = _define(2, "cross_batch_interpolation", "lookup", True, "interpolated between two measured batches at the same total KV")
CROSS_KV = _define(3, "cross_kv_interpolation", "lookup", True, "prefill: interpolated along cached KV")
KV_FIRST = _define(4, "kv_first_interpolation", "lookup", True, "prefill: interpolated KV first, then tokens")
COMPOSED = _define(5, "mixed_composition", "lookup", True, "prefill + decode lookups of one pass, each inside measured support")
EMPTY = _define(6, "empty_iteration", "lookup", True, "no work: 0 ms")
NO_PREFILL_WORK = _define(7, "no_prefill_work", "lookup", True, "a prefill query with 0 new tokens: 0 ms")

# ---- lookup refusals (16–31): latency NaN --------------------------------------------------------
FIRST_UNSUPPORTED = 16  # lookup codes at or above this are refusals
BATCH_OUT_OF_RANGE = _define(16, "unsupported:batch_outside_measured_range", "lookup", False,
                             "batch size lies outside the measured batch sizes")
KV_OUT_OF_RANGE = _define(17, "unsupported:kv_outside_measured_range", "lookup", False,
                          "total past KV lies outside every measured decode curve")
NO_LOWER_BRACKET = _define(18, "unsupported:no_lower_batch_covering_kv", "lookup", False,
                           "no measured lower batch curve covers this total KV")
NO_UPPER_BRACKET = _define(19, "unsupported:no_upper_batch_covering_kv", "lookup", False,
                           "no measured upper batch curve covers this total KV")
REGIME_LOWER = _define(20, "unsupported:lower_bracket_crosses_capture_regime", "lookup", False,
                       "the lower covering batch lies across a capture-regime boundary")
REGIME_UPPER = _define(21, "unsupported:upper_bracket_crosses_capture_regime", "lookup", False,
                       "the upper covering batch lies across a capture-regime boundary")
BATCH_RATIO = _define(22, "unsupported:batch_bracket_wider_than_4x", "lookup", False,
                      "the covering batch bracket spans more than 4x in batch size")
NOT_NEAREST = _define(23, "unsupported:bracket_not_among_4_nearest_covering_batches", "lookup", False,
                      "the covering bracket is not among the 4 nearest covering batches")
PREFILL_BATCH_UNMEASURED = _define(24, "unsupported:prefill_batch_not_measured", "lookup", False,
                                   "prefill is interpolated within one measured batch only")
PREFILL_NO_SUPPORT = _define(25, "unsupported:no_same_batch_two_sided_prefill_support", "lookup", False,
                             "no same-batch two-sided measured support (token-first or KV-first)")
SD_MIXED_REFUSED = _define(26, "unsupported:speculative_round_has_no_mixed_composition", "lookup", False,
                           "a measured speculative round has no qualified mixed-iteration composition")
INVALID_QUERY = _define(27, "unsupported:invalid_query", "lookup", False, "negative coordinates")
SUM_WITHOUT_REQUESTS = _define(28, "unsupported:token_sum_without_requests", "lookup", False,
                               "a KV or token sum is given for a phase with no requests")
PREFILL_TOKENS_BELOW_BATCH = _define(29, "unsupported:fewer_prefill_tokens_than_requests", "lookup", False,
                                     "a prefill lookup needs at least one new token per prefill request")
COUNT_BEYOND_U32 = _define(30, "unsupported:count_beyond_32_bits", "lookup", False,
                           "a request count or token sum >= 2^32 (the FPM query fields are unsigned 32-bit)")

# ---- KV capacity of one pool (32–47) --------------------------------------------------------------
CAPACITY_OK = _define(32, "ok", "capacity", True, "at least one request of this shape fits the pool")
DOES_NOT_FIT = _define(33, "request_does_not_fit", "capacity", True,
                       "not even one request of this shape fits the pool (max concurrency 0)")
FIRST_REFUSED = 40  # capacity codes at or above this are refusals (max concurrency −1)
BLOCK_SIZE_INVALID = _define(40, "refused:block_size_must_be_positive", "capacity", False,
                             "a linear pool needs a positive block size")
NO_KV_BUDGET = _define(41, "refused:no_kv_budget_after_non_kv_resources", "capacity", False,
                       "no KV bytes are left after the non-KV resources")
INVALID_REQUEST = _define(42, "refused:invalid_request_lengths", "capacity", False,
                          "negative ISL/OSL or an empty request")

# ---- steady-state sweep refusals (48–63): metrics NaN ----------------------------------------------
REQUEST_EXCEEDS_KV_POOL = _define(48, "unsupported:request_exceeds_kv_pool", "sweep", False,
                                  "one request (ISL + OSL + lookahead) needs more KV blocks than the pool holds")
REQUEST_EXCEEDS_CONTEXT = _define(49, "unsupported:request_exceeds_max_model_len", "sweep", False,
                                  "ISL + OSL exceeds the deployment's context bound (max_model_len)")
PROMPT_EXCEEDS_PREFILL_POOL = _define(50, "unsupported:prompt_exceeds_prefill_kv_pool", "sweep", False,
                                      "a prompt does not fit the prefill worker's KV pool")
TOKEN_BUDGET_TOO_SMALL = _define(51, "unsupported:token_budget_below_one_decode_round", "sweep", False,
                                 "max_num_batched_tokens is below the nextn + 1 tokens of one decoding request")

# ---- replay outcomes (64–79); a replay stopped by a lookup carries that lookup's code ---------------
RUNNING = _define(64, "running", "replay", True, "the replay has not finished (never a final status)")
COMPLETED = _define(65, "completed", "replay", True, "every admitted request finished")
SLOTS_FULL = _define(66, "running list full", "replay", True,
                     "the running list of a replay run below max_num_seqs filled up; it continues at a larger "
                     "slot capacity (never a final status when the capacity covers max_num_seqs)")
STALLED = _define(72, "stalled: a request can never fit in the KV pool", "replay", False,
                  "the request at the head of the running list cannot get its KV blocks even with every other "
                  "request preempted; its needs only grow, so the replay stops")
PASS_LIMIT = _define(73, "stopped: pass limit reached", "replay", False, "the replay reached its pass limit")

SEVERITY: tuple[int, ...] = (
    # answers, best first
    EXACT, WITHIN_CURVE, CROSS_BATCH, CROSS_KV, KV_FIRST, COMPOSED, EMPTY, NO_PREFILL_WORK,
    CAPACITY_OK, RUNNING, SLOTS_FULL, COMPLETED, DOES_NOT_FIT,
    # a lookup outside measured support
    BATCH_OUT_OF_RANGE, KV_OUT_OF_RANGE, NO_LOWER_BRACKET, NO_UPPER_BRACKET, REGIME_LOWER, REGIME_UPPER,
    BATCH_RATIO, NOT_NEAREST, PREFILL_BATCH_UNMEASURED, PREFILL_NO_SUPPORT, SD_MIXED_REFUSED, INVALID_QUERY,
    SUM_WITHOUT_REQUESTS, PREFILL_TOKENS_BELOW_BATCH, COUNT_BEYOND_U32,
    # the configuration cannot serve the request at all (worse than any lookup refusal)
    BLOCK_SIZE_INVALID, NO_KV_BUDGET, INVALID_REQUEST,
    REQUEST_EXCEEDS_KV_POOL, REQUEST_EXCEEDS_CONTEXT, PROMPT_EXCEEDS_PREFILL_POOL, TOKEN_BUDGET_TOO_SMALL,
    PASS_LIMIT, STALLED,
)
"""Every code, from best to worst: the worst of several statuses is the one latest here."""

assert sorted(SEVERITY) == sorted(REGISTRY), "SEVERITY must list every registered code once"

RANK = np.full(NUM_CODES, -1, np.int32)
"""``RANK[code]`` = position of ``code`` in :data:`SEVERITY` (−1 for unregistered codes)."""
RANK[list(SEVERITY)] = np.arange(len(SEVERITY), dtype=np.int32)

NAMES: dict[int, str] = {c: s.name for c, s in REGISTRY.items()}
EXPLAIN: dict[int, str] = {c: s.explain for c, s in REGISTRY.items() if not s.answer}
"""Why a result is refused, per refusal code (answers are explained by :data:`REGISTRY`)."""
_NAME_TABLE = np.array([NAMES.get(i, f"unknown:{i}") for i in range(NUM_CODES)], dtype=object)
ANSWERS = np.array([REGISTRY[i].answer if i in REGISTRY else False for i in range(NUM_CODES)])
"""``ANSWERS[code]``: the code's result holds usable values (a lookup answer, a capacity, a completed replay)."""


def is_supported(code: np.ndarray | int | np.integer) -> np.ndarray | np.bool_:
    """True where a lookup status code is an answer (not unsupported)."""
    return np.asarray(code) < FIRST_UNSUPPORTED


def name(code: int | np.integer) -> str:
    return NAMES.get(int(code), f"unknown:{int(code)}")


def names(codes: np.ndarray) -> np.ndarray:
    """Vectorized code → name (object array of str)."""
    return _NAME_TABLE[np.asarray(codes, dtype=np.int64)]


def name_table() -> list[str]:
    """Names indexed by code (``unknown:<code>`` for unregistered codes): a dictionary for output columns."""
    return list(_NAME_TABLE)


def worse(a, b, xp=np):
    """The worse of two status codes, elementwise, by :data:`SEVERITY` (int32). ``xp`` is the array
    namespace: NumPy on the host, ``jax.numpy`` inside compiled code (this module imports no JAX)."""
    rank = xp.asarray(RANK)
    return xp.where(rank[b] > rank[a], b, a).astype(xp.int32)


def worst_of(codes, used=None, xp=np):
    """The worst of the ``used`` status codes (all when ``used`` is None; any shape) by :data:`SEVERITY`,
    as an int32 scalar; :data:`EXACT` when none is used. ``xp`` as in :func:`worse`."""
    codes = xp.asarray(codes, xp.int32).ravel()
    ranks = xp.asarray(RANK)[codes]
    if used is not None:
        ranks = xp.where(xp.asarray(used).ravel(), ranks, -1)
    return xp.where(xp.max(ranks) >= 0, codes[xp.argmax(ranks)], EXACT).astype(xp.int32)


def worst(*codes: int | np.integer) -> int:
    """The worst of some status codes by :data:`SEVERITY` (Python ints; arrays: :func:`worst_of`)."""
    return max((int(c) for c in codes), key=lambda c: int(RANK[c]))
