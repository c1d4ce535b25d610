"""Physical memory rules of a deployment's resources, in plain Python: what an importer refuses to write and
``jaxsim profiles validate`` fails, one line each with the numbers.

* ``gpu-memory-fit``: the KV pool plus what else the rank holds (weights, activations, runtime and
  communication overhead, when the profile states them) fits the GPU's memory at the recorded
  ``gpu_memory_utilization``;
* ``kv-pool-holds-request``: the pool holds one request of ``max_model_len`` tokens at its peak (the reference's
  request peak: linear ``L × kv_bytes_per_token``; grouped pages with the scheduler's token budget in flight),
  or vLLM would not start.

The same rule name (``gpu-memory-fit``) refuses a binding whose GPU memory budget is smaller than the pool
(:func:`jaxsim.rules.capacity.capacity_problems`); the sweep's ``gpu_budget`` (a GPU count) is a different rule.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path

from jaxsim import systems
from jaxsim.errors import JaxsimError
from jaxsim.profile.directory import find_profile_file
from jaxsim.profile.memory_breakdown import deployment_key, load_memory_breakdown
from jaxsim.profile.model import DECLARED_BYTE_FIELDS, ModelProfile, Resources, load_profile
from jaxsim.rules.capacity import request_cache_bytes

__all__ = [
    "memory_fit_problems", "profile_dir_memory_problems", "profile_memory_problems", "request_fit_problems", "stated_non_kv_bytes",
]


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def memory_fit_problems(res: Resources, gpu_memory_bytes: int | None, *, non_kv_bytes: Mapping[str, int] | None = None) -> list[str]:
    """``gpu-memory-fit``: pool + non-KV bytes ≤ GPU memory × gpu_memory_utilization (runtime-memory pools;
    ``non_kv_bytes`` by name, e.g. the op model's weights/activations/overheads; none known: the pool alone)."""
    rm = res.runtime_memory
    if rm is None or gpu_memory_bytes is None:
        return []
    other = {k: int(v) for k, v in (non_kv_bytes or {}).items() if k in DECLARED_BYTE_FIELDS and v}
    budget = math.floor(gpu_memory_bytes * rm.gpu_memory_utilization)
    used = rm.kv_cache_bytes + sum(other.values())
    if used <= budget:
        return []
    parts = " + ".join([f"KV pool {rm.kv_cache_bytes} B"] + [f"{k.removesuffix('_bytes')} {v} B" for k, v in other.items()])
    total = f" = {used} B" if other else ""
    return [f"gpu-memory-fit: {parts}{total} ({_gib(used)}) > GPU memory {gpu_memory_bytes} B x gpu_memory_utilization "
            f"{rm.gpu_memory_utilization:g} = {budget} B ({_gib(budget)})"]


def request_fit_problems(res: Resources, max_model_len: int | None = None) -> list[str]:
    """``kv-pool-holds-request``: the runtime pool holds one ``max_model_len`` request at its peak (the recorded
    max_model_len unless given; the scheduler's ``max_num_tokens`` in flight for windowed groups)."""
    rm = res.runtime_memory
    if rm is None:
        return []
    length = rm.max_model_len if max_model_len is None else int(max_model_len)
    peak = request_cache_bytes(res, length, res.max_num_tokens)
    if peak <= rm.kv_cache_bytes:
        return []
    return [f"kv-pool-holds-request: the KV pool ({rm.kv_cache_bytes} B, {_gib(rm.kv_cache_bytes)}, at gpu_memory_utilization "
            f"{rm.gpu_memory_utilization:g}) cannot hold one max_model_len={length} request ({peak} B at its peak): "
            "vLLM would not start"]


def _system_gpu_bytes(system: str) -> int | None:
    try:
        return systems.gpu_memory_bytes(system)
    except JaxsimError:
        return None


_STATED = re.compile(r"\b(" + "|".join(DECLARED_BYTE_FIELDS) + r") (\d+)\b")


def stated_non_kv_bytes(res: Resources) -> dict[str, int] | None:
    """Non-KV bytes a runtime pool's provenance states (``weights_bytes N, ...``, as op-model imports written
    before memory.json existed record them); None when it states none."""
    found = dict(_STATED.findall(res.runtime_memory.provenance)) if res.runtime_memory is not None else {}
    return {k: int(v) for k, v in found.items()} or None


def profile_memory_problems(profile: ModelProfile, source: str, breakdown: Mapping[tuple, Mapping] | None = None) -> list[str]:
    """Both rules for every runtime-memory deployment of ``profile``: the rank's non-KV bytes and GPU memory from
    ``breakdown`` (``memory.json``) when it states them, else the non-KV bytes the pool's provenance states (or
    none: the pool alone) against the system's spec sheet."""
    out = []
    for i, d in enumerate(profile.deployments):
        entry = (breakdown or {}).get(deployment_key(d))
        gpu = entry["gpu_memory_bytes"] if entry else _system_gpu_bytes(d.system)
        non_kv = {k: entry[k] for k in DECLARED_BYTE_FIELDS} if entry else stated_non_kv_bytes(d.resources)
        for p in memory_fit_problems(d.resources, gpu, non_kv_bytes=non_kv) + request_fit_problems(d.resources):
            out.append(f"{source}: deployments[{i}] ({d.describe()}): {p}")
    return out


def profile_dir_memory_problems(root: str | os.PathLike) -> list[str]:
    """:func:`profile_memory_problems` of a profile directory (with its ``memory.json``); [] when the profile does
    not load (the directory's own validation says why)."""
    root = Path(root)
    try:
        pfile = root if root.is_file() else find_profile_file(root)
        profile = load_profile(pfile)
    except JaxsimError:
        return []
    try:
        breakdown = load_memory_breakdown(pfile.parent)
    except JaxsimError as e:
        return [str(e)]
    return profile_memory_problems(profile, str(pfile), breakdown)
