"""Compiled kernels: pure array functions per physical quantity, written for one query and vmapped at
the call site; validation happens before (:mod:`jaxsim.rules`), results carry status codes.

* :mod:`jaxsim.kernels.support` / :mod:`jaxsim.kernels.rounds`: a profile cell compiled into flat lookup
  arrays (:class:`RoundTable`) and the decode / prefill / mixed / scheduler-pass lookups;
* :mod:`jaxsim.kernels.tables`: the one cache of compiled profile cells (bundle, deployment, DCP → table);
* :mod:`jaxsim.kernels.batched`: kernels over host query columns (padded, chunked, sharded);
* :mod:`jaxsim.kernels.queries`: validated round-timing queries (:mod:`jaxsim.query_files`) through the kernels;
* :mod:`jaxsim.kernels.capacity`: KV pool bytes → tokens → blocks → concurrency, KV transfer time;
* :mod:`jaxsim.kernels.acceptance`: speculative acceptance (expected tokens per round, sampled bursts);
* :mod:`jaxsim.kernels.status`: the one status registry (codes, names, explanations, severity);
* :mod:`jaxsim.kernels.buckets`: power-of-two compile-shape buckets.

``__all__`` is the public API, imported on first use (importing the package imports no JAX).
"""

from jaxsim._lazy import lazy_api

__getattr__, __all__ = lazy_api("jaxsim.kernels", {
    **dict.fromkeys(("RoundTable", "compile_round_table", "common_tables", "stack_round_tables", "decode_latency_ms",
                     "prefill_latency_ms", "prefill_query_ms", "mixed_latency_ms", "scheduler_pass_latency_ms", "pass_lookups",
                     "decode_batch", "prefill_batch", "mixed_batch"), "rounds"),
    **dict.fromkeys(("load_round_table", "round_table"), "tables"),
    **dict.fromkeys(("run_batched", "decode_points", "support_grid", "prefill_grid"), "batched"),
    **dict.fromkeys(("KvPool", "PoolCapacity", "pool_capacity", "make_pool", "kv_transfer_ms",
                     "blocks_for", "request_blocks", "max_concurrency"), "capacity"),
    **dict.fromkeys(("expected_tokens_per_round", "sample_burst"), "acceptance"),
    "pow2_bucket": "buckets",
})
