"""The binding rules of a resolved role (:class:`~jaxsim.rules.role.ResolvedRole`) and of the roles together:
pure functions listing problem lines (``<rule>: <why> (<values>)``), in the order ``jaxsim validate`` prints them.
"""

from __future__ import annotations

from jaxsim.rules.capacity import capacity_problems
from jaxsim.rules.config import IDENTITY_OVERRIDES, DeploymentConfig
from jaxsim.rules.role import ResolvedRole

__all__ = ["FPM_FMHA_MODES", "cross_role_problems", "policy_problem", "role_problems"]

FPM_FMHA_MODES = ("bfloat16", "fp8", "fp8_block")

SD_POLICY_MSG = (
    "speculative-round FPM requires explicit fpm_interpolation, direct method, SILICON data and fallback_policy='deny'"
)
SD_NEXTN_MSG = "speculative-round FPM nextn must match num_draft_tokens and cannot use generic speculation"
SD_PARALLEL_MSG = "speculative-round FPM supports vLLM pure TP with PP1/DP1/CP1 and no recorded DCP"
SD_RESOURCES_MSG = "speculative-round FPM resources require observed runtime memory and a linear cache"


def policy_problem(cfg: DeploymentConfig, speculative: bool) -> str | None:
    """jaxsim prices only direct FPM interpolation of SILICON data with fallback denied."""
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


def _not_pure_tp(r: ResolvedRole) -> bool:
    pt = r.role.parallel_tuple
    return pt[1:3] != (1, 1) or pt[4:] != (1, 1) or r.role.dcp is not None


def _selection_problems(r: ResolvedRole) -> list[str]:
    """No deployment of the role's identity (and, on a speculative profile, why the parallelism cannot be)."""
    out = []
    pt, dcp = r.role.parallel_tuple, r.role.dcp
    if any(d.is_speculative for d in r.bundle.profile.deployments) and _not_pure_tp(r):
        out.append(f"sd-parallel: {SD_PARALLEL_MSG} ({r.where}: tp={pt[0]} pp={pt[1]} dp={pt[2]} moe_ep={pt[4]} cp={pt[5]} dcp={dcp})")
    out.append(f"no-deployment: {r.where}: {r.deployment_error}")
    return out


def _speculative_problems(cfg: DeploymentConfig, r: ResolvedRole) -> list[str]:
    """A speculative-round deployment: nextn = its K, pure TP, observed runtime memory and a linear cache."""
    out = []
    dep, pt, where = r.deployment, r.role.parallel_tuple, r.where
    k = dep.num_draft_tokens
    if cfg.nextn != k or cfg.speculation is not None:
        extra = ", generic speculation set" if cfg.speculation is not None else ""
        out.append(f"sd-nextn: {SD_NEXTN_MSG} ({where}: nextn={cfg.nextn}, num_draft_tokens={k}{extra})")
    if _not_pure_tp(r):
        out.append(f"sd-parallel: {SD_PARALLEL_MSG} ({where}: pp={pt[1]} dp={pt[2]} moe_ep={pt[4]} cp={pt[5]} dcp={r.role.dcp})")
    res = dep.resources
    if res.runtime_memory is None or res.cache_layout != "linear":
        out.append(f"sd-resources: {SD_RESOURCES_MSG} ({where}: memory {res.memory_source}, cache {res.cache_layout})")
    return out


def _autoregressive_problems(cfg: DeploymentConfig, r: ResolvedRole) -> list[str]:
    """An autoregressive deployment: no nextn, no generic speculation, DCP a divisor of TP."""
    out = []
    where, dcp, tp = r.where, r.role.dcp, r.role.parallel_tuple[0]
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
    if dcp is not None and (dcp < 1 or tp % dcp):
        out.append(f"dcp: {where}.dcp must be a positive divisor of tp (dcp={dcp}, tp={tp})")
    return out


def _override_problems(cfg: DeploymentConfig, r: ResolvedRole) -> list[str]:
    """Identity overrides must repeat the deployment's values exactly."""
    out = []
    dep, ov = r.deployment, cfg.overrides
    for key in IDENTITY_OVERRIDES:
        v = getattr(ov, key)
        if v is not None and v != getattr(dep, key) and not (key == "fmha_quant_mode" and v not in FPM_FMHA_MODES):
            out.append(f"override-mismatch: overrides.{key}={v!r} must equal the profile's {getattr(dep, key)!r} ({r.where})")
    return out


def _cell_problems(r: ResolvedRole) -> list[str]:
    """A cell must match, with genuine rows of every phase the role runs."""
    if r.cell is None:
        return [f"no-cell: {r.where}: {r.cell_error}"]
    return [f"cell-support: {r.where}: the matching FPM cell has no genuine {phase} measurements"
            for phase in r.cell.missing_phases(r.role.name)]


def role_problems(cfg: DeploymentConfig, r: ResolvedRole) -> list[str]:
    """Every problem of one resolved role, in order; resolution failures end the list where they occur."""
    if r.profile_problem is not None:
        return [r.profile_problem]
    prof = r.bundle.profile
    out: list[str] = []
    if cfg.model != prof.model:
        out.append(f"model-mismatch: model must equal the profile's model exactly (config {cfg.model!r}, profile {prof.model!r})")
    if r.deployment is None:
        return out + _selection_problems(r)
    dep = r.deployment
    pol = policy_problem(cfg, dep.is_speculative)
    if pol:
        out.append(pol)
    out += _speculative_problems(cfg, r) if dep.is_speculative else _autoregressive_problems(cfg, r)
    out += _override_problems(cfg, r)
    if dep.resources.cache_layout == "grouped" and (cfg.mode == "disaggregated" or cfg.kv_offload):
        out.append(f"grouped-cache: grouped KV caches are aggregated-only and HBM-only ({r.where})")
    out += _cell_problems(r)
    if r.request is not None:
        problems = capacity_problems(dep.resources, prof.context_length, r.request, num_draft_tokens=dep.num_draft_tokens)
        out += [f"{p} ({r.where})" for p in problems]
    return out


def cross_role_problems(cfg: DeploymentConfig, roles: list[ResolvedRole]) -> list[str]:
    """Prefill and decode must agree: both speculative-round bindings when nextn > 0, one execution identity."""
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
