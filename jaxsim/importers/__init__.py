"""Importers: measured forward-pass logs, planner sweeps and the op model into FPM profile directories.

A layer above the kernels (beside :mod:`jaxsim.deploy`): an import reports its table's in-sample coverage and
derives speculative rounds through the compiled kernels (the one oracle for every timing)."""

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
