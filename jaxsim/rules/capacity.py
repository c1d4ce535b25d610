"""KV-cache capacity rules in plain Python (no JAX): what a request asks of a pool, and every reason the
reference refuses it — checked before anything is compiled (``jaxsim validate`` imports only this).

The equality checks of the reference (requested memory fraction == recorded, scheduler envelope ==
recorded, no CUDA-graph reservation on a runtime pool, context within bounds, GPU budget holds the pool)
are exact float/int comparisons. The compiled capacity kernels are in :mod:`jaxsim.kernels.capacity`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jaxsim.fields import is_int, is_number
from jaxsim.profile.cache_pages import group_pages
from jaxsim.profile.model import DECLARED_BYTE_FIELDS, Resources

__all__ = [
    "VLLM_DEFAULT_GPU_MEMORY_UTILIZATION",
    "CapacityRequest",
    "KvCacheEstimate",
    "block_size_problem",
    "capacity_problems",
    "non_kv_bytes",
    "request_cache_bytes",
]

VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9


# ----------------------------------------------------------------------------------------------------
# requests and pre-dispatch checks (plain Python)


@dataclass(frozen=True)
class CapacityRequest:
    """What an engine asks of a profile's pool (the reference's cache-budget request)."""

    total_gpu_bytes: int
    memory_fraction_value: float
    max_num_tokens: int
    max_batch_size: int
    memory_fraction_kind: str = "of_total"
    context_length: int | None = None
    block_size: int = 64
    nextn: int = 0
    cuda_graph_reserved_bytes: int = 0
    tolerance_fraction: float | None = None


def block_size_problem(block_size) -> str | None:
    """The block count needs a positive integer scheduler block."""
    if not is_int(block_size) or block_size <= 0:
        return f"block-size: scheduler block_size must be a positive integer (got {block_size!r})"
    return None


def request_cache_bytes(res: Resources, length_tokens: int, step_tokens: int) -> int:
    """Bytes one request of ``length_tokens`` holds in this deployment's KV cache (exact integers):
    ``length × kv_bytes_per_token`` for a linear cache, pages × page bytes summed over the groups of a
    grouped one (:func:`group_pages`)."""
    if res.cache_layout == "linear":
        return int(length_tokens) * int(res.kv_bytes_per_token or 0)
    return sum(int(group_pages(int(length_tokens), g.block_size_tokens, g.sliding_window or 0, int(step_tokens))) * g.page_size_bytes
               for g in res.cache_groups)


def non_kv_bytes(res: Resources) -> int:
    """Sum of the declared non-KV byte fields (0 for fields left unset)."""
    return sum(getattr(res, f) or 0 for f in DECLARED_BYTE_FIELDS)


def capacity_problems(
    res: Resources, profile_context_length: int, req: CapacityRequest, *, num_draft_tokens: int = 0
) -> list[str]:
    """Every reason the reference refuses this request against this deployment's resources, one line each.

    ``num_draft_tokens`` is the profile's measured-round depth (0 for autoregressive profiles). The block
    size is checked separately (:func:`block_size_problem`): a bad block refuses only the block count.
    """
    out: list[str] = []
    if req.memory_fraction_kind != "of_total":
        out.append(
            f"memory-fraction-kind: vLLM FPM resources require memory_fraction_kind='of_total' "
            f"(got {req.memory_fraction_kind!r})"
        )
    frac = req.memory_fraction_value
    if not is_number(frac) or not (math.isfinite(frac) and 0.0 < frac <= 1.0):
        out.append(f"gpu-memory-utilization: memory fraction must be finite in (0, 1] (got {frac!r})")
        frac = None
    tol = req.tolerance_fraction
    if tol is not None and not (is_number(tol) and math.isfinite(tol) and 0.0 <= tol < 1.0):
        out.append(f"tolerance: tolerance_fraction must be finite and in [0, 1) (got {tol!r})")
    if num_draft_tokens > 0 and req.nextn != num_draft_tokens:
        out.append(
            "sd-nextn: speculative-round FPM nextn must match num_draft_tokens and cannot use generic speculation "
            f"(nextn={req.nextn}, num_draft_tokens={num_draft_tokens})"
        )
    if num_draft_tokens == 0 and req.nextn != 0:
        out.append(
            f"ar-nextn: FPM profile resources support plain autoregressive execution; nextn must be 0 (got {req.nextn})"
        )
    src = res.memory_source
    if src == "pending":
        out.append(
            "memory-pending: FPM memory is pending runtime profiling: the deployment has neither runtime_memory nor all four declared byte fields"
        )
        return out
    rm = res.runtime_memory
    bound = profile_context_length if rm is None else min(profile_context_length, rm.max_model_len)
    ctx = req.context_length
    if ctx is not None and not (0 < ctx <= bound):
        out.append(
            f"context-length: context_length must be positive and within the FPM profile context bound "
            f"(got {ctx}, bound {bound} = min(profile context_length {profile_context_length}"
            + (f", max_model_len {rm.max_model_len})" if rm is not None else ")")
        )
    if rm is not None:
        if frac is not None and frac != rm.gpu_memory_utilization:
            out.append(
                f"gpu-memory-utilization: memory fraction must equal the recorded runtime gpu_memory_utilization "
                f"(got {frac!r}, recorded {rm.gpu_memory_utilization!r})"
            )
        if req.cuda_graph_reserved_bytes != 0:
            out.append(
                f"cuda-graph-reserved: runtime memory already includes graph reservations; cuda_graph_reserved_bytes "
                f"must be 0 (got {req.cuda_graph_reserved_bytes})"
            )
        if req.max_num_tokens != res.max_num_tokens:
            out.append(
                f"scheduler-envelope: runtime memory requires the exact recorded rank-local max_num_tokens="
                f"{res.max_num_tokens} (got {req.max_num_tokens}); collect new runtime memory for changed scheduler settings"
            )
        if req.max_batch_size != res.max_batch_size:
            out.append(
                f"scheduler-envelope: runtime memory requires the exact recorded rank-local max_batch_size="
                f"{res.max_batch_size} (got {req.max_batch_size}); collect new runtime memory for changed scheduler settings"
            )
        if frac is not None and not (req.total_gpu_bytes * frac >= rm.kv_cache_bytes):
            out.append(
                f"gpu-memory-fit: GPU memory budget is smaller than the recorded runtime KV cache allocation "
                f"({req.total_gpu_bytes} B × {frac!r} < kv_cache_bytes {rm.kv_cache_bytes})"
            )
    else:
        if req.max_num_tokens > res.max_num_tokens or req.max_batch_size > res.max_batch_size:
            out.append(
                f"scheduler-envelope: scheduler envelope exceeds the declared profile bounds "
                f"(max_num_tokens {req.max_num_tokens} > {res.max_num_tokens} or max_batch_size "
                f"{req.max_batch_size} > {res.max_batch_size})"
            )
        if frac is not None:
            budget = math.floor(req.total_gpu_bytes * frac - float(non_kv_bytes(res) + req.cuda_graph_reserved_bytes))
            if budget <= 0:
                out.append(
                    f"no-kv-budget: no KV budget after non-KV resources and CUDA graphs "
                    f"({req.total_gpu_bytes} B × {frac!r} − {non_kv_bytes(res)} − {req.cuda_graph_reserved_bytes} ≤ 0)"
                )
    if res.cache_layout == "grouped" and num_draft_tokens > 0:
        out.append("grouped-cache: kv_cache_groups currently do not support speculative decoding")
    return out


@dataclass(frozen=True)
class KvCacheEstimate:
    """The reference's cache estimate for one accepted request (bytes/tokens exact integers)."""

    total_gpu_capacity_bytes: int
    total_kv_size_bytes: int
    kv_size_per_token_bytes: int | None
    total_kv_size_tokens: int | None
    tolerance_fraction: float | None
    tolerance_kv_size_bytes: int | None
    tolerance_kv_size_tokens: int | None
    request_peak_cache_bytes: int
    num_gpu_blocks: int | None
    blocks_problem: str | None
    source: str
    context_length: int

    @property
    def usable_kv_bytes(self) -> int:
        """Pool bytes after tolerance (the pool replay and concurrency use)."""
        return self.total_kv_size_bytes if self.tolerance_kv_size_bytes is None else self.tolerance_kv_size_bytes
