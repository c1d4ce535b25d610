"""jaxsim: evaluate LLM-serving deployments from measured forward-pass profiles.

Importing the package imports no JAX; modules that compile kernels enable x64 through
:func:`jaxsim._jax.ensure_x64`.
"""

__version__ = "0.1.0"
