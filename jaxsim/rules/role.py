"""One role of a deployment config resolved against its profile, as far as it resolves: the profile
directory, the loaded bundle, the deployment of exactly the role's identity, its cell of genuine rows and
the capacity request the role makes of the deployment's KV pool.

Resolving stops at the first step that fails and records why (the problem lines are listed, without
resolving anything, by :mod:`jaxsim.rules.role_problems`). Loading goes through the profile caches
(:mod:`jaxsim.profile.resolve`), so resolving the same roles again costs microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from jaxsim.errors import BindingError, JaxsimError
from jaxsim.profile import CellRows, Deployment, ProfileBundle
from jaxsim.profile.resolve import cell_rows, load_bundle, recorded_moe_layout, resolve_profile_dir, select_deployment
from jaxsim.rules.capacity import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, CapacityRequest
from jaxsim.rules.config import DeploymentConfig, RoleConfig

__all__ = ["ResolvedRole", "capacity_request", "resolve_role"]


@dataclass(frozen=True, eq=False)
class ResolvedRole:
    """A role resolved step by step; a field is None when its step was not reached or failed.

    ``profile_problem`` is the whole problem line of a missing, unknown or invalid profile;
    ``deployment_error`` / ``cell_error`` the one-line reason no deployment / cell matched. ``request`` is
    None when the deployment did not resolve or the GPU memory is unknown.
    """

    role: RoleConfig
    root: Path | None = None
    bundle: ProfileBundle | None = None
    deployment: Deployment | None = None
    cell: CellRows | None = None
    request: CapacityRequest | None = None
    profile_problem: str | None = None
    deployment_error: str | None = None
    cell_error: str | None = None

    @property
    def where(self) -> str:
        return f"roles.{self.role.name}"


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


def resolve_role(cfg: DeploymentConfig, role: RoleConfig, total_gpu_bytes: int | None) -> ResolvedRole:
    """Resolve ``role`` of ``cfg``: profile directory → bundle → deployment → cell, and its capacity request."""
    where = f"roles.{role.name}"
    spec = cfg.profile if role.profile is None else role.profile
    if spec is None:
        return ResolvedRole(role, profile_problem=f"profile-missing: {where} has no profile (set profile or {where}.profile)")
    root = None
    try:
        root = resolve_profile_dir(spec, cfg.base_dir)
        bundle = load_bundle(root)
    except BindingError as e:
        msg = str(e)
        problem = msg if msg.startswith("profile-not-found") else f"profile-invalid: {where}: {msg}"
        return ResolvedRole(role, root, profile_problem=problem)
    if role.moe_tp is None and role.moe_ep is None:  # the profile's recorded MoE layout, when it has one at this TP
        moe = recorded_moe_layout(bundle, cfg.system, cfg.backend, cfg.backend_version, role.parallel_tuple, role.name)
        if moe is not None:
            role = replace(role, moe_tp=moe[0], moe_ep=moe[1])
    try:
        dep = select_deployment(bundle, cfg.system, cfg.backend, cfg.backend_version, role.parallel_tuple, role.name)
    except JaxsimError as e:
        return ResolvedRole(role, root, bundle, deployment_error=_one_line(e))
    cell, cell_error = None, None
    try:
        cell = cell_rows(bundle, dep, role.dcp)
    except JaxsimError as e:
        cell_error = _one_line(e)
    request = capacity_request(cfg, role, dep, total_gpu_bytes)
    return ResolvedRole(role, root, bundle, dep, cell, request, cell_error=cell_error)


def capacity_request(cfg: DeploymentConfig, role: RoleConfig, dep: Deployment,
                     total_gpu_bytes: int | None) -> CapacityRequest | None:
    """What the role asks of the deployment's KV pool: the role's scheduler envelope and memory fraction,
    else the recorded ones (vLLM's default fraction without a recorded runtime); None without GPU memory."""
    if total_gpu_bytes is None:
        return None
    res = dep.resources
    rm = res.runtime_memory
    frac = role.gpu_memory_utilization
    if frac is None:
        frac = rm.gpu_memory_utilization if rm is not None else VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    return CapacityRequest(
        total_gpu_bytes=total_gpu_bytes,
        memory_fraction_value=frac,
        max_num_tokens=res.max_num_tokens if role.max_num_batched_tokens is None else role.max_num_batched_tokens,
        max_batch_size=res.max_batch_size if role.max_num_seqs is None else role.max_num_seqs,
        context_length=cfg.context_length if cfg.context_length is None or cfg.context_length > 0 else None,
        block_size=cfg.block_size,
        nextn=dep.num_draft_tokens,
        cuda_graph_reserved_bytes=cfg.cuda_graph_reserved_bytes,
        tolerance_fraction=cfg.tolerance_fraction,
    )
