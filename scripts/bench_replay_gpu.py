"""Self-contained accelerator benchmark of batched replay: many configurations x one trace in one call.

On the replay benchmark's SYNTHETIC dense profile (made-up smooth latencies, timing only; not a
measurement: scripts/bench_replay.py writes it) and the first R requests of the bundled Azure
conversation excerpt (arrivals x 0.5), replays C configurations (max_num_seqs 16..256 x
max_num_batched_tokens 512..8192, cycled) with one shared table in ONE jitted call
(:func:`jaxsim.replay.engine.replay_stack`), and reports compile time, replay time, completed
request-replays per second, scheduler passes and loop steps (a loop step advances a decode stretch of
up to ``--lookahead`` passes and one pass: jaxsim.replay.stretch). When C configurations do not fit the
device's memory, C is halved until they do (said in the output).

    python scripts/bench_replay_gpu.py                       # 10,000 configs x 1,000 requests
    python scripts/bench_replay_gpu.py --small               # 16 configs x 60 requests (CPU check)
    python scripts/bench_replay_gpu.py --configs 2000 --requests 1000 --lookahead 0

Writes JSON to $OUT/bench_replay_gpu.json when $OUT is set, else prints it to stdout (after the human
lines, on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _table_and_blocks(work: Path):
    """The SYNTHETIC profile's compiled round table and the worker's KV pool (blocks)."""
    import bench_replay as br

    from jaxsim.deploy.binding import bind
    from jaxsim.replay.deployment import config_from_binding
    from jaxsim.rules.config import load_config

    pdir, _ = br.write_profile(work)
    cfg = work / "one.toml"
    br.jaxsim_config(cfg, pdir, 128, 8192, 16)
    c = config_from_binding(bind(load_config(cfg)))
    base = c.aggregated.params(0, None, 10_000_000)
    return base.table, int(base.num_gpu_blocks), int(base.max_model_len)


def _trace(requests: int):
    import bench_replay as br

    from jaxsim.replay.traces import make_trace

    reqs = br.read_requests(br.bundled_trace("azure_conv_1k"), 1000)
    while len(reqs) < requests:  # tiled: each copy after the last arrival (+1 s)
        shift = reqs[-1][0] + 1000.0
        reqs = reqs + [(a + shift, i, o) for a, i, o in reqs[: requests - len(reqs)]]
    reqs = reqs[:requests]
    return make_trace("azure_conv_1k", [a * 0.5 for a, _, _ in reqs], [i for _, i, _ in reqs], [o for _, _, o in reqs])


def _params(table, blocks: int, context: int, n: int):
    """n configurations (the max_num_seqs x max_num_batched_tokens grid, cycled) stacked, sharing ``table``."""
    import dataclasses

    import jax
    import numpy as np

    from jaxsim.replay.engine import make_params

    grid = [(s, t) for s in range(16, 257, 16) for t in range(512, 8193, 512)]
    picked = [grid[i % len(grid)] for i in range(n)]
    ps = [dataclasses.replace(make_params(table, max_num_batched_tokens=t, max_num_seqs=s, block_size=16, num_gpu_blocks=blocks,
                                          max_model_len=context), table=None) for s, t in picked]
    stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *ps)
    return dataclasses.replace(stacked, table=table), max(s for s, _ in picked)


def run(configs: int, requests: int, lookahead: int | None, work: Path) -> dict:
    import jax
    import numpy as np

    from jaxsim._jax import ensure_x64, jit_x64
    from jaxsim.replay.engine import COMPLETED, DONE, replay_stack, slot_bucket

    ensure_x64()
    table, blocks, context = _table_and_blocks(work)
    trace = _trace(requests)
    rq1 = trace.requests(requests)
    fn = jit_x64(replay_stack, static_argnames=("slots", "stochastic", "timeline_len", "shared_table", "lookahead"))
    n = configs
    while True:
        try:
            p, max_seqs = _params(table, blocks, context, n)
            rq = jax.tree.map(lambda a: np.broadcast_to(np.asarray(a), (n,) + np.shape(a)), rq1)
            keys = jax.random.split(jax.random.PRNGKey(0), n)
            statics = dict(slots=slot_bucket(max_seqs), stochastic=False, timeline_len=0, shared_table=True, lookahead=lookahead)
            t0 = time.perf_counter()
            compiled = fn.lower(p, rq, keys, **statics).compile()
            compile_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            res = jax.block_until_ready(compiled(p, rq, keys))
            first_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            res = jax.block_until_ready(compiled(p, rq, keys))
            run_s = time.perf_counter() - t0
            break
        except Exception as e:  # device out of memory: halve the configurations
            if "RESOURCE_EXHAUSTED" not in str(e) and "out of memory" not in str(e).lower() or n <= 1:
                raise
            _log(f"{n} configurations do not fit ({str(e).splitlines()[0][:160]}); trying {n // 2}")
            n //= 2
    res = jax.tree.map(np.asarray, res)
    done = int(np.sum(res.terminal == DONE))
    out = {
        "device": str(jax.devices()[0].device_kind), "platform": jax.devices()[0].platform, "host": platform.node(),
        "configs_requested": configs, "configs": n, "requests_per_config": requests, "lookahead": lookahead,
        "slots": statics["slots"], "compile_s": compile_s, "first_call_s": first_s, "run_s": run_s,
        "completed_request_replays": done, "replays_completed": int(np.sum(res.status == COMPLETED)),
        "request_replays_per_s": done / run_s, "passes_total": int(np.sum(res.num_passes)),
        "loop_steps_total": int(np.sum(res.num_steps)), "loop_iterations": int(np.max(res.num_steps)),
        "passes_max": int(np.max(res.num_passes)),
        "provenance": "SYNTHETIC profile (made-up latencies, timing only) x bundled azure_conv_1k arrivals x0.5",
    }
    out["passes_per_loop_iteration"] = out["passes_max"] / max(out["loop_iterations"], 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=int, default=10_000)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--lookahead", type=int, default=None, help="decode-stretch lookahead (default: the engine's; 0: pass by pass)")
    ap.add_argument("--small", action="store_true", help="16 configurations x 60 requests (a CPU check)")
    args = ap.parse_args()
    if args.small:
        args.configs, args.requests = 16, 60
    with tempfile.TemporaryDirectory(prefix="jaxsim-bench-gpu-") as tmp:
        out = run(args.configs, args.requests, args.lookahead, Path(tmp))
    _log(f"{out['platform']} {out['device']}: {out['configs']} configs x {out['requests_per_config']} requests: compile "
         f"{out['compile_s']:.1f} s, replay {out['run_s']:.2f} s -> {out['request_replays_per_s']:,.0f} request-replays/s; "
         f"{out['loop_iterations']:,} loop iterations for at most {out['passes_max']:,} passes")
    text = json.dumps(out, indent=1)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_replay_gpu.json").write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
