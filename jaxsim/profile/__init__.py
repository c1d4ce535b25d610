"""FPM profiles: the model profile, its timing table and profile directories."""

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
    "find_profile_file",
    "load_profile",
    "load_profile_dir",
    "make_rows",
    "parse_profile_text",
    "read_table",
    "save_profile",
    "validate_profile_dir",
    "validate_table",
    "write_table",
]
