"""Where a compiled replay's time goes on XLA:CPU: thunks executed per loop step, and per loop of the compiled program.

XLA:CPU runs a compiled program as a sequence of thunks (one per fused operation, copy, loop or branch); a replay's
loop step executes a few hundred of them, each costing a fraction of a microsecond whatever its work, so the replay's
time follows the number of thunks it executes. This script replays the benchmark of ``scripts/bench_prefix_sweep.py``
(the first N requests of the bundled ``mooncake_conversation_1k``, the SYNTHETIC profile of ``scripts/bench_replay.py``,
one configuration) with prefix caching on or off, in this process, then once more under JAX's profiler, and prints:

* the replay time (best of ``--repeat`` runs), passes and loop steps;
* thunk executions in all and per loop step (the profiler's events; timing under the profiler is inflated);
* the compiled advance program's loops (``while`` and ``cond`` computations, from an HLO dump of a fresh compilation),
  each with the thunks it executed, its iterations and its thunks per iteration: the loops a change should shorten.

    PYTHONPATH=$PWD python scripts/thunk_profile.py [--caching on|off] [--requests 200] [--repeat 9] [--top 15]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def thunk_counts(profile_bytes: bytes) -> Counter:
    """Executions per event name (thunks, and the host-side events around them) of a serialized profile."""
    from jax.profiler import ProfileData

    counts: Counter = Counter()
    for plane in ProfileData.from_serialized_xspace(profile_bytes).planes:
        for line in plane.lines:
            for ev in line.events:
                if not ev.name.startswith("end:"):
                    counts[ev.name] += 1
    return counts


def hlo_loops(text: str) -> tuple[dict[str, str], dict[str, tuple[str, str]], set[str]]:
    """Of an optimized HLO module: each instruction's computation, each called computation's (caller instruction,
    role) and the fused computations (run as one thunk)."""
    owner: dict[str, str] = {}
    parent: dict[str, tuple[str, str]] = {}
    fused: set[str] = set()
    comp = None
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head and not line.startswith(" "):
            comp = head.group(1)
            continue
        inst = re.match(r"^\s+(?:ROOT )?%?([\w.\-]+) = ", line)
        if not (inst and comp):
            continue
        name = inst.group(1)
        owner[name] = comp
        if " fusion(" in line:
            fused.update(re.findall(r"calls=%?([\w.\-]+)", line))
            continue
        for role in ("body", "condition", "to_apply", "calls"):
            for called in re.findall(role + r"=%?([\w.\-]+)", line):
                parent[called] = (name, role)
        branches = re.search(r"branch_computations=\{([^}]*)\}", line)
        if branches:
            for called in branches.group(1).split(","):
                parent[called.strip().lstrip("%")] = (name, "branch")
    return owner, parent, fused


def loop_table(counts: Counter, hlo_text: str, top: int) -> list[str]:
    """Per computation of the program (a loop body, a condition, a branch), the thunks it executed."""
    owner, parent, fused = hlo_loops(hlo_text)
    per: Counter = Counter()
    kinds: dict[str, set] = defaultdict(set)
    for name, n in counts.items():
        comp = owner.get(name)
        if comp is not None and comp not in fused:
            per[comp] += n
            kinds[comp].add(name)

    def path(comp: str) -> str:
        out = []
        while comp in parent:
            inst, role = parent[comp]
            out.append(f"{inst}.{role}")
            comp = owner.get(inst, "")
        return "/".join(reversed(out)) or "(entry)"

    lines = ["| computation (loop nesting) | thunks executed | thunks per iteration | iterations |", "|---|---:|---:|---:|"]
    for comp, n in per.most_common(top):
        width = len(kinds[comp])
        lines.append(f"| {path(comp)} | {n:,} | {width} | {n / max(width, 1):,.0f} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caching", choices=("on", "off"), default="on")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="jaxsim-thunks-"))
    dump = work / "hlo"
    # a fresh executable cache, so that the advance program is compiled (and dumped) in this process
    os.environ["JAXSIM_CACHE_DIR"] = str(work / "cache")
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump} --xla_dump_hlo_as_text".strip()

    import bench_prefix_sweep as bps
    import bench_replay as br
    from jax._src.lib import _profiler

    from jaxsim.cli.cmd_replay import configs_from_sweep
    from jaxsim.devices import enable_compilation_cache, use_all_cpu_cores
    from jaxsim.replay.orchestrate import run_replays
    from jaxsim.replay.traces import load_trace

    use_all_cpu_cores()
    enable_compilation_cache()
    pdir, _ = br.write_profile(work)
    spec = work / "spec.toml"
    bps.spec(spec, pdir, 1, args.caching == "on")
    configs = configs_from_sweep(spec)
    trace = load_trace("mooncake_conversation_1k", max_requests=args.requests)
    run_replays(configs, trace, [0], timings={})  # compile
    best, t = float("inf"), {}
    for _ in range(args.repeat):
        t = {}
        run_replays(configs, trace, [0], timings=t)
        best = min(best, t["run_s"])
    session = _profiler.ProfilerSession()
    run_replays(configs, trace, [0], timings={})
    counts = thunk_counts(session.stop())
    hlo = sorted(dump.glob("*advance*after_optimizations.txt"))
    owner = hlo_loops(hlo[-1].read_text())[0] if hlo else {}
    thunks = sum(n for name, n in counts.items() if name in owner)
    steps = int(t.get("loop_steps", 0))
    print(f"prefix caching {args.caching}, {args.requests} requests, one configuration: replay {best:.3f} s (best of "
          f"{args.repeat}), {t.get('passes', 0):,} passes in {steps:,} loop steps; {thunks:,} thunks executed by the advance "
          f"program, {thunks / max(steps, 1):,.0f} per loop step")
    if hlo:
        print("\n".join(loop_table(counts, hlo[-1].read_text(), args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
