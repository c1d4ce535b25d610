#!/usr/bin/env python
"""Regenerate jaxsim's bundled profiles, licences and acceptance tables from the shared measured data.

    .venv/bin/python scripts/build_bundled_profiles.py /work/shared/data [--out jaxsim/data]

This data builder is the only code allowed to read the shared data folder; product code and tests read the
copies it writes under ``jaxsim/data``. Output bytes are deterministic for a given pyarrow version.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jaxsim.importers import derived_sd, dynamo_planner  # noqa: E402
from jaxsim.importers.fpm_log import (  # noqa: E402
    BinningConfig,
    combine_profiles,
    import_fpm_log,
    merge_columns,
    read_fpm_log,
    resolve_identity,
    write_profile_dir,
)

QWEN_MODEL = "Qwen/Qwen3-32B"
QWEN_ARCH = "Qwen3ForCausalLM"
# Qwen3-32B config.json (public): 64 layers, 8 KV heads, head_dim 128; BF16 KV, K and V -> 262144 B/token.
QWEN_KV_BYTES_TP1 = 64 * 8 * 128 * 2 * 2
QWEN_SOURCE = (
    "GitHub ai-dynamo/aiconfigurator, branch simonec/dev-layerwise-collector-clean-base, commit "
    "645aa4208be2fcf2f8690d0921248f97c5a83724, folder fpm_golden_runs/ (Apache-2.0, NVIDIA)"
)
QWEN_LICENCE = (
    "Apache-2.0, NVIDIA aiconfigurator fpm_golden_runs: jaxsim/data/LICENSES/aiconfigurator_LICENSE_Apache-2.0.txt "
    "and jaxsim/data/ATTRIBUTION.md"
)
GPU_NOTE = (
    "The GPU is not named in the source files; it is inferred as NVIDIA B300 (system b300_sxm) because the "
    "measured KV pools (TP1 723,056 tokens = 190 GB of BF16 KV) only fit a ~288 GB card and the same branch's "
    "other data is B300 - an inference, not a recorded fact."
)


def _card_checksum(card_path: Path) -> str:
    card = json.loads(card_path.read_text(encoding="utf-8"))["card_json"]
    return card["model_info"]["hf_config_json"]["checksum"]


def build_qwen(data: Path, out: Path) -> None:
    runs = data / "measured" / "fpm_runs"
    imports = []
    checksums = set()
    for tp in (1, 2, 4):
        run = runs / f"qwen3_32b_bf16_tp{tp}_ep1"
        checksums.add(_card_checksum(run / "dynamo_model_card_runtime.json"))
        imports.append((tp, run))
    if len(checksums) != 1:
        raise SystemExit(f"the three runs record different config.json checksums: {sorted(checksums)}")
    checksum = checksums.pop()
    revision = checksum.split(":", 1)[1][:40]
    results = []
    for tp, run in imports:
        ident = resolve_identity(
            model_card=run / "dynamo_model_card_runtime.json", vllm_metadata=run / "vllm_metadata.json",
            model_revision=revision, architecture=QWEN_ARCH, system="b300_sxm", kv_bytes_per_token=QWEN_KV_BYTES_TP1 // tp,
        )
        results.append(import_fpm_log(read_fpm_log(run / "fpm_metrics_detail.csv"), ident))
    summary = "; ".join(
        f"TP{r.deployment.tp}: {r.summary.rows_read} passes, {r.summary.rows_used} used, "
        f"{sum(r.summary.dropped.values())} dropped ({', '.join(f'{k} {v}' for k, v in r.summary.dropped.items() if v)}), "
        f"{r.summary.mixed_kept_out} mixed kept out"
        for r in results
    )
    provenance = (
        f"MEASURED. Qwen/Qwen3-32B BF16 on vLLM 0.20.1 behind Dynamo (prefix caching on, CUDA graphs "
        f"FULL_AND_PIECEWISE, gpu_memory_utilization 0.9, max_num_batched_tokens 8192, max_num_seqs 1024, KV block 16), "
        f"one real forward pass per log row, from {QWEN_SOURCE}. {GPU_NOTE} Imported with jaxsim "
        f"(scripts/build_bundled_profiles.py): {BinningConfig().describe()}. "
        f"{summary}. model_revision {revision} is a PLACEHOLDER: the first 40 hex digits of the blake3 checksum of "
        f"config.json recorded in the Dynamo model card ({checksum}); the run recorded no Hugging Face commit, so it is "
        f"not a Hub revision. architecture and kv_bytes_per_token (64 layers x 8 KV heads x head_dim 128 x K,V x 2 B, "
        f"split over TP) come from the public Qwen3-32B config.json; KV pools are total_kv_blocks x 16 from the model cards."
    )
    profile = combine_profiles([r.profile for r in results], provenance=provenance)
    columns = merge_columns([r.columns for r in results])
    columns["model_support_level"] = ["measured"] * len(columns["latency_ms"])
    name = "qwen3-32b-bf16-b300"
    write_profile_dir(out / "profiles" / name, profile, columns, force=True,
                      extra_sidecar={"runtime_run_ids": [f"sha256:{r.log.sha256}" for r in results],
                                     "provenance": f"measured: imported from {QWEN_SOURCE}"})
    entries = [{
        "name": name, "model": QWEN_MODEL, "system": "b300_sxm", "tps": [1, 2, 4], "kind": "measured",
        "description": "Qwen3-32B BF16, vLLM 0.20.1, TP1/TP2/TP4 on (inferred) B300: real forward-pass logs",
        "licence": QWEN_LICENCE,
    }]
    for k in (1, 2, 3):
        sd_name = f"{name}-eagle3-k{k}"
        derived_sd.write_derived_profile(out / "profiles" / sd_name, out / "profiles" / name, num_draft_tokens=k, force=True)
        entries.append({
            "name": sd_name, "model": QWEN_MODEL, "system": "b300_sxm", "tps": [1, 2, 4], "kind": "derived",
            "num_draft_tokens": k,
            "description": f"DERIVED EAGLE-3 K={k} speculative rounds for Qwen3-32B from the measured {name} passes",
            "licence": QWEN_LICENCE,
        })
    return entries


def build_llama(data: Path, out: Path) -> list[dict]:
    src = data / "measured" / "dynamo_planner_h200_llama31_8b_fp8"
    name = "llama-3.1-8b-fp8-h200"
    result = dynamo_planner.import_planner_dir(
        src, model="nvidia/Llama-3.1-8B-Instruct-FP8", system="h200_sxm", backend_version="dynamo-1.6.1",
        **dynamo_planner.LLAMA31_8B_FP8_DEFAULTS,
    )
    columns = dict(result.columns)
    columns["model_support_level"] = ["measured"] * len(columns["latency_ms"])
    write_profile_dir(out / "profiles" / name, result.profile, columns, force=True,
                      extra_sidecar={"provenance": "measured: Dynamo planner profiling results (ai-dynamo==1.6.1 wheel)"})
    return [{
        "name": name, "model": result.profile.model, "system": "h200_sxm", "tps": [1], "kind": "measured",
        "description": "Llama-3.1-8B-Instruct FP8 on H200 TP1: Dynamo planner TTFT/ITL sweep (approximate batch)",
        "licence": "Apache-2.0, NVIDIA ai-dynamo 1.6.1 planner test data: jaxsim/data/LICENSES/ai-dynamo_LICENSE_Apache-2.0.txt "
                   "and jaxsim/data/ATTRIBUTION.md",
    }]


ATTRIBUTION = """# Bundled data: sources, licences and attribution

Everything under `jaxsim/data/profiles/` and `jaxsim/data/acceptance/` is built by
`scripts/build_bundled_profiles.py` from public measurements. Keep this file and `LICENSES/` with any copy.

| bundled | source | licence |
|---|---|---|
| `profiles/qwen3-32b-bf16-b300/` (measured) | NVIDIA aiconfigurator `fpm_golden_runs/` (GitHub ai-dynamo/aiconfigurator, branch `simonec/dev-layerwise-collector-clean-base`, commit `645aa4208be2fcf2f8690d0921248f97c5a83724`): per-iteration vLLM forward-pass logs of Qwen/Qwen3-32B BF16, TP1/TP2/TP4 | Apache-2.0, `LICENSES/aiconfigurator_LICENSE_Apache-2.0.txt` |
| `profiles/qwen3-32b-bf16-b300-eagle3-k{1,2,3}/` (DERIVED) | computed by jaxsim from the measured Qwen3-32B profile above (see each profile's provenance); no speculative round was measured | as above |
| `profiles/llama-3.1-8b-fp8-h200/` (measured, approximate batch) | NVIDIA Dynamo planner profiling results shipped in the PyPI wheel `ai-dynamo==1.6.1`, `dynamo/planner/tests/data/profiling_results/H200_TP1P_TP1D/` | Apache-2.0, `LICENSES/ai-dynamo_LICENSE_Apache-2.0.txt` |
| `profiles/qwen3-32b-bf16-b300-calibrated/`, `profiles/llama-3.1-8b-fp8-h200-calibrated/` (CALIBRATED) | aiconfigurator-core 0.12.0's op-level model (NVIDIA, PyPI `aiconfigurator-core`) times a correction fitted by jaxsim (`scripts/build_calibrated_profiles.py`) to the measured Qwen3-32B logs and the Dynamo planner sweep above; `calibration.json` in each folder holds the fit and its held-out errors | Apache-2.0, `LICENSES/aiconfigurator_LICENSE_Apache-2.0.txt` (and `LICENSES/ai-dynamo_LICENSE_Apache-2.0.txt` for the Llama data) |
| `acceptance/vllm_eagle3_acceptance_mtbench.csv` | vLLM test baselines, `tests/v1/spec_decode/test_acceptance_length.py` (vllm-project/vllm); rows marked `verified_in_upstream_file=no` are unconfirmed | Apache-2.0, `LICENSES/Apache-2.0.txt` |

The Qwen3-32B GPU is not named in the source files: jaxsim labels it `b300_sxm` as an inference from the KV
capacity (only a ~288 GB card fits the measured pools) and from the same branch's other B300 data.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path, help="the shared data folder (holds measured/, acceptance/, licenses/)")
    ap.add_argument("--out", type=Path, default=REPO / "jaxsim" / "data", help="where jaxsim/data lives")
    args = ap.parse_args(argv)
    data, out = args.data.resolve(), args.out.resolve()
    profiles = out / "profiles"
    if profiles.exists():
        shutil.rmtree(profiles)
    profiles.mkdir(parents=True)
    entries = build_qwen(data, out)
    entries += build_llama(data, out)
    try:
        import build_calibrated_profiles  # noqa: PLC0415 (needs the opmodel extra)
    except ImportError as e:
        print(f"calibrated profiles skipped: {e}")
    else:
        entries += build_calibrated_profiles.build(data, out)
    (profiles / "index.json").write_text(json.dumps({"format": 1, "profiles": entries}, indent=1) + "\n", encoding="utf-8")
    lic = out / "LICENSES"
    lic.mkdir(exist_ok=True)
    for src, dst in (("aiconfigurator_LICENSE_Apache-2.0.txt", None), ("ai-dynamo_LICENSE_Apache-2.0.txt", None),
                     ("aiconfigurator_LICENSE_Apache-2.0.txt", "Apache-2.0.txt")):
        shutil.copyfile(data / "licenses" / src, lic / (dst or src))
    acc = out / "acceptance"
    acc.mkdir(exist_ok=True)
    shutil.copyfile(data / "acceptance" / "vllm_eagle3_acceptance_mtbench.csv", acc / "vllm_eagle3_acceptance_mtbench.csv")
    (out / "ATTRIBUTION.md").write_text(ATTRIBUTION, encoding="utf-8")
    total = sum(p.stat().st_size for p in list(profiles.rglob("*")) + list(lic.rglob("*")) + list(acc.rglob("*")) if p.is_file())
    print(f"wrote {len(entries)} profiles, licences and acceptance tables under {out} ({total / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
