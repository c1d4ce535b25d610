"""Deployment configs: TOML → frozen dataclasses (structure and types only).

A config names a model, a system, a backend version, a profile (bundled name or directory) and one
``aggregated`` role or a ``prefill`` + ``decode`` pair, each with its own parallelism, replica count,
scheduler envelope and memory fraction. Parsing is strict: an unknown key or a wrong type raises a
one-line :class:`~jaxsim.errors.BindingError` naming the file and the key path. Whether the config can be
bound to a measured profile is decided by :mod:`jaxsim.rules.validate`, which lists every problem at once.

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

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from jaxsim import limits
from jaxsim import schema as sc
from jaxsim.errors import BindingError, read_text
from jaxsim.overhead import OverheadError, ServingOverhead, read_overhead
from jaxsim.router import Router, RouterError, read_router

__all__ = [
    "ROLE_NAMES", "MODES", "DEFAULT_BLOCK_SIZE", "PRECISION_OVERRIDES", "IDENTITY_OVERRIDES", "REFUSED_OVERRIDES",
    "RoleConfig", "Overrides", "DeploymentConfig", "config_from_dict", "check_config", "parse_config_text", "load_config",
]

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
    ``moe_tp``/``moe_ep`` both ``None``: the MoE layout the profile records for this identity when it records
    exactly one (an imported MoE profile binds with no extra keys), else 1 (the reference's default); see
    :func:`jaxsim.profile.resolve.recorded_moe_layout`. ``dcp`` is absent unless stated.
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
    prefix_caching: bool = True  # vLLM's automatic prefix caching (on by default, as in vLLM and the reference)
    async_scheduling: bool = False  # vLLM's --async-scheduling in replays (off by default, as the reference schedules)

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
    overhead: ServingOverhead = ServingOverhead()  # serving overhead a replay adds per request (zero unless set)
    router: Router = Router()  # how a replay routes requests over a pool's replicas (round-robin unless set)
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
# schema (jaxsim.schema): structure, types and the documented limits; the binding judges the rest


_PARALLEL = sc.Field(sc.Int(lo=1, limit="parallel"))
_ROLE_FIELDS: dict[str, sc.Field] = {
    "tp": _PARALLEL, "pp": _PARALLEL, "dp": _PARALLEL, "moe_tp": _PARALLEL, "moe_ep": _PARALLEL, "cp": _PARALLEL,
    "dcp": sc.Field(sc.Int()),
    "replicas": sc.Field(sc.Int(lo=1, limit="replicas")),
    "profile": sc.Field(sc.Str()),
    "max_num_batched_tokens": sc.Field(sc.Int(lo=1, limit="tokens")),
    "max_num_seqs": sc.Field(sc.Int(lo=1, limit="max_num_seqs")),
    "gpu_memory_utilization": sc.Field(sc.Num()),
    "prefix_caching": sc.Field(sc.Bool()),
    "async_scheduling": sc.Field(sc.Bool()),
}


def _check_dcp(doc: sc.Doc, path: str, dcp: int | None) -> None:
    """dcp is absent unless stated; any stated value is checked by the binding, only its size here."""
    if dcp is not None and abs(dcp) > limits.LIMITS["parallel"].hi:
        raise doc.error(sc.sub(path, "dcp"), limits.problem("parallel", dcp) + " (docs/limits.md)")


def _check_gpus(doc: sc.Doc, roles: tuple[RoleConfig, ...]) -> None:
    gpus = sum(x.gpus * x.replicas for x in roles)
    if (msg := limits.problem("gpus", gpus)) is not None:
        raise doc.error("roles", f"the deployment's GPUs (tp x pp x dp x cp x replicas, summed over roles) {msg} (docs/limits.md)")


def _role_table(name: str) -> sc.Table:
    def make(doc: sc.Doc, path: str, d: dict) -> RoleConfig:
        _check_dcp(doc, path, d.get("dcp"))
        return RoleConfig(name=name, **d)

    return sc.Table(_ROLE_FIELDS, make)


_OVERRIDES = sc.Table(
    {k: sc.Field(sc.Bool() if k == "enable_eplb" else sc.Int() if k == "wideep_num_slots" else sc.Str())
     for k in (f.name for f in fields(Overrides))},
    lambda doc, path, d: Overrides(**d),
)

_STR = sc.Field(sc.Str())
_NUM = sc.Field(sc.Num())  # accepted_tokens, kv_transfer_gbps, tolerance_fraction: the binding judges the values
_CONFIG = sc.Table({
    "model": sc.Field(sc.Str(), required=True),
    "system": sc.Field(sc.Str(), required=True),
    "profile": _STR, "backend": _STR, "backend_version": _STR, "mode": _STR,
    "nextn": sc.Field(sc.Int(lo=0, hi=64)),
    "accept_rates": sc.Field(sc.Array(sc.Num())),
    "accepted_tokens": _NUM,
    "acceptance_preset": _STR,
    "block_size": sc.Field(sc.Int(limit="block_size")),
    "context_length": sc.Field(sc.Int(limit="tokens")),
    "gpu_memory_bytes": sc.Field(sc.Int(lo=1, limit="bytes")),
    "estimation_mode": _STR, "method": _STR, "database_mode": _STR, "fallback": _STR,
    "speculation": sc.Field(sc.Raw(dict)),
    "kv_offload": sc.Field(sc.Bool()),
    "kv_transfer_gbps": _NUM,
    "cuda_graph_reserved_bytes": sc.Field(sc.Int(lo=0, limit="bytes", upper_only=True)),
    "tolerance_fraction": _NUM,
    "overrides": sc.Field(_OVERRIDES),
    "overhead": sc.Field(sc.Custom(lambda doc, v, path: _overhead(doc, v, path))),
    "router": sc.Field(sc.Custom(lambda doc, v, path: _router(doc, v, path))),
    "roles": sc.Field(sc.Table({n: sc.Field(_role_table(n)) for n in ROLE_NAMES}, lambda doc, path, d: tuple(d.values()))),
})


def _overhead(doc: sc.Doc, v: Any, path: str) -> ServingOverhead:
    """``overhead = {fixed_ms = ..., per_prompt_token_ms = ..., per_output_token_ms = ...}`` (provenance: "set in
    FILE" unless given) or the JSON file ``jaxsim calibrate --benchmark`` writes (relative to the config's folder)."""
    if isinstance(v, str):
        base_dir = doc.context.get("base_dir")
        p = Path(v).expanduser()
        v = base_dir / p if base_dir is not None and not p.is_absolute() else p
    elif isinstance(v, Mapping) and "provenance" not in v:
        v = dict(v, provenance=f"set in {doc.source}")
    try:
        return read_overhead(v, path)
    except OverheadError as e:
        raise doc.error("", str(e)) from None


def _router(doc: sc.Doc, v: Any, path: str) -> Router:
    """``router = "kv"`` or ``[router] policy = "kv", overlap_score_weight = 1.0, ttl_s = 120`` (:mod:`jaxsim.router`)."""
    try:
        return read_router(v, path or "router")
    except RouterError as e:
        raise doc.error("", str(e)) from None


def config_from_dict(obj: Mapping[str, Any], *, source: str = "<config>", base_dir: str | os.PathLike | None = None) -> DeploymentConfig:
    """Build a config from a parsed TOML/JSON mapping; one-line BindingError on an unknown key or wrong type."""
    doc = sc.Doc(source, BindingError, base_dir=None if base_dir is None else Path(base_dir))
    kw = _CONFIG.read(doc, dict(obj))
    if "roles" not in kw:
        names = ("prefill", "decode") if kw.get("mode", "aggregated") == "disaggregated" else ("aggregated",)
        kw["roles"] = tuple(RoleConfig(name=n) for n in names)
    _check_gpus(doc, kw["roles"])
    return DeploymentConfig(**kw, source=source, base_dir=None if base_dir is None else Path(base_dir))


def check_config(cfg: DeploymentConfig) -> DeploymentConfig:
    """``cfg`` built in code, after the checks :func:`config_from_dict` makes of its roles: each role's
    stated values (parallelism, replicas, scheduler envelope, memory fraction) by the same field types and
    documented limits, and the deployment's GPUs. Raises the same one-line BindingError (``cfg.source``,
    then the key path) the reader would for the equivalent TOML. Whether the config binds to a profile is
    :mod:`jaxsim.rules.validate`'s question."""
    doc = sc.Doc(cfg.source, BindingError)
    for role in cfg.roles:
        path = f"roles.{role.name}"
        for key, f in _ROLE_FIELDS.items():
            if (v := getattr(role, key)) is not None:
                f.type.read(doc, v, f"{path}.{key}")
        _check_dcp(doc, path, role.dcp)
    _check_gpus(doc, cfg.roles)
    return cfg


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

