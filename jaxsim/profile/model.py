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
from typing import Any, Iterable

from jaxsim.errors import ProfileError, read_text

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


# ----------------------------------------------------------------------------------------------------
# strict field readers


class _Obj:
    """A JSON object being parsed: tracks its field path and which keys were consumed."""

    def __init__(self, value: Any, source: str, path: str, allowed: Iterable[str]):
        self.source, self.path = source, path
        if not isinstance(value, dict):
            raise self.error("", f"expected an object, got {_type_name(value)}")
        unknown = [k for k in value if k not in set(allowed)]
        if unknown:
            raise self.error(str(unknown[0]), "unknown field (extra inputs are not permitted)")
        self.value = value

    def sub(self, key: str | int) -> str:
        """Field path of a child."""
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str | int, msg: str) -> ProfileError:
        """A one-line error at this object's child ``key`` ("" = the object itself)."""
        where = self.sub(key) if key != "" else self.path
        return ProfileError(f"{self.source}: {where}: {msg}" if where else f"{self.source}: {msg}")

    def get(self, key: str, default: Any = _MISSING) -> Any:
        if key in self.value:
            return self.value[key]
        if default is _MISSING:
            raise self.error(key, "field required")
        return default

    def int(self, key: str, *, lo: int, hi: int | None = None, default: Any = _MISSING) -> Any:
        if key not in self.value and default is not _MISSING:
            return default
        v = self.get(key)
        if not _is_int(v):
            raise self.error(key, f"expected an integer, got {_type_name(v)}")
        if v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise self.error(key, f"must be an integer {rng} (got {v})")
        return v

    def str(self, key: str, *, default: Any = _MISSING) -> Any:
        if key not in self.value and default is not _MISSING:
            return default
        v = self.get(key)
        if not isinstance(v, str):
            raise self.error(key, f"expected a string, got {_type_name(v)}")
        if not v.strip():
            raise self.error(key, "must be a non-empty string")
        return v

    def literal(self, key: str, allowed: tuple, *, default: Any = _MISSING) -> Any:
        if key not in self.value and default is not _MISSING:
            return default
        v = self.get(key)
        for a in allowed:
            if type(v) is type(a) and v == a:
                return v
        exp = " or ".join(repr(a) for a in allowed)
        raise self.error(key, f"must be {exp} (got {v!r})")

    def enum(self, key: str, members: tuple[str, ...]) -> str:
        v = self.get(key)
        if not isinstance(v, str):
            raise self.error(key, f"expected a string, got {_type_name(v)}")
        if v not in members:
            raise self.error(key, f"unknown FPM {key} {v!r} (expected one of {', '.join(members)})")
        return v


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), type(v).__name__
    )


def _has_control_chars(s: str) -> bool:
    return any(ord(c) < 32 or 127 <= ord(c) <= 159 for c in s)


def _check_version_label(obj: _Obj, key: str, v: Any) -> str | None:
    """backend_version: None (draft) or a literal, path-safe version label."""
    if v is None:
        return None
    if not isinstance(v, str):
        raise obj.error(key, f"expected a string or null, got {_type_name(v)}")
    if (
        not v
        or v.lower() in UNSAFE_VERSION_LABELS
        or any(c.isspace() or c in "/\\\0" for c in v)
    ):
        raise obj.error(key, f"must be a literal, path-safe version label (got {v!r})")
    return v


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
        o = _Obj(value, source, path, ("kv_cache_bytes", "gpu_memory_utilization", "max_model_len", "provenance"))
        kv = o.int("kv_cache_bytes", lo=1, hi=MAX_BYTES)
        gmu = o.get("gpu_memory_utilization")
        if isinstance(gmu, bool) or not isinstance(gmu, (int, float)):
            raise o.error("gpu_memory_utilization", f"expected a number, got {_type_name(gmu)}")
        gmu = float(gmu)
        if not (0.0 < gmu <= 1.0):
            raise o.error("gpu_memory_utilization", f"must be in (0, 1] (got {gmu!r})")
        return cls(kv, gmu, o.int("max_model_len", lo=1), o.str("provenance"))

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
        keys = ("name", "kind", "num_layers", "block_size_tokens", "page_size_bytes", "sliding_window")
        o = _Obj(value, source, path, keys)
        name = o.str("name")
        kind = o.literal("kind", ("attention", "convolution"))
        layers = o.int("num_layers", lo=1, hi=MAX_U32)
        block = o.int("block_size_tokens", lo=1, hi=MAX_U32)
        page = o.int("page_size_bytes", lo=1, hi=MAX_BYTES)
        window = o.get("sliding_window", None)
        if window is not None:
            window = o.int("sliding_window", lo=1, hi=MAX_U32)
        if kind == "convolution" and window is None:
            raise o.error("sliding_window", "a convolution cache group requires sliding_window")
        return cls(name, kind, layers, block, page, window)

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
        keys = (
            "cache_layout", "max_num_tokens", "max_batch_size", "provenance", "runtime_memory",
            "kv_bytes_per_token", "cache_groups", *DECLARED_BYTE_FIELDS,
        )
        o = _Obj(value, source, path, keys)
        layout = o.literal("cache_layout", ("linear", "grouped"))
        max_tokens = o.int("max_num_tokens", lo=1)
        max_batch = o.int("max_batch_size", lo=1)
        prov = o.str("provenance")
        rm = o.get("runtime_memory", None)
        rm = None if rm is None else RuntimeMemory._parse(rm, source, o.sub("runtime_memory"))
        kvbpt = o.get("kv_bytes_per_token", None)
        if kvbpt is not None:
            kvbpt = o.int("kv_bytes_per_token", lo=1, hi=MAX_BYTES)
        groups_raw = o.get("cache_groups", [])
        if not isinstance(groups_raw, list):
            raise o.error("cache_groups", f"expected an array, got {_type_name(groups_raw)}")
        groups = tuple(
            CacheGroup._parse(g, source, f"{o.sub('cache_groups')}[{i}]") for i, g in enumerate(groups_raw)
        )
        declared = {}
        for f in DECLARED_BYTE_FIELDS:
            v = o.get(f, None)
            declared[f] = None if v is None else o.int(f, lo=0, hi=MAX_BYTES)
        if sum(v for v in declared.values() if v is not None) > MAX_BYTES:
            raise o.error("", "declared resource bytes must sum to <= 2**53")
        if rm is not None and any(v is not None for v in declared.values()):
            raise o.error("", "runtime_memory cannot be combined with declared non-KV resource bytes")
        if layout == "linear" and (kvbpt is None or groups):
            key = "kv_bytes_per_token" if kvbpt is None else "cache_groups"
            raise o.error(key, "linear cache requires kv_bytes_per_token and no cache_groups")
        if layout == "grouped" and (not groups or kvbpt is not None):
            key = "cache_groups" if not groups else "kv_bytes_per_token"
            raise o.error(key, "grouped cache requires cache_groups without a scalar kv_bytes_per_token")
        names = [g.name for g in groups]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise o.error("cache_groups", f"cache group names must be unique ({dup!r} repeats)")
        return cls(layout, max_tokens, max_batch, prov, rm, kvbpt, groups, **declared)

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
        o = _Obj(value, source, path, cls.KEYS)
        kind = o.literal("kind", ("speculative_round",))
        method = o.literal("method", SPECULATIVE_METHODS)
        k = o.int("num_draft_tokens", lo=1, hi=5)
        draft = o.str("draft_model")
        if draft != draft.strip() or _has_control_chars(draft):
            raise o.error("draft_model", "draft_model must be nonblank, trimmed, and contain no control characters")
        rev = o.get("draft_revision")
        if not isinstance(rev, str) or not HEX40.fullmatch(rev):
            raise o.error("draft_revision", "draft_revision must be a lowercase 40-hex immutable checkpoint revision")
        scope = o.literal("timing_scope", (SD_TIMING_SCOPE,))
        return cls(kind, method, k, draft, rev, scope)

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
        keys = (
            "system", "backend", "backend_version", "tp", "dp", "moe_tp", "moe_ep", "pp", "cp",
            "gemm_quant_mode", "moe_quant_mode", "fmha_quant_mode", "comm_quant_mode", "kv_cache_dtype",
            "moe_backend", "attention_backend", "enable_wideep", "enable_eplb", "worker_type", "resources",
            "execution_profile",
        )
        o = _Obj(value, source, path, keys)
        kw: dict[str, Any] = {
            "system": o.str("system"),
            "backend": o.literal("backend", ("vllm",)),
            "backend_version": _check_version_label(o, "backend_version", o.get("backend_version")),
        }
        for k in ("tp", "dp", "moe_tp", "moe_ep"):
            kw[k] = o.int(k, lo=1)
        kw["pp"] = o.literal("pp", (1,), default=1)
        kw["cp"] = o.literal("cp", (1,), default=1)
        kw["gemm_quant_mode"] = o.enum("gemm_quant_mode", GEMM_QUANT_MODES)
        kw["moe_quant_mode"] = o.enum("moe_quant_mode", MOE_QUANT_MODES)
        kw["fmha_quant_mode"] = o.enum("fmha_quant_mode", FMHA_QUANT_MODES)
        kw["comm_quant_mode"] = o.enum("comm_quant_mode", COMM_QUANT_MODES)
        kw["kv_cache_dtype"] = o.enum("kv_cache_dtype", KV_CACHE_DTYPES)
        kw["moe_backend"] = o.str("moe_backend", default="auto")
        kw["attention_backend"] = o.str("attention_backend", default="auto")
        kw["enable_wideep"] = o.literal("enable_wideep", (False,), default=False)
        kw["enable_eplb"] = o.literal("enable_eplb", (False,), default=False)
        wt = o.get("worker_type", None)
        kw["worker_type"] = None if wt is None else o.literal("worker_type", WORKER_TYPES)
        kw["resources"] = Resources._parse(o.get("resources"), source, o.sub("resources"))
        ep = o.get("execution_profile", None)
        kw["execution_profile"] = None if ep is None else ExecutionProfile._parse(ep, source, o.sub("execution_profile"))
        dep = cls(**kw)
        if dep.execution_profile is not None:
            if dep.dp != 1 or dep.pp != 1 or dep.cp != 1 or dep.moe_ep != 1 or dep.moe_tp not in (1, dep.tp):
                raise o.error("", "speculative-round FPM identity currently requires vLLM pure TP with DP1/PP1/CP1")
            res = dep.resources
            if res.runtime_memory is None or res.cache_layout != "linear":
                raise o.error(
                    "resources", "speculative-round FPM resources require observed runtime memory and a linear cache"
                )
        return dep

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


def _topology_ok(d: Deployment, num_experts: int) -> bool:
    if num_experts == 0:
        return d.dp == 1 and d.moe_ep == 1 and d.moe_tp in (1, d.tp)
    tp_mode = d.dp == 1 and d.moe_ep == 1 and d.moe_tp == d.tp
    dep_mode = d.tp == 1 and d.moe_tp == 1 and d.moe_ep == d.dp
    tep_mode = d.dp == 1 and d.moe_tp == 1 and d.moe_ep == d.tp
    return tp_mode or dep_mode or tep_mode


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
        o = _Obj(obj, source, "", cls.KEYS)
        schema = o.literal("schema_version", (1,))
        model = o.str("model")
        rev = o.str("model_revision")
        if rev.strip().lower() in MUTABLE_REFS:
            raise o.error("model_revision", f"provide a pinned model_revision, not the mutable reference {rev!r}")
        arch = o.str("architecture")
        ctx = o.int("context_length", lo=1)
        experts = o.int("num_experts", lo=0)
        data_source = o.get("data_source", None)
        if data_source is not None:
            data_source = o.literal("data_source", DATA_SOURCES)
        prov = o.str("provenance")
        raw = o.get("deployments")
        if not isinstance(raw, list):
            raise o.error("deployments", f"expected an array, got {_type_name(raw)}")
        if not raw:
            raise o.error("deployments", "at least one deployment is required")
        deps = tuple(Deployment._parse(d, source, f"deployments[{i}]") for i, d in enumerate(raw))
        for i, d in enumerate(deps):
            where = f"deployments[{i}]"
            if not _topology_ok(d, experts):
                raise o.error(where, "FPM profile requires dense TP or an MoE TP, DEP, or TEP topology with matching world sizes")
            if d.moe_ep > 1 and (experts == 0 or experts % d.moe_ep):
                raise o.error(f"{where}.moe_ep", f"moe_ep={d.moe_ep} requires num_experts > 0 divisible by it (num_experts={experts})")
        if any(d.execution_profile is not None for d in deps) and not HEX40.fullmatch(rev):
            raise o.error(
                "model_revision",
                "model_revision must be a lowercase 40-hex immutable checkpoint revision when a deployment has an execution_profile",
            )
        seen: dict[tuple, list[tuple[int, str | None]]] = {}
        for i, d in enumerate(deps):
            key = (d.system, d.backend, d.backend_version, d.parallel_tuple)
            prior = seen.setdefault(key, [])
            for j, role in prior:
                if role == d.worker_type:
                    raise o.error(f"deployments[{i}]", f"duplicate FPM deployment identity (same as deployments[{j}])")
                if role is None or d.worker_type is None:
                    raise o.error(
                        f"deployments[{i}]",
                        f"ambiguous FPM deployment identity: role-less and role-specific entries (deployments[{j}]) share one key",
                    )
            prior.append((i, d.worker_type))
        return cls(schema, model, rev, arch, ctx, experts, prov, deps, data_source)

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
            if not _is_int(v) or v <= 0:
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

