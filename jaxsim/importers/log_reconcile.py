"""An FPM log's identity checked against the log's own passes before anything is written.

A log is the best witness of the run that wrote it: every pass shows how many tokens the scheduler put in it,
how many requests ran, and how much KV they held at once. The files an identity is read from (vLLM metadata,
Dynamo model card) can disagree with each other and with the run, so:

* scheduler envelope: the first recorded envelope (the vLLM metadata's, else the model card's) that the log's
  passes respect (tokens scheduled per pass ≤ max_num_batched_tokens, requests per pass ≤ max_num_seqs) is used,
  and the import says which and why; when options set the envelope, or no recorded one fits, a pass beyond it is
  an error naming the pass;
* KV pool: the KV held in one pass (past KV of its decode requests + their new tokens + the cached prefix and new
  tokens of its prefill requests) never exceeds the pool the run had, so a recorded pool smaller than that is an
  error naming both numbers, or, with ``widen_kv_pool``, widened to the observed maximum and said so.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from jaxsim import systems
from jaxsim.errors import JaxsimError, ProfileError, TableError
from jaxsim.importers.fpm_log import FpmLog, LogIdentity
from jaxsim.profile.model import Deployment
from jaxsim.rules.memory_fit import memory_fit_problems, request_fit_problems

__all__ = ["check_physical", "kv_held_tokens", "pass_envelope", "reconcile_with_log"]


def pass_envelope(log: FpmLog) -> tuple[np.ndarray, np.ndarray]:
    """(tokens scheduled, requests run) per pass: prefill tokens + one token per decode request (a lower bound
    for speculative decoding, whose decodes take K + 1), prefill + decode requests."""
    return log.prefill_tokens + log.num_decode_requests, log.num_prefill_requests + log.num_decode_requests


def kv_held_tokens(log: FpmLog) -> np.ndarray:
    """KV tokens each pass holds at once: decode past KV + the decode requests' new tokens + prefill cached
    prefixes + prefill new tokens."""
    return log.decode_kv_tokens + log.num_decode_requests + log.prefill_kv_tokens + log.prefill_tokens


def _first_beyond(values: np.ndarray, bound: int | None) -> int | None:
    if bound is None:
        return None
    over = np.flatnonzero(values > bound)
    return int(over[np.argmax(values[over])]) if over.size else None


def _envelope(log: FpmLog, ident: LogIdentity) -> LogIdentity:
    tokens, requests = pass_envelope(log)
    where = lambda i: f"counter_id {int(log.counter_id[i])}"  # noqa: E731
    for n, (src, mbt, mns) in enumerate(ident.envelope_sources):
        bad_t, bad_r = _first_beyond(tokens, mbt), _first_beyond(requests, mns)
        if bad_t is None and bad_r is None:
            if mbt is None or mns is None:
                break  # an incomplete envelope: the picks already took each value from the first file that has it
            skipped = "; ".join(f"the {s} says {t} / {r}, beyond passes of this log" for s, t, r in ident.envelope_sources[:n])
            note = (f"scheduler envelope max_num_batched_tokens={mbt}, max_num_seqs={mns} from the {src}"
                    + (f" ({skipped})" if skipped else "") + f"; the log's passes schedule at most {int(tokens.max())} tokens "
                    f"and {int(requests.max())} requests")
            return replace(ident, max_num_tokens=int(mbt), max_batch_size=int(mns), notes=ident.notes + (note,),
                           envelope_sources=ident.envelope_sources[n:])
    bad_t, bad_r = _first_beyond(tokens, ident.max_num_tokens), _first_beyond(requests, ident.max_batch_size)
    if bad_t is not None:
        raise TableError(f"{log.source}: pass {where(bad_t)} schedules {int(tokens[bad_t])} tokens > max_num_batched_tokens "
                         f"{ident.max_num_tokens} ({_said(ident)}); pass --max-num-batched-tokens the run used")
    if bad_r is not None:
        raise TableError(f"{log.source}: pass {where(bad_r)} runs {int(requests[bad_r])} requests > max_num_seqs "
                         f"{ident.max_batch_size} ({_said(ident)}); pass --max-num-seqs the run used")
    return ident


def _said(ident: LogIdentity) -> str:
    if not ident.envelope_sources:
        return "as given"
    return "; ".join(f"the {s} says {t} / {r}" for s, t, r in ident.envelope_sources)


def _pool(log: FpmLog, ident: LogIdentity, widen: bool) -> LogIdentity:
    held = kv_held_tokens(log)
    i = int(np.argmax(held))
    peak, pool = int(held[i]), int(ident.kv_cache_tokens)
    if peak <= pool:
        return replace(ident, notes=ident.notes + (f"KV pool {pool} tokens holds every pass of the log (at most {peak} tokens at once)",))
    what = (f"pass counter_id {int(log.counter_id[i])} holds {peak} KV tokens at once ({int(log.num_decode_requests[i])} decode "
            f"requests with {int(log.decode_kv_tokens[i])} past tokens, {int(log.num_prefill_requests[i])} prefill requests "
            f"with {int(log.prefill_kv_tokens[i])} cached + {int(log.prefill_tokens[i])} new tokens)")
    if not widen:
        raise TableError(f"{log.source}: {what} > the recorded KV pool of {pool} tokens x {ident.kv_bytes_per_token} B/token; "
                         "the log contradicts its pool: pass --kv-cache-tokens, or --widen-kv-pool to widen it to the observed maximum")
    note = f"KV pool widened from the recorded {pool} tokens to {peak}: {what}"
    return replace(ident, kv_cache_tokens=peak, notes=ident.notes + (note,))


def reconcile_with_log(log: FpmLog, ident: LogIdentity, *, widen_kv_pool: bool = False) -> LogIdentity:
    """The identity with the scheduler envelope the log's passes respect and a KV pool that holds them (module
    docstring); TableError naming the pass and the numbers otherwise."""
    return _pool(log, _envelope(log, ident), widen_kv_pool)


def check_physical(dep: Deployment, source: str) -> None:
    """ProfileError (one line, the numbers) when the deployment's KV pool does not fit the system's GPU at the
    recorded gpu_memory_utilization or cannot hold one max_model_len request (:mod:`jaxsim.rules.memory_fit`)."""
    try:
        gpu = systems.gpu_memory_bytes(dep.system)
    except JaxsimError:
        gpu = None
    problems = memory_fit_problems(dep.resources, gpu) + request_fit_problems(dep.resources)
    if problems:
        raise ProfileError(f"{source}: {dep.system} tp={dep.tp}: {problems[0]}")
