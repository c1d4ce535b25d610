"""What a replay will cost before it starts: scheduler passes, time and memory, estimated from the trace
and the configurations alone, and the up-front refusal of a replay this machine's memory cannot hold
(``jaxsim replay``: one line, exit 2, nothing compiled or written).

The figures are estimates, not promises:

* **memory**: :data:`BASE_BYTES` for the process (JAX, a profile, the executables) plus
  :data:`BYTES_PER_REQUEST` per request and replay (engine state, host copies, per-request results and
  their parquet table), plus the per-pass timeline when asked for. Both constants are measured (whole
  ``jaxsim replay`` processes on the 2-core machine, docs/benchmarks.md): 1,000 requests 0.46-0.65 GB
  peak, 100,000 requests 0.60 GB, that is about 1.5 kB per request; the constant takes 2 kB.
* **passes**: at least ``max(requests, output tokens / max_num_seqs)`` per replica (a pass emits at most
  one token per running request, and every request takes a pass); real traces take more (azure_conv_1k
  tiled to 100,000 requests at max_num_seqs 128: 935,837 passes, 5 times this bound).
* **time**: those passes at :data:`SECONDS_PER_PASS` (a pass costs 15-50 us on XLA:CPU).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BASE_BYTES = 700 * 2**20
BYTES_PER_REQUEST = 2048
SECONDS_PER_PASS = 20e-6
TIMELINE_FIELD_BYTES = 8 * 16  # a timeline row: float64 fields, rounded up


@dataclass(frozen=True)
class Estimate:
    """Estimated cost of a replay command: request-replays, scheduler passes (a lower bound), seconds of
    replay at :data:`SECONDS_PER_PASS` and peak memory in bytes."""

    request_replays: int
    passes: int
    seconds: float
    bytes: int

    def describe(self) -> str:
        return (f"{self.request_replays:,} request-replays, at least {self.passes:,} scheduler passes (about "
                f"{_duration(self.seconds)} of replay or more), about {self.bytes / 2**30:,.1f} GB of memory")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:,.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:,.0f} min"
    return f"{seconds / 3600:,.1f} h"


def estimate(configs: Sequence, output_tokens: np.ndarray, seeds: int, timeline_len: int = 0) -> Estimate:
    """The cost of replaying a trace with ``output_tokens`` (one entry per request) on every
    configuration (:class:`~jaxsim.replay.deployment.ReplayConfig`) for ``seeds`` seeds."""
    out = np.asarray(output_tokens, np.int64)
    n = int(out.size)
    total_out = int(out.sum())
    passes = 0
    workers = 0
    for c in configs:
        for pool in c.pools:
            r = int(pool.replicas)
            per = -(-n // r)
            passes += r * max(per, -(-(total_out // r) // max(int(pool.max_num_seqs), 1)))
            workers += r
    passes *= int(seeds)
    replays = len(configs) * int(seeds)
    mem = BASE_BYTES + BYTES_PER_REQUEST * n * replays + workers * int(seeds) * int(timeline_len) * TIMELINE_FIELD_BYTES
    return Estimate(request_replays=n * replays, passes=passes, seconds=passes * SECONDS_PER_PASS, bytes=mem)


def available_bytes() -> int | None:
    """Memory this process may still use: the system's available memory (``MemAvailable``), capped by
    a cgroup limit when there is one; None when neither can be read."""
    avail = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        avail = None
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            raw = f.read().strip()
        if raw.isdigit():
            avail = int(raw) if avail is None else min(avail, int(raw))
    except OSError:
        pass
    return avail


def refusal(est: Estimate, available: int | None) -> str | None:
    """Why a replay of cost ``est`` is refused up front (its estimated memory exceeds what is available),
    or None."""
    if available is None or est.bytes <= available:
        return None
    return (f"this replay would need more memory than is available: {est.describe()}; {available / 2**30:,.1f} GB "
            "available. Replay fewer requests (--max-requests), fewer seeds or configurations, or split the trace")


def check_environment_override() -> bool:
    """``JAXSIM_REPLAY_NO_MEMORY_CHECK=1`` skips the memory refusal (a machine whose swap or a later free
    makes room: the user's call)."""
    return os.environ.get("JAXSIM_REPLAY_NO_MEMORY_CHECK", "") == "1"


def file_rows(path) -> int | None:
    """Lines in a trace file (an upper bound on its requests, counted without parsing it: a trace too
    large for this machine is refused before it is read), or None when it is not a readable file."""
    try:
        with open(path, "rb") as f:
            rows, last = 0, b"\n"
            while chunk := f.read(1 << 24):
                rows += chunk.count(b"\n")
                last = chunk[-1:]
        return rows + (last != b"\n")
    except OSError:
        return None
