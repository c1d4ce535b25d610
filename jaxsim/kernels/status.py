"""Status codes carried by every compiled lookup result.

Codes below ``FIRST_UNSUPPORTED`` are answers; codes at or above it explain why a query lies outside
measured support. Nothing is ever extrapolated: an unsupported result has latency NaN.
"""

from __future__ import annotations

import numpy as np

EXACT = 0
WITHIN_CURVE = 1
CROSS_BATCH = 2
CROSS_KV = 3
KV_FIRST = 4
COMPOSED = 5
EMPTY = 6
NO_PREFILL_WORK = 7

FIRST_UNSUPPORTED = 16
BATCH_OUT_OF_RANGE = 16
KV_OUT_OF_RANGE = 17
NO_LOWER_BRACKET = 18
NO_UPPER_BRACKET = 19
REGIME_LOWER = 20
REGIME_UPPER = 21
BATCH_RATIO = 22
NOT_NEAREST = 23
PREFILL_BATCH_UNMEASURED = 24
PREFILL_NO_SUPPORT = 25
SD_MIXED_REFUSED = 26
INVALID_QUERY = 27
SUM_WITHOUT_REQUESTS = 28
PREFILL_TOKENS_BELOW_BATCH = 29

NAMES: dict[int, str] = {
    EXACT: "exact_lookup",
    WITHIN_CURVE: "within_curve_interpolation",
    CROSS_BATCH: "cross_batch_interpolation",
    CROSS_KV: "cross_kv_interpolation",
    KV_FIRST: "kv_first_interpolation",
    COMPOSED: "mixed_composition",
    EMPTY: "empty_iteration",
    NO_PREFILL_WORK: "no_prefill_work",
    BATCH_OUT_OF_RANGE: "unsupported:batch_outside_measured_range",
    KV_OUT_OF_RANGE: "unsupported:kv_outside_measured_range",
    NO_LOWER_BRACKET: "unsupported:no_lower_batch_covering_kv",
    NO_UPPER_BRACKET: "unsupported:no_upper_batch_covering_kv",
    REGIME_LOWER: "unsupported:lower_bracket_crosses_capture_regime",
    REGIME_UPPER: "unsupported:upper_bracket_crosses_capture_regime",
    BATCH_RATIO: "unsupported:batch_bracket_wider_than_4x",
    NOT_NEAREST: "unsupported:bracket_not_among_4_nearest_covering_batches",
    PREFILL_BATCH_UNMEASURED: "unsupported:prefill_batch_not_measured",
    PREFILL_NO_SUPPORT: "unsupported:no_same_batch_two_sided_prefill_support",
    SD_MIXED_REFUSED: "unsupported:speculative_round_has_no_mixed_composition",
    INVALID_QUERY: "unsupported:invalid_query",
    SUM_WITHOUT_REQUESTS: "unsupported:token_sum_without_requests",
    PREFILL_TOKENS_BELOW_BATCH: "unsupported:fewer_prefill_tokens_than_requests",
}

EXPLAIN: dict[int, str] = {
    BATCH_OUT_OF_RANGE: "batch size lies outside the measured batch sizes",
    KV_OUT_OF_RANGE: "total past KV lies outside every measured decode curve",
    NO_LOWER_BRACKET: "no measured lower batch curve covers this total KV",
    NO_UPPER_BRACKET: "no measured upper batch curve covers this total KV",
    REGIME_LOWER: "the lower covering batch lies across a capture-regime boundary",
    REGIME_UPPER: "the upper covering batch lies across a capture-regime boundary",
    BATCH_RATIO: "the covering batch bracket spans more than 4x in batch size",
    NOT_NEAREST: "the covering bracket is not among the 4 nearest covering batches",
    PREFILL_BATCH_UNMEASURED: "prefill is interpolated within one measured batch only",
    PREFILL_NO_SUPPORT: "no same-batch two-sided measured support (token-first or KV-first)",
    SD_MIXED_REFUSED: "a measured speculative round has no qualified mixed-iteration composition",
    INVALID_QUERY: "negative coordinates",
    SUM_WITHOUT_REQUESTS: "a KV or token sum is given for a phase with no requests",
    PREFILL_TOKENS_BELOW_BATCH: "a prefill lookup needs at least one new token per prefill request",
}


def is_supported(code: np.ndarray | int) -> np.ndarray | bool:
    """True where a status code is an answer (not unsupported)."""
    return np.asarray(code) < FIRST_UNSUPPORTED


def name(code: int) -> str:
    return NAMES.get(int(code), f"unknown:{int(code)}")


def names(codes: np.ndarray) -> np.ndarray:
    """Vectorized code → name (object array of str)."""
    table = np.array([NAMES.get(i, f"unknown:{i}") for i in range(64)], dtype=object)
    return table[np.asarray(codes, dtype=np.int64)]
