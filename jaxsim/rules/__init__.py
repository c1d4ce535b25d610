"""Binding and capacity rules, in plain Python (no JAX, no kernels): everything decided before anything compiles.

* :mod:`jaxsim.rules.config`: deployment configs (TOML → frozen dataclasses, read through :mod:`jaxsim.schema`);
* :mod:`jaxsim.rules.validate`: every problem of binding a config to its profiles, listed at once;
* :mod:`jaxsim.rules.role`: one role resolved against its profile (directory, bundle, deployment, cell,
  capacity request), as far as it resolves;
* :mod:`jaxsim.rules.role_problems` / :mod:`jaxsim.rules.config_problems`: the rules of a resolved role (exact
  identities, speculation, overrides, cell support, capacity) and of a config as a whole;
* :mod:`jaxsim.rules.capacity`: the reference's capacity equality checks and KV-pool estimates.

A valid config is assembled with compiled tables and KV pools by :mod:`jaxsim.deploy`. Layers: profile I/O
(:mod:`jaxsim.profile`, :mod:`jaxsim.schema`, :mod:`jaxsim.limits`, :mod:`jaxsim.acceptance`) → these rules →
compiled kernels (:mod:`jaxsim.kernels`) → :mod:`jaxsim.deploy` → sweep / replay → CLI. ``__all__`` is the
public API, imported on first use.
"""

from jaxsim._lazy import lazy_api

__getattr__, __all__ = lazy_api("jaxsim.rules", {
    **dict.fromkeys(("DeploymentConfig", "RoleConfig", "Overrides", "load_config", "parse_config_text", "config_from_dict"),
                    "config"),
    **dict.fromkeys(("Analysis", "analyze", "validate_config"), "validate"),
    **dict.fromkeys(("ResolvedRole", "resolve_role"), "role"),
    **dict.fromkeys(("CapacityRequest", "KvCacheEstimate", "capacity_problems", "block_size_problem", "non_kv_bytes",
                     "VLLM_DEFAULT_GPU_MEMORY_UTILIZATION"), "capacity"),
})
