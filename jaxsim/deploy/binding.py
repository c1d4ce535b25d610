"""Binding a validated deployment config to compiled kernels: per role the selected deployment, its profile
bundle, the compiled :class:`~jaxsim.kernels.rounds.RoundTable` and the KV pool, plus nextn and acceptance
rates padded to 5.

:func:`bind` validates first (:func:`jaxsim.rules.validate.analyze`, plain Python) and raises
:class:`~jaxsim.errors.BindingError` with the first problem. Tables come from the one cache
(:func:`jaxsim.kernels.tables.round_table`); KV estimates and pools are memoized per distinct resources, so
binding many configs over the same profiles compiles and dispatches each once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np

from jaxsim import acceptance, systems
from jaxsim._jax import ensure_x64
from jaxsim.deploy.kv_estimate import BlockView, block_view, estimate_kv_cache
from jaxsim.errors import BindingError
from jaxsim.kernels.capacity import KvPool, PoolCapacity, make_pool, pool_capacity_jit
from jaxsim.kernels.rounds import RoundTable
from jaxsim.kernels.tables import round_table
from jaxsim.profile import CellRows, Deployment, ProfileBundle
from jaxsim.rules.capacity import KvCacheEstimate
from jaxsim.rules.config import DeploymentConfig, RoleConfig
from jaxsim.rules.validate import analyze

__all__ = ["Binding", "RoleBinding", "bind"]


# ----------------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True, eq=False)
class RoleBinding:
    """One bound role: its deployment, profile bundle, compiled round table and KV pool.

    ``max_num_batched_tokens``/``max_num_seqs``/``gpu_memory_utilization`` are the resolved per-rank
    scheduler envelope and memory fraction; ``kv`` is the reference's cache estimate and ``pool`` the
    (tolerance-adjusted) pool ready for :func:`jaxsim.kernels.capacity.pool_capacity`; ``blocks`` the pool in
    scheduler blocks as the sweep and the replay allocate it (a grouped cache: a fixed part per request).
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
    blocks: BlockView
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


# ----------------------------------------------------------------------------------------------------
# assembly

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
    return _memo("estimate", estimate_kv_cache, res, int(context_length), req)


def _kv_pool(res, kv_bytes: int, block_size: int, num_draft_tokens: int):
    return _memo("pool", lambda r, b, bs, k: make_pool(r, b, block_size=bs, num_draft_tokens=k), res, int(kv_bytes),
                 int(block_size), int(num_draft_tokens))


def bind(cfg: DeploymentConfig) -> Binding:
    """Validate and resolve ``cfg``; BindingError (``<config file>: <first problem>``) when invalid."""
    analysis = analyze(cfg)
    problems = analysis.problems
    if problems:
        more = f" (+{len(problems) - 1} more; run `jaxsim validate`)" if len(problems) > 1 else ""
        raise BindingError(f"{cfg.source}: {problems[0]}{more}")
    ensure_x64()
    out: dict[str, RoleBinding] = {}
    ctx = None
    for r in analysis.roles:
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
            table=round_table(r.bundle, dep, r.role.dcp),
            kv=kv,
            pool=_kv_pool(dep.resources, kv.usable_kv_bytes, cfg.block_size, dep.num_draft_tokens),
            blocks=block_view(dep.resources, kv, cfg.block_size),
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
        gpu_memory_bytes=int(analysis.total_gpu_bytes),
        kv_transfer_bytes_per_s=link,
    )
