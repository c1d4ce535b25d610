"""Convert the GPU spec sheets that aiconfigurator-core ships (``aiconfigurator_core/systems/<name>.yaml``,
NVIDIA, Apache-2.0) into ``jaxsim/data/systems/<name>.json`` (same keys and values, YAML comments dropped).

Sheets jaxsim already bundles (from aisimulate) are kept unchanged; only the others are written, and
``jaxsim/data/systems/sources.csv`` records where each sheet came from. Needs the ``opmodel`` extra and PyYAML.

    PYTHONPATH=$PWD python scripts/build_system_sheets.py [--out jaxsim/data/systems]
"""

from __future__ import annotations

import argparse
import csv
import json
from importlib.metadata import version
from pathlib import Path

import yaml

KEEP_FROM_AISIMULATE = ("a100_sxm", "b300_sxm", "h100_sxm", "h200_sxm")
NOT_GPUS = ("attention_lane_defaults", "perf_data_reuse_manifest", "query_versions")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "jaxsim" / "data" / "systems")
    args = ap.parse_args()
    import aiconfigurator_core

    src = Path(aiconfigurator_core.__file__).parent / "systems"
    ver = version("aiconfigurator-core")
    rows = [(n, "aisimulate", "aisimulate_core/systems/" + n + ".yaml", "LICENSE-aisimulate-Apache-2.0.txt") for n in KEEP_FROM_AISIMULATE]
    for p in sorted(src.glob("*.yaml")):
        name = p.stem
        if name in NOT_GPUS or name in KEEP_FROM_AISIMULATE:
            continue
        sheet = yaml.safe_load(p.read_text(encoding="utf-8"))
        if not isinstance(sheet, dict) or "gpu" not in sheet:
            continue
        misc = sheet.get("misc", {})
        if isinstance(misc.get("nccl_mem"), dict):
            misc["nccl_mem"] = {str(k): v for k, v in misc["nccl_mem"].items()}
        (args.out / f"{name}.json").write_text(json.dumps(sheet, indent=1) + "\n", encoding="utf-8")
        rows.append((name, f"aiconfigurator-core {ver}", f"aiconfigurator_core/systems/{name}.yaml", "LICENSE-aiconfigurator-core-Apache-2.0.txt"))
    with (args.out / "sources.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(("system", "source", "file", "licence"))
        w.writerows(sorted(rows))
    print(f"{len(rows)} spec sheets listed in {args.out / 'sources.csv'}")


if __name__ == "__main__":
    main()
