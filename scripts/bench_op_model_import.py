"""Wall time of `jaxsim import op-model` per cell at max_num_seqs <= 256 (issue #23's target: <= 10 s per cell on 2 cores).

Imports a fixed set of the silicon sample's heaviest cells (large MoE models, long contexts, the widest envelopes the
coverage script uses at <= 256 sequences) one after another, in-process through the CLI (writing included), and
prints each cell's wall time, the op model's share (pricing) and its query count, then the median and max. Run it
on an otherwise idle machine; the numbers are wall times, so other jobs on the same cores inflate them.

  PYTHONPATH=$PWD python scripts/bench_op_model_import.py [--work /tmp/bench-opm] [--cells N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

CELLS = [
    ("MiniMaxAI/MiniMax-M2.5", "b300_sxm", ["--tp", "2", "--max-num-seqs", "256", "--max-model-len", "9216"]),
    ("MiniMaxAI/MiniMax-M2.5", "b200_sxm", ["--layout", "tp2:ep2", "--max-num-seqs", "256", "--max-model-len", "2048"]),
    ("MiniMaxAI/MiniMax-M2.5", "b200_sxm", ["--layout", "tp2:dp2:ep4", "--max-num-seqs", "256", "--max-model-len", "2048"]),
    ("openai/gpt-oss-120b", "h100_sxm", ["--tp", "4", "--max-num-seqs", "256", "--max-model-len", "9216"]),
    ("moonshotai/Kimi-K2.5", "h200_sxm", ["--tp", "8", "--max-num-seqs", "256", "--max-model-len", "9216"]),
    ("meta-llama/Meta-Llama-3.1-70B", "b200_sxm", ["--tp", "1", "--max-num-seqs", "64", "--max-model-len", "9216",
                                                  "--gemm-quant-mode", "fp8"]),
    ("Qwen/Qwen3-32B", "h100_sxm", ["--tp", "2", "--max-num-seqs", "128", "--max-model-len", "5120"]),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=None, help="where the profiles go (default: a temporary folder)")
    ap.add_argument("--cells", type=int, default=len(CELLS), help="only the first N cells")
    args = ap.parse_args()
    from typer.testing import CliRunner

    from jaxsim.cli.main import app

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-opm-"))
    work.mkdir(parents=True, exist_ok=True)
    walls = []
    for i, (model, system, extra) in enumerate(CELLS[: args.cells]):
        out = work / f"cell{i}"
        t0 = time.perf_counter()
        r = CliRunner().invoke(app, ["import", "op-model", model, "--system", system, "--output", str(out), "--force", "--json", *extra])
        wall = time.perf_counter() - t0
        if r.exit_code != 0:
            print(f"{model} {system} {' '.join(extra)}: refused: {r.output.strip()}")
            continue
        s = json.loads(r.output[r.output.index("{"):])
        cells = s["cells"]
        walls.append(wall)
        print(f"{wall:6.2f} s wall  {sum(c['seconds'] for c in cells):6.2f} s pricing  {sum(c['queries'] for c in cells):7d} queries  "
              f"{model} {system} {' '.join(extra)}", flush=True)
    if walls:
        print(f"{len(walls)} cells: median {statistics.median(walls):.2f} s, max {max(walls):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
