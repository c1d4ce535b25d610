"""Importers: measured forward-pass logs, planner sweeps and the op model into FPM profile directories.

A layer above the kernels (beside :mod:`jaxsim.deploy`): an import reports its table's in-sample coverage and
derives speculative rounds through the compiled kernels (the one oracle for every timing).

``__all__`` is the public API, imported on first use (importing the package imports no JAX).
"""

from jaxsim._lazy import lazy_api

__getattr__, __all__ = lazy_api(
    "jaxsim.importers",
    {
        **dict.fromkeys(
            (
                "BinningConfig",
                "FpmImport",
                "FpmLog",
                "ImportSummary",
                "LogIdentity",
                "import_fpm_log",
                "read_fpm_log",
                "resolve_identity",
                "write_import",
            ),
            "fpm_log",
        ),
    },
)
