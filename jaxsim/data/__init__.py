"""Data bundled with jaxsim: measured and derived FPM profiles, acceptance presets, GPU spec sheets, traces.

Every file here keeps its upstream licence and attribution (``LICENSES/``, ``ATTRIBUTION.md`` and the
per-folder READMEs).
"""

from jaxsim._lazy import lazy_api

__getattr__, __all__ = lazy_api("jaxsim.data", dict.fromkeys((
    "list_bundled", "bundled_names", "get_bundled", "resolve_profile", "profiles_root", "data_root",
    "list_acceptance_presets", "acceptance_preset",
), "registry"))
