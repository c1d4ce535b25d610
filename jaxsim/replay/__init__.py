"""Trace replay: request traces, the JAX scheduler engine, metrics and batched replays.

Modules: :mod:`~jaxsim.replay.traces` (request traces), :mod:`~jaxsim.replay.engine` (one worker's
scheduler as a JAX state machine; its specification is the plain-Python oracle in
``tests/replay_support.py``), :mod:`~jaxsim.replay.executables` (its compiled entry points),
:mod:`~jaxsim.replay.runner` (many replays per compiled call, capacity by capacity),
:mod:`~jaxsim.replay.deployment` (pools, configurations, outcomes), :mod:`~jaxsim.replay.orchestrate`
(replaying deployments: replicas, disaggregated stages), :mod:`~jaxsim.replay.metrics` and
:mod:`~jaxsim.replay.results` (the request and timeline tables, the files ``jaxsim replay`` writes).

Typical use::

    from jaxsim.deploy.binding import bind
    from jaxsim.rules.config import load_config
    from jaxsim.replay import config_from_binding, load_trace, run_replays, write_results

    cfg = config_from_binding(bind(load_config("configs/deployment_speculative.toml")))
    [outcome] = run_replays([cfg], load_trace("azure_code_1k", max_requests=200))
    outcome.summary["p99_ttft_ms"], outcome.status_text
    write_results([outcome], "replay.parquet")  # what `jaxsim replay --output replay.parquet` writes

``__all__`` is the public API, imported on first use (importing the package imports no JAX).
"""

from jaxsim._lazy import lazy_api

__getattr__, __all__ = lazy_api(
    "jaxsim.replay",
    {
        **dict.fromkeys(("ReplayConfig", "ReplayOutcome", "WorkerPool", "config_from_binding"), "deployment"),
        **dict.fromkeys(
            ("EngineParams", "ReplayResult", "Requests", "is_stochastic", "make_params", "replay", "replay_jit", "replay_stack", "status_name"),
            "engine",
        ),
        "replay_many": "executables",
        **dict.fromkeys(("aggregate", "per_request", "timeline_table"), "metrics"),
        "run_replays": "orchestrate",
        **dict.fromkeys(("request_table", "write_results"), "results"),
        **dict.fromkeys(("replay_batch", "stack_params"), "runner"),
        **dict.fromkeys(("Trace", "gamma_trace", "list_traces", "load_trace", "make_trace", "poisson_trace"), "traces"),
    },
)
