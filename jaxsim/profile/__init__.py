"""FPM profiles: the model profile, its timing table and profile directories, and finding and loading them.

* :mod:`jaxsim.profile.model`: ``profile.json`` (identities, resources, provenance);
* :mod:`jaxsim.profile.table`: the FPM timing table and its sidecar, cells of genuine rows;
* :mod:`jaxsim.profile.directory`: a profile directory (profile + tables) loaded and validated;
* :mod:`jaxsim.profile.resolve`: a name or path → directory → bundle → deployment → cell, cached by exact identity.
"""

from jaxsim.profile.directory import ProfileBundle, find_profile_file, load_profile_dir, validate_profile_dir
from jaxsim.profile.model import (
    CacheGroup,
    Deployment,
    ExecutionProfile,
    ModelProfile,
    Resources,
    RuntimeMemory,
    load_profile,
    parse_profile_text,
    save_profile,
)
from jaxsim.profile.resolve import (
    cell_rows,
    choose_deployment,
    clear_caches,
    load_bundle,
    profile_data_source,
    resolve_profile_dir,
    select_deployment,
)
from jaxsim.profile.table import (
    IDENTITY_COLUMNS,
    SD_POLICY,
    SUPPORTED_POLICIES,
    CellRows,
    FpmTable,
    make_rows,
    read_table,
    validate_table,
    write_table,
)

__all__ = [
    "CacheGroup",
    "CellRows",
    "Deployment",
    "ExecutionProfile",
    "FpmTable",
    "IDENTITY_COLUMNS",
    "ModelProfile",
    "ProfileBundle",
    "Resources",
    "RuntimeMemory",
    "SD_POLICY",
    "SUPPORTED_POLICIES",
    "cell_rows",
    "choose_deployment",
    "clear_caches",
    "find_profile_file",
    "load_bundle",
    "load_profile",
    "load_profile_dir",
    "make_rows",
    "parse_profile_text",
    "profile_data_source",
    "read_table",
    "resolve_profile_dir",
    "save_profile",
    "select_deployment",
    "validate_profile_dir",
    "validate_table",
    "write_table",
]
