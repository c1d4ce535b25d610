"""Round-robin against cache-aware (KV) routing on the bundled Mooncake conversation trace: the README's walk-through.

Replays ``mooncake_conversation_1k`` (its own ``hash_ids``, 512 tokens per hash) on the calibrated Qwen3-32B TP2
deployment of ``configs/routing_mooncake.toml`` with 1..``--max-replicas`` replicas, each its own engine and prefix
cache, once per router. Prints, per router: the prefix-cache hit rate, TTFT p50/p99 at 4 replicas, and the fewest
replicas (GPUs = replicas x TP) whose replay meets the TTFT SLA. Every number comes from ``jaxsim.replay`` (the
same code as ``jaxsim replay``); requests the deployment rejects (prompts over max_model_len) are left out of the
latency statistics, as the CLI's summary leaves them out.

    PYTHONPATH=$PWD python scripts/routing_walkthrough.py [--time-scale 0.5] [--sla-ttft-p99-ms 2000]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _config(replicas: int, policy: str):
    from jaxsim.deploy.binding import bind
    from jaxsim.replay.deployment import config_from_binding
    from jaxsim.router import Router
    from jaxsim.rules.config import load_config

    c = config_from_binding(bind(load_config(ROOT / "configs" / "routing_mooncake.toml")), name=f"{policy}x{replicas}")
    return dataclasses.replace(c, aggregated=dataclasses.replace(c.aggregated, replicas=replicas), router=Router(policy))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-scale", type=float, default=1.0, help="multiply arrival times (below 1: more load)")
    ap.add_argument("--max-requests", type=int, default=1000)
    ap.add_argument("--max-replicas", type=int, default=8)
    ap.add_argument("--sla-ttft-p99-ms", type=float, default=2000.0)
    ap.add_argument("--routers", default="round_robin,kv")
    args = ap.parse_args()

    import jaxsim._jax  # noqa: F401  (x64)
    from jaxsim.replay.orchestrate import run_replays
    from jaxsim.replay.traces import load_trace

    trace = load_trace("mooncake_conversation_1k", max_requests=args.max_requests, time_scale=args.time_scale)
    tp = 2  # configs/routing_mooncake.toml: [roles.aggregated] tp = 2
    print(f"mooncake_conversation_1k: {len(trace)} requests over {trace.arrival_ms.max() / 1e3:.0f} s, calibrated Qwen3-32B B300 TP{tp}, "
          f"SLA TTFT p99 <= {args.sla_ttft_p99_ms:,.0f} ms")
    rows, served = {}, {}
    for policy in args.routers.split(","):
        for r in range(1, args.max_replicas + 1):
            t0 = time.perf_counter()
            (o,) = run_replays([_config(r, policy)], trace, [0])
            s = o.summary
            rows[policy, r] = s
            served[policy, r] = s["completed_requests"] + s["rejected_requests"] == len(trace)  # none left unfinished
            print(f"  {policy:>12} x{r}: hit {100 * s['prefix_hit_ratio']:5.1f} %, TTFT p50 {s['p50_ttft_ms']:9,.0f} ms, "
                  f"p99 {s['p99_ttft_ms']:9,.0f} ms, completed {s['completed_requests']:.0f}, {o.status_text}, {time.perf_counter() - t0:.1f} s")
    print()
    print("| router | prefix-cache hit rate (4 replicas) | TTFT p50 / p99 (4 replicas) | fewest replicas meeting the SLA | GPUs |")
    print("|---|---:|---:|---:|---:|")
    for policy in args.routers.split(","):
        s = rows.get((policy, 4))
        ok = [r for r in range(1, args.max_replicas + 1) if rows[policy, r]["p99_ttft_ms"] <= args.sla_ttft_p99_ms and served[policy, r]]
        need = f"{min(ok)}" if ok else f"> {args.max_replicas}"
        gpus = f"{min(ok) * tp}" if ok else "-"
        cells = (f"{100 * s['prefix_hit_ratio']:.1f} %", f"{s['p50_ttft_ms']:,.0f} / {s['p99_ttft_ms']:,.0f} ms") if s else ("-", "-")
        print(f"| {policy} | {cells[0]} | {cells[1]} | {need} | {gpus} |")


if __name__ == "__main__":
    main()
