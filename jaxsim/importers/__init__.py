"""Importers: measured forward-pass logs and planner sweeps into FPM profile directories."""

from jaxsim.importers.fpm_log import (
    BinningConfig,
    FpmImport,
    FpmLog,
    ImportSummary,
    LogIdentity,
    import_fpm_log,
    read_fpm_log,
    resolve_identity,
    write_import,
)

__all__ = [
    "BinningConfig",
    "FpmImport",
    "FpmLog",
    "ImportSummary",
    "LogIdentity",
    "import_fpm_log",
    "read_fpm_log",
    "resolve_identity",
    "write_import",
]
