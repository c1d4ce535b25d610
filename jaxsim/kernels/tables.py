"""Compiled round tables of profile cells: the one cache, keyed by exact identity (bundle, deployment, DCP).

Every compiled table of a profile's cell comes from here (deployment bindings, figures, calibration, the
``round`` command), compiled once for as long as its loaded bundle lives: a profile directory that changes on
disk is loaded as a new bundle (:func:`jaxsim.profile.resolve.load_bundle`), so its tables compile afresh.
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path

from jaxsim.kernels.rounds import RoundTable, compile_round_table
from jaxsim.profile import Deployment, ProfileBundle
from jaxsim.profile.resolve import cell_rows, choose_deployment, load_bundle, resolve_profile_dir

__all__ = ["load_round_table", "round_table"]

_LOCK = threading.RLock()
_TABLES: weakref.WeakKeyDictionary[ProfileBundle, dict[tuple, RoundTable]] = weakref.WeakKeyDictionary()


def round_table(bundle: ProfileBundle, deployment: Deployment, dcp: int | None = None) -> RoundTable:
    """The deployment's cell compiled for the kernels (a speculative-round table when it is one), once."""
    key = (deployment, dcp)
    with _LOCK:
        hit = _TABLES.get(bundle, {}).get(key)
    if hit is None:
        cell = cell_rows(bundle, deployment, dcp)
        hit = compile_round_table(cell, speculative=deployment.is_speculative, num_draft_tokens=deployment.num_draft_tokens)
        with _LOCK:
            _TABLES.setdefault(bundle, {})[key] = hit
    return hit


def load_round_table(profile: str | Path, **want) -> tuple[RoundTable, Deployment]:
    """Load a profile (directory or bundled name), select one deployment, compile its cell.

    The cell must hold genuine rows of every phase the worker role runs (``role``, else the deployment's
    worker_type, else aggregated: both phases), as the reference requires when it builds the model."""
    bundle = load_bundle(str(resolve_profile_dir(str(profile))))
    deployment = choose_deployment(bundle, **want)
    cell_rows(bundle, deployment).require_phases(want.get("role") or deployment.worker_type)
    return round_table(bundle, deployment), deployment
