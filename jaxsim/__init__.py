"""jaxsim: evaluate LLM-serving deployments from measured forward-pass profiles.

Layers, bottom up; a module imports only its own or lower layers (each package states its public API in
``__all__``; ``tests/test_layers.py`` checks every import against the table in ``tests/import_layers.py``):

0. profile I/O and the ground floor: :mod:`jaxsim.profile` (profile.json + FPM table, directories, cached
   resolution and loading), :mod:`jaxsim.data` (bundled profiles, presets, spec sheets, traces),
   :mod:`jaxsim.schema` (the input documents' declared fields), :mod:`jaxsim.limits` (input ranges),
   :mod:`jaxsim.errors`, :mod:`jaxsim.outputs`, :mod:`jaxsim.systems`, :mod:`jaxsim.acceptance` (presets and
   their lowering), :mod:`jaxsim.query_files` (round-timing query files);
1. rules, plain Python with no kernels and no JAX: :mod:`jaxsim.rules` (deployment configs, binding
   validation, capacity rules) and :mod:`jaxsim.sla`;
2. compiled kernels: :mod:`jaxsim.kernels` (with the JAX set-up :mod:`jaxsim._jax`, :mod:`jaxsim.devices`);
3. assembly above the kernels: :mod:`jaxsim.deploy` (a validated config bound to compiled tables and KV
   pools) and :mod:`jaxsim.importers` (profiles written from logs, checked through the kernels);
4. sweep / replay: :mod:`jaxsim.sweep`, :mod:`jaxsim.replay` (with :mod:`jaxsim.calibrate`,
   :mod:`jaxsim.accuracy`, :mod:`jaxsim.plots`, :mod:`jaxsim.round_queries`);
5. CLI: :mod:`jaxsim.cli`.

Importing the package imports no JAX; modules that compile kernels enable x64 through
:func:`jaxsim._jax.ensure_x64`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("jaxsim")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
