"""Cost of replays with the engines in the loop (a router, multi-turn sessions) against an ordinary replay of the
same requests sent at the times the loop decided (the same scheduler passes, one compiled call).

Two cases on the calibrated Qwen3-32B deployment (configs/deployment_calibrated.toml):

* sessions: `jaxsim trace sessions`-style chat sessions on one replica (a turn sent when the previous completes);
* kv: an open loop of `--requests` on 4 replicas routed by Dynamo's KV router.

Each case runs twice in this process (the first compiles or loads its executables); the second run is timed, as is
the ordinary replay of the decided send times (also run twice). Prints passes, host calls and seconds.

  PYTHONPATH=$PWD python scripts/bench_inloop.py [--sessions 60] [--requests 600]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import tomllib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "deployment_calibrated.toml"


def _config(replicas: int, router: str):
    from jaxsim.deploy.binding import bind
    from jaxsim.replay.deployment import config_from_binding
    from jaxsim.router import Router
    from jaxsim.rules.config import config_from_dict

    text = CONFIG.read_text().replace("replicas = 1", f"replicas = {replicas}")
    cfg = config_from_dict(tomllib.loads(text), source=str(CONFIG), base_dir=CONFIG.parent)
    return dataclasses.replace(config_from_binding(bind(cfg), name=f"{replicas}x-{router}"), router=Router(router))


def _ordinary(c, trace, replica, sent_ms, order) -> tuple[float, int]:
    """An ordinary replay of the requests at positions ``order`` sent at ``sent_ms`` on ``replica``: (seconds, passes)."""
    from jaxsim.replay import orchestrate as O
    from jaxsim.replay.traces import Trace

    plain = Trace("sent", sent_ms[order], trace.input_tokens[order], trace.output_tokens[order], np.arange(order.size))
    stage = dataclasses.replace(O._first_stage(c, 0, plain, O._max_passes(trace)), assignment=replica[order])
    for _ in range(2):
        run, tm = O.StageRun(stage), {}
        t0 = time.perf_counter()
        O._run_stages([run], timeline_len=0, chunk=256, timings=tm)
        dt = time.perf_counter() - t0
    return dt, int(tm["passes"])


def sessions_case(n: int) -> None:
    from jaxsim.replay import orchestrate as O
    from jaxsim.replay.session_traces import SessionShape, session_trace
    from jaxsim.replay.sessions import run_sessions

    shape = SessionShape(turns=4, new_input="uniform:200:1500", output="uniform:50:400", think_time_ms=2000.0)
    trace, _ = session_trace(n, 1.0, shape, seed=1)
    c = _config(1, "round_robin")
    stage = O._first_stage(c, 0, trace, O._max_passes(trace))
    for _ in range(2):
        tm = {}
        t0 = time.perf_counter()
        _, _, _, d = run_sessions(stage, trace.sessions, c.router, None, 0, tm)
        dt = time.perf_counter() - t0
    q = np.flatnonzero(d.entered)
    q = q[np.lexsort((d.engine_row[q], d.sent_ms[q]))]
    plain_s, plain_passes = _ordinary(c, trace, d.replica, d.sent_ms, q)
    print(f"sessions: {n} sessions x 4 turns = {len(trace)} requests, one replica: in the loop {dt:.2f} s, {tm['passes']:,} passes; "
          f"ordinary replay of the decided send times {plain_s:.2f} s, {plain_passes:,} passes ({dt / plain_s:.1f}x)")


def kv_case(n: int) -> None:
    from jaxsim.replay import orchestrate as O
    from jaxsim.replay.loads import Lengths, benchmark_trace, parse_load
    from jaxsim.replay.online import run_routed

    trace = benchmark_trace(parse_load(f"poisson:12:{n}"), Lengths(2048, 256, 0.5, "vllm"), seed=0)
    c = _config(4, "kv")
    stage = O._first_stage(c, 0, trace, O._max_passes(trace))
    for _ in range(2):
        tm = {}
        t0 = time.perf_counter()
        routed, results, _, _ = run_routed(stage, c.router, None, 0, tm)
        dt = time.perf_counter() - t0
    cols = O.StageRun(routed, results).columns(len(trace))
    order = np.arange(len(trace))
    plain_s, plain_passes = _ordinary(c, trace, np.asarray(routed.replica), np.asarray(cols["sent_ms"]), order)
    print(f"kv router: {n} requests, 4 replicas: in the loop {dt:.2f} s, {tm['passes']:,} passes; ordinary replay of its decisions "
          f"{plain_s:.2f} s, {plain_passes:,} passes ({dt / plain_s:.1f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=60)
    ap.add_argument("--requests", type=int, default=600)
    args = ap.parse_args()
    import jaxsim._jax  # noqa: F401  (x64)

    sessions_case(args.sessions)
    kv_case(args.requests)


if __name__ == "__main__":
    main()
