"""Vectorized deployment sweeps: steady-state metrics over millions of configurations.

* :mod:`jaxsim.sweep.spec`: the sweep spec (TOML) and its lazy, validated expansion;
* :mod:`jaxsim.sweep.evaluate`: the compiled steady-state evaluator (one config, vmapped);
* :mod:`jaxsim.sweep.run`: chunked, sharded, resumable streaming to parquet/CSV, Pareto frontier.

``__all__`` is the public API, imported on first use (importing the package imports no JAX).
"""

from jaxsim._lazy import lazy_api

__getattr__, __all__ = lazy_api("jaxsim.sweep", {
    **dict.fromkeys(("ConfigInputs", "Metrics", "SLABounds", "evaluate_chunk", "evaluate_config", "expected_rounds"), "evaluate"),
    "pareto_mask": "frontier",
    **dict.fromkeys(("OutputExistsError", "SweepResult", "run_sweep"), "run"),
    **dict.fromkeys(("SpecError", "SweepPlan", "SweepSpec", "load_spec", "plan_sweep", "spec_from_dict"), "spec"),
})
