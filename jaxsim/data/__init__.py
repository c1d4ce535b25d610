"""Data bundled with jaxsim: measured and derived FPM profiles, acceptance presets, GPU spec sheets, traces.

Every file here keeps its upstream licence and attribution (``LICENSES/``, ``ATTRIBUTION.md`` and the
per-folder READMEs).
"""
