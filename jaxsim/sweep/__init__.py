"""Vectorized deployment sweeps: steady-state metrics over millions of configurations.

* :mod:`jaxsim.sweep.spec`: the sweep spec (TOML) and its lazy, validated expansion;
* :mod:`jaxsim.sweep.evaluate`: the compiled steady-state evaluator (one config, vmapped);
* :mod:`jaxsim.sweep.run`: chunked, sharded, resumable streaming to parquet/CSV, Pareto frontier.
"""

from jaxsim.sweep.evaluate import ConfigInputs, Metrics, SLABounds, evaluate_chunk, evaluate_config, expected_rounds
from jaxsim.sweep.frontier import pareto_mask
from jaxsim.sweep.run import OutputExistsError, SweepResult, run_sweep
from jaxsim.sweep.spec import SpecError, SweepPlan, SweepSpec, load_spec, plan_sweep, spec_from_dict

__all__ = [
    "ConfigInputs",
    "Metrics",
    "OutputExistsError",
    "SLABounds",
    "SpecError",
    "SweepPlan",
    "SweepResult",
    "SweepSpec",
    "evaluate_chunk",
    "evaluate_config",
    "expected_rounds",
    "load_spec",
    "pareto_mask",
    "plan_sweep",
    "run_sweep",
    "spec_from_dict",
]
