"""Deployments to replay and what a replay of one returns: worker pools (a compiled table, its scheduler
envelope and KV pool, its replicas), aggregated or disaggregated (prefill + decode pools joined by a KV
link) configurations built from a validated binding, and the per-(configuration, seed) outcome."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxsim.errors import BindingError
from jaxsim.kernels.capacity import blocks_for
from jaxsim.kernels.rounds import RoundTable
from jaxsim.overhead import ServingOverhead
from jaxsim.replay.engine import EngineParams, is_stochastic, make_params
from jaxsim.router import Router


@dataclass(frozen=True, eq=False)
class WorkerPool:
    """One role: a compiled table, its scheduler envelope and KV pool, and how many replicas serve it.

    Requests go to replicas as the deployment's router decides (:class:`~jaxsim.router.Router`; round-robin
    in arrival order by default).
    """

    table: RoundTable
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    num_gpu_blocks: int
    max_model_len: int
    replicas: int = 1
    state_blocks: int = 0  # fixed blocks every request holds (a grouped cache's window and state groups)
    prefix_caching: bool = True  # requests sharing a prompt prefix read its cached blocks (a trace with hash_ids)
    async_scheduling: bool = False  # vLLM's async scheduling (a pass scheduled while the previous one runs); off: as the reference

    def params(self, nextn: int, accept_rates, max_passes: int, max_concurrency: int = 0) -> EngineParams:
        return make_params(
            self.table, max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=self.max_num_seqs,
            block_size=self.block_size, num_gpu_blocks=self.num_gpu_blocks, num_draft_tokens=nextn,
            accept_rates=accept_rates, max_model_len=self.max_model_len, max_passes=max_passes,
            max_concurrency=max_concurrency, state_blocks=self.state_blocks, async_scheduling=bool(self.async_scheduling),
        )


@dataclass(frozen=True, eq=False)
class ReplayConfig:
    """A deployment to replay: one aggregated pool, or prefill + decode pools joined by a KV link.

    Disaggregated: a prefill replica computes the prompt and its first token; the KV then travels
    (``input_tokens × kv_bytes_per_token / kv_transfer_bytes_per_s``) to a decode replica, where the
    request arrives with its prompt cached and is observed from its first decode round on (TTFT =
    prefill + transfer + first round).

    ``max_concurrency`` C > 0 replays a closed loop (``vllm bench serve --max-concurrency C``): per
    replica, a semaphore of C over the requests routed to that replica (round-robin in arrival order),
    each request sent when it has arrived and a slot is free, FIFO; TTFT and E2E are measured from the
    send. 0: open loop (every request sent at its arrival). Disaggregated: C clients over the whole
    pipeline (a request holds its client from its send to its last decode token, the next request in arrival
    order is sent when one completes; :mod:`jaxsim.replay.pd_closed_loop`), the prefill pool round-robin in
    send order.

    ``router`` routes the aggregated pool's or the prefill pool's requests over its replicas (a disaggregated
    deployment's decode pool takes its requests round-robin); any policy but round-robin needs an open loop.
    """

    name: str
    nextn: int
    accept_rates: np.ndarray
    aggregated: WorkerPool | None = None
    prefill: WorkerPool | None = None
    decode: WorkerPool | None = None
    kv_bytes_per_token: int | None = None
    kv_transfer_bytes_per_s: float | None = None
    data_source: str = "measured"  # what the profile's numbers are (measured, derived, modelled, calibrated)
    max_concurrency: int = 0  # closed loop: requests in flight per replica (disaggregated: in the whole pipeline; 0: open loop)
    overhead: ServingOverhead = ServingOverhead()  # serving overhead added per request on the host (zero unless set)
    router: Router = Router()  # how the first pool's requests go to its replicas

    def __post_init__(self):
        agg = self.aggregated is not None
        pd = self.prefill is not None and self.decode is not None
        if agg == pd:
            raise ValueError(f"{self.name}: give either an aggregated pool or a prefill and a decode pool")
        if pd and not (self.kv_bytes_per_token and self.kv_transfer_bytes_per_s and self.kv_transfer_bytes_per_s > 0):
            raise ValueError(f"{self.name}: disaggregated replay needs kv_bytes_per_token and a positive KV link bandwidth")
        if isinstance(self.max_concurrency, bool) or int(self.max_concurrency) != self.max_concurrency or self.max_concurrency < 0:
            raise ValueError(f"{self.name}: max_concurrency={self.max_concurrency!r} must be an integer >= 0 (0: open loop)")
        if self.router.routed and self.max_concurrency:
            raise ValueError(f"{self.name}: router {self.router.policy!r} with a closed loop: the closed loop runs per replica over "
                             "round-robin shares; replay an open-loop trace or load to route by state")

    @property
    def mode(self) -> str:
        return "aggregated" if self.aggregated is not None else "disaggregated"

    @property
    def pools(self) -> tuple[WorkerPool, ...]:
        return (self.aggregated,) if self.aggregated is not None else (self.prefill, self.decode)

    @property
    def stochastic(self) -> bool:
        return is_stochastic(np.asarray(self.accept_rates)[: self.nextn])

    def rejection_reasons(self, input_tokens) -> np.ndarray:
        """Why each request would be rejected ('' when a worker can run it): the plain-numpy twin of
        :func:`jaxsim.replay.engine.accepted_mask` applied to every pool the request passes through."""
        inp = np.asarray(input_tokens, np.int64)
        out = np.full(inp.shape, "", dtype=object)
        for role, pool in zip(("",) if self.aggregated is not None else ("prefill ", "decode "), self.pools):
            blocks = blocks_for(inp, pool.block_size) + pool.state_blocks
            too_long = (inp >= pool.max_model_len) & (out == "")
            for i in np.flatnonzero(too_long):
                out[i] = f"{role}prompt of {int(inp[i]):,} tokens >= max_model_len {pool.max_model_len:,}"
            too_big = (blocks > pool.num_gpu_blocks) & (out == "")
            for i in np.flatnonzero(too_big):
                out[i] = f"{role}prompt needs {int(blocks[i]):,} KV blocks > the pool's {pool.num_gpu_blocks:,}"
        return out


def _pool_from_role(rb, block_size: int, context_length: int) -> WorkerPool:
    if rb.blocks.num_gpu_blocks is None:
        raise BindingError(f"roles.{rb.name}: no KV block count for replay ({rb.blocks.problem})")
    return WorkerPool(
        table=rb.table, max_num_batched_tokens=int(rb.max_num_batched_tokens), max_num_seqs=int(rb.max_num_seqs),
        block_size=int(block_size), num_gpu_blocks=int(rb.blocks.num_gpu_blocks),
        max_model_len=min(int(rb.kv.context_length), int(context_length)), replicas=int(rb.replicas) * int(rb.role.dp),  # DP ranks
        state_blocks=int(rb.blocks.state_blocks), prefix_caching=bool(rb.role.prefix_caching),
        async_scheduling=bool(rb.role.async_scheduling),
    )


def config_from_binding(b, name: str | None = None) -> ReplayConfig:
    """A :class:`ReplayConfig` from a :class:`jaxsim.deploy.binding.Binding` (the one place a binding
    becomes a replay configuration)."""
    label = name or Path(str(b.config.source)).stem
    pools = {role: _pool_from_role(rb, b.block_size, b.context_length) for role, rb in b.roles.items()}
    rates = np.asarray(b.accept_rates, np.float64)
    if b.mode == "aggregated":
        return ReplayConfig(label, int(b.nextn), rates, aggregated=pools["aggregated"], data_source=b.data_source,
                            overhead=b.config.overhead, router=b.config.router)
    return ReplayConfig(
        label, int(b.nextn), rates, prefill=pools["prefill"], decode=pools["decode"],
        kv_bytes_per_token=int(b.prefill.kv_bytes_per_token), kv_transfer_bytes_per_s=float(b.kv_transfer_bytes_per_s),
        data_source=b.data_source, overhead=b.config.overhead, router=b.config.router,
    )


@dataclass(eq=False)
class ReplayOutcome:
    """One (configuration, seed) replay of a trace: per-request columns (trace order), aggregates and
    the replay status (``completed`` unless a pass left measured support, a request can never fit, or
    the pass limit was hit)."""

    config: ReplayConfig
    seed: int
    status: int
    status_text: str
    requests: dict
    summary: dict
    timeline: list[dict] | None = None  # one pass timeline per worker pool (metrics.timeline_table)
    failed_query: tuple | None = None  # the stopping pass's lookup (engine.PassPrice.query)
    routing: dict | None = None  # how a routed pool's requests went to its replicas (routing.RoutingSummary.to_json)

    @property
    def failure(self) -> str:
        """The stopping pass's lookup (for a replay stopped outside measured support), else ''."""
        if self.failed_query is None:
            return ""
        prefill_requests, prefill_tokens, prefill_kv_tokens, decode_requests, decode_kv_tokens = self.failed_query
        parts = []
        if prefill_requests:
            parts.append(f"prefill(batch={prefill_requests}, tokens={prefill_tokens}, kv={prefill_kv_tokens})")
        if decode_requests:
            parts.append(f"decode(batch={decode_requests}, kv={decode_kv_tokens})")
        return " + ".join(parts)
