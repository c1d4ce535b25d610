"""Profile → compiled round table, with deployment selection by exact identity."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from jaxsim.errors import ProfileError
from jaxsim.kernels.rounds import RoundTable, compile_round_table
from jaxsim.profile import Deployment, ProfileBundle
from jaxsim.rules.binding import load_bundle, resolve_profile_dir


def choose_deployment(bundle: ProfileBundle, **want) -> Deployment:
    """The one deployment matching the given identity fields (None = any); ambiguity is an error."""
    fields = {"tp": "tp", "dp": "dp", "moe_tp": "moe_tp", "moe_ep": "moe_ep", "role": "worker_type", "system": "system", "backend_version": "backend_version"}
    found = []
    for d in bundle.profile.deployments:
        ok = True
        for key, attr in fields.items():
            v = want.get(key)
            if v is None:
                continue
            have = getattr(d, attr)
            if key == "role" and have is None:
                continue
            if have != v:
                ok = False
        if ok:
            found.append(d)
    if len(found) == 1:
        return found[0]
    have = "; ".join(d.describe() for d in bundle.profile.deployments)
    if not found:
        asked = ", ".join(f"{k}={v}" for k, v in want.items() if v is not None) or "defaults"
        raise ProfileError(f"{bundle.root}: no deployment matches {asked} (have: {have})")
    raise ProfileError(f"{bundle.root}: {len(found)} deployments match; choose one with --tp/--role/... (have: {have})")


@lru_cache(maxsize=256)
def _compile(path: str, deployment: Deployment, role: str | None) -> RoundTable:
    bundle = load_bundle(path)
    cell = bundle.cell(deployment).require_phases(role)
    return compile_round_table(cell, speculative=deployment.is_speculative, num_draft_tokens=deployment.num_draft_tokens)


def profile_data_source(profile: str | Path) -> str:
    """What a profile's numbers are: measured, derived, modelled or calibrated (stored or inferred)."""
    return load_bundle(resolve_profile_dir(str(profile))).profile.source


def load_round_table(profile: str | Path, **want) -> tuple[RoundTable, Deployment]:
    """Load a profile (directory or bundled name), select one deployment, compile its cell.

    The cell must hold genuine rows of every phase the worker role runs (``role``, else the deployment's
    worker_type, else aggregated: both phases), as the reference requires when it builds the model."""
    path = str(resolve_profile_dir(str(profile)))
    bundle = load_bundle(path)
    deployment = choose_deployment(bundle, **want)
    return _compile(path, deployment, want.get("role") or deployment.worker_type), deployment
