"""Dump the plan and the results of sweep specs, to compare two versions of the sweep bit for bit.

    PYTHONPATH=$PWD python scripts/dump_sweep_plans.py OUT.json [--no-large]

Every ``configs/*.toml`` that the sweep accepts, plus a few specs built in code that reach the planner's
refusal paths (unknown profile, GPU budget, GPUs over the documented limit, nextn without acceptance,
explicit scheduler envelopes, grouped cache, no link bandwidth), is planned: counts, refusals, labels,
every binding column, acceptance rows, groups, the identity of each round table, and the decoded inputs
of every config. Each spec with valid configs is then run; the result rows are dumped as per-column
digests (NaNs included) and the summary without timings. Two dumps are equal iff nothing observable
changed (``diff`` them).
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np
import pyarrow.parquet as pq

import jaxsim._jax  # noqa: F401  (x64)
from jaxsim.sweep.run import run_sweep
from jaxsim.sweep.spec import SpecError, load_spec, plan_sweep, spec_from_dict

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "tests" / "goldens" / "public" / "tables"
GROUPED = ROOT / "tests" / "goldens" / "public" / "rejections" / "sd-grouped-cache"


def _digest(a) -> str:
    a = np.ascontiguousarray(np.asarray(a))
    if a.dtype == object:
        return hashlib.sha256(json.dumps([str(x) for x in a.ravel()]).encode()).hexdigest()[:16]
    return hashlib.sha256(a.dtype.str.encode() + str(a.shape).encode() + a.tobytes()).hexdigest()[:16]


def _small(a):
    a = np.asarray(a)
    return a.tolist() if a.size <= 64 else _digest(a)


def _table_id(t) -> str:
    return "/".join(_digest(x) for x in jax.tree.leaves(t))


def _columns(plan) -> dict:
    """The per-binding columns by name (the link bandwidth apart: ``link_bytes_per_s``)."""
    b = plan.bindings
    if isinstance(b, dict):  # the layout before the typed columns
        return {**{k: np.asarray(v) for k, v in b.items()}, "link_bytes_per_s": np.asarray(plan.link_bytes_per_s)}
    cols = {k: np.asarray(v) for k, v in vars(b).items()}
    cols["link_bytes_per_s"] = cols.pop("kv_transfer_bytes_per_s")
    return cols


def dump_plan(plan) -> dict:
    cols = _columns(plan)
    n = plan.num_configs
    idx = np.arange(n, dtype=np.int64)
    ins = plan.inputs(idx)
    return {
        "summary": plan.summary(),
        "labels": plan.labels,
        "bindings": {k: v.tolist() for k, v in sorted(cols.items())},
        "binding_dtypes": {k: v.dtype.str for k, v in sorted(cols.items())},
        "rates": plan.rates.tolist(),
        "rates_nextn": plan.rates_nextn.tolist(),
        "accepted_mean": plan.accepted_mean.tolist(),
        "groups": [list(map(int, g[:4])) + [bool(g[4])] for g in plan.groups],
        "tables": [_table_id(t) for t in plan.tables],
        "workloads": [_small(x) for x in (plan.wl_isl, plan.wl_osl, plan.wl_weight, plan.wl_mean_isl, plan.wl_mean_osl)],
        "inputs": {k: _digest(getattr(ins, k)) for k in ins.__dataclass_fields__},
        "input_columns": {k: _digest(v) for k, v in plan.input_columns(idx).items()},
        "chunks": _small(np.asarray(plan.chunks(4096))),
        "rounds_table": _digest(plan.rounds_table()) if plan.tables else None,
    }


def dump_run(spec, plan, tmp: Path) -> dict:
    out = tmp / f"{spec.name}.parquet"
    res = run_sweep(spec, out, csv=True, top=5, devices=jax.devices()[:1], plan=plan, force=True)
    t = pq.read_table(out)
    summ = {k: v for k, v in res.summary.items()}
    return {
        "summary": summ,
        "rows": t.num_rows,
        "schema": str(t.schema.remove_metadata()),
        "metadata": {k.decode(): v.decode() for k, v in (t.schema.metadata or {}).items() if k != b"ARROW:schema"},
        "columns": {c: _digest(t.column(c).combine_chunks().to_numpy(zero_copy_only=False)) for c in t.column_names},
        "top": res.top.to_pylist().__repr__(),
        "pareto": _digest(np.asarray(res.pareto.column("config_id").to_numpy()) if res.pareto.num_rows else []),
        "csv": hashlib.sha256(out.with_suffix(".csv").read_bytes()).hexdigest()[:16],
    }


def code_specs() -> dict:
    base = {
        "name": "t",
        "block_size": 16,
        "gpu_budget": 8,
        "profile": [{"name": str(TABLES / "ar_core"), "label": "ar"}, {"name": str(TABLES / "sd_k3"), "label": "sd3"}],
        "serving": {"mode": ["aggregated", "disaggregated"], "ratios": ["1:1", "1:2"]},
        "speculation": {"nextn": ["profile", 2], "acceptance": [1.5, [0.8, 0.6, 0.4]]},
        "scheduler": {"concurrency": [1, 4, 16]},
        "workload": [{"name": "w", "isl": [256, 1024], "osl": 128}, {"name": "mix", "requests": [[512, 64, 1], [2048, 256, 3]]}],
        "sla": {"mean_ttft_ms": 1000, "mean_tpot_ms": 40, "p90_ttft_ms": 900.0, "min_tokens_per_s_per_user": 5.0},
    }
    ov = lambda **kw: {**base, **kw}  # noqa: E731
    return {
        "base": base,
        "budget_envelope": ov(gpu_budget=1, scheduler={"concurrency": [1], "max_num_seqs": ["recorded", 7]},
                              speculation={"nextn": ["profile"], "acceptance": [1.0]}),
        "unknown_profile": ov(profile=[{"name": "no-such-profile-xyz"}, {"name": str(TABLES / "ar_core")}]),
        "no_acceptance": ov(speculation={"nextn": ["profile", 1, 0]}),
        "gpus_over_limit": {**{k: v for k, v in base.items() if k != "gpu_budget"},
                            "profile": [{"name": str(TABLES / "ar_core"), "label": "ar", "tp": [1, 64]},
                                        {"name": str(TABLES / "sd_k2"), "label": "sd2"}],
                            "serving": {"mode": ["disaggregated", "aggregated"], "ratios": ["1024:1024", "3:1"]}},
        "envelopes": {**{k: v for k, v in base.items() if k != "gpu_budget"}, "kv_transfer_gbps": 25.0,
                        "scheduler": {"concurrency": [2, 8], "max_num_seqs": [4, "recorded", 64],
                                   "max_num_batched_tokens": [512, "recorded", 8192]}},
        "envelopes_budget": ov(scheduler={"concurrency": [2, 8], "max_num_seqs": [4, "recorded", 64],
                                   "max_num_batched_tokens": [512, "recorded", 8192]}),
        "all_profiles": ov(profile=[{"name": str(TABLES / n), "label": n} for n in ("ar_core", "ar_decoy", "sd_k2", "sd_k3")]
                           + [{"name": str(GROUPED), "label": "grouped"}],
                           speculation={"nextn": ["profile", 0, 2, 3], "acceptance": ["eagle3-mtbench-qwen3-8b", 0.7]}),
        "bundled": ov(profile=[{"name": "llama-3.1-8b-fp8-h200"}, {"name": "qwen3-32b-bf16-b300-calibrated", "tp": [1, 2, 8]}],
                      gpu_budget=4, speculation={}),
    }


def main(argv: list[str]) -> int:
    out_path = Path(argv[0])
    large = "--no-large" not in argv
    specs = {}
    for p in sorted((ROOT / "configs").glob("*.toml")):
        try:
            specs[f"configs/{p.name}"] = load_spec(p)
        except SpecError as e:
            print(f"skip {p.name}: {str(e)[:100]}", file=sys.stderr)
    for name, d in code_specs().items():
        specs[f"code:{name}"] = spec_from_dict(d, source=f"{name}.toml", base_dir=ROOT)
    dump: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in specs.items():
            if not large and "large" in name:
                continue
            plan = plan_sweep(spec)
            entry = {"plan": dump_plan(plan)}
            if plan.num_configs:
                entry["run"] = dump_run(spec, plan, Path(tmp))
            dump[name] = entry
            print(f"{name}: {plan.num_bindings} bindings, {plan.num_configs} configs, {len(plan.invalid)} refusal rules",
                  file=sys.stderr)
    text = json.dumps(dump, indent=1, sort_keys=True, default=str).replace(str(ROOT), "<root>")  # checkouts compare
    out_path.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
