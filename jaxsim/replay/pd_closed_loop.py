"""A closed loop of benchmark clients over a disaggregated (prefill/decode) deployment: when is each request sent?

``vllm bench serve --max-concurrency C`` against a P/D deployment keeps C requests in flight across the whole
pipeline: a request is sent (to a prefill replica), prefilled, its KV travels to a decode replica, it decodes,
and its completion frees the client that sends the next request. Send times therefore depend on decode
completions, which depend on the prefill pool, which depends on the send times: neither pool can be replayed
alone, one after the other, as an open loop is.

:func:`closed_loop_send_ms` finds the send times by running both pools' engines in the loop
(:class:`~jaxsim.replay.inloop.EngineLoop`) under conservative synchronisation: neither pool runs past the
earliest time at which the other could still hand it work it does not know yet.

* A decode arrival is a prefill completion plus the request's KV transfer (at least ``min_transfer_ms``), so no
  unknown decode arrival can come before ``LP + min_transfer_ms``, where ``LP`` bounds the prefill completions not
  yet known: the decode pool runs its passes that start before that, and a known decode arrival is added to its
  replica (round-robin in decode-arrival order, as the two-stage replay assigns them) only once no unknown one can
  precede it.
* The k-th completion in time order releases the client of row ``k + C`` (rows: requests in arrival order), sent at
  ``max(its arrival, that completion)`` (vLLM's FIFO semaphore, as the aggregated engine's closed loop). A
  completion is used only once no unknown completion can come before it (``LD`` bounds them), and the prefill pool
  runs its passes that start before ``LD`` (no unknown send can reach it earlier); sends go to the prefill replicas
  round-robin in send order.

Each round either pool moves on by at least the shortest KV transfer. The caller replays both stages again with
these send times as arrivals, one after the other (:mod:`jaxsim.replay.orchestrate`), and checks that the
completions of that replay release exactly these sends: a closed loop's send times are the one fixed point of
"send when the previous completions free a client", so a replay that reproduces them is the closed loop's.
"""

from __future__ import annotations

import heapq

import numpy as np

from jaxsim.kernels.pass_floor import shortest_pass_ms
from jaxsim.replay.engine import RUNNING
from jaxsim.replay.inloop import EngineLoop, engine_loop

__all__ = ["closed_loop_send_ms", "released_send_ms", "MAX_STALLED_ROUNDS"]

MAX_STALLED_ROUNDS = 1000
"""Rounds in a row without any pool moving on before the loop gives up (a guard: each round moves one on)."""


def released_send_ms(arrival_ms: np.ndarray, completion_ms: np.ndarray, clients: int) -> np.ndarray:
    """Send times of requests (arrival order) under a closed loop of ``clients``: the first ``clients`` at their
    arrival, then row ``k + clients`` at ``max(its arrival, the k-th completion)`` (completions in time order; NaN:
    never completed, so the rows it would free are never sent: NaN)."""
    arrival = np.asarray(arrival_ms, np.float64)
    n, c = arrival.size, int(clients)
    sent = np.full(n, np.nan)
    sent[:c] = arrival[:c]
    done = np.sort(np.asarray(completion_ms, np.float64)[np.isfinite(completion_ms)])
    k = min(done.size, max(n - c, 0))
    sent[c:c + k] = np.maximum(arrival[c:c + k], done[:k])
    return sent


class _Pool:
    """One pool's engines in the loop and the host's view of them: rows per replica, each row's request, the rows
    whose completion was seen, and a lower bound on the time of any completion not yet seen, per replica: a request
    completes at the end of a pass, and one with ``r`` tokens still to emit needs at least ``ceil(r / per_pass)``
    more passes of at least ``shortest_ms`` each (:func:`~jaxsim.kernels.pass_floor.shortest_pass_ms`)."""

    def __init__(self, engines, shortest_ms: float, per_pass: int):
        self.engines = engines
        self.shortest_ms, self.per_pass = float(shortest_ms), max(int(per_pass), 1)
        self.reps, size = int(engines.reps), int(engines.size)
        self.rows = np.zeros(self.reps, np.int64)
        self.request = np.full((self.reps, size), -1, np.int64)
        self.seen = np.zeros((self.reps, size), bool)
        self.bound = np.full(self.reps, np.inf)  # no work: no completion to come until a request is added
        self.count = 0  # requests added (round-robin position)

    def add(self, q: int, sent_ms: float, prompt_tokens: int, output_tokens: int, materialized: bool) -> None:
        w = self.count % self.reps
        row = int(self.rows[w])
        self.engines.insert(w, row, float(sent_ms), int(prompt_tokens), int(output_tokens), request=int(q), materialized=materialized)
        self.request[w, row] = q
        self.rows[w] += 1
        self.count += 1
        self.bound[w] = min(self.bound[w], float(sent_ms) + self.shortest_ms)  # it completes a pass after it is sent

    @property
    def busy(self) -> bool:
        """Whether a replica has work (running, or a request added since it last ran)."""
        return bool(np.isfinite(self.bound).any())

    def advance(self, stop_ms: float) -> list[tuple[float, int]]:
        """Run every replica's passes that start before ``stop_ms``; the completions seen (time, request)."""
        stop = np.full(self.reps, float(stop_ms))
        view = self.engines.advance(stop)
        out = []
        for w in range(self.reps):
            m = int(self.rows[w])
            new = np.flatnonzero(view.done[w, :m] & ~self.seen[w, :m])
            self.seen[w, new] = True
            out += [(float(view.last_token_ms[w, r]), int(self.request[w, r])) for r in new]
            # a running replica's next pass starts at or after both its clock and the stop, and its next completion
            # comes after the passes its closest request still needs (a request that can never complete, rejected at
            # admission, needs none); a completed or stopped replica has nothing left to complete until a request is added
            left = view.remaining[w, :m][~view.done[w, :m] & (view.remaining[w, :m] > 0)]
            passes = -(-int(left.min()) // self.per_pass) if left.size else 0
            start = max(float(view.now_ms[w]), float(stop_ms))
            self.bound[w] = start + passes * self.shortest_ms if int(view.status[w]) == RUNNING else np.inf
        return out


def closed_loop_send_ms(prefill_stage, decode_stage, clients: int, transfer_ms: np.ndarray, timings: dict | None = None) -> np.ndarray:
    """Send time of each request of ``prefill_stage`` (its columns: requests in arrival order, each a prompt and one
    token) under a closed loop of ``clients`` over the prefill pool and ``decode_stage``'s pool (the same requests with
    their whole output, arriving materialized ``transfer_ms`` after their prefill completes); NaN for a request never
    sent (the completions that would free its client never came: a pool stopped outside measured support)."""
    arrival = np.asarray(prefill_stage.arrival_ms, np.float64)
    prompt = np.asarray(prefill_stage.input_tokens, np.int64)
    output = np.asarray(decode_stage.output_tokens, np.int64)
    transfer = np.asarray(transfer_ms, np.float64)
    n, c = arrival.size, int(clients)
    lead = float(np.min(transfer)) if n else 0.0
    pre = _Pool(engine_loop(prefill_stage, 0, timings), shortest_pass_ms(prefill_stage.pool.table), prefill_stage.nextn + 1)
    dec = _Pool(EngineLoop(decode_stage, 0, timings), shortest_pass_ms(decode_stage.pool.table), decode_stage.nextn + 1)
    sp, sd = pre.shortest_ms, dec.shortest_ms
    sent = np.full(n, np.nan)
    sent[:c] = arrival[:c]
    next_send, released = 0, 0
    arrivals: list = []  # decode arrivals known, not yet added: (time, request)
    done: list = []  # decode completions known, not yet used: (time, request)
    stalled, last = 0, None
    def send_known() -> None:  # sends go out in row order, round-robin
        nonlocal next_send
        while next_send < n and not np.isnan(sent[next_send]):
            pre.add(next_send, float(sent[next_send]), int(prompt[next_send]), 1, materialized=False)
            next_send += 1

    while True:
        send_known()
        first_arrival = arrivals[0][0] if arrivals else np.inf
        first_done = done[0][0] if done else np.inf
        # no prefill completion not yet seen comes before lp (a send it would answer comes at a decode completion,
        # seen or not); no decode completion not yet seen before ld (each takes a pass after its decode arrival)
        lp = min(float(pre.bound.min()), float(dec.bound.min()) + sp, first_arrival + sd + sp, first_done + sp)
        ld = min(float(dec.bound.min()), first_arrival + sd, lp + lead + sd)
        while done and done[0][0] <= ld:  # completions in time order free the next clients
            t, _ = heapq.heappop(done)
            if c + released < n:
                sent[c + released] = max(float(arrival[c + released]), t)
            released += 1
        send_known()
        while arrivals and arrivals[0][0] <= lp + lead:  # decode arrivals no unknown one precedes, in order
            t, q = heapq.heappop(arrivals)
            dec.add(q, float(t), int(prompt[q]), int(output[q]), materialized=True)
        if not np.isfinite(lp) and not np.isfinite(ld) and not arrivals and not done:
            break
        if pre.busy:  # a pool with nothing to run is not called (each call costs a device round trip)
            for t, q in pre.advance(ld):
                heapq.heappush(arrivals, (t + float(transfer[q]), q))
        if dec.busy:
            for t, q in dec.advance(lp + lead):
                heapq.heappush(done, (t, q))
        now = (lp, ld, next_send, released, dec.count)
        stalled = stalled + 1 if now == last else 0
        last = now
        if stalled > MAX_STALLED_ROUNDS:
            raise RuntimeError(f"closed loop over a disaggregated deployment made no progress at {lp:.3f} ms")
    return sent
