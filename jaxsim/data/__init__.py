"""Data bundled with jaxsim: measured and derived FPM profiles, acceptance presets, GPU spec sheets, traces.

Every file here keeps its upstream licence and attribution (``LICENSES/``, ``ATTRIBUTION.md`` and the
per-folder READMEs). The bundled profiles are listed by :mod:`jaxsim.data.registry`; the acceptance presets
(``acceptance/``) are read by :mod:`jaxsim.acceptance`.
"""

from jaxsim._lazy import lazy_api

__getattr__, __all__ = lazy_api("jaxsim.data", dict.fromkeys((
    "list_bundled", "bundled_names", "get_bundled", "resolve_profile", "profiles_root", "data_root",
), "registry"))
