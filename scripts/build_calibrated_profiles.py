#!/usr/bin/env python
"""Build jaxsim's bundled CALIBRATED profiles: aiconfigurator's op model corrected to the bundled measured logs.

    .venv/bin/python scripts/build_calibrated_profiles.py /work/shared/data [--out jaxsim/data]

Needs the ``opmodel`` extra (aiconfigurator-core). Writes, and adds to ``profiles/index.json``:

* ``qwen3-32b-bf16-b300-calibrated``: Qwen/Qwen3-32B on b300_sxm, TP1/TP2/TP4, the op model calibrated to each TP's
  measured vLLM 0.20.1 log (``measured/fpm_runs/qwen3_32b_bf16_tp{1,2,4}_ep1``);
* ``llama-3.1-8b-fp8-h200-calibrated``: meta-llama/Meta-Llama-3.1-8B (FP8 GEMM) on h200_sxm, TP1, calibrated to the
  Dynamo planner's H200 sweep of nvidia/Llama-3.1-8B-Instruct-FP8 (``measured/dynamo_planner_h200_llama31_8b_fp8``).

Each profile is fitted on the training part of the blocked time split (the held-out scores printed and stored
in ``calibration.json`` are of exactly the bundled rows). Like the measured-profile builder, this is the only
code that reads the shared data folder.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jaxsim import calibrate as C  # noqa: E402
from jaxsim.importers import op_model as om  # noqa: E402
from jaxsim.importers.dynamo_planner import LLAMA31_8B_FP8_DEFAULTS  # noqa: E402

QWEN_LICENCE = (
    "Apache-2.0: op model aiconfigurator-core 0.12.0 (NVIDIA) and measured logs NVIDIA aiconfigurator fpm_golden_runs: "
    "jaxsim/data/LICENSES/aiconfigurator_LICENSE_Apache-2.0.txt and jaxsim/data/ATTRIBUTION.md"
)
LLAMA_LICENCE = (
    "Apache-2.0: op model aiconfigurator-core 0.12.0 (NVIDIA, jaxsim/data/LICENSES/aiconfigurator_LICENSE_Apache-2.0.txt) "
    "and NVIDIA ai-dynamo 1.6.1 planner test data (jaxsim/data/LICENSES/ai-dynamo_LICENSE_Apache-2.0.txt); see "
    "jaxsim/data/ATTRIBUTION.md"
)
# table density of the bundled profiles (package size): Qwen decode curves for every batch up to 128 (the logs'
# concurrency is 32, the quickstart's up to 48) and prefill batches 1..32 (azure_code_1k replays to completion); Llama's planner points
# reach batch ~800, so its decode curves are
# thinned to every batch up to 32, then 1/8-octave steps to 1024 (jaxsim interpolates between covering curves);
# Llama prefill batches 1..8. Thinning happens BEFORE calibration, so the stored held-out scores are of the bundled rows.
QWEN_MAX_NUM_SEQS = 128
QWEN_MAX_PREFILL_BATCH = 32
MAX_PREFILL_BATCH = 8


def batch_grid(max_batch: int) -> np.ndarray:
    hi = [int(round(32 * 2 ** (i / 8))) for i in range(1, 8 * int(np.ceil(np.log2(max_batch / 32))) + 1)]
    return np.unique(np.clip(np.array(list(range(1, 33)) + hi + [max_batch]), 1, max_batch))


def thin_decode(src: Path, dst: Path, grid: np.ndarray) -> Path:
    """A copy of a flat profile directory keeping decode rows only at batches in ``grid``."""
    from jaxsim.importers.fpm_log import write_profile_dir
    from jaxsim.profile.directory import load_profile_dir

    b = load_profile_dir(src)
    t = b.table
    keep = (t.column("workload_kind") != "decode") | np.isin(t.column("batch_size"), grid)
    arrow = t.arrow.filter(pa.array(keep))
    cols = {c: arrow.column(c) for c in arrow.column_names}
    write_profile_dir(dst, b.profile, cols, measurement_policy=t.measurement_policy, force=True,
                      extra_sidecar={k: v for k, v in t.sidecar.items() if k == "provenance"})
    return dst


def _print(name: str, tp: int, cal: C.Calibration) -> None:
    for row in C.score_lines(cal.scores):
        print(f"  {name} TP{tp} " + " | ".join(row))


def build_qwen(data: Path, out: Path, tmp: Path) -> dict:
    req = om.OpModelRequest(model="Qwen/Qwen3-32B", system="b300_sxm", tp=(1, 2, 4), max_num_seqs=QWEN_MAX_NUM_SEQS,
                            max_prefill_batch=QWEN_MAX_PREFILL_BATCH, max_model_len=40960)
    modelled = om.write_op_model(tmp / "qwen-modelled", om.import_op_model(req))
    parts, reports = [], {}
    for tp in (1, 2, 4):
        log = data / "measured" / "fpm_runs" / f"qwen3_32b_bf16_tp{tp}_ep1" / "fpm_metrics_detail.csv"
        cal = C.calibrate(modelled, log)
        _print("qwen3-32b", tp, cal)
        parts.append(C.calibrated_profile(cal, provenance_extra=(
            "Log source: GitHub ai-dynamo/aiconfigurator, branch simonec/dev-layerwise-collector-clean-base, commit "
            "645aa4208be2fcf2f8690d0921248f97c5a83724, fpm_golden_runs/ (Apache-2.0, NVIDIA); the GPU is not named in the "
            "log, b300_sxm is an inference from its KV capacity. Built by scripts/build_calibrated_profiles.py.")))
        reports[f"tp{tp}"] = {**cal.summary(), "log": f"fpm_golden_runs/qwen3_32b_bf16_tp{tp}_ep1/fpm_metrics_detail.csv"}
    name = "qwen3-32b-bf16-b300-calibrated"
    C.write_calibrated(out / "profiles" / name, parts, force=True, report=reports,
                       extra_sidecar={"provenance": "calibrated: aiconfigurator-core 0.12.0 op model x correction fitted to measured vLLM logs"})
    return {"name": name, "model": "Qwen/Qwen3-32B", "system": "b300_sxm", "tps": [1, 2, 4], "kind": "calibrated",
            "description": "Qwen3-32B BF16 on (inferred) B300, TP1/TP2/TP4: op model calibrated to the measured vLLM 0.20.1 logs",
            "licence": QWEN_LICENCE}


def build_llama(data: Path, out: Path, tmp: Path) -> dict:
    req = om.OpModelRequest(model="meta-llama/Meta-Llama-3.1-8B", system="h200_sxm", tp=(1,), gemm_quant_mode="fp8",
                            max_num_seqs=1024, max_num_batched_tokens=16384, max_prefill_batch=MAX_PREFILL_BATCH,
                            max_model_len=16384)
    full = om.write_op_model(tmp / "llama-modelled-full", om.import_op_model(req))
    modelled = thin_decode(full, tmp / "llama-modelled", batch_grid(1024))
    cal = C.calibrate(modelled, data / "measured" / "dynamo_planner_h200_llama31_8b_fp8", model="nvidia/Llama-3.1-8B-Instruct-FP8",
                      model_revision=LLAMA31_8B_FP8_DEFAULTS["model_revision"], backend_version="dynamo-1.6.1",
                      config=C.CalibrationConfig(window=10))
    _print("llama-3.1-8b", 1, cal)
    name = "llama-3.1-8b-fp8-h200-calibrated"
    part = C.calibrated_profile(cal, provenance_extra=(
        "The op model prices meta-llama/Meta-Llama-3.1-8B with FP8 GEMMs; the planner measured nvidia/Llama-3.1-8B-Instruct-FP8 "
        "(same architecture), whose name the profile takes. Planner points are read as passes: TTFT as a batch-1 prefill, ITL "
        "as a decode pass at the approximate batch round(kv_usage x max_kv / context). Log source: PyPI ai-dynamo==1.6.1, "
        "dynamo/planner/tests/data/profiling_results/H200_TP1P_TP1D/ (Apache-2.0). Built by scripts/build_calibrated_profiles.py."))
    C.write_calibrated(
        out / "profiles" / name,
        [part],
        force=True,
        report={"tp1": cal.summary()},
        extra_sidecar={"provenance": "calibrated: aiconfigurator-core 0.12.0 op model x correction fitted to the Dynamo planner sweep"},
    )
    return {"name": name, "model": "nvidia/Llama-3.1-8B-Instruct-FP8", "system": "h200_sxm", "tps": [1], "kind": "calibrated",
            "description": "Llama-3.1-8B FP8 on H200 TP1: op model calibrated to the Dynamo planner's measured TTFT/ITL sweep",
            "licence": LLAMA_LICENCE}


def build(data: Path, out: Path) -> list[dict]:
    with tempfile.TemporaryDirectory() as t:
        return [build_qwen(data, out, Path(t)), build_llama(data, out, Path(t))]


def add_to_index(out: Path, entries: list[dict]) -> None:
    idx_path = out / "profiles" / "index.json"
    idx = json.loads(idx_path.read_text(encoding="utf-8"))
    names = {e["name"] for e in entries}
    idx["profiles"] = [e for e in idx["profiles"] if e["name"] not in names] + entries
    idx_path.write_text(json.dumps(idx, indent=1) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path, help="the shared data folder (holds measured/)")
    ap.add_argument("--out", type=Path, default=REPO / "jaxsim" / "data", help="where jaxsim/data lives")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    entries = build(args.data.resolve(), out)
    add_to_index(out, entries)
    for e in entries:
        d = out / "profiles" / e["name"]
        size = sum(p.stat().st_size for p in d.iterdir())
        print(f"wrote {d} ({size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
