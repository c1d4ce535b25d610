"""FPM profiles: the model profile, its timing table and profile directories, and finding and loading them.

* :mod:`jaxsim.profile.model`: ``profile.json`` (identities, resources, provenance);
* :mod:`jaxsim.profile.table`: the FPM timing table and its sidecar, cells of genuine rows;
* :mod:`jaxsim.profile.directory`: a profile directory (profile + tables) loaded and validated;
* :mod:`jaxsim.profile.resolve`: a name or path → directory → bundle → deployment → cell, cached by exact identity.

``__all__`` is the public API, imported on first use (importing the package imports no JAX).
"""

from jaxsim._lazy import lazy_api

__getattr__, __all__ = lazy_api(
    "jaxsim.profile",
    {
        **dict.fromkeys(("ProfileBundle", "find_profile_file", "load_profile_dir", "validate_profile_dir"), "directory"),
        **dict.fromkeys(
            (
                "CacheGroup",
                "Deployment",
                "ExecutionProfile",
                "ModelProfile",
                "Resources",
                "RuntimeMemory",
                "load_profile",
                "parse_profile_text",
                "save_profile",
            ),
            "model",
        ),
        **dict.fromkeys(
            ("cell_rows", "choose_deployment", "clear_caches", "load_bundle", "profile_data_source", "resolve_profile_dir", "select_deployment"),
            "resolve",
        ),
        **dict.fromkeys(
            (
                "CellRows",
                "FpmTable",
                "IDENTITY_COLUMNS",
                "SD_POLICY",
                "SUPPORTED_POLICIES",
                "make_rows",
                "read_table",
                "validate_table",
                "write_table",
            ),
            "table",
        ),
    },
)
