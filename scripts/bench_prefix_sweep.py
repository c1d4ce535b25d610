"""Prefix caching on against off, at 1 and at 256 configurations, in one run (issue 26's target: a replay with prefix
caching on takes <= 1.5x the time of the same replay with it off).

Trace: the first N requests of the bundled `mooncake_conversation_1k` (its own hash_ids, 512 tokens per hash).
Profile: the SYNTHETIC replay-benchmark profile of scripts/bench_replay.py (made-up latencies, declared memory, so its
scheduler envelope can be swept), its decode curves extended to the 32,768-token context; block 16. Configurations:
max_num_seqs x max_num_batched_tokens (16 x 16 = 256).
Each (size, caching) runs in a fresh process through `jaxsim.replay.orchestrate.run_replays`, as `jaxsim replay
--sweep` runs it: once to compile (executable cache on), then again; the second run's replay time is reported, and the
ratio cached / off per size.

    PYTHONPATH=$PWD python scripts/bench_prefix_sweep.py [--requests 200] [--sizes 1,256] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_replay as br  # noqa: E402

BLOCK = 16
# Mooncake contexts reach the profile's 32,768-token context: decode curves out to it (the replay benchmark's stop at 8,192)
br.DECODE_PER_REQ_KV = [*br.DECODE_PER_REQ_KV, 16384, 32768]


def spec(path: Path, pdir: Path, n: int, caching: bool) -> None:
    """``n`` configurations of the synthetic profile (one at max_num_seqs 128 and 8,192 tokens when n is 1)."""
    seqs, toks = br.sweep_axes(n) if n > 1 else ([128], [8192])
    br.sweep_spec(path, pdir, seqs, toks, BLOCK, prefix_caching=caching)


def worker(spec_path: str, requests: int, out: str) -> None:
    """Engine-only measurement in this process: compile run, then the measured run."""
    from jaxsim.devices import enable_compilation_cache, use_all_cpu_cores

    use_all_cpu_cores()
    enable_compilation_cache()
    from jaxsim.cli.cmd_replay import configs_from_sweep
    from jaxsim.replay.orchestrate import run_replays
    from jaxsim.replay.traces import load_trace

    configs = configs_from_sweep(Path(spec_path))
    trace = load_trace("mooncake_conversation_1k", max_requests=requests)
    first: dict = {}
    run_replays(configs, trace, [0], timings=first)
    again: dict = {}
    outs = run_replays(configs, trace, [0], timings=again)
    Path(out).write_text(json.dumps({
        "configs": len(configs), "completed_requests": sum(int(o.summary["completed_requests"] or 0) for o in outs),
        "replays_completed": sum(o.status_text == "completed" for o in outs),
        "hit_tokens": sum(int(o.summary.get("cache_hit_tokens") or 0) for o in outs),
        "compile_s": first.get("compile_s", 0.0), "run_s": again.get("run_s", 0.0), "passes": again.get("passes", 0),
        "loop_steps": again.get("loop_steps", 0),
    }))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--sizes", default="1,256")
    ap.add_argument("--json", default=None)
    ap.add_argument("--_worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._worker:
        worker(args._worker[0], int(args._worker[1]), args._worker[2])
        return
    work = Path(tempfile.mkdtemp(prefix="jaxsim-bench-prefix-"))
    pdir, _ = br.write_profile(work)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")])}
    results = []
    for n in [int(x) for x in args.sizes.split(",")]:
        row = {"configs": n}
        for caching in (True, False):
            s, out = work / f"spec_{n}_{caching}.toml", work / f"out_{n}_{caching}.json"
            spec(s, pdir, n, caching)
            p = subprocess.run([sys.executable, __file__, "--_worker", str(s), str(args.requests), str(out)], env=env,
                               capture_output=True, text=True)
            if p.returncode:
                sys.exit(f"worker failed ({n} configs, caching {caching}):\n{p.stderr[-3000:]}")
            row["on" if caching else "off"] = json.loads(out.read_text())
        row["ratio"] = row["on"]["run_s"] / max(row["off"]["run_s"], 1e-9)
        results.append(row)
        on, off = row["on"], row["off"]
        print(f"{n:4d} configs x {args.requests} requests: replay cached {on['run_s']:.2f} s ({on['passes']:,} passes, "
              f"{on['loop_steps']:,} loop steps, {on['hit_tokens']:,} hit tokens, {on['replays_completed']}/{n} completed) | "
              f"off {off['run_s']:.2f} s ({off['passes']:,} passes, {off['loop_steps']:,} loop steps, "
              f"{off['replays_completed']}/{n} completed) | cached / off {row['ratio']:.2f}x", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
