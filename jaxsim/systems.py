"""GPU spec sheets bundled with jaxsim (``jaxsim/data/systems/<system>.json``, from aisimulate, Apache-2.0)."""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from jaxsim.errors import BindingError

_PACKAGE = "jaxsim.data"


def _dir():
    return resources.files(_PACKAGE).joinpath("systems")


@functools.lru_cache(maxsize=None)
def list_systems() -> tuple[str, ...]:
    """Names of the bundled spec sheets (e.g. ``h200_sxm``)."""
    return tuple(sorted(p.name[: -len(".json")] for p in _dir().iterdir() if p.name.endswith(".json")))


@functools.lru_cache(maxsize=None)
def system_spec(system: str) -> dict[str, Any]:
    """The whole spec sheet of ``system``; BindingError naming the known systems when absent."""
    if system not in list_systems():
        raise BindingError(f"unknown system {system!r}: no spec sheet (known: {', '.join(list_systems())})")
    return json.loads(_dir().joinpath(f"{system}.json").read_text(encoding="utf-8"))


def gpu_memory_bytes(system: str) -> int:
    """Total memory of one GPU, bytes (``gpu.mem_capacity``)."""
    return int(system_spec(system)["gpu"]["mem_capacity"])


def memory_bandwidth_bytes_per_s(system: str) -> float:
    """Peak HBM bandwidth of one GPU, bytes/s (``gpu.mem_bw``)."""
    return float(system_spec(system)["gpu"]["mem_bw"])


def interconnect_bandwidth_bytes_per_s(system: str, *, scope: str = "inter_node") -> float:
    """Per-GPU one-direction link bandwidth, bytes/s: ``inter_node`` (NIC), ``intra_node`` (NVLink) or ``pcie``."""
    keys = {"inter_node": "inter_node_bw", "intra_node": "intra_node_bw", "pcie": "pcie_bw"}
    if scope not in keys:
        raise BindingError(f"interconnect scope must be one of {', '.join(keys)} (got {scope!r})")
    return float(system_spec(system)["node"][keys[scope]])
