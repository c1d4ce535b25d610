"""How requests are routed across a pool's replicas (issue 26, Deliver 2): the policy a deployment states.

* ``round_robin`` (the default): request i of the pool, in arrival order, goes to replica i mod R.
* ``least_loaded``: the replica with the fewest requests in flight (routed, not yet completed) when the
  request arrives; ties go to the lowest replica index.
* ``kv``: the Dynamo KV router's policy (docs.nvidia.com/dynamo, "KV Router", cost function):
  ``cost = overlap_score_weight × prefill_blocks + decode_blocks`` per replica, the lowest cost wins
  (temperature 0; ties to the lowest index). ``prefill_blocks`` are the prompt blocks still to compute on
  that replica (the prompt blocks of its requests routed and not yet at their first token, less their
  cached overlap, plus the incoming request's blocks less its overlap there); ``decode_blocks`` the KV
  blocks its requests in flight hold plus the incoming request's (``--router-assume-kv-reuse``: a
  block shared by requests in flight counts once; output blocks not tracked, the Dynamo defaults). The
  overlap is the incoming prompt's leading blocks the router believes the replica holds: Dynamo's
  approximation mode (``--no-router-kv-events``), where the router predicts each replica's cache from its own
  routing decisions and forgets a block ``ttl_s`` after it last routed it there (``--router-ttl-secs``,
  default 120 s). Defaults as Dynamo's: ``overlap_score_weight`` 1.0, ``ttl_s`` 120.

Plain Python: read and checked before anything is compiled; the routing itself is
:mod:`jaxsim.replay.routing`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from jaxsim.errors import InputError

__all__ = ["ROUTER_POLICIES", "Router", "RouterError", "read_router"]

ROUTER_POLICIES = ("round_robin", "least_loaded", "kv")
MAX_OVERLAP_SCORE_WEIGHT = 1000.0  # a weight above this makes the decode load irrelevant: a typo, not a policy
MAX_TTL_S = 86_400.0 * 365


class RouterError(InputError):
    """A router setting that cannot be used (one line naming the key)."""


@dataclass(frozen=True)
class Router:
    """A pool's routing policy (see the module docstring). ``max_rounds``: replays the router's fixed point
    may take (each round replays the pool with the decisions of the last; see :mod:`jaxsim.replay.routing`)."""

    policy: str = "round_robin"
    overlap_score_weight: float = 1.0
    ttl_s: float = 120.0
    max_rounds: int = 16

    def __post_init__(self):
        if self.policy not in ROUTER_POLICIES:
            raise RouterError(f"policy={self.policy!r}: expected one of {', '.join(ROUTER_POLICIES)}")
        w = self.overlap_score_weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or not 0 <= w <= MAX_OVERLAP_SCORE_WEIGHT:
            raise RouterError(f"overlap_score_weight={w!r}: must be a number in [0, {MAX_OVERLAP_SCORE_WEIGHT:g}]")
        t = self.ttl_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 < t <= MAX_TTL_S:
            raise RouterError(f"ttl_s={t!r}: must be a number of seconds in (0, {MAX_TTL_S:g}]")
        r = self.max_rounds
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 256:
            raise RouterError(f"max_rounds={r!r}: must be an integer in [1, 256]")

    @property
    def routed(self) -> bool:
        """Whether decisions depend on the replicas' state (anything but round-robin)."""
        return self.policy != "round_robin"

    def to_json(self) -> dict:
        return asdict(self)


def read_router(v: Any, path: str = "router") -> Router:
    """A :class:`Router` from a policy name (``"kv"``) or a table (``{policy = "kv", overlap_score_weight = 1.0,
    ttl_s = 120, max_rounds = 16}``); one line naming the key otherwise."""
    if isinstance(v, str):
        v = {"policy": v}
    if not isinstance(v, Mapping):
        raise RouterError(f"{path}: expected a policy name ({', '.join(ROUTER_POLICIES)}) or a table, got {type(v).__name__}")
    unknown = sorted(set(v) - {"policy", "overlap_score_weight", "ttl_s", "max_rounds"})
    if unknown:
        raise RouterError(f"{path}.{unknown[0]}: unknown key (known: policy, overlap_score_weight, ttl_s, max_rounds)")
    try:
        return Router(**dict(v))
    except RouterError as e:
        raise RouterError(f"{path}.{e}") from None
