"""Deployments assembled for the compiled kernels: a validated config (:mod:`jaxsim.rules`) bound to compiled
round tables and KV pools (:mod:`jaxsim.kernels`), ready for sweeps and replays.

* :mod:`jaxsim.deploy.binding`: :func:`bind` → :class:`Binding` (per role: deployment, bundle, compiled table,
  KV estimate and pool, scheduler envelope; nextn and acceptance rates padded to 5).
* :mod:`jaxsim.deploy.kv_estimate`: :func:`estimate_kv_cache` (pool bytes, tokens, blocks of an accepted
  capacity request) and :func:`block_view` (the pool in scheduler blocks, with a grouped cache's fixed blocks).

Layers: profile I/O → rules → kernels → this package → sweep / replay → CLI. ``__all__`` is the public API,
imported on first use (importing the package imports no JAX).
"""

from jaxsim._lazy import lazy_api

__getattr__, __all__ = lazy_api("jaxsim.deploy", {
    **dict.fromkeys(("Binding", "RoleBinding", "bind"), "binding"),
    **dict.fromkeys(("BlockView", "block_view", "estimate_kv_cache"), "kv_estimate"),
})
