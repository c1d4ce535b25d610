"""Binding and capacity rules, in plain Python (no JAX): everything decided before anything compiles.

* :mod:`jaxsim.rules.config`: deployment configs (TOML → frozen dataclasses, read through :mod:`jaxsim.schema`);
* :mod:`jaxsim.rules.binding`: a deployment config bound to a profile (exact identities, scheduler
  envelope, speculation, KV pool), every problem listed at once;
* :mod:`jaxsim.rules.capacity`: the reference's capacity equality checks and KV-pool estimates;

Layers: profile I/O (:mod:`jaxsim.profile`) → these rules → compiled kernels (:mod:`jaxsim.kernels`) →
sweep / replay → CLI. ``__all__`` is the public API, imported on first use.
"""

from jaxsim._lazy import lazy_api

__getattr__, __all__ = lazy_api("jaxsim.rules", {
    **dict.fromkeys(("DeploymentConfig", "RoleConfig", "Overrides", "load_config", "parse_config_text", "config_from_dict"),
                    "config"),
    **dict.fromkeys(("Binding", "RoleBinding", "bind", "validate_config", "load_bundle", "resolve_profile_dir",
                     "clear_caches"), "binding"),
    **dict.fromkeys(("CapacityRequest", "KvCacheEstimate", "capacity_problems", "block_size_problem", "non_kv_bytes",
                     "VLLM_DEFAULT_GPU_MEMORY_UTILIZATION"), "capacity"),
})
