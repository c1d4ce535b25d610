"""Shared helpers for the replay tests: golden cases, golden tables and a plain-Python oracle.

The oracle, :func:`oracle_replay`, is the specification of the replay scheduler: its rules written one
request at a time, with lists and loops (no vectorization); its latencies come from the same compiled
kernels. ``jaxsim/replay/engine.py`` is its vectorized transcription, one phase function per step of a
pass (``schedule_running``: the running-list loop; ``admit``: the waiting-queue loop; ``reserve``: the
speculative reservation loop; ``price``: the prefill and decode lookups; ``emit`` and ``commit``: the
emission loop and the end of the pass), checked against this oracle on random traces
(``tests/test_replay_engine.py``). Read, and change, the rules here first.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np

from jaxsim.acceptance import pad_rates, rates_from_accepted
from jaxsim.kernels.capacity import kv_blocks, kv_tokens
from jaxsim.kernels.rounds import common_tables, compile_round_table, decode_batch, prefill_batch
from jaxsim.profile import load_profile_dir
from jaxsim.replay.engine import make_params
from jaxsim.replay.traces import make_trace

GOLDENS = Path(__file__).parent / "goldens" / "public"
PREFIX_CASES = Path(__file__).parent / "data" / "prefix_cases"
TABLES = ("ar_core", "sd_k2", "sd_k3")
SLOTS = 16
PAD = 16


@functools.lru_cache(maxsize=1)
def replay_golden() -> dict:
    return json.loads((GOLDENS / "replay.json").read_text())


def replay_cases() -> list[dict]:
    return replay_golden()["cases"]


@functools.cache
def golden_table(name: str):
    bundle = load_profile_dir(GOLDENS / "tables" / name)
    dep = bundle.profile.deployments[0]
    ep = dep.execution_profile
    k = ep.num_draft_tokens if ep is not None else 0
    return compile_round_table(bundle.cell(dep), speculative=ep is not None, num_draft_tokens=k)


@functools.lru_cache(maxsize=1)
def padded_tables() -> dict:
    """The golden tables padded to one shape (one compilation serves every case)."""
    return dict(zip(TABLES, common_tables([golden_table(t) for t in TABLES])))


def case_rates(case: dict) -> np.ndarray:
    es = case["engine_settings"]
    k = es["nextn"] or 0
    return pad_rates(rates_from_accepted(es["nextn_accepted"], k)) if k else np.zeros(5)


def case_blocks(case: dict) -> int:
    es = case["engine_settings"]
    return int(kv_blocks(kv_tokens(np.int64(es["kv_cache_bytes"]), np.int64(es["kv_bytes_per_token"])), np.int64(es["block_size"])))


def case_params(case: dict, *, padded: bool = True, **overrides):
    es = case["engine_settings"]
    table = padded_tables()[case["table"]] if padded else golden_table(case["table"])
    kw = dict(
        max_num_batched_tokens=es["max_num_batched_tokens"], max_num_seqs=es["max_num_seqs"],
        block_size=es["block_size"], num_gpu_blocks=case_blocks(case), num_draft_tokens=es["nextn"] or 0,
        accept_rates=case_rates(case), max_model_len=es["context_length"],
    )
    kw.update(overrides)
    return make_params(table, **kw)


def case_trace(case: dict):
    reqs = case["requests"]
    return make_trace(
        case["id"], [r["arrival_time_ms"] for r in reqs], [r["input_length"] for r in reqs],
        [r["output_length"] for r in reqs], rebase=False,
    )


# ----------------------------------------------------------------------------------------------------
# plain-Python oracle (deterministic acceptance: every rate 0 or 1)


def _dur(ms: float) -> float:
    ns = round(ms / 1000.0 * 1e9)
    return (ns // 1_000_000_000 + (ns % 1_000_000_000) / 1e9) * 1000.0


class _Req:
    def __init__(self, i, arrival, prompt, out):
        self.i, self.arrival, self.prompt, self.out = i, arrival, prompt, out
        self.gen = self.computed = self.alloc = 0
        self.first = self.second = self.last = None
        self.preempt = self.admits = self.rounds = 0
        self.recomputing = False  # preempted: recomputing until it emits again
        self.sent = None  # when the client sends it (closed loop: when it holds a semaphore slot)

    @property
    def length(self):
        return self.prompt + self.gen


class _Pool:
    """The reference's vLLM block pool, one block at a time: reference counts, a hash -> block map of
    cached full blocks, and two kinds of free blocks: blocks holding no cached hash (never used, or
    released without one), handed out first, and cached blocks nobody holds, in release order (a
    request releases its blocks tail first, so its prefix is evicted last); handing one of those out
    evicts its hash (least recently released first). vLLM keeps both kinds in one free queue; the
    reference's replay hands out uncached blocks before evicting any (measured: seeds 10 and 67 of
    ``scripts/diff_replay_vs_reference.py --prefix``)."""

    def __init__(self, n):
        self.hash = [None] * n
        self.ref = [0] * n
        self.plain = dict.fromkeys(range(n))  # free blocks holding no cached hash (ordered; any order would do)
        self.queue = {}  # free cached blocks, least recently released first
        self.cached = {}  # block key -> [block ids] (the first serves hits)

    def free_count(self):
        return len(self.plain) + len(self.queue)

    def hits(self, keys, limit):
        """Leading cached blocks of ``keys``, at most ``limit``."""
        out = []
        for k in keys[:limit]:
            if k not in self.cached:
                break
            out.append(self.cached[k][0])
        return out

    def touch(self, blocks):
        for b in blocks:
            if self.ref[b] == 0:
                del self.queue[b]
            self.ref[b] += 1

    def take(self, m):
        out = []
        for _ in range(m):
            if self.plain:
                b = next(iter(self.plain))
                del self.plain[b]
            else:
                b = next(iter(self.queue))
                del self.queue[b]
                h = self.hash[b]
                self.cached[h].remove(b)
                if not self.cached[h]:
                    del self.cached[h]
                self.hash[b] = None
            self.ref[b] = 1
            out.append(b)
        return out

    def release(self, blocks):
        for b in reversed(blocks):  # tail first: the request's prefix is evicted last
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.hash[b] is None:
                    self.plain[b] = None
                else:
                    self.queue[b] = None

    def register(self, blocks, keys, lo, hi):
        for j in range(lo, hi):
            b = blocks[j]
            if self.hash[b] is None:
                self.hash[b] = keys[j]
                self.cached.setdefault(keys[j], []).append(b)


def oracle_replay(table, trace, *, max_num_batched_tokens, max_num_seqs, block_size, num_gpu_blocks,
                  num_draft_tokens, accept_rates, max_model_len, max_passes=100_000, max_concurrency=0,
                  block_keys=None, async_scheduling=False):
    """Replay ``trace`` (sorted by arrival) one request at a time; returns (per-request list, lookups,
    status).

    ``max_concurrency`` C > 0: a closed loop, as ``vllm bench serve --max-concurrency C`` (an
    ``asyncio.Semaphore(C)``, FIFO wake-ups): a request is sent once it has arrived and holds a
    slot; each completion hands its slot to the next request in arrival order. Rejected requests
    hold no slot.

    ``block_keys`` (prefix caching on): per request, the keys of its prompt's full KV blocks
    (:func:`jaxsim.replay.prefix_cache.block_keys`); blocks holding generated tokens are keyed by
    their request (never shared, but a preempted request's recompute reads them back while cached).
    A request admitted with nothing computed first reads its leading cached blocks (at most
    ``(length - 1) // block_size``: one token is always computed); a block is cached once a pass
    allocates it full of known prompt tokens, and stays cached after its holders release it until
    the pool hands it out again (blocks holding no cached hash first, then the least recently
    released cached block).

    ``async_scheduling`` (vLLM's ``--async-scheduling``): while a pass runs, the next one is already scheduled
    (just after the running one started), so while requests are running a pass admits only requests sent before
    the start of the pass before it; with nothing running, those sent by its own start."""
    K, B, S, bs, NB = num_draft_tokens, max_num_batched_tokens, max_num_seqs, block_size, num_gpu_blocks
    rates = np.asarray(accept_rates)[:K]
    assert np.all((rates == 0) | (rates == 1)), "the oracle only replays certain acceptance"
    run_len = int(np.cumprod(rates == 1).sum()) + 1 if K else 1
    blocks = lambda n: -(-n // bs)
    reqs = [_Req(i, float(a), int(p), int(o)) for i, (a, p, o) in enumerate(zip(trace.arrival_ms, trace.input_tokens, trace.output_tokens))]
    pool = _Pool(NB)
    for r in reqs:
        r.blocks, r.keys, r.hit = [], list(block_keys[r.i]) if block_keys is not None else [], 0
        r.first_hit = None
    rejected = {r.i for r in reqs if r.prompt >= max_model_len or blocks(r.prompt) > NB}
    for r in reqs:
        r.out = min(r.out, max_model_len - r.prompt) if r.i not in rejected else r.out
    pending = [r for r in reqs if r.i not in rejected]
    C, clients, completions = max_concurrency, list(pending), 0
    for j, r in enumerate(clients):
        r.sent = r.arrival if (C == 0 or j < C) else None  # the others wait for a slot
    for r in reqs:
        if r.i in rejected:
            r.sent = r.arrival
    waiting, running, lookups = [], [], []
    now, passes, status = 0.0, 0, "completed"
    last_start = -math.inf
    free = pool.free_count

    def keys(r, n):
        """Keys of the request's first ``n`` blocks: its prompt's, then blocks holding generated tokens
        (the request's own: only its recompute can read them)."""
        return r.keys[:n] + [("generated", r.i, j) for j in range(len(r.keys), n)]

    def grow(r, tokens):
        """Blocks for ``tokens`` tokens; full blocks of known tokens among them are cached."""
        r.blocks += pool.take(max(blocks(tokens) - len(r.blocks), 0))
        if block_keys is not None:
            full = min(tokens, r.length) // bs
            pool.register(r.blocks, keys(r, full), 0, full)

    def release(r):
        pool.release(r.blocks)
        r.blocks = []

    def preempt_tail():
        v = running.pop()
        release(v)
        v.computed = 0
        v.preempt += 1
        v.recomputing = True
        waiting.insert(0, v)
        return v

    while pending or waiting or running:
        if passes >= max_passes:
            return reqs, lookups, "pass_limit"
        # the sends the scheduler has seen: async, those before the previous pass's start (it schedules just after)
        seen = math.nextafter(last_start, -math.inf) if (async_scheduling and running) else now
        while pending and pending[0].sent is not None and pending[0].sent <= seen:
            waiting.append(pending.pop(0))
        if not waiting and not running:
            if pending[0].sent is None:
                return reqs, lookups, "stalled"
            now = pending[0].sent
            continue
        budget, sched, preempted = B, {}, False
        idx = 0
        while idx < len(running) and budget > 0:
            r = running[idx]
            # a recompute one token short finishes with that token; a decode stops at the context limit
            decode = r.gen > 0 and r.computed == r.length - 1 and not r.recomputing
            n = min(K + 1, max_model_len - r.length, budget) if decode else min(r.length - r.computed, budget)
            need = max(blocks(r.computed + (1 if decode else n)) - len(r.blocks), 0)
            while need > free() and r in running:
                preempt_tail()
                preempted = True
            if r not in running:
                if idx == 0:  # the head alone cannot fit: it never will
                    return reqs, lookups, "stalled"
                break
            grow(r, r.computed + (1 if decode else n))
            sched[r] = ("d" if decode else "p", n, r.computed)
            budget -= n
            idx += 1
        if not preempted:
            while waiting and len(running) < S:
                r = waiting[0]
                hit = pool.hits(keys(r, (r.length - 1) // bs), (r.length - 1) // bs) if block_keys is not None else []
                cached = len(hit) * bs
                n = min(r.length - cached, budget)
                # the whole known sequence must fit; cached blocks nobody holds are free but get taken
                evictable = sum(pool.ref[b] == 0 for b in hit)
                if blocks(r.length) - len(hit) > free() - evictable or n == 0:
                    break
                waiting.pop(0)
                running.append(r)
                r.admits += 1
                pool.touch(hit)
                r.blocks = list(hit)
                r.hit = max(r.hit, cached)  # the reference's reused_input_tokens: the most of any admission (seed 758)
                if r.first_hit is None:
                    r.first_hit = cached
                r.computed = cached
                grow(r, cached + n)
                sched[r] = ("p", n, cached)
                budget -= n
        pre = [(r, v) for r, v in sched.items() if v[0] == "p"]
        ptoks = [(min(c + n, r.prompt) - min(c, r.prompt), min(c, r.prompt)) for r, (_, n, c) in pre]
        ptoks = [x for x in ptoks if x[0] > 0]
        for r, (_, n, _) in pre:
            r.computed += n

        def ready():
            return [r for r in running if r in sched and (sched[r][0] == "d" or r.computed == r.length)]

        rdy = ready()
        while K and rdy:
            burst = lambda r: min(sched[r][1], r.out - r.gen) if sched[r][0] == "d" else 1  # scheduled tokens
            if sum(blocks(r.length + burst(r)) - blocks(r.length) for r in rdy) <= free():
                break
            sched.pop(preempt_tail(), None)
            if not running:
                return reqs, lookups, "stalled"
            rdy = ready()
        dec = [r for r in rdy if r.gen > 0]
        p_ms = d_ms = 0.0
        if ptoks:
            q = (len(ptoks), sum(x[0] for x in ptoks), sum(x[1] for x in ptoks))
            lat, code = prefill_batch(table, np.array([q[0]]), np.array([q[1]]), np.array([q[2]]))
            lookups.append(("prefill",) + q)
            if int(code[0]) >= 16:
                return reqs, lookups, int(code[0])
            p_ms = _dur(float(lat[0]))
        if dec:
            # shared prefix blocks are counted once per request: the reference caps the total at the pool
            q = (len(dec), min(sum(r.length - 1 for r in dec), NB * bs))
            lat, code = decode_batch(table, np.array([q[0]]), np.array([q[1]]))
            lookups.append(("decode",) + q)
            if int(code[0]) >= 16:
                return reqs, lookups, int(code[0])
            d_ms = _dur(float(lat[0]))
        end = (now + p_ms) + d_ms
        for r in rdy:
            # a decode emits at most the tokens it was scheduled
            b = 1 if (r.gen == 0 or r.computed == r.length) else min(run_len, r.out - r.gen, sched[r][1])
            if r.first is None:
                r.first = end
            elif r.second is None:
                r.second = end
            r.last = end
            r.rounds += r.gen > 0
            r.gen += b
            r.recomputing = False
            r.computed = r.length - 1
            if K:
                r.blocks += pool.take(max(blocks(r.length) - len(r.blocks), 0))
        for r in list(running):
            if r.gen >= r.out:
                running.remove(r)
                release(r)
                if C and completions + C < len(clients):  # its slot goes to the next client waiting
                    nxt = clients[completions + C]
                    nxt.sent = max(nxt.arrival, end)
                completions += 1
        last_start, now, passes = now, end, passes + 1
    return reqs, lookups, status


def pass_lookups(res) -> list:
    """A replay's lookups pass by pass from its timeline, as ``oracle_replay`` lists them: ("prefill", requests,
    tokens, kv) and ("decode", requests, kv)."""
    from jaxsim.replay import metrics

    tl = metrics.timeline_table(res)
    out = []
    for i in range(len(tl["pass"])):
        if tl["prefill_requests"][i]:
            out.append(("prefill", tl["prefill_requests"][i], tl["prefill_tokens"][i], tl["prefill_kv_tokens"][i]))
        if tl["decode_requests"][i]:
            out.append(("decode", tl["decode_requests"][i], tl["decode_kv_tokens"][i]))
    return out


@functools.cache
def prefix_case(name: str):
    """A reference prefix-caching case (tests/data/prefix_cases): its settings ``c``, the reference's records by
    request (0-based), the table, the trace sorted by arrival (``order``: each position's request), its block
    keys and the engine settings ``kw``."""
    from types import SimpleNamespace

    from jaxsim.replay.prefix_cache import block_keys, read_hash_ids

    d = PREFIX_CASES / name
    c = json.loads((d / "case.json").read_text())
    ref = [json.loads(x) for x in (d / "reference_requests.jsonl").read_text().splitlines() if x.strip()]
    ref = {int(r["session_id"].removeprefix("request_")) - 1: r for r in ref}
    bundle = load_profile_dir(d / "profile")
    table = compile_round_table(bundle.cell(bundle.profile.deployments[0]))
    reqs = c["requests"]
    t0 = min(r["timestamp"] for r in reqs)
    order = sorted(range(len(reqs)), key=lambda i: reqs[i]["timestamp"])
    trace = make_trace(name, [reqs[i]["timestamp"] - t0 for i in order], [reqs[i]["input_length"] for i in order],
                       [reqs[i]["output_length"] for i in order], rebase=False)
    hashes = read_hash_ids(d / "trace.jsonl", c["trace_block_size"])
    keys, num_keys = block_keys([hashes[i] for i in order], trace.input_tokens, c["trace_block_size"], c["block_size"])
    kw = dict(max_num_batched_tokens=c["max_num_batched_tokens"], max_num_seqs=c["max_num_seqs"], block_size=c["block_size"],
              num_gpu_blocks=c["blocks"], num_draft_tokens=0, accept_rates=np.zeros(5), max_model_len=c["context"])
    return SimpleNamespace(dir=d, c=c, ref=ref, table=table, trace=trace, order=order, keys=keys, num_keys=num_keys, kw=kw)


def spec_block_keys(hash_ids, input_tokens, trace_block_size: int, block_size: int):
    """The specification of :func:`jaxsim.replay.prefix_cache.block_keys` (a trie of hash-id prefixes in dicts, keys
    numbered as first met): per request its full KV blocks' keys, and how many keys differ."""
    tbs, bs = int(trace_block_size), int(block_size)
    nodes: dict = {}  # (parent trie node, hash id) -> node of that hash-id prefix
    keys: dict = {}  # (block index, trie node of its covering prefix) -> key
    out = []
    for hashes, n in zip(hash_ids, input_tokens):
        full = int(n) // bs
        path, node = [], -1
        for h in list(hashes)[: -(-full * bs // tbs) if full else 0]:
            node = nodes.setdefault((node, int(h)), len(nodes))
            path.append(node)
        out.append(np.array([keys.setdefault((j, path[((j + 1) * bs - 1) // tbs]), len(keys)) for j in range(full)], np.int64))
    return out, len(keys)
