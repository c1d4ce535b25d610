"""Binding a deployment config to measured profiles: plain-Python validation before any jit.

:func:`validate_config` lists every problem of a config, one line each, starting with the rule's name
(``sd-nextn: speculative-round FPM nextn must match num_draft_tokens ... (nextn=2, num_draft_tokens=3)``).
:func:`bind` raises :class:`~jaxsim.errors.BindingError` with the first problem, or returns a
:class:`Binding`: per role the selected deployment, its profile bundle, the compiled
:class:`~jaxsim.kernels.rounds.RoundTable`, the KV pool, plus nextn and acceptance rates padded to 5.

Profile directories, selected cells and compiled tables are cached by exact identity (resolved path,
file stamps, deployment, DCP), so re-validating many configs over the same profiles costs microseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

import numpy as np

from jaxsim import acceptance, systems
from jaxsim.rules.capacity import (
    VLLM_DEFAULT_GPU_MEMORY_UTILIZATION,
    CapacityRequest,
    KvCacheEstimate,
    block_size_problem,
    capacity_problems,
)
from jaxsim.rules.config import (
    IDENTITY_OVERRIDES,
    MODES,
    REFUSED_OVERRIDES,
    DeploymentConfig,
    RoleConfig,
)
from jaxsim.errors import BindingError, JaxsimError
from jaxsim.profile import CellRows, Deployment, ProfileBundle
from jaxsim.profile.model import MAX_BYTES, UNSAFE_VERSION_LABELS
from jaxsim.profile.resolve import cell_rows, load_bundle, resolve_profile_dir, select_deployment

if TYPE_CHECKING:  # the compiled kernels are imported where a binding is built: validation needs no JAX
    from jaxsim.kernels.capacity import KvPool, PoolCapacity
    from jaxsim.kernels.rounds import RoundTable

MAX_NEXTN = acceptance.MAX_DRAFT_TOKENS
FPM_FMHA_MODES = ("bfloat16", "fp8", "fp8_block")

SD_POLICY_MSG = (
    "speculative-round FPM requires explicit fpm_interpolation, direct method, SILICON data and fallback_policy='deny'"
)
SD_NEXTN_MSG = "speculative-round FPM nextn must match num_draft_tokens and cannot use generic speculation"
SD_PARALLEL_MSG = "speculative-round FPM supports vLLM pure TP with PP1/DP1/CP1 and no recorded DCP"
SD_RESOURCES_MSG = "speculative-round FPM resources require observed runtime memory and a linear cache"


# ----------------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True, eq=False)
class RoleBinding:
    """One bound role: its deployment, profile bundle, compiled round table and KV pool.

    ``max_num_batched_tokens``/``max_num_seqs``/``gpu_memory_utilization`` are the resolved per-rank
    scheduler envelope and memory fraction; ``kv`` is the reference's cache estimate and ``pool`` the
    (tolerance-adjusted) pool ready for :func:`jaxsim.kernels.capacity.pool_capacity`.
    """

    name: str
    role: RoleConfig
    profile_dir: Path
    bundle: ProfileBundle
    deployment: Deployment
    cell: CellRows
    table: RoundTable
    kv: KvCacheEstimate
    pool: KvPool
    max_num_batched_tokens: int
    max_num_seqs: int
    gpu_memory_utilization: float

    @property
    def is_speculative(self) -> bool:
        return self.deployment.is_speculative

    @property
    def data_source(self) -> str:
        """What this role's profile numbers are: measured, derived, modelled or calibrated."""
        return self.bundle.profile.source

    @property
    def num_draft_tokens(self) -> int:
        return self.deployment.num_draft_tokens

    @property
    def replicas(self) -> int:
        return self.role.replicas

    @property
    def kv_bytes_per_token(self) -> int | None:
        return self.deployment.resources.kv_bytes_per_token

    def capacity(self, isl: int, osl: int) -> PoolCapacity:
        """KV tokens, blocks, per-request blocks and max concurrency per rank for requests of ISL + OSL."""
        from jaxsim.kernels.capacity import pool_capacity_jit

        return pool_capacity_jit(self.pool, np.int64(isl), np.int64(osl))


@dataclass(frozen=True, eq=False)
class Binding:
    """A validated deployment: resolved roles plus speculation settings.

    ``accept_rates`` are the per-position conditional acceptance rates padded to 5 (zeros for an
    autoregressive deployment). ``kv_transfer_bytes_per_s`` is the P/D link bandwidth (None when
    aggregated).
    """

    config: DeploymentConfig
    roles: Mapping[str, RoleBinding]
    nextn: int
    accept_rates: np.ndarray
    block_size: int
    context_length: int
    gpu_memory_bytes: int
    kv_transfer_bytes_per_s: float | None

    @property
    def mode(self) -> str:
        return self.config.mode

    @property
    def is_speculative(self) -> bool:
        return self.nextn > 0

    @property
    def data_source(self) -> str:
        """The roles' data sources (one value, or ``prefill-source+decode-source`` when they differ)."""
        return "+".join(dict.fromkeys(r.data_source for r in self.roles.values()))

    def role(self, name: str) -> RoleBinding:
        return self.roles[name]

    @property
    def aggregated(self) -> RoleBinding:
        return self.roles["aggregated"]

    @property
    def prefill(self) -> RoleBinding:
        return self.roles["prefill"]

    @property
    def decode(self) -> RoleBinding:
        return self.roles["decode"]


def _round_table(bundle: ProfileBundle, dep: Deployment, dcp: int | None) -> RoundTable:
    from jaxsim.kernels.tables import round_table

    return round_table(bundle, dep, dcp)


# ----------------------------------------------------------------------------------------------------
# analysis


@dataclass
class _Role:
    role: RoleConfig
    root: Path | None = None
    bundle: ProfileBundle | None = None
    deployment: Deployment | None = None
    cell: CellRows | None = None
    request: CapacityRequest | None = None


def _gpu_memory_bytes(cfg: DeploymentConfig, out: list[str]) -> int | None:
    if cfg.gpu_memory_bytes is not None:
        if cfg.gpu_memory_bytes > MAX_BYTES:
            out.append(f"gpu-memory: gpu_memory_bytes must be <= 2**53 (got {cfg.gpu_memory_bytes})")
            return None
        return cfg.gpu_memory_bytes
    try:
        return systems.gpu_memory_bytes(cfg.system)
    except JaxsimError:
        out.append(
            f"gpu-memory: system {cfg.system!r} has no bundled spec sheet (known: {', '.join(systems.list_systems())}); "
            "set gpu_memory_bytes"
        )
        return None


def _acceptance_problems(cfg: DeploymentConfig) -> list[str]:
    out: list[str] = []
    given = [k for k in ("accept_rates", "accepted_tokens", "acceptance_preset") if getattr(cfg, k) is not None]
    if len(given) > 1:
        out.append(f"acceptance-exclusive: set only one of accept_rates, accepted_tokens, acceptance_preset (got {', '.join(given)})")
    if given and cfg.nextn == 0:
        out.append(f"acceptance-requires-nextn: {given[0]} requires nextn > 0 (nextn=0)")
    if cfg.nextn > 0 and not given:
        out.append(
            f"acceptance-missing: nextn={cfg.nextn} requires an explicit acceptance: accept_rates, accepted_tokens or acceptance_preset"
        )
    if cfg.accept_rates is not None:
        for i, r in enumerate(cfg.accept_rates):
            if not (math.isfinite(r) and 0.0 <= r <= 1.0):
                out.append(f"accept-rates-range: accept_rates[{i}]={r!r} must be a finite probability in [0, 1]")
    if cfg.accepted_tokens is not None:
        a = cfg.accepted_tokens
        if not (math.isfinite(a) and 0.0 <= a <= cfg.nextn):
            out.append(f"accepted-range: accepted_tokens={a!r} must be finite and within [0, nextn={cfg.nextn}]")
    if cfg.acceptance_preset is not None and not acceptance.is_preset(cfg.acceptance_preset):
        names = ", ".join(acceptance.preset_names())
        out.append(f"acceptance-preset: unknown acceptance_preset {cfg.acceptance_preset!r} (known: {names})")
    return out


def _config_problems(cfg: DeploymentConfig) -> list[str]:
    out: list[str] = []
    if cfg.mode not in MODES:
        out.append(f"mode: mode must be 'aggregated' or 'disaggregated' (got {cfg.mode!r})")
    else:
        want = ("aggregated",) if cfg.mode == "aggregated" else ("prefill", "decode")
        if tuple(sorted(cfg.role_names)) != tuple(sorted(want)):
            out.append(
                f"roles: mode {cfg.mode!r} needs exactly the roles {', '.join(want)} (got {', '.join(cfg.role_names) or 'none'})"
            )
    if cfg.backend != "vllm":
        out.append(f"backend: FPM profiles exist only for backend 'vllm' (got {cfg.backend!r})")
    bv = cfg.backend_version
    if bv is None or bv.lower() in UNSAFE_VERSION_LABELS or any(c.isspace() or c in "/\\\0" for c in bv):
        out.append(f"backend-version: fpm_profile requires a literal, path-safe backend_version (got {bv!r})")
    if not (0 <= cfg.nextn <= MAX_NEXTN):
        out.append(f"nextn-range: nextn must be in 0..={MAX_NEXTN} (got {cfg.nextn})")
    out += _acceptance_problems(cfg)
    bp = block_size_problem(cfg.block_size)
    if bp:
        out.append(bp)
    if cfg.context_length is not None and cfg.context_length <= 0:
        out.append(f"context-length: context_length must be positive (got {cfg.context_length})")
    if cfg.kv_offload:
        out.append("kv-offload: FPM capacity is the recorded HBM pool; KV offload (kv_offload=true) is not supported")
    if cfg.kv_transfer_gbps is not None and not (math.isfinite(cfg.kv_transfer_gbps) and cfg.kv_transfer_gbps > 0):
        out.append(f"kv-transfer: kv_transfer_gbps must be finite and > 0 (got {cfg.kv_transfer_gbps!r})")
    if cfg.mode == "disaggregated" and cfg.kv_transfer_gbps is None and cfg.system not in systems.list_systems():
        out.append(f"kv-transfer: system {cfg.system!r} has no bundled spec sheet for the P/D link; set kv_transfer_gbps")
    ov = cfg.overrides
    if ov.fmha_quant_mode is not None and ov.fmha_quant_mode not in FPM_FMHA_MODES:
        out.append(f"fmha-override: fpm_fmha_quant_mode must be bfloat16, fp8, or fp8_block (got {ov.fmha_quant_mode!r})")
    refused = [k for k in REFUSED_OVERRIDES if getattr(ov, k) is not None]
    if refused:
        out.append(
            f"unsupported-override: fpm_interpolation does not support EPLB, slots, moe_backend or moe_kernel_source "
            f"overrides (got {', '.join(f'overrides.{k}' for k in refused)})"
        )
    return out


def _policy_problem(cfg: DeploymentConfig, speculative: bool) -> str | None:
    got = {
        "estimation_mode": (cfg.estimation_mode, "fpm_interpolation"),
        "method": (cfg.method, "direct"),
        "database_mode": (cfg.database_mode, "SILICON"),
        "fallback": (cfg.fallback, "deny"),
    }
    bad = [f"{k}={v!r}" for k, (v, want) in got.items() if v != want]
    if not bad:
        return None
    rule = SD_POLICY_MSG if speculative else (
        "jaxsim prices only direct FPM interpolation: estimation_mode='fpm_interpolation', method='direct', "
        "database_mode='SILICON', fallback='deny'"
    )
    return f"estimator-policy: {rule} (got {', '.join(bad)})"


def _role_problems(cfg: DeploymentConfig, r: _Role, total_gpu: int | None) -> list[str]:
    out: list[str] = []
    role = r.role
    where = f"roles.{role.name}"
    spec = cfg.profile if role.profile is None else role.profile
    if spec is None:
        return [f"profile-missing: {where} has no profile (set profile or {where}.profile)"]
    try:
        r.root = resolve_profile_dir(spec, cfg.base_dir)
        r.bundle = load_bundle(r.root)
    except BindingError as e:
        msg = str(e)
        return [msg if msg.startswith("profile-not-found") else f"profile-invalid: {where}: {msg}"]
    prof = r.bundle.profile
    if cfg.model != prof.model:
        out.append(f"model-mismatch: model must equal the profile's model exactly (config {cfg.model!r}, profile {prof.model!r})")
    pt = role.parallel_tuple
    try:
        dep = select_deployment(r.bundle, cfg.system, cfg.backend, cfg.backend_version, pt, role.name)
    except JaxsimError as e:
        if any(d.is_speculative for d in prof.deployments) and (pt[1:3] != (1, 1) or pt[4:] != (1, 1) or role.dcp is not None):
            out.append(f"sd-parallel: {SD_PARALLEL_MSG} ({where}: tp={pt[0]} pp={pt[1]} dp={pt[2]} moe_ep={pt[4]} cp={pt[5]} dcp={role.dcp})")
        out.append(f"no-deployment: {where}: {' '.join(str(e).split())}")
        return out
    r.deployment = dep
    sd = dep.is_speculative
    k = dep.num_draft_tokens
    pol = _policy_problem(cfg, sd)
    if pol:
        out.append(pol)
    if sd:
        if cfg.nextn != k or cfg.speculation is not None:
            extra = ", generic speculation set" if cfg.speculation is not None else ""
            out.append(f"sd-nextn: {SD_NEXTN_MSG} ({where}: nextn={cfg.nextn}, num_draft_tokens={k}{extra})")
        if pt[1:3] != (1, 1) or pt[4:] != (1, 1) or role.dcp is not None:
            out.append(f"sd-parallel: {SD_PARALLEL_MSG} ({where}: pp={pt[1]} dp={pt[2]} moe_ep={pt[4]} cp={pt[5]} dcp={role.dcp})")
        res = dep.resources
        if res.runtime_memory is None or res.cache_layout != "linear":
            out.append(f"sd-resources: {SD_RESOURCES_MSG} ({where}: memory {res.memory_source}, cache {res.cache_layout})")
    else:
        if cfg.nextn > 0:
            out.append(
                f"ar-nextn: FPM profiles support plain autoregressive decoder-only execution; estimation_mode="
                f"'fpm_interpolation' does not support MTP speculative decoding ({where}: nextn={cfg.nextn}, "
                "the deployment has no speculative-round execution_profile)"
            )
        if cfg.speculation is not None:
            out.append(
                "speculation: generic speculation needs op-level draft costs that FPM curves do not contain; "
                "use a measured speculative-round profile and nextn"
            )
        if role.dcp is not None and (role.dcp < 1 or pt[0] % role.dcp):
            out.append(f"dcp: {where}.dcp must be a positive divisor of tp (dcp={role.dcp}, tp={pt[0]})")
    ov = cfg.overrides
    for key in IDENTITY_OVERRIDES:
        v = getattr(ov, key)
        if v is not None and v != getattr(dep, key) and not (key == "fmha_quant_mode" and v not in FPM_FMHA_MODES):
            out.append(f"override-mismatch: overrides.{key}={v!r} must equal the profile's {getattr(dep, key)!r} ({where})")
    res = dep.resources
    if res.cache_layout == "grouped" and (cfg.mode == "disaggregated" or cfg.kv_offload):
        out.append(f"grouped-cache: grouped KV caches are aggregated-only and HBM-only ({where})")
    try:
        r.cell = cell_rows(r.bundle, dep, role.dcp)
    except JaxsimError as e:
        out.append(f"no-cell: {where}: {' '.join(str(e).split())}")
    else:
        for phase in r.cell.missing_phases(role.name):
            out.append(f"cell-support: {where}: the matching FPM cell has no genuine {phase} measurements")
    rm = res.runtime_memory
    frac = role.gpu_memory_utilization
    if frac is None:
        frac = rm.gpu_memory_utilization if rm is not None else VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    if total_gpu is not None:
        r.request = CapacityRequest(
            total_gpu_bytes=total_gpu,
            memory_fraction_value=frac,
            max_num_tokens=res.max_num_tokens if role.max_num_batched_tokens is None else role.max_num_batched_tokens,
            max_batch_size=res.max_batch_size if role.max_num_seqs is None else role.max_num_seqs,
            context_length=cfg.context_length if cfg.context_length is None or cfg.context_length > 0 else None,
            block_size=cfg.block_size,
            nextn=k,
            cuda_graph_reserved_bytes=cfg.cuda_graph_reserved_bytes,
            tolerance_fraction=cfg.tolerance_fraction,
        )
        out += [f"{p} ({where})" for p in capacity_problems(res, prof.context_length, r.request, num_draft_tokens=k)]
    return out


def _cross_role_problems(cfg: DeploymentConfig, roles: list[_Role]) -> list[str]:
    bound = [r for r in roles if r.deployment is not None]
    if len(bound) < 2:
        return []
    out: list[str] = []
    sd = [r for r in bound if r.deployment.is_speculative]
    if sd and len(sd) < len(bound) and cfg.nextn > 0:
        for r in bound:
            if not r.deployment.is_speculative:
                out.append(
                    f"execution-binding: estimation_mode='fpm_interpolation' does not support MTP speculative decoding: "
                    f"roles.{r.role.name} has no speculative-round execution binding while nextn={cfg.nextn}"
                )
    ids = {r.role.name: r.deployment.execution_identity(r.bundle.profile.model_revision)[1] for r in bound}
    if len(set(ids.values())) > 1:
        desc = "; ".join(
            f"{r.role.name}: " + (
                f"{r.deployment.execution_profile.method} K={r.deployment.num_draft_tokens} draft {r.deployment.execution_profile.draft_model!r}@"
                f"{r.deployment.execution_profile.draft_revision[:8]}" if r.deployment.is_speculative else "autoregressive"
            )
            for r in bound
        )
        out.append(f"role-identity: full SD-round FPM prefill and decode identities must agree ({desc})")
    return out


def _analyze(cfg: DeploymentConfig) -> tuple[list[str], list[_Role], int | None]:
    out = _config_problems(cfg)
    total_gpu = _gpu_memory_bytes(cfg, out)
    roles = [_Role(r) for r in cfg.roles]
    role_out: list[str] = []
    for r in roles:
        role_out += _role_problems(cfg, r, total_gpu)
    cross = _cross_role_problems(cfg, roles)
    if any(c.startswith("execution-binding:") for c in cross):
        role_out = [m for m in role_out if not m.startswith("ar-nextn:")]
    out += role_out + cross
    if all(r.deployment is None for r in roles):
        sd = any(d.is_speculative for r in roles if r.bundle is not None for d in r.bundle.profile.deployments)
        pol = _policy_problem(cfg, sd)
        if pol and pol not in out:
            out.append(pol)
    return list(dict.fromkeys(out)), roles, total_gpu


def validate_config(cfg: DeploymentConfig) -> list[str]:
    """Every problem binding ``cfg`` would hit, one line each (``<rule>: <why> (<values>)``); [] = valid."""
    return _analyze(cfg)[0]


_CAPACITY_MEMO: dict = {}


def _memo(kind: str, fn, *key):
    """``fn(*key)`` once per distinct (immutable) key: a sweep binds the same few resources hundreds of
    times, and each capacity evaluation is a compiled-kernel dispatch."""
    try:
        return _CAPACITY_MEMO[(kind, *key)]
    except KeyError:
        pass
    except TypeError:  # an unhashable field: no memo
        return fn(*key)
    if len(_CAPACITY_MEMO) > 4096:
        _CAPACITY_MEMO.clear()
    out = _CAPACITY_MEMO[(kind, *key)] = fn(*key)
    return out


def _kv_estimate(res, context_length: int, req):
    from jaxsim.kernels.capacity import estimate_kv_cache

    return _memo("estimate", estimate_kv_cache, res, int(context_length), req)


def _kv_pool(res, kv_bytes: int, block_size: int, num_draft_tokens: int):
    from jaxsim.kernels.capacity import make_pool

    return _memo("pool", lambda r, b, bs, k: make_pool(r, b, block_size=bs, num_draft_tokens=k), res, int(kv_bytes),
                 int(block_size), int(num_draft_tokens))


def bind(cfg: DeploymentConfig) -> Binding:
    """Validate and resolve ``cfg``; BindingError (``<config file>: <first problem>``) when invalid."""
    problems, roles, total_gpu = _analyze(cfg)
    if problems:
        more = f" (+{len(problems) - 1} more; run `jaxsim validate`)" if len(problems) > 1 else ""
        raise BindingError(f"{cfg.source}: {problems[0]}{more}")
    from jaxsim._jax import ensure_x64

    ensure_x64()
    out: dict[str, RoleBinding] = {}
    ctx = None
    for r in roles:
        dep, req = r.deployment, r.request
        kv = _kv_estimate(dep.resources, r.bundle.profile.context_length, req)
        ctx = kv.context_length if ctx is None else min(ctx, kv.context_length)
        out[r.role.name] = RoleBinding(
            name=r.role.name,
            role=r.role,
            profile_dir=r.root,
            bundle=r.bundle,
            deployment=dep,
            cell=r.cell,
            table=_round_table(r.bundle, dep, r.role.dcp),
            kv=kv,
            pool=_kv_pool(dep.resources, kv.usable_kv_bytes, cfg.block_size, dep.num_draft_tokens),
            max_num_batched_tokens=req.max_num_tokens,
            max_num_seqs=req.max_batch_size,
            gpu_memory_utilization=req.memory_fraction_value,
        )
    link = None
    if cfg.mode == "disaggregated":
        link = cfg.kv_transfer_gbps * 1e9 if cfg.kv_transfer_gbps is not None else systems.interconnect_bandwidth_bytes_per_s(cfg.system)
    return Binding(
        config=cfg,
        roles=MappingProxyType(out),
        nextn=cfg.nextn,
        accept_rates=acceptance.config_rates(cfg.nextn, accept_rates=cfg.accept_rates, accepted_tokens=cfg.accepted_tokens,
                                             preset=cfg.acceptance_preset),
        block_size=cfg.block_size,
        context_length=int(ctx),
        gpu_memory_bytes=int(total_gpu),
        kv_transfer_bytes_per_s=link,
    )
