"""Deployments assembled for the compiled kernels: a validated config (:mod:`jaxsim.rules`) bound to compiled
round tables and KV pools (:mod:`jaxsim.kernels`), ready for sweeps and replays.

* :mod:`jaxsim.deploy.binding`: :func:`bind` → :class:`Binding` (per role: deployment, bundle, compiled table,
  KV estimate and pool, scheduler envelope; nextn and acceptance rates padded to 5).

Layers: profile I/O → rules → kernels → this package → sweep / replay → CLI. ``__all__`` is the public API,
imported on first use (importing the package imports no JAX).
"""

from jaxsim._lazy import lazy_api

__getattr__, __all__ = lazy_api("jaxsim.deploy", dict.fromkeys(("Binding", "RoleBinding", "bind"), "binding"))
