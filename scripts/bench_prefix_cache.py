"""Prefix-caching engine vs the plain engine on one replay: µs per scheduler pass (plain: pass by pass, lookahead 0,
and with its default decode stretches). Synthetic shared-prefix trace (8 prefixes, SYNTHETIC golden ar_core table).

    PYTHONPATH=$PWD python scripts/bench_prefix_cache.py REQUESTS POOL_BLOCKS    # e.g. 100 400, 100 100000
    (env SEQS, MML, MBT: max_num_seqs, max_model_len, max_num_batched_tokens)
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import jax  # noqa: E402
import numpy as np  # noqa: E402
from replay_support import golden_table  # noqa: E402

from jaxsim.replay import cache_engine as ce  # noqa: E402
from jaxsim.replay.engine import make_params, replay_jit  # noqa: E402
from jaxsim.replay.prefix_cache import block_keys  # noqa: E402
from jaxsim.replay.traces import make_trace  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
g = np.random.default_rng(0)
tbs, bs = 16, 16
hashes, prompts = [], []
for i in range(n):
    p = int(g.integers(0, 8))
    ids = [p * 100 + j for j in range(int(g.integers(2, 12)))] + [10**6 + i * 10 + j for j in range(int(g.integers(1, 6)))]
    hashes.append(ids); prompts.append(len(ids) * tbs + int(g.integers(1, tbs)))
outs = g.integers(4, 60, n)
trace = make_trace("t", np.sort(g.uniform(0, 20 * n, n)), prompts, outs, rebase=False)
table = golden_table("ar_core")
blocks = int(sys.argv[2]) if len(sys.argv) > 2 else 400
kw = dict(max_num_batched_tokens=int(os.environ.get("MBT", 512)), max_num_seqs=int(os.environ.get("SEQS", 8)), block_size=bs,
          num_gpu_blocks=blocks, num_draft_tokens=0, accept_rates=np.zeros(5), max_model_len=int(os.environ.get("MML", 4096)))
params = make_params(table, **kw)
keys, nk = block_keys(hashes, trace.input_tokens, tbs, bs)
rq = trace.requests(1 << (n - 1).bit_length())
pk, cap = ce.prompt_keys(keys, nk, rq.arrival_ms.shape[0])
settings = ("max_num_seqs", "block_size", "num_gpu_blocks", "max_model_len")
shapes = ce.shapes_for(trace.input_tokens, trace.output_tokens, num_keys=cap, **{k: kw[k] for k in settings})

def best(f, reps=3):
    f(); ts = []
    for _ in range(reps):
        t = time.perf_counter(); out = f(); jax.block_until_ready(out); ts.append(time.perf_counter() - t)
    return min(ts), out

tc, oc = best(lambda: ce.cached_replay_jit(params, rq, pk, shapes))
key = jax.random.key(0)
t0, o0 = best(lambda: replay_jit(params, rq, key, slots=shapes.slots, stochastic=False, lookahead=0))
td, od = best(lambda: replay_jit(params, rq, key, slots=shapes.slots, stochastic=False))
pc, p0 = int(oc.result.num_passes), int(o0.num_passes)
print(f"status cached={int(oc.result.status)} plain={int(o0.status)} passes cached={pc} plain={p0} hits={int(np.sum(oc.hit_tokens))}")
print(f"cached {tc*1e3:.1f} ms ({tc/pc*1e6:.1f} us/pass)  plain-by-pass {t0*1e3:.1f} ms ({t0/p0*1e6:.1f} us/pass)  "
      f"plain-default {td*1e3:.1f} ms  ratio cached/plain-by-pass {tc/pc/(t0/p0):.2f}")
