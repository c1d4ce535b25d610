"""``memory.json``: what a modelled profile's ranks hold besides the KV pool, per deployment.

``profile.json`` follows the reference's format, where a runtime KV pool excludes the declared non-KV byte
fields; an importer that models memory (``jaxsim import op-model``) states the rest of the rank here, so that
``jaxsim profiles validate`` can check the whole rank against the GPU (:mod:`jaxsim.rules.memory_fit`)::

    {"format": "jaxsim-memory-breakdown-v1", "source": "...",
     "deployments": [{"system": "h100_sxm", "backend_version": "0.24.0", "tp": 1, "dp": 1, "moe_tp": 1,
                      "moe_ep": 1, "worker_type": null, "gpu_memory_bytes": 85899345920,
                      "weights_bytes": ..., "activations_bytes": ..., "runtime_overhead_bytes": ...,
                      "comm_overhead_bytes": ...}]}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from jaxsim.errors import ProfileError
from jaxsim.profile.model import DECLARED_BYTE_FIELDS, Deployment

__all__ = ["MEMORY_FORMAT", "MEMORY_NAME", "deployment_key", "load_memory_breakdown", "memory_breakdown_doc"]

MEMORY_NAME = "memory.json"
MEMORY_FORMAT = "jaxsim-memory-breakdown-v1"
_KEY = ("system", "backend_version", "tp", "dp", "moe_tp", "moe_ep", "worker_type")


def deployment_key(d: Deployment | dict) -> tuple:
    """The identity a breakdown entry is matched on."""
    get = d.get if isinstance(d, dict) else (lambda k: getattr(d, k))
    return tuple(get(k) for k in _KEY)


def memory_breakdown_doc(entries: list[tuple[Deployment, int, dict]], source: str) -> dict:
    """The file's JSON object for (deployment, GPU memory bytes, non-KV bytes by field) entries."""
    deps = []
    for d, gpu, mem in entries:
        item: dict[str, Any] = dict(zip(_KEY, deployment_key(d)))
        item["gpu_memory_bytes"] = int(gpu)
        item.update({k: int(mem.get(k, 0)) for k in DECLARED_BYTE_FIELDS})
        deps.append(item)
    return {"format": MEMORY_FORMAT, "source": source, "deployments": deps}


def load_memory_breakdown(root: str | os.PathLike) -> dict[tuple, dict] | None:
    """Entries of ``root/memory.json`` by :func:`deployment_key` (None when the file is absent); ProfileError
    naming the file when it is malformed."""
    p = Path(root) / MEMORY_NAME
    if not p.is_file():
        return None
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ProfileError(f"{p}: cannot read the memory breakdown: {' '.join(str(e).split())}") from None
    if not isinstance(doc, dict) or doc.get("format") != MEMORY_FORMAT or not isinstance(doc.get("deployments"), list):
        raise ProfileError(f"{p}: not a {MEMORY_FORMAT} file (format, deployments)")
    out = {}
    for i, item in enumerate(doc["deployments"]):
        fields = ("gpu_memory_bytes",) + DECLARED_BYTE_FIELDS
        if not isinstance(item, dict) or any(not isinstance(item.get(k), int) or isinstance(item.get(k), bool) or item[k] < 0
                                             for k in fields):
            raise ProfileError(f"{p}: deployments[{i}]: expected non-negative integer {', '.join(fields)}")
        out[deployment_key(item)] = item
    return out
