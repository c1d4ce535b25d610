"""Trace replay: request traces, the JAX scheduler engine, metrics and batched replays."""

from jaxsim.replay.traces import Trace, gamma_trace, list_traces, load_trace, make_trace, poisson_trace

__all__ = ["Trace", "gamma_trace", "list_traces", "load_trace", "make_trace", "poisson_trace"]
