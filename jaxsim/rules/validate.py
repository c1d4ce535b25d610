"""Validating a deployment config against its profiles: every problem binding it would hit, one line each,
starting with the rule's name (``sd-nextn: speculative-round FPM nextn must match num_draft_tokens ...
(nextn=2, num_draft_tokens=3)``), decided in plain Python before anything compiles.

:func:`analyze` also returns the resolved roles, from which :func:`jaxsim.deploy.binding.bind` assembles a
binding when there is no problem.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxsim.rules.config import DeploymentConfig
from jaxsim.rules.config_problems import config_problems, gpu_memory_bytes
from jaxsim.rules.role import ResolvedRole, resolve_role
from jaxsim.rules.role_problems import cross_role_problems, policy_problem, role_problems

__all__ = ["Analysis", "analyze", "validate_config"]


@dataclass(frozen=True, eq=False)
class Analysis:
    """A config's problems (deduplicated, in order; empty = valid), its resolved roles and GPU memory per rank."""

    problems: list[str]
    roles: list[ResolvedRole]
    total_gpu_bytes: int | None


def analyze(cfg: DeploymentConfig) -> Analysis:
    """Resolve every role of ``cfg`` and list every problem: the config's, each role's, then across roles."""
    out = config_problems(cfg)
    total_gpu, gpu_problem = gpu_memory_bytes(cfg)
    if gpu_problem:
        out.append(gpu_problem)
    roles = [resolve_role(cfg, r, total_gpu) for r in cfg.roles]
    role_out = [p for r in roles for p in role_problems(cfg, r)]
    cross = cross_role_problems(cfg, roles)
    if any(c.startswith("execution-binding:") for c in cross):
        role_out = [m for m in role_out if not m.startswith("ar-nextn:")]
    out += role_out + cross
    if all(r.deployment is None for r in roles):
        sd = any(d.is_speculative for r in roles if r.bundle is not None for d in r.bundle.profile.deployments)
        pol = policy_problem(cfg, sd)
        if pol and pol not in out:
            out.append(pol)
    return Analysis(list(dict.fromkeys(out)), roles, total_gpu)


def validate_config(cfg: DeploymentConfig) -> list[str]:
    """Every problem binding ``cfg`` would hit, one line each (``<rule>: <why> (<values>)``); [] = valid."""
    return analyze(cfg).problems
