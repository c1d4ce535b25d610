"""GPU spec sheets bundled with jaxsim (``jaxsim/data/systems/<system>.json``; from aisimulate and
aiconfigurator-core, both NVIDIA, Apache-2.0; ``sources.csv`` says which sheet came from where)."""

from __future__ import annotations

import csv
import functools
import json
from importlib import resources
from typing import Any

from jaxsim.errors import BindingError

_PACKAGE = "jaxsim.data"


def _dir():
    return resources.files(_PACKAGE).joinpath("systems")


@functools.cache
def list_systems() -> tuple[str, ...]:
    """Names of the bundled spec sheets (e.g. ``h200_sxm``)."""
    return tuple(sorted(p.name[: -len(".json")] for p in _dir().iterdir() if p.name.endswith(".json")))


@functools.cache
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


@functools.cache
def _sources() -> dict[str, dict[str, str]]:
    text = _dir().joinpath("sources.csv").read_text(encoding="utf-8")
    return {r["system"]: r for r in csv.DictReader(text.splitlines())}


def system_source(system: str) -> dict[str, str]:
    """Where a spec sheet came from: ``source`` (package), ``file`` (its path there) and ``licence`` (file name)."""
    system_spec(system)
    return dict(_sources().get(system, {"system": system, "source": "unrecorded", "file": "", "licence": ""}))


def describe_systems() -> list[dict[str, Any]]:
    """One summary per bundled spec sheet (spec-sheet values, not measurements)."""
    out = []
    for name in list_systems():
        spec = system_spec(name)
        gpu, node = spec["gpu"], spec["node"]
        src = system_source(name)
        out.append({
            "system": name,
            "gpu_memory_bytes": int(gpu["mem_capacity"]),
            "memory_bandwidth_bytes_per_s": float(gpu["mem_bw"]),
            "bfloat16_tc_flops": float(gpu.get("bfloat16_tc_flops", 0.0)),
            "fp8_tc_flops": float(gpu.get("fp8_tc_flops", 0.0)),
            "gpus_per_node": int(node.get("num_gpus_per_node", 1)),
            "intra_node_bytes_per_s": float(node.get("intra_node_bw", 0.0)),
            "source": src["source"],
            "licence": src["licence"],
        })
    return out
