"""Deployment configs: TOML → frozen dataclasses (structure and types only).

A config names a model, a system, a backend version, a profile (bundled name or directory) and one
``aggregated`` role or a ``prefill`` + ``decode`` pair, each with its own parallelism, replica count,
scheduler envelope and memory fraction. Parsing is strict: an unknown key or a wrong type raises a
one-line :class:`~jaxsim.errors.BindingError` naming the file and the key path. Whether the config can be
bound to a measured profile is decided by :mod:`jaxsim.binding`, which lists every problem at once.

Example (``configs/deployment_aggregated.toml``)::

    model = "Qwen/Qwen3-32B"
    system = "b300_sxm"
    backend_version = "0.20.1"
    profile = "qwen3-32b-bf16-tp1"
    block_size = 64

    [roles.aggregated]
    tp = 1
    replicas = 1
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from jaxsim import limits
from jaxsim.errors import BindingError, read_text

ROLE_NAMES = ("aggregated", "prefill", "decode")
MODES = ("aggregated", "disaggregated")
DEFAULT_BLOCK_SIZE = 64
PRECISION_OVERRIDES = ("gemm_quant_mode", "moe_quant_mode", "fmha_quant_mode", "comm_quant_mode", "kv_cache_dtype")
IDENTITY_OVERRIDES = PRECISION_OVERRIDES + ("attention_backend",)
REFUSED_OVERRIDES = ("moe_backend", "enable_eplb", "wideep_num_slots", "moe_kernel_source")


@dataclass(frozen=True)
class RoleConfig:
    """One worker role: its parallelism, replica count, scheduler envelope and memory fraction.

    ``None`` for ``max_num_batched_tokens``, ``max_num_seqs`` or ``gpu_memory_utilization`` means "the
    profile's recorded value"; a stated value must equal the recorded one for runtime-memory profiles.
    ``moe_tp``/``moe_ep`` ``None`` mean 1 (the reference's default). ``dcp`` is absent unless stated.
    """

    name: str
    tp: int = 1
    pp: int = 1
    dp: int = 1
    moe_tp: int | None = None
    moe_ep: int | None = None
    cp: int = 1
    dcp: int | None = None
    replicas: int = 1
    profile: str | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    gpu_memory_utilization: float | None = None

    @property
    def parallel_tuple(self) -> tuple[int, int, int, int, int, int]:
        """(tp, pp, dp, moe_tp, moe_ep, cp) with the reference's defaults applied."""
        return (
            self.tp, self.pp, self.dp, 1 if self.moe_tp is None else self.moe_tp,
            1 if self.moe_ep is None else self.moe_ep, self.cp,
        )

    @property
    def gpus(self) -> int:
        """GPUs used by one replica of this role."""
        return self.tp * self.pp * self.dp * self.cp


@dataclass(frozen=True)
class Overrides:
    """Low-level engine overrides. Precision/attention overrides must equal the profile's; the rest are refused."""

    gemm_quant_mode: str | None = None
    moe_quant_mode: str | None = None
    fmha_quant_mode: str | None = None
    comm_quant_mode: str | None = None
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None
    moe_backend: str | None = None
    enable_eplb: bool | None = None
    wideep_num_slots: int | None = None
    moe_kernel_source: str | None = None


@dataclass(frozen=True)
class DeploymentConfig:
    """A whole deployment: identity, roles, speculation and estimator policy.

    ``source`` (the file) prefixes every message; ``base_dir`` resolves relative profile directories.
    """

    model: str
    system: str
    roles: tuple[RoleConfig, ...]
    profile: str | None = None
    backend: str = "vllm"
    backend_version: str | None = None
    mode: str = "aggregated"
    nextn: int = 0
    accept_rates: tuple[float, ...] | None = None
    accepted_tokens: float | None = None
    acceptance_preset: str | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    context_length: int | None = None
    gpu_memory_bytes: int | None = None
    estimation_mode: str = "fpm_interpolation"
    method: str = "direct"
    database_mode: str = "SILICON"
    fallback: str = "deny"
    speculation: Mapping[str, Any] | None = field(default=None, compare=False)
    kv_offload: bool = False
    kv_transfer_gbps: float | None = None
    cuda_graph_reserved_bytes: int = 0
    tolerance_fraction: float | None = None
    overrides: Overrides = Overrides()
    source: str = field(default="<config>", compare=False)
    base_dir: Path | None = field(default=None, compare=False)

    def role(self, name: str) -> RoleConfig:
        """The role called ``name``; KeyError if absent."""
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)

    @property
    def role_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.roles)


# ----------------------------------------------------------------------------------------------------
# strict parsing

_TOP_KEYS = {f.name for f in fields(DeploymentConfig)} - {"source", "base_dir"}
_ROLE_KEYS = {f.name for f in fields(RoleConfig)} - {"name"}
_OVERRIDE_KEYS = {f.name for f in fields(Overrides)}


def _type_name(v: Any) -> str:
    return {dict: "table", list: "array", str: "string", bool: "boolean", int: "integer", float: "float"}.get(
        type(v), type(v).__name__
    )


class _Reader:
    def __init__(self, source: str):
        self.source = source

    def error(self, path: str, msg: str) -> BindingError:
        return BindingError(f"{self.source}: {path}: {msg}" if path else f"{self.source}: {msg}")

    def table(self, v: Any, path: str, allowed: set[str]) -> dict:
        if not isinstance(v, dict):
            raise self.error(path, f"expected a table, got {_type_name(v)}")
        for k in v:
            if k not in allowed:
                where = f"{path}.{k}" if path else k
                raise self.error(where, f"unknown key (allowed: {', '.join(sorted(allowed))})")
        return v

    def int(self, v: Any, path: str, lo: int | None = None, limit: str | None = None) -> int:
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.error(path, f"expected an integer, got {_type_name(v)} {v!r}")
        if lo is not None and v < lo:
            raise self.error(path, f"must be >= {lo} (got {v})")
        # without ``lo`` the lower bound is the binding's rule (reference rejection codes); only the upper is checked here
        if limit is not None and (lo is not None or v > limits.LIMITS[limit].hi) and (msg := limits.problem(limit, v)) is not None:
            raise self.error(path, msg + " (docs/limits.md)")
        return v

    def float(self, v: Any, path: str, limit: str | None = None) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.error(path, f"expected a number, got {_type_name(v)} {v!r}")
        if limit is not None and not math.isfinite(v):  # unlimited keys: the binding's rules judge them
            raise self.error(path, f"must be a finite number (got {v!r})")
        if limit is not None and (msg := limits.problem(limit, v)) is not None:
            raise self.error(path, msg + " (docs/limits.md)")
        return float(v)

    def str(self, v: Any, path: str) -> str:
        if not isinstance(v, str):
            raise self.error(path, f"expected a string, got {_type_name(v)} {v!r}")
        if not v.strip():
            raise self.error(path, "must be a non-empty string")
        return v

    def bool(self, v: Any, path: str) -> bool:
        if not isinstance(v, bool):
            raise self.error(path, f"expected a boolean, got {_type_name(v)} {v!r}")
        return v


def _role(r: _Reader, name: str, value: Any) -> RoleConfig:
    path = f"roles.{name}"
    d = r.table(value, path, _ROLE_KEYS)
    kw: dict[str, Any] = {"name": name}
    role_limits = {"replicas": "replicas", "max_num_batched_tokens": "tokens", "max_num_seqs": "max_num_seqs"}
    for k in ("tp", "pp", "dp", "moe_tp", "moe_ep", "cp", "dcp", "replicas", "max_num_batched_tokens", "max_num_seqs"):
        if k in d:
            if k == "dcp":  # absent unless stated; any stated value is checked by the binding
                kw[k] = r.int(d[k], f"{path}.{k}")
                if abs(kw[k]) > limits.LIMITS["parallel"].hi:
                    raise r.error(f"{path}.{k}", limits.problem("parallel", kw[k]) + " (docs/limits.md)")
            else:
                kw[k] = r.int(d[k], f"{path}.{k}", lo=1, limit=role_limits.get(k, "parallel"))
    if "profile" in d:
        kw["profile"] = r.str(d["profile"], f"{path}.profile")
    if "gpu_memory_utilization" in d:
        kw["gpu_memory_utilization"] = r.float(d["gpu_memory_utilization"], f"{path}.gpu_memory_utilization")
    return RoleConfig(**kw)


def config_from_dict(obj: Mapping[str, Any], *, source: str = "<config>", base_dir: str | os.PathLike | None = None) -> DeploymentConfig:
    """Build a config from a parsed TOML/JSON mapping; one-line BindingError on an unknown key or wrong type."""
    r = _Reader(source)
    d = r.table(dict(obj), "", _TOP_KEYS)
    for k in ("model", "system"):
        if k not in d:
            raise r.error(k, "required key missing")
    kw: dict[str, Any] = {"source": source, "base_dir": None if base_dir is None else Path(base_dir)}
    for k in ("model", "system", "profile", "backend", "mode", "acceptance_preset", "estimation_mode", "method",
              "database_mode", "fallback"):
        if k in d:
            kw[k] = r.str(d[k], k)
    if "backend_version" in d:
        kw["backend_version"] = r.str(d["backend_version"], "backend_version")
    for k, lo, lim in (("nextn", 0, None), ("block_size", None, "block_size"), ("context_length", None, "tokens"),
                       ("gpu_memory_bytes", 1, "bytes"), ("cuda_graph_reserved_bytes", 0, None)):
        if k in d:
            kw[k] = r.int(d[k], k, lo=lo, limit=lim)
    if kw.get("nextn", 0) > 64:
        raise r.error("nextn", f"must be <= 64 draft tokens (got {kw['nextn']:,})")
    if kw.get("cuda_graph_reserved_bytes", 0) > limits.LIMITS["bytes"].hi:
        raise r.error("cuda_graph_reserved_bytes", limits.problem("bytes", kw["cuda_graph_reserved_bytes"]))
    for k, lim in (("accepted_tokens", None), ("kv_transfer_gbps", None), ("tolerance_fraction", None)):  # the binding judges these
        if k in d:
            kw[k] = r.float(d[k], k, limit=lim)
    if "accept_rates" in d:
        rates = d["accept_rates"]
        if not isinstance(rates, list):
            raise r.error("accept_rates", f"expected an array of numbers, got {_type_name(rates)}")
        kw["accept_rates"] = tuple(r.float(x, f"accept_rates[{i}]") for i, x in enumerate(rates))
    if "kv_offload" in d:
        kw["kv_offload"] = r.bool(d["kv_offload"], "kv_offload")
    if "speculation" in d:
        if not isinstance(d["speculation"], dict):
            raise r.error("speculation", f"expected a table, got {_type_name(d['speculation'])}")
        kw["speculation"] = dict(d["speculation"])
    if "overrides" in d:
        o = r.table(d["overrides"], "overrides", _OVERRIDE_KEYS)
        okw: dict[str, Any] = {}
        for k, v in o.items():
            p = f"overrides.{k}"
            okw[k] = r.bool(v, p) if k == "enable_eplb" else r.int(v, p) if k == "wideep_num_slots" else r.str(v, p)
        kw["overrides"] = Overrides(**okw)
    roles_raw = d.get("roles")
    if roles_raw is None:
        mode = kw.get("mode", "aggregated")
        names = ("prefill", "decode") if mode == "disaggregated" else ("aggregated",)
        kw["roles"] = tuple(RoleConfig(name=n) for n in names)
    else:
        roles_tbl = r.table(roles_raw, "roles", set(ROLE_NAMES))
        kw["roles"] = tuple(_role(r, n, roles_tbl[n]) for n in ROLE_NAMES if n in roles_tbl)
    gpus = sum(x.gpus * x.replicas for x in kw["roles"])
    if (msg := limits.problem("gpus", gpus)) is not None:
        raise r.error("roles", f"the deployment's GPUs (tp x pp x dp x cp x replicas, summed over roles) {msg} (docs/limits.md)")
    return DeploymentConfig(**kw)


def parse_config_text(text: str, *, source: str = "<config>", base_dir: str | os.PathLike | None = None) -> DeploymentConfig:
    """Parse TOML text into a config."""
    try:
        obj = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BindingError(f"{source}: invalid TOML: {' '.join(str(e).split())}") from None
    return config_from_dict(obj, source=source, base_dir=base_dir)


def load_config(path: str | os.PathLike) -> DeploymentConfig:
    """Read a TOML deployment config; relative profile directories resolve against the file's folder."""
    p = Path(path)
    return parse_config_text(read_text(p, "config", BindingError), source=str(p), base_dir=p.parent)


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
