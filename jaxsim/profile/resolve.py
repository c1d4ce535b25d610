"""Finding and loading profiles, cached by exact identity: a name or path → a directory → a loaded bundle →
a selected deployment → its cell of genuine rows.

Directories are reused by resolved path and file stamps (mtime, size), selections and cells by (bundle,
identity), so re-validating many configs over the same profiles costs microseconds. A failed selection or
cell is remembered too and raises the same error again. The compiled round tables of these cells are
cached beside the kernels (:func:`jaxsim.kernels.tables.round_table`), keyed by the bundle.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from jaxsim.data import registry
from jaxsim.errors import BindingError, JaxsimError, ProfileError
from jaxsim.profile.directory import ProfileBundle, load_profile_dir
from jaxsim.profile.model import Deployment
from jaxsim.profile.table import CellRows

__all__ = [
    "STAMP_TTL_S", "cell_rows", "choose_deployment", "clear_caches", "load_bundle", "profile_data_source",
    "recorded_moe_layout", "resolve_profile_dir", "select_deployment",
]

_LOCK = threading.RLock()
_RESOLVED: dict[tuple[str, Path | None], Path] = {}
_BUNDLES: dict[str, tuple[tuple, float, ProfileBundle | str]] = {}
_SELECTED: dict[tuple, Deployment | JaxsimError] = {}
_CELLS: dict[tuple, CellRows | JaxsimError] = {}

STAMP_TTL_S = 1.0
"""A cached profile directory is re-stamped (mtime/size of its files) at most this often."""


def clear_caches() -> None:
    """Forget every cached profile directory, selection and cell (and so every table compiled from them)."""
    with _LOCK:
        for c in (_RESOLVED, _BUNDLES, _SELECTED, _CELLS):
            c.clear()


def _stamp(root: str) -> tuple:
    out = []
    for name in ("", "profile.json", "fpm_forward_perf.parquet", "fpm_forward_perf.metadata.json"):
        try:
            st = os.stat(os.path.join(root, name) if name else root)
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def resolve_profile_dir(name_or_path: str, base_dir: Path | None = None) -> Path:
    """A directory (relative to ``base_dir``, then the working directory) or a bundled profile name."""
    key = (name_or_path, base_dir)
    hit = _RESOLVED.get(key)
    if hit is not None:
        return hit
    p = Path(name_or_path).expanduser()
    cands = [p] if p.is_absolute() else ([base_dir / p] if base_dir is not None else []) + [p]
    found: Path | None = next((c for c in cands if c.exists()), None)
    if found is None:
        try:
            found = Path(registry.resolve_profile(name_or_path))
        except (JaxsimError, KeyError, FileNotFoundError):
            found = None
        if found is None:
            names = ", ".join(registry.bundled_names())
            raise BindingError(
                f"profile-not-found: {name_or_path!r} is neither a profile directory nor a bundled profile "
                f"(bundled: {names or 'none available'})"
            )
    found = found.resolve()
    with _LOCK:
        _RESOLVED[key] = found
    return found


def load_bundle(root: Path | str) -> ProfileBundle:
    """Load (or reuse) a profile directory; raises the loader's one-line error.

    Reuse is by exact path and file stamps (mtime, size), re-checked at most every ``STAMP_TTL_S``.
    """
    key = str(root)
    now = time.monotonic()
    hit = _BUNDLES.get(key)
    if hit is not None and now - hit[1] < STAMP_TTL_S:
        value = hit[2]
    else:
        stamp = _stamp(key)
        if hit is not None and hit[0] == stamp:
            value = hit[2]
        else:
            try:
                value = load_profile_dir(key)
            except JaxsimError as e:
                value = " ".join(str(e).split())
        with _LOCK:
            _BUNDLES[key] = (stamp, now, value)
    if isinstance(value, str):
        raise BindingError(value)
    return value


def _remembered(cache: dict, key: tuple, compute):
    """``compute()`` once per key; a JaxsimError it raised is remembered and raised again."""
    with _LOCK:
        hit = cache.get(key)
    if hit is None:
        try:
            hit = compute()
        except JaxsimError as e:
            hit = e
        with _LOCK:
            cache[key] = hit
    if isinstance(hit, JaxsimError):
        raise type(hit)(*hit.args)
    return hit


def select_deployment(bundle: ProfileBundle, system: str, backend: str, version: str | None, parallel: tuple,
                      role: str) -> Deployment:
    """The deployment of exactly this identity (``parallel`` = tp, pp, dp, moe_tp, moe_ep, cp) and worker role."""
    pt = parallel
    return _remembered(_SELECTED, (bundle, system, backend, version, pt, role), lambda: bundle.profile.select(
        system, backend, version, tp=pt[0], pp=pt[1], dp=pt[2], moe_tp=pt[3], moe_ep=pt[4], cp=pt[5], worker_type=role))


def recorded_moe_layout(bundle: ProfileBundle, system: str, backend: str, version: str | None, parallel: tuple,
                        role: str) -> tuple[int, int] | None:
    """The (moe_tp, moe_ep) the profile records for this identity when a role leaves both unset: the one MoE
    layout among the deployments with this system, version, tp, pp, dp, cp and role (None when there is no
    such deployment or several layouts; the reference's default 1, 1 then applies)."""
    tp, pp, dp, _, _, cp = parallel
    found = {
        (d.moe_tp, d.moe_ep) for d in bundle.profile.deployments
        if d.system == system and d.backend == backend and d.backend_version == version and (d.tp, d.pp, d.dp, d.cp) == (tp, pp, dp, cp)
        and d.worker_type in (None, role)
    }
    return found.pop() if len(found) == 1 else None


def cell_rows(bundle: ProfileBundle, deployment: Deployment, dcp: int | None = None) -> CellRows:
    """The deployment's genuine rows (see :meth:`ProfileBundle.cell`)."""
    return _remembered(_CELLS, (bundle, deployment, dcp), lambda: bundle.cell(deployment, dcp=dcp))


def choose_deployment(bundle: ProfileBundle, **want) -> Deployment:
    """The one deployment matching the given identity fields (None = any); ambiguity is an error."""
    fields = {
        "tp": "tp",
        "dp": "dp",
        "moe_tp": "moe_tp",
        "moe_ep": "moe_ep",
        "role": "worker_type",
        "system": "system",
        "backend_version": "backend_version",
    }
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


def profile_data_source(profile: str | Path) -> str:
    """What a profile's numbers are: measured, derived, modelled or calibrated (stored or inferred)."""
    return load_bundle(resolve_profile_dir(str(profile))).profile.source
