"""A routed pool replayed with its router in the loop.

Every replica's engine runs up to the next arrival (each replica stops before the first pass that would
start at or after it: :func:`~jaxsim.replay.engine.advance_until_stack`), the router reads the replicas'
first-token and completion times and decides (:func:`~jaxsim.replay.routing.choose`), the request is added
to the chosen replica's rows (the next row after its accepted ones, in arrival order, as the engine's start
lays them out: :func:`~jaxsim.replay.engine.insert_request_stack`), and the engines go on
(:class:`~jaxsim.replay.inloop.EngineLoop`: the state stays on the device between calls). The passes are
the ones an uninterrupted replay of each replica's requests runs (a pass never depends on requests that
arrive after it starts), decided with no knowledge of the future. Pass by pass (no decode stretch: a
stretch would look past the next arrival). A request no replica can ever run (too long, or larger than the
pool) is rejected by the replica it was sent to without entering its engine, as the engine's start would.
"""

from __future__ import annotations

import numpy as np

from jaxsim.replay.sessions import run_sessions
from jaxsim.replay.traces import Sessions
from jaxsim.router import Router

__all__ = ["run_routed"]


def run_routed(stage, router: Router, keys: list[np.ndarray] | None, timeline_len: int, timings: dict | None = None, report=None):
    """Replay ``stage`` (a :class:`~jaxsim.replay.orchestrate.Stage` of an open loop) with ``router`` in the loop:
    (the stage with each request's replica as its assignment, one :class:`ReplayResult` per replica over its
    requests in arrival order, a :class:`RoutingSummary`, the loop's :class:`~jaxsim.replay.sessions.SessionRun`).
    ``keys``: each prompt's full-block keys the router scores overlap with (None: none); ``report``:
    :class:`~jaxsim.replay.inloop.EngineLoop`'s. The replicas cache prefixes when the stage has keys
    (:func:`~jaxsim.replay.inloop.engine_loop`). The loop is the sessions' loop
    (:func:`~jaxsim.replay.sessions.run_sessions`) over requests that are each a session of one turn."""
    return run_sessions(stage, Sessions.independent(int(stage.arrival_ms.size)), router, keys, timeline_len, timings, report)
