"""FPM model profile (aisimulate ``FpmModelProfile``, schema_version 1): strict parsing, rules, I/O.

Parsing mirrors the reference's strict pydantic models: unknown keys and type coercion are refused
(``bool`` is never an ``int``; an ``int`` is accepted where a float is expected). Every error is a
one-line :class:`~jaxsim.errors.ProfileError` naming the file and the field path.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxsim import schema as sc
from jaxsim.errors import ProfileError, read_text
from jaxsim.fields import is_int

__all__ = [
    "MAX_BYTES", "MAX_U32", "MUTABLE_REFS", "UNSAFE_VERSION_LABELS", "HEX40", "GEMM_QUANT_MODES", "MOE_QUANT_MODES",
    "FMHA_QUANT_MODES", "KV_CACHE_DTYPES", "COMM_QUANT_MODES", "WORKER_TYPES", "DATA_SOURCES", "SELECTOR_PREFIX",
    "SPECULATIVE_METHODS", "AR_EXECUTION_IDENTITY", "SD_TIMING_SCOPE", "DECLARED_BYTE_FIELDS", "RuntimeMemory",
    "CacheGroup", "Resources", "ExecutionProfile", "Deployment", "ModelProfile", "infer_data_source",
    "parse_profile_text", "load_profile", "save_profile",
]

MAX_BYTES = 2**53
MAX_U32 = 2**32 - 1
MUTABLE_REFS = frozenset({"main", "master", "head", "latest", "current", "unknown", "tbd", "unpinned"})
UNSAFE_VERSION_LABELS = MUTABLE_REFS | {"previous", "next", ".", ".."}
HEX40 = re.compile(r"[0-9a-f]{40}")

GEMM_QUANT_MODES = (
    "bfloat16", "int8_wo", "int4_wo", "fp8", "fp8_static", "sq", "fp8_block", "fp8_ootb", "nvfp4",
    "nvfp4_wo", "w4a16_nvfp4",
)
MOE_QUANT_MODES = (
    "bfloat16", "fp8", "int4_wo", "fp8_block", "w4afp8", "nvfp4", "nvfp4_wo", "w4a16_mxfp4",
    "w4a8_mxfp4_mxfp8", "w4a8_mxfp4_mxfp8_trtllm", "w4a16_mxfp4_cutlass", "w4a16_nvfp4",
    "w4a16_mxfp4_humming",
)
FMHA_QUANT_MODES = ("bfloat16", "float16", "fp8", "fp8_block")
KV_CACHE_DTYPES = ("bfloat16", "int8", "fp8")
COMM_QUANT_MODES = ("half", "int8", "fp8")
WORKER_TYPES = ("prefill", "decode", "aggregated")
DATA_SOURCES = ("measured", "derived", "modelled", "calibrated")

SELECTOR_PREFIX = "speculative_round_v1:"
SPECULATIVE_METHODS = ("eagle3", "mtp")
AR_EXECUTION_IDENTITY = ("", "full", "none", "text")
SD_TIMING_SCOPE = "model_step_cuda"

_MISSING = object()


def _has_control_chars(s: str) -> bool:
    return any(ord(c) < 32 or 127 <= ord(c) <= 159 for c in s)


def _version_label(doc: sc.Doc, v: Any, path: str) -> str:
    """backend_version: a literal, path-safe version label (null, a draft, is allowed by the field)."""
    if not isinstance(v, str):
        raise doc.error(path, f"expected a string or null, got {doc.got(v)}")
    if not v or v.lower() in UNSAFE_VERSION_LABELS or any(c.isspace() or c in "/\\\0" for c in v):
        raise doc.error(path, f"must be a literal, path-safe version label (got {v!r})")
    return v


def _doc(source: str) -> sc.Doc:
    return sc.Doc(source, ProfileError, json=True)


# ----------------------------------------------------------------------------------------------------
# model


@dataclass(frozen=True)
class RuntimeMemory:
    """Observed rank-local KV pool after engine init (bytes) and the exact vLLM settings used."""

    kv_cache_bytes: int
    gpu_memory_utilization: float
    max_model_len: int
    provenance: str

    @classmethod
    def _parse(cls, value: Any, source: str, path: str) -> RuntimeMemory:
        return _RUNTIME_MEMORY.read(_doc(source), value, path)

    def to_dict(self) -> dict:
        return {
            "kv_cache_bytes": self.kv_cache_bytes,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_model_len": self.max_model_len,
            "provenance": self.provenance,
        }


@dataclass(frozen=True)
class CacheGroup:
    """One KV-cache group of a grouped layout (page = one block of all the group's layers, bytes)."""

    name: str
    kind: str
    num_layers: int
    block_size_tokens: int
    page_size_bytes: int
    sliding_window: int | None = None

    @classmethod
    def _parse(cls, value: Any, source: str, path: str) -> CacheGroup:
        return _CACHE_GROUP.read(_doc(source), value, path)

    def to_dict(self) -> dict:
        d = {
            "name": self.name,
            "kind": self.kind,
            "num_layers": self.num_layers,
            "block_size_tokens": self.block_size_tokens,
            "page_size_bytes": self.page_size_bytes,
        }
        if self.sliding_window is not None:
            d["sliding_window"] = self.sliding_window
        return d


DECLARED_BYTE_FIELDS = ("weights_bytes", "activations_bytes", "runtime_overhead_bytes", "comm_overhead_bytes")


@dataclass(frozen=True)
class Resources:
    """Rank-local memory and scheduler geometry of one deployment."""

    cache_layout: str
    max_num_tokens: int
    max_batch_size: int
    provenance: str
    runtime_memory: RuntimeMemory | None = None
    kv_bytes_per_token: int | None = None
    cache_groups: tuple[CacheGroup, ...] = ()
    weights_bytes: int | None = None
    activations_bytes: int | None = None
    runtime_overhead_bytes: int | None = None
    comm_overhead_bytes: int | None = None

    @property
    def memory_source(self) -> str:
        """"runtime" (observed pool), "declared" (all four byte fields) or "pending"."""
        if self.runtime_memory is not None:
            return "runtime"
        if all(getattr(self, f) is not None for f in DECLARED_BYTE_FIELDS):
            return "declared"
        return "pending"

    @classmethod
    def _parse(cls, value: Any, source: str, path: str) -> Resources:
        return _RESOURCES.read(_doc(source), value, path)

    def to_dict(self) -> dict:
        d: dict[str, Any] = {
            "cache_layout": self.cache_layout,
            "max_num_tokens": self.max_num_tokens,
            "max_batch_size": self.max_batch_size,
            "provenance": self.provenance,
        }
        if self.runtime_memory is not None:
            d["runtime_memory"] = self.runtime_memory.to_dict()
        if self.kv_bytes_per_token is not None:
            d["kv_bytes_per_token"] = self.kv_bytes_per_token
        if self.cache_groups:
            d["cache_groups"] = [g.to_dict() for g in self.cache_groups]
        for f in DECLARED_BYTE_FIELDS:
            if getattr(self, f) is not None:
                d[f] = getattr(self, f)
        return d


@dataclass(frozen=True)
class ExecutionProfile:
    """Speculative-round identity: one timed step = a whole draft+verify round (EAGLE-3 draft model, or the
    model's own multi-token-prediction layers, method "mtp", as priced by ``jaxsim import op-model``)."""

    kind: str
    method: str
    num_draft_tokens: int
    draft_model: str
    draft_revision: str
    timing_scope: str

    KEYS = ("kind", "method", "num_draft_tokens", "draft_model", "draft_revision", "timing_scope")

    @classmethod
    def _parse(cls, value: Any, source: str, path: str) -> ExecutionProfile:
        return _EXECUTION_PROFILE.read(_doc(source), value, path)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.KEYS}

    def selector(self, model_revision: str) -> str:
        """The canonical ``speculative_round_v1:{...}`` row selector (compact JSON, fixed key order)."""
        body = {"model_revision": model_revision, "execution_profile": self.to_dict()}
        return SELECTOR_PREFIX + json.dumps(body, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Deployment:
    """One (system, backend, version, topology, role) entry of a profile."""

    system: str
    backend: str
    backend_version: str | None
    tp: int
    dp: int
    moe_tp: int
    moe_ep: int
    gemm_quant_mode: str
    moe_quant_mode: str
    fmha_quant_mode: str
    comm_quant_mode: str
    kv_cache_dtype: str
    resources: Resources
    pp: int = 1
    cp: int = 1
    moe_backend: str = "auto"
    attention_backend: str = "auto"
    enable_wideep: bool = False
    enable_eplb: bool = False
    worker_type: str | None = None
    execution_profile: ExecutionProfile | None = None

    @property
    def parallel_tuple(self) -> tuple[int, int, int, int, int, int]:
        """(tp, pp, dp, moe_tp, moe_ep, cp)."""
        return (self.tp, self.pp, self.dp, self.moe_tp, self.moe_ep, self.cp)

    @property
    def is_speculative(self) -> bool:
        return self.execution_profile is not None

    @property
    def num_draft_tokens(self) -> int:
        """K of the measured speculative round; 0 for autoregressive."""
        return 0 if self.execution_profile is None else self.execution_profile.num_draft_tokens

    def match_identity(self) -> list[str]:
        """The 15 identity strings that table rows must carry."""
        return [
            self.gemm_quant_mode, self.moe_quant_mode, self.fmha_quant_mode, self.comm_quant_mode,
            self.kv_cache_dtype, *(str(x) for x in self.parallel_tuple), self.moe_backend,
            self.attention_backend, str(self.enable_wideep), str(self.enable_eplb),
        ]

    def execution_identity(self, model_revision: str) -> list[str]:
        """The 4 execution strings (model_config_sha256, execution_profile, engram, modality)."""
        if self.execution_profile is None:
            return list(AR_EXECUTION_IDENTITY)
        return ["", self.execution_profile.selector(model_revision), "none", "text"]

    def describe(self) -> str:
        """Short human identity, for messages."""
        role = self.worker_type or "role-less"
        return (
            f"{self.system}/{self.backend}/{self.backend_version} tp={self.tp} pp={self.pp} dp={self.dp} "
            f"moe_tp={self.moe_tp} moe_ep={self.moe_ep} cp={self.cp} ({role})"
        )

    @classmethod
    def _parse(cls, value: Any, source: str, path: str) -> Deployment:
        return _DEPLOYMENT.read(_doc(source), value, path)

    def to_dict(self) -> dict:
        d: dict[str, Any] = {
            "system": self.system,
            "backend": self.backend,
            "backend_version": self.backend_version,
            "tp": self.tp,
            "dp": self.dp,
            "moe_tp": self.moe_tp,
            "moe_ep": self.moe_ep,
        }
        if self.pp != 1:
            d["pp"] = self.pp
        if self.cp != 1:
            d["cp"] = self.cp
        for k in ("gemm_quant_mode", "moe_quant_mode", "fmha_quant_mode", "comm_quant_mode", "kv_cache_dtype"):
            d[k] = getattr(self, k)
        if self.moe_backend != "auto":
            d["moe_backend"] = self.moe_backend
        if self.attention_backend != "auto":
            d["attention_backend"] = self.attention_backend
        if self.enable_wideep:
            d["enable_wideep"] = self.enable_wideep
        if self.enable_eplb:
            d["enable_eplb"] = self.enable_eplb
        if self.worker_type is not None:
            d["worker_type"] = self.worker_type
        d["resources"] = self.resources.to_dict()
        if self.execution_profile is not None:
            d["execution_profile"] = self.execution_profile.to_dict()
        return d


def infer_data_source(provenance: str) -> str:
    """The data source of a profile that stores none (written before ``data_source`` existed).

    Its provenance says it: text starting "DERIVED" (jaxsim's derived EAGLE-3 rounds), "MODELLED" or
    "CALIBRATED" names that source; anything else was imported from real forward passes: "measured".
    """
    head = provenance.lstrip().upper()
    for src in ("derived", "modelled", "calibrated"):
        if head.startswith(src.upper()):
            return src
    return "measured"


def _topology_ok(d: Deployment, num_experts: int, source: str = "measured") -> bool:
    """The reference's topologies (dense TP; MoE TP, DEP, TEP). A MODELLED profile (the op model prices attention DP
    at any attention TP) may also record attention-DP ranks of TP > 1 with the experts over all of them
    (moe_tp 1, moe_ep = tp x dp): DEP at attention TP > 1."""
    if num_experts == 0:
        return d.dp == 1 and d.moe_ep == 1 and d.moe_tp in (1, d.tp)
    tp_mode = d.dp == 1 and d.moe_ep == 1 and d.moe_tp == d.tp
    dep_mode = d.tp == 1 and d.moe_tp == 1 and d.moe_ep == d.dp
    tep_mode = d.dp == 1 and d.moe_tp == 1 and d.moe_ep == d.tp
    modelled_dp = source == "modelled" and d.dp > 1 and d.moe_tp == 1 and d.moe_ep == d.tp * d.dp
    return tp_mode or dep_mode or tep_mode or modelled_dp


@dataclass(frozen=True)
class ModelProfile:
    """One model's FPM profile: identity plus one entry per measured deployment."""

    schema_version: int
    model: str
    model_revision: str
    architecture: str
    context_length: int
    num_experts: int
    provenance: str
    deployments: tuple[Deployment, ...]
    data_source: str | None = None

    KEYS = (
        "schema_version", "model", "model_revision", "architecture", "context_length", "num_experts",
        "data_source", "provenance", "deployments",
    )

    @property
    def source(self) -> str:
        """What the numbers are: the stored ``data_source``, else inferred (see :func:`infer_data_source`)."""
        return self.data_source if self.data_source is not None else infer_data_source(self.provenance)

    @classmethod
    def from_dict(cls, obj: Any, source: str = "profile.json") -> ModelProfile:
        """Parse and validate a profile object; raises ProfileError naming ``source`` and the field path."""
        return _MODEL_PROFILE.read(_doc(source), obj, "")

    def to_dict(self) -> dict:
        """JSON object in the golden files' key order (defaulted fields omitted)."""
        d: dict[str, Any] = {
            "schema_version": self.schema_version,
            "model": self.model,
            "model_revision": self.model_revision,
            "architecture": self.architecture,
            "context_length": self.context_length,
            "num_experts": self.num_experts,
        }
        if self.data_source is not None:
            d["data_source"] = self.data_source
        d["provenance"] = self.provenance
        d["deployments"] = [x.to_dict() for x in self.deployments]
        return d

    def to_json(self) -> str:
        """Canonical file text: indent 1, UTF-8, trailing newline."""
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n"

    def select(
        self,
        system: str,
        backend: str,
        backend_version: str | None,
        tp: int = 1,
        pp: int = 1,
        dp: int = 1,
        moe_tp: int | None = None,
        moe_ep: int | None = None,
        cp: int = 1,
        worker_type: str = "aggregated",
        *,
        model: str | None = None,
    ) -> Deployment:
        """The first deployment with exactly this identity and worker_type in {None, requested}."""
        if model is not None and model != self.model:
            raise ProfileError(f"FPM profile model identity mismatch: requested {model!r}, profile={self.model!r}")
        if worker_type not in WORKER_TYPES:
            raise ProfileError(f"worker_type must be one of {', '.join(WORKER_TYPES)} (got {worker_type!r})")
        dims = {"tp": tp, "pp": pp, "dp": dp, "moe_tp": 1 if moe_tp is None else moe_tp,
                "moe_ep": 1 if moe_ep is None else moe_ep, "cp": cp}
        for name, v in dims.items():
            if not is_int(v) or v <= 0:
                raise ProfileError(f"parallel dimensions must be integers > 0 ({name}={v!r})")
        want = tuple(dims[k] for k in ("tp", "pp", "dp", "moe_tp", "moe_ep", "cp"))
        for d in self.deployments:
            if (
                d.system == system
                and d.backend == backend
                and d.backend_version == backend_version
                and d.parallel_tuple == want
                and d.worker_type in (None, worker_type)
            ):
                return d
        have = "; ".join(d.describe() for d in self.deployments)
        raise ProfileError(
            f"no matching FPM deployment profile for {system}/{backend}/{backend_version} tp={want[0]} pp={want[1]} "
            f"dp={want[2]} moe_tp={want[3]} moe_ep={want[4]} cp={want[5]} worker_type={worker_type} "
            f"in model {self.model!r} (have: {have})"
        )


# ----------------------------------------------------------------------------------------------------
# schema (jaxsim.schema): field declarations, then the cross-field rules of each object


def _F(t: sc.Type, *, required: bool = True, default: Any = sc.MISSING, nullable: bool = False) -> sc.Field:
    return sc.Field(t, required=required and default is sc.MISSING and not nullable, default=default, nullable=nullable)


def _opt(t: sc.Type) -> sc.Field:
    """Optional; an explicit null means absent."""
    return sc.Field(t, default=None, nullable=True)


def _enum(key: str, members: tuple[str, ...]) -> sc.Field:
    return _F(sc.Literal(members, strings=True,
                         message=lambda v: f"unknown FPM {key} {v!r} (expected one of {', '.join(members)})"))


def _make_resources(doc: sc.Doc, path: str, d: dict) -> Resources:
    rm, kvbpt, groups = d["runtime_memory"], d["kv_bytes_per_token"], d["cache_groups"]
    declared = {f: d[f] for f in DECLARED_BYTE_FIELDS}
    if sum(v for v in declared.values() if v is not None) > MAX_BYTES:
        raise doc.error(path, "declared resource bytes must sum to <= 2**53")
    if rm is not None and any(v is not None for v in declared.values()):
        raise doc.error(path, "runtime_memory cannot be combined with declared non-KV resource bytes")
    if d["cache_layout"] == "linear" and (kvbpt is None or groups):
        key = "kv_bytes_per_token" if kvbpt is None else "cache_groups"
        raise doc.error(sc.sub(path, key), "linear cache requires kv_bytes_per_token and no cache_groups")
    if d["cache_layout"] == "grouped" and (not groups or kvbpt is not None):
        key = "cache_groups" if not groups else "kv_bytes_per_token"
        raise doc.error(sc.sub(path, key), "grouped cache requires cache_groups without a scalar kv_bytes_per_token")
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise doc.error(sc.sub(path, "cache_groups"), f"cache group names must be unique ({dup!r} repeats)")
    return Resources(**d)


def _make_cache_group(doc: sc.Doc, path: str, d: dict) -> CacheGroup:
    if d["kind"] == "convolution" and d["sliding_window"] is None:
        raise doc.error(sc.sub(path, "sliding_window"), "a convolution cache group requires sliding_window")
    return CacheGroup(**d)


def _draft_revision(doc: sc.Doc, v: Any, path: str) -> str:
    if not isinstance(v, str) or not HEX40.fullmatch(v):
        raise doc.error(path, "draft_revision must be a lowercase 40-hex immutable checkpoint revision")
    return v


def _make_deployment(doc: sc.Doc, path: str, d: dict) -> Deployment:
    dep = Deployment(**d)
    if dep.execution_profile is not None:
        if dep.dp != 1 or dep.pp != 1 or dep.cp != 1 or dep.moe_ep != 1 or dep.moe_tp not in (1, dep.tp):
            raise doc.error(path, "speculative-round FPM identity currently requires vLLM pure TP with DP1/PP1/CP1")
        res = dep.resources
        if res.runtime_memory is None or res.cache_layout != "linear":
            raise doc.error(sc.sub(path, "resources"),
                            "speculative-round FPM resources require observed runtime memory and a linear cache")
    return dep


def _pinned_revision(rev: str) -> str | None:
    if rev.strip().lower() in MUTABLE_REFS:
        return f"provide a pinned model_revision, not the mutable reference {rev!r}"
    return None


def _make_model_profile(doc: sc.Doc, path: str, d: dict) -> ModelProfile:
    deps, experts, rev = d["deployments"], d["num_experts"], d["model_revision"]
    source = d.get("data_source") or infer_data_source(d["provenance"])
    for i, dep in enumerate(deps):
        where = f"deployments[{i}]"
        if not _topology_ok(dep, experts, source):
            extra = (" (attention DP at tp > 1 with moe_tp 1, moe_ep = tp x dp is accepted in modelled profiles only)"
                     if experts and dep.dp > 1 and dep.tp > 1 else "")
            raise doc.error(where, f"FPM profile requires dense TP or an MoE TP, DEP, or TEP topology with matching world sizes{extra}")
        if dep.moe_ep > 1 and (experts == 0 or experts % dep.moe_ep):
            raise doc.error(f"{where}.moe_ep", f"moe_ep={dep.moe_ep} requires num_experts > 0 divisible by it (num_experts={experts})")
    if any(dep.execution_profile is not None for dep in deps) and not HEX40.fullmatch(rev):
        raise doc.error(
            "model_revision",
            "model_revision must be a lowercase 40-hex immutable checkpoint revision when a deployment has an execution_profile",
        )
    seen: dict[tuple, list[tuple[int, str | None]]] = {}
    for i, dep in enumerate(deps):
        key = (dep.system, dep.backend, dep.backend_version, dep.parallel_tuple)
        prior = seen.setdefault(key, [])
        for j, role in prior:
            if role == dep.worker_type:
                raise doc.error(f"deployments[{i}]", f"duplicate FPM deployment identity (same as deployments[{j}])")
            if role is None or dep.worker_type is None:
                raise doc.error(
                    f"deployments[{i}]",
                    f"ambiguous FPM deployment identity: role-less and role-specific entries (deployments[{j}]) share one key",
                )
        prior.append((i, dep.worker_type))
    return ModelProfile(**d)


_U32 = sc.Int(lo=1, hi=MAX_U32)
_RUNTIME_MEMORY = sc.Table({
    "kv_cache_bytes": _F(sc.Int(lo=1, hi=MAX_BYTES)),
    "gpu_memory_utilization": _F(sc.Num(gt=0.0, le=1.0)),
    "max_model_len": _F(sc.Int(lo=1)),
    "provenance": _F(sc.Str()),
}, lambda doc, path, d: RuntimeMemory(**d))
_CACHE_GROUP = sc.Table({
    "name": _F(sc.Str()),
    "kind": _F(sc.Literal(("attention", "convolution"))),
    "num_layers": _F(_U32),
    "block_size_tokens": _F(_U32),
    "page_size_bytes": _F(sc.Int(lo=1, hi=MAX_BYTES)),
    "sliding_window": _opt(_U32),
}, _make_cache_group)
_RESOURCES = sc.Table({
    "cache_layout": _F(sc.Literal(("linear", "grouped"))),
    "max_num_tokens": _F(sc.Int(lo=1)),
    "max_batch_size": _F(sc.Int(lo=1)),
    "provenance": _F(sc.Str()),
    "runtime_memory": _opt(_RUNTIME_MEMORY),
    "kv_bytes_per_token": _opt(sc.Int(lo=1, hi=MAX_BYTES)),
    "cache_groups": _F(sc.Array(_CACHE_GROUP), default=()),
    **{f: _opt(sc.Int(lo=0, hi=MAX_BYTES)) for f in DECLARED_BYTE_FIELDS},
}, _make_resources)
_EXECUTION_PROFILE = sc.Table({
    "kind": _F(sc.Literal(("speculative_round",))),
    "method": _F(sc.Literal(SPECULATIVE_METHODS)),
    "num_draft_tokens": _F(sc.Int(lo=1, hi=5)),
    "draft_model": _F(sc.Str(check=lambda v: None if v == v.strip() and not _has_control_chars(v) else
                             "draft_model must be nonblank, trimmed, and contain no control characters")),
    "draft_revision": _F(sc.Custom(_draft_revision)),
    "timing_scope": _F(sc.Literal((SD_TIMING_SCOPE,))),
}, lambda doc, path, d: ExecutionProfile(**d))
_DEPLOYMENT = sc.Table({
    "system": _F(sc.Str()),
    "backend": _F(sc.Literal(("vllm",))),
    "backend_version": sc.Field(sc.Custom(_version_label), required=True, nullable=True),
    "tp": _F(sc.Int(lo=1)), "dp": _F(sc.Int(lo=1)), "moe_tp": _F(sc.Int(lo=1)), "moe_ep": _F(sc.Int(lo=1)),
    "pp": _F(sc.Literal((1,)), default=1),
    "cp": _F(sc.Literal((1,)), default=1),
    "gemm_quant_mode": _enum("gemm_quant_mode", GEMM_QUANT_MODES),
    "moe_quant_mode": _enum("moe_quant_mode", MOE_QUANT_MODES),
    "fmha_quant_mode": _enum("fmha_quant_mode", FMHA_QUANT_MODES),
    "comm_quant_mode": _enum("comm_quant_mode", COMM_QUANT_MODES),
    "kv_cache_dtype": _enum("kv_cache_dtype", KV_CACHE_DTYPES),
    "moe_backend": _F(sc.Str(), default="auto"),
    "attention_backend": _F(sc.Str(), default="auto"),
    "enable_wideep": _F(sc.Literal((False,)), default=False),
    "enable_eplb": _F(sc.Literal((False,)), default=False),
    "worker_type": _opt(sc.Literal(WORKER_TYPES)),
    "resources": _F(_RESOURCES),
    "execution_profile": _opt(_EXECUTION_PROFILE),
}, _make_deployment)
_MODEL_PROFILE = sc.Table({
    "schema_version": _F(sc.Literal((1,))),
    "model": _F(sc.Str()),
    "model_revision": _F(sc.Str(check=_pinned_revision)),
    "architecture": _F(sc.Str()),
    "context_length": _F(sc.Int(lo=1)),
    "num_experts": _F(sc.Int(lo=0)),
    "data_source": _opt(sc.Literal(DATA_SOURCES)),
    "provenance": _F(sc.Str()),
    "deployments": _F(sc.Array(_DEPLOYMENT, min_len=1, empty="at least one deployment is required")),
}, _make_model_profile)


# ----------------------------------------------------------------------------------------------------
# files


def _no_duplicate_keys(source: str):
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise ProfileError(f"{source}: duplicate JSON key {k!r}")
            out[k] = v
        return out

    return hook


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


def parse_profile_text(text: str, source: str = "profile.json") -> ModelProfile:
    """Parse profile JSON text (duplicate keys and NaN/Infinity refused)."""
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicate_keys(source), parse_constant=_reject_constant)
    except ProfileError:
        raise
    except ValueError as e:
        raise ProfileError(f"{source}: invalid JSON: {str(e).splitlines()[0]}") from None
    return ModelProfile.from_dict(obj, source=source)


def load_profile(path: str | os.PathLike) -> ModelProfile:
    """Read and validate a profile JSON file."""
    p = Path(path)
    return parse_profile_text(read_text(p, "profile", ProfileError), source=str(p))


def save_profile(profile: ModelProfile, path: str | os.PathLike) -> None:
    """Write ``profile`` atomically in canonical form (save -> load -> save is byte-identical)."""
    p = Path(path)
    from jaxsim.outputs import write_bytes

    write_bytes(p, profile.to_json().encode("utf-8"))

