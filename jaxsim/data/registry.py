"""Profiles bundled with jaxsim (``jaxsim/data/profiles/<name>/``), listed in ``profiles/index.json``.

Each bundled directory is a flat profile directory (``profile.json`` + ``fpm_forward_perf.{parquet,
metadata.json}``). ``kind`` is the profile's data source: "measured" (imported from real forward-pass logs or planner sweeps),
"derived" (computed from measured tables by a documented model; see the profile's provenance), "modelled"
(op-level model) or "calibrated" (a modelled surface corrected to measured passes). Licences
and attribution: ``jaxsim/data/LICENSES/`` and ``jaxsim/data/ATTRIBUTION.md``. Regenerate with
``scripts/build_bundled_profiles.py``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from jaxsim.errors import ProfileError

INDEX_NAME = "index.json"
KINDS = ("measured", "derived", "modelled", "calibrated")  # = the profiles' data_source values


@dataclass(frozen=True)
class BundledProfile:
    """One bundled profile directory and what it holds."""

    name: str
    path: Path
    model: str
    system: str
    tps: tuple[int, ...]
    kind: str
    description: str
    num_draft_tokens: int = 0
    licence: str = ""

    def to_dict(self) -> dict:
        return {
            "name": self.name, "path": str(self.path), "model": self.model, "system": self.system,
            "tps": list(self.tps), "kind": self.kind, "data_source": self.kind,
            "num_draft_tokens": self.num_draft_tokens,
            "description": self.description, "licence": self.licence,
        }


def profiles_root() -> Path:
    """The directory holding the bundled profiles."""
    return Path(str(resources.files("jaxsim.data").joinpath("profiles")))


def data_root() -> Path:
    """``jaxsim/data`` (licences, attribution, acceptance tables)."""
    return Path(str(resources.files("jaxsim.data")))


@functools.cache
def _index() -> tuple[BundledProfile, ...]:
    root = profiles_root()
    path = root / INDEX_NAME
    if not path.is_file():
        return ()
    entries = json.loads(path.read_text(encoding="utf-8"))["profiles"]
    out = []
    for e in entries:
        if e["kind"] not in KINDS:
            raise ProfileError(f"{path}: {e['name']}: kind must be one of {', '.join(KINDS)}")
        out.append(BundledProfile(
            name=e["name"], path=root / e["name"], model=e["model"], system=e["system"], tps=tuple(e["tps"]),
            kind=e["kind"], description=e["description"], num_draft_tokens=int(e.get("num_draft_tokens", 0)),
            licence=e.get("licence", ""),
        ))
    return tuple(out)


def list_bundled() -> list[BundledProfile]:
    """Every bundled profile, in index order."""
    return list(_index())


def bundled_names() -> list[str]:
    """Names of the bundled profiles."""
    return [p.name for p in _index()]


def get_bundled(name: str) -> BundledProfile:
    """The bundled profile called ``name``; ProfileError listing the names when unknown."""
    for p in _index():
        if p.name == name:
            return p
    raise ProfileError(f"unknown bundled profile {name!r} (bundled: {', '.join(bundled_names()) or 'none'})")


def resolve_profile(name_or_path: str) -> Path:
    """A bundled profile's directory by name, else ``name_or_path`` when it is a directory or profile file.

    Unknown names raise ProfileError listing the bundled names.
    """
    for p in _index():
        if p.name == name_or_path:
            return p.path
    path = Path(name_or_path).expanduser()
    if path.is_dir() or path.is_file():
        return path
    raise ProfileError(
        f"{name_or_path!r} is neither a profile directory nor a bundled profile (bundled: {', '.join(bundled_names()) or 'none'})"
    )
