"""A router's view of a pool's replicas and its decisions (the policies: :mod:`jaxsim.router`), on the host.

The router decides at each arrival from what it knows then: which requests it sent where, which of them
have their first token (their prefill is done) and which have completed, as the replicas' engines report
them (:mod:`jaxsim.replay.online` runs the engines up to each arrival and hands their times here). For
the KV policy it also predicts each replica's cache from its own decisions (Dynamo's approximation mode).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from jaxsim.router import Router

__all__ = ["ReplicaView", "RoutingSummary", "choose", "round_robin"]


def round_robin(n: int, replicas: int) -> np.ndarray:
    """Request i (arrival order) to replica i mod ``replicas``."""
    return np.arange(int(n)) % max(int(replicas), 1)


@dataclass(frozen=True)
class RoutingSummary:
    """How a routed pool's requests went to its replicas: the policy, requests per replica and the share of
    prompt tokens the router predicted cached where it sent them."""

    policy: str
    requests_per_replica: tuple[int, ...]
    predicted_overlap_share: float

    def to_json(self) -> dict:
        return {"policy": self.policy, "requests_per_replica": list(self.requests_per_replica),
                "predicted_overlap_share": round(self.predicted_overlap_share, 6)}


class ReplicaView:
    """What the router knows of one replica: the requests it sent there (in order), those still in flight
    (not completed) and still prefilling (no first token yet) at the current time, the KV blocks its
    requests in flight hold (a block shared by several counted once) and the blocks it believes cached
    there (key -> when it last sent a prompt holding it, ms)."""

    def __init__(self):
        self.sent: list[int] = []  # requests (stage positions) in the order sent here
        self.entered: list[bool] = []  # whether each entered the replica's engine (False: rejected, it holds nothing)
        self.keys: list[np.ndarray] = []
        self.blocks: list[int] = []
        self.prefill_left: list[int] = []
        self.flying = np.zeros(0, bool)
        self.prefilling = np.zeros(0, bool)
        self.prefill_blocks = 0
        self.active_keys: Counter = Counter()
        self.active_other_blocks = 0  # blocks with no key (a prompt's partial last block)
        self.cached: dict[int, float] = {}

    def update(self, t_ms: float, first_token_ms: np.ndarray, completed_ms: np.ndarray) -> None:
        """Forget what is over at ``t_ms``, from the replica's times of the requests sent there (in order; nan:
        not yet): prefills with their first token, requests completed."""
        over = self.prefilling & (first_token_ms <= t_ms)
        for i in np.flatnonzero(over):
            self.prefill_blocks -= self.prefill_left[i]
        self.prefilling &= ~over
        gone = self.flying & (completed_ms <= t_ms)
        for i in np.flatnonzero(gone):
            self.active_keys.subtract(self.keys[i].tolist())
            self.active_other_blocks -= self.blocks[i] - self.keys[i].size
        if gone.any():
            self.active_keys += Counter()  # drop keys no request in flight holds
        self.flying &= ~gone

    @property
    def in_flight(self) -> int:
        return int(self.flying.sum())

    def overlap_blocks(self, keys: np.ndarray, t_ms: float, ttl_ms: float) -> int:
        """The prompt's leading blocks this replica is believed to hold at ``t_ms``."""
        n = 0
        for key in keys.tolist():
            last = self.cached.get(key)
            if last is None or t_ms - last > ttl_ms:
                break
            n += 1
        return n

    def cost(self, router: Router, keys: np.ndarray, blocks: int, overlap: int) -> float:
        """Dynamo's cost of sending the request here: weight x prefill blocks + decode blocks."""
        new_active = sum(1 for key in keys.tolist() if self.active_keys.get(key, 0) <= 0) + blocks - keys.size
        prefill = self.prefill_blocks + blocks - overlap
        decode = len(self.active_keys) + self.active_other_blocks + new_active
        return float(router.overlap_score_weight) * prefill + decode

    def take(self, q: int, t_ms: float, keys: np.ndarray, blocks: int, overlap: int, in_engine: bool) -> None:
        """Request ``q`` sent here at ``t_ms`` (``in_engine`` False: the replica rejects it, it holds nothing)."""
        self.sent.append(q)
        self.entered.append(in_engine)
        self.keys.append(keys)
        self.blocks.append(blocks)
        self.prefill_left.append(blocks - overlap)
        self.flying = np.append(self.flying, in_engine)
        self.prefilling = np.append(self.prefilling, in_engine)
        if in_engine:
            self.prefill_blocks += blocks - overlap
            self.active_keys.update(keys.tolist())
            self.active_other_blocks += blocks - keys.size
        for key in keys.tolist():
            self.cached[key] = t_ms


def choose(router: Router, views: list[ReplicaView], q: int, t_ms: float, keys: np.ndarray, blocks: int) -> tuple[int, int]:
    """The replica a state-routing ``router`` (least-loaded or kv; round-robin needs no state) sends request
    ``q`` to at ``t_ms`` (its prompt's full-block keys and its block count) and the blocks it believes cached
    there; ties go to the lowest index."""
    if router.policy == "least_loaded":
        return int(np.argmin([v.in_flight for v in views])), 0
    ttl_ms = float(router.ttl_s) * 1000.0
    hits = [v.overlap_blocks(keys, t_ms, ttl_ms) for v in views]
    best = int(np.argmin([v.cost(router, keys, blocks, h) for v, h in zip(views, hits)]))
    return best, hits[best]
