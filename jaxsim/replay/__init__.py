"""Trace replay: request traces, the JAX scheduler engine, metrics and batched replays.

Modules: :mod:`~jaxsim.replay.traces` (request traces), :mod:`~jaxsim.replay.engine` (one worker's
scheduler as a JAX state machine; its specification is the plain-Python oracle in
``tests/replay_support.py``), :mod:`~jaxsim.replay.executables` (its compiled entry points),
:mod:`~jaxsim.replay.runner` (many replays per compiled call, capacity by capacity),
:mod:`~jaxsim.replay.deployment` (pools, configurations, outcomes), :mod:`~jaxsim.replay.orchestrate`
(replaying deployments: replicas, disaggregated stages) and :mod:`~jaxsim.replay.metrics`.

Typical use::

    from jaxsim.deploy.binding import bind
    from jaxsim.rules.config import load_config
    from jaxsim.replay import config_from_binding, load_trace, run_replays

    cfg = config_from_binding(bind(load_config("configs/deployment_speculative.toml")))
    [outcome] = run_replays([cfg], load_trace("azure_code_1k", max_requests=200))
    outcome.summary["p99_ttft_ms"], outcome.status_text
"""

from jaxsim.replay.deployment import ReplayConfig, ReplayOutcome, WorkerPool, config_from_binding
from jaxsim.replay.engine import (
    EngineParams, ReplayResult, Requests, is_stochastic, make_params, replay, replay_jit, replay_stack, status_name,
)
from jaxsim.replay.executables import replay_many
from jaxsim.replay.metrics import aggregate, per_request, timeline_table
from jaxsim.replay.orchestrate import run_replays
from jaxsim.replay.runner import replay_batch, stack_params
from jaxsim.replay.traces import Trace, gamma_trace, list_traces, load_trace, make_trace, poisson_trace

__all__ = [
    "EngineParams", "ReplayConfig", "ReplayOutcome", "ReplayResult", "Requests", "Trace", "WorkerPool",
    "aggregate", "config_from_binding", "gamma_trace", "is_stochastic", "list_traces", "load_trace",
    "make_params", "make_trace", "per_request", "poisson_trace", "replay", "replay_batch", "replay_jit", "replay_many",
    "replay_stack", "run_replays", "stack_params", "status_name", "timeline_table",
]
