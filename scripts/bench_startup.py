"""Wall time of CLI start-up: `jaxsim --help`, `jaxsim profiles list`, `jaxsim validate CONFIG`, and of the
imports every compiled command pays (ml_dtypes, jax, equinox).

Each command runs N times (default 5) in a fresh interpreter (`python -m jaxsim ...`) from a checkout;
prints the median and the min in seconds and whether the command imported JAX (via `-X importtime`).
Numbers depend on machine load; run it on an idle machine for the ≤ 0.5 s target.

  python scripts/bench_startup.py [--repeat 5] [--root OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = (
    ("--help",),
    ("profiles", "list"),
    ("validate", "configs/deployment_aggregated.toml"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--root", type=Path, default=ROOT, help="jaxsim checkout to time (default: this one)")
    args = ap.parse_args()
    root = args.root.resolve()
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    bare = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        bare.append(time.perf_counter() - t0)
    print(f"{root}: bare interpreter start median {statistics.median(bare):.3f} s")
    # the heavy imports every compiled command pays (ml_dtypes is pinned below 0.7 in pyproject.toml: 0.7.0
    # took ~0.5 s to import); versions printed so a slow one is visible
    for module in ("ml_dtypes", "jax", "equinox"):
        walls = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", f"import {module}"], env=env, check=True)
            walls.append(time.perf_counter() - t0)
        version = subprocess.run([sys.executable, "-c", f"import importlib.metadata as m; print(m.version('{module}'))"],
                                 env=env, capture_output=True, text=True).stdout.strip()
        print(f"import {module} {version}: median {statistics.median(walls):.3f} s (interpreter start included)")
    print(f"{'command':<52} {'median_s':>9} {'min_s':>7}  imports_jax")
    for cmd in COMMANDS:
        walls = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "jaxsim", *cmd], cwd=root, env=env, capture_output=True, check=True)
            walls.append(time.perf_counter() - t0)
        probe = subprocess.run([sys.executable, "-X", "importtime", "-m", "jaxsim", *cmd], cwd=root, env=env,
                               capture_output=True, text=True, check=True)
        jax_loaded = any(line.split("|")[-1].strip() == "jax" for line in probe.stderr.splitlines())
        print(f"{'jaxsim ' + ' '.join(cmd):<52} {statistics.median(walls):>9.3f} {min(walls):>7.3f}  {jax_loaded}")


if __name__ == "__main__":
    main()
