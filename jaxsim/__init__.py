"""jaxsim: evaluate LLM-serving deployments from measured forward-pass profiles."""

import jax

jax.config.update("jax_enable_x64", True)

__version__ = "0.1.0"
