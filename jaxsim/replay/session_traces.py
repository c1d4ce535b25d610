"""Synthetic multi-turn sessions (chat conversations), written as a Mooncake JSONL with session fields.

Sessions start with gamma inter-arrival times (``rate_rps`` sessions/s, coefficient of variation ``cv``;
1 is Poisson). Each has ``turns`` turns; turn 1's prompt is ``new_input`` tokens (a length spec,
:func:`~jaxsim.replay.traces.sample_lengths`), of which the leading ``round(shared_prefix_ratio x mean new
input)`` tokens (at most all but one) are the system prompt its prefix group shares; turn k > 1's prompt is the
whole conversation so far plus ``new_input`` new tokens: prompt(k) = prompt(k-1) + output(k-1) + new(k). A later
turn is sent ``think_time_ms`` after the previous turn completes (the replay decides when:
:mod:`jaxsim.replay.sessions`). The knobs are the reference's synthetic-session source (``turns``,
``shared_prefix_ratio``, ``prefix_groups``, ``inter_turn_delay_ms``, ``new_input_tokens_per_turn``,
``output_tokens_per_turn``).

``hash_ids`` (one per started block of ``trace_block_size`` tokens, Mooncake's convention) say what is shared:
a group's system-prompt blocks carry the group's ids, and turn k repeats the ids of turn k-1's full prompt
blocks (the rest of its prompt is new: the previous answer and the new message). Prefix-aware tools read them
(``jaxsim trace prefix``, the KV router, the sweep's ``prefix_hit_ratio = "measured"``).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from jaxsim import limits
from jaxsim.errors import QueryError
from jaxsim.replay.traces import Sessions, Trace, _interarrivals, make_trace, sample_lengths

__all__ = ["SessionShape", "session_trace", "write_session_jsonl"]


class SessionShape:
    """A synthetic session workload's shape (validated on construction; one-line :class:`QueryError` otherwise)."""

    def __init__(self, *, turns: int = 4, new_input="fixed:1024", output="fixed:128", shared_prefix_ratio: float = 0.0,
                 prefix_groups: int = 0, think_time_ms: float = 0.0, trace_block_size: int = 512):
        if isinstance(turns, bool) or int(turns) != turns or not 1 <= turns <= 1000:
            raise QueryError(f"turns={turns!r} must be an integer in 1..1000")
        if not (math.isfinite(shared_prefix_ratio) and 0.0 <= shared_prefix_ratio < 1.0):
            raise QueryError(f"shared_prefix_ratio={shared_prefix_ratio!r} must be a number in [0, 1)")
        if isinstance(prefix_groups, bool) or int(prefix_groups) != prefix_groups or prefix_groups < 0:
            raise QueryError(f"prefix_groups={prefix_groups!r} must be an integer >= 0")
        if shared_prefix_ratio > 0 and prefix_groups == 0:
            raise QueryError("shared_prefix_ratio > 0 needs prefix_groups >= 1 (the sessions sharing each system prompt)")
        if not (math.isfinite(think_time_ms) and think_time_ms >= 0):
            raise QueryError(f"think_time_ms={think_time_ms!r} must be a number of ms >= 0")
        if isinstance(trace_block_size, bool) or int(trace_block_size) != trace_block_size or trace_block_size < 1:
            raise QueryError(f"trace_block_size={trace_block_size!r} must be an integer >= 1")
        self.turns, self.new_input, self.output = int(turns), new_input, output
        self.shared_prefix_ratio, self.prefix_groups = float(shared_prefix_ratio), int(prefix_groups)
        self.think_time_ms, self.trace_block_size = float(think_time_ms), int(trace_block_size)


def session_trace(sessions: int, rate_rps: float, shape: SessionShape, *, cv: float = 1.0, seed: int = 0,
                  name: str = "sessions") -> tuple[Trace, list[list[int]]]:
    """``sessions`` synthetic sessions of ``shape``: the trace (turns in arrival order, all turns of a session stamped
    with its start; :class:`~jaxsim.replay.traces.Sessions` attached) and each request's hash ids (trace order)."""
    limits.check("requests", int(sessions) * shape.turns, "sessions x turns", QueryError)
    rng = np.random.default_rng(seed)
    n = int(sessions)
    gaps = _interarrivals(n, float(rate_rps), float(cv), rng)
    start = np.concatenate([[0.0], np.cumsum(gaps[1:])]) if n else np.zeros(0)
    new = sample_lengths(shape.new_input, n * shape.turns, rng, what="new_input").reshape(n, shape.turns)
    out = sample_lengths(shape.output, n * shape.turns, rng, what="output").reshape(n, shape.turns)
    group = rng.integers(0, max(shape.prefix_groups, 1), size=n)
    prefix = int(round(shape.shared_prefix_ratio * float(new[:, 0].mean()))) if n else 0
    bs = shape.trace_block_size
    hi = int(limits.LIMITS["tokens"].hi)
    next_id = shape.prefix_groups * (prefix // bs)  # ids below it: the groups' system-prompt blocks

    def fresh(k: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + k))
        next_id += k
        return ids

    arrival, prompt, output, session, turn, previous, delay, hashes = [], [], [], [], [], [], [], []
    for j in range(n):
        ids: list[int] = []
        length = 0
        for k in range(shape.turns):
            if k == 0:
                length = int(new[j, 0])
                shared = min(prefix, length - 1) // bs
                ids = [int(group[j]) * (prefix // bs) + b for b in range(shared)]
                ids += fresh(-(-length // bs) - len(ids))
            else:
                kept = ids[: length // bs]  # the previous prompt's full blocks
                length = length + int(out[j, k - 1]) + int(new[j, k])
                if length > hi:
                    raise QueryError(f"session {j}: turn {k + 1}'s prompt would be {length:,} tokens, above {hi:,} (docs/limits.md); "
                                     "fewer turns or shorter turns")
                ids = kept + fresh(-(-length // bs) - len(kept))
            arrival.append(float(start[j]))
            prompt.append(length)
            output.append(int(out[j, k]))
            session.append(f"s{j}")
            turn.append(k + 1)
            previous.append(len(arrival) - 2 if k else -1)
            delay.append(shape.think_time_ms if k else 0.0)
            hashes.append(ids)
    source = (f"{name}(sessions={n}, rate_rps={rate_rps}, cv={cv}, turns={shape.turns}, new_input={shape.new_input}, "
              f"output={shape.output}, shared_prefix_ratio={shape.shared_prefix_ratio}, prefix_groups={shape.prefix_groups}, "
              f"think_time_ms={shape.think_time_ms}, seed={seed})")
    t = make_trace(name, arrival, prompt, output, source=source)
    order = t.row
    position = np.empty(order.size, np.int64)
    position[order] = np.arange(order.size)
    prev = np.asarray(previous, np.int64)[order]
    ses = Sessions(np.asarray(session, dtype=object)[order], np.asarray(turn, np.int64)[order],
                   np.where(prev >= 0, position[np.maximum(prev, 0)], -1), np.asarray(delay, np.float64)[order])
    trace = Trace(t.name, t.arrival_ms, t.input_tokens, t.output_tokens, np.arange(order.size, dtype=np.int64), t.source, ses)
    return trace, [hashes[i] for i in order]


def write_session_jsonl(trace: Trace, hash_ids: list[list[int]], path: str | os.PathLike) -> None:
    """Write a session trace as Mooncake JSONL (timestamp, input_length, output_length, hash_ids, session_id, turn, and
    delay_ms on later turns), one row per request in trace order."""
    from jaxsim.outputs import atomic_file

    ses = trace.sessions
    with atomic_file(path, "w", encoding="utf-8") as f:
        for q in range(len(trace)):
            row = {"timestamp": float(trace.arrival_ms[q]), "input_length": int(trace.input_tokens[q]),
                   "output_length": int(trace.output_tokens[q]), "hash_ids": [int(x) for x in hash_ids[q]]}
            if ses is not None and ses.session[q]:
                row |= {"session_id": str(ses.session[q]), "turn": int(ses.turn[q])}
                if ses.previous[q] >= 0:
                    row["delay_ms"] = float(ses.delay_ms[q])
            f.write(json.dumps(row) + "\n")
