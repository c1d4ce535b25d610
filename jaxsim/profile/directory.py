"""Profile directories: a profile JSON plus the FPM table(s) its deployments are measured in.

Two layouts are understood:

* flat (the goldens' ``tables/<name>/``): ``profile.json`` next to ``fpm_forward_perf.{parquet,metadata.json}``;
  every deployment is looked up in that one table.
* materialized (the reference's profile cache): ``profile.json`` (or the single other ``*.json``) at the
  root and ``data/<system>/<backend>/<backend_version>/fpm_forward_perf.{parquet,metadata.json}``; each
  deployment uses the table of its own system/backend/version.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from jaxsim.errors import JaxsimError, ProfileError, TableError
from jaxsim.profile.model import Deployment, ModelProfile, load_profile
from jaxsim.profile.table import PARQUET_NAME, SIDECAR_NAME, CellRows, FpmTable, load_table_problems

PROFILE_NAME = "profile.json"
_NOT_PROFILES = {"binding.json", SIDECAR_NAME, "memory.json", "calibration.json"}

TableKey = tuple[str, str, "str | None"]


def _key(d: Deployment) -> TableKey:
    return (d.system, d.backend, d.backend_version)


@dataclass(frozen=True, eq=False)
class ProfileBundle:
    """A loaded profile with its validated table(s).

    ``table`` is the table of the first deployment; ``tables`` maps (system, backend, backend_version)
    to the table for that identity.
    """

    profile: ModelProfile
    table: FpmTable
    root: Path
    tables: dict = field(default_factory=dict)

    def table_for(self, deployment: Deployment) -> FpmTable:
        """The table ``deployment`` is measured in."""
        try:
            return self.tables[_key(deployment)]
        except KeyError:
            raise TableError(f"{self.root}: no FPM table for {deployment.describe()}") from None

    def cell(self, deployment: Deployment, *, dcp: int | None = None) -> CellRows:
        """The deployment's genuine rows (exact model_path + 19-string identity)."""
        return self.table_for(deployment).select_cell(
            self.profile.model, deployment, self.profile.model_revision, dcp=dcp
        )


def find_profile_file(root: Path) -> Path:
    """``profile.json``, else the one other ``*.json`` at the root (sidecars and binding.json excluded)."""
    if (root / PROFILE_NAME).is_file():
        return root / PROFILE_NAME
    cands = sorted(p for p in root.glob("*.json") if p.is_file() and p.name not in _NOT_PROFILES)
    if len(cands) != 1:
        found = ", ".join(p.name for p in cands) or "none"
        raise ProfileError(f"{root}: expected profile.json or exactly one profile *.json (found: {found})")
    return cands[0]


def _split(path: str | os.PathLike) -> tuple[Path, Path | None]:
    """(root, explicit profile file or None)."""
    p = Path(path)
    if p.is_file():
        return p.parent, p
    if not p.is_dir():
        raise ProfileError(f"{p}: no such profile directory")
    return p, None


def _is_flat(root: Path) -> bool:
    return (root / PARQUET_NAME).exists() or (root / SIDECAR_NAME).exists()


def _table_dir(root: Path, key: TableKey) -> Path:
    system, backend, version = key
    if version is None:
        raise TableError(f"{root}: a deployment on {system}/{backend} needs a literal backend_version to find its table")
    return root / "data" / system / backend / version


def _flat_problems(table: FpmTable, profile: ModelProfile) -> list[str]:
    out = []
    for d in profile.deployments:
        out += table.identity_problems(d.system, d.backend, d.backend_version)
    return list(dict.fromkeys(out))


def load_profile_dir(path: str | os.PathLike) -> ProfileBundle:
    """Load a profile directory (or a profile file inside one); raises ProfileError/TableError."""
    root, pfile = _split(path)
    profile = load_profile(pfile or find_profile_file(root))
    tables: dict = {}
    if _is_flat(root):
        problems, table = load_table_problems(root, None, None, None)
        if table is not None:
            problems = _flat_problems(table, profile)
        if problems:
            raise TableError(problems[0] + (f" (+{len(problems) - 1} more problems)" if len(problems) > 1 else ""))
        for d in profile.deployments:
            tables[_key(d)] = table
    elif (root / "data").is_dir():
        for d in profile.deployments:
            key = _key(d)
            if key not in tables:
                problems, table = load_table_problems(_table_dir(root, key), *key)
                if problems:
                    raise TableError(problems[0] + (f" (+{len(problems) - 1} more problems)" if len(problems) > 1 else ""))
                tables[key] = table
    else:
        raise TableError(f"{root}: no FPM table: expected {PARQUET_NAME} + {SIDECAR_NAME} or a data/ tree")
    return ProfileBundle(profile=profile, table=tables[_key(profile.deployments[0])], root=root, tables=tables)


def _cell_problems(profile: ModelProfile, source: Path, tables: dict) -> list[str]:
    """Every deployment must find its cell, with genuine rows for each phase its role runs."""
    out = []
    for i, d in enumerate(profile.deployments):
        table = tables.get(_key(d))
        if table is None:
            continue
        where = f"{source}: deployments[{i}]"
        try:
            cell = table.select_cell(profile.model, d, profile.model_revision)
        except TableError as e:
            out.append(f"{where}: {e}")
            continue
        for phase in cell.missing_phases(d.worker_type):
            out.append(f"{where}: {table.path}: the matching FPM cell has no genuine {phase} measurements")
    return out


def validate_profile_dir(path: str | os.PathLike) -> list[str]:
    """Every profile, sidecar, row and cell-matching problem of a profile directory, one line each.

    An empty list means the directory is valid. User errors never raise.
    """
    try:
        root, pfile = _split(path)
    except JaxsimError as e:
        return [str(e)]
    problems: list[str] = []
    profile: ModelProfile | None = None
    try:
        pfile = pfile or find_profile_file(root)
        profile = load_profile(pfile)
    except JaxsimError as e:
        problems.append(str(e))
    tables: dict = {}
    if _is_flat(root):
        table_problems, table = load_table_problems(root, None, None, None)
        problems += table_problems
        if table is not None and profile is not None:
            problems += _flat_problems(table, profile)
            for d in profile.deployments:
                if not table.identity_problems(d.system, d.backend, d.backend_version):
                    tables[_key(d)] = table
    elif (root / "data").is_dir():
        wanted = {_key(d) for d in profile.deployments} if profile is not None else set()
        present = {
            (p.parent.parent.parent.name, p.parent.parent.name, p.parent.name): p.parent
            for pattern in (f"data/*/*/*/{PARQUET_NAME}", f"data/*/*/*/{SIDECAR_NAME}")
            for p in root.glob(pattern)
        }
        for key in sorted(wanted - set(present), key=str):
            try:
                problems.append(f"{_table_dir(root, key)}: no FPM table for deployments on {key[0]}/{key[1]}/{key[2]}")
            except TableError as e:
                problems.append(str(e))
        for key, tdir in sorted(present.items()):
            table_problems, table = load_table_problems(tdir, *key)
            problems += table_problems
            if table is not None:
                tables[key] = table
    else:
        problems.append(f"{root}: no FPM table: expected {PARQUET_NAME} + {SIDECAR_NAME} or a data/ tree")
    if profile is not None:
        assert pfile is not None
        problems += _cell_problems(profile, pfile, tables)
    return problems
