"""jaxsim: evaluate LLM-serving deployments from measured forward-pass profiles.

Layers, bottom up (each package states its public API in ``__all__``):

1. profile I/O: :mod:`jaxsim.profile` (profile.json + FPM table), :mod:`jaxsim.importers`, :mod:`jaxsim.data`
   (bundled profiles, traces, presets), :mod:`jaxsim.schema` (the input documents' declared fields);
2. deployment configs, binding and capacity rules, plain Python: :mod:`jaxsim.rules`;
3. compiled kernels: :mod:`jaxsim.kernels`;
4. sweep / replay: :mod:`jaxsim.sweep`, :mod:`jaxsim.replay` (with :mod:`jaxsim.sla`,
   :mod:`jaxsim.calibrate`, :mod:`jaxsim.accuracy`, :mod:`jaxsim.plots`);
5. CLI: :mod:`jaxsim.cli`.

Importing the package imports no JAX; modules that compile kernels enable x64 through
:func:`jaxsim._jax.ensure_x64`.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
