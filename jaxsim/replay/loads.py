"""Benchmark load models: the requests a serving benchmark sends and when, as its client defines them
(docs/benchmark-loads.md cites the code each rule is taken from).

* :class:`LoadModel` says how requests are sent. A **closed loop** (``vllm bench serve --max-concurrency C
  --request-rate inf``, InferenceX's runs): C clients, N prompts, all C sent at t = 0, each next one sent
  when a request completes (the replay engine's ``max_concurrency``). An **open loop** (``--request-rate
  R [--burstiness B]``): gamma inter-arrival times with mean 1/R and shape B (B = 1: Poisson), by vLLM's
  rule (every request waits one sampled interval, the cumulative send times rescaled so the last is N/R)
  or InferenceX's (the first request at 0, no rescaling).
* :class:`Lengths` says how long they are: fixed ISL/OSL, or random with a range ratio r, by vLLM's rule
  (integer-uniform on [⌊L(1−r)⌋, ⌈L(1+r)⌉], mean L) or InferenceX's (U{⌊rL⌋ .. L}, mean ≈ (1+r)L/2).
  Lengths can also come from a trace (its requests in order) or a workload mix (:func:`mix_lengths`).
* :func:`benchmark_trace` draws the requests (seeded, numpy) as a :class:`~jaxsim.replay.traces.Trace`;
  :func:`with_load` gives a deployment the load's per-replica concurrency.

Bad input raises :class:`LoadError` (one line naming the problem).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from jaxsim import limits
from jaxsim.errors import InputError
from jaxsim.fields import is_int, is_number
from jaxsim.replay.deployment import ReplayConfig
from jaxsim.replay.traces import Trace, make_trace

__all__ = [
    "LoadError", "RULES", "KINDS", "PROMPTS_PER_CLIENT", "DEFAULT_OPEN_PROMPTS", "LoadModel", "Lengths", "parse_load",
    "closed_loop", "open_loop", "arrival_times_ms", "length_bounds", "draw_lengths", "check_lengths", "mix_lengths",
    "trace_lengths", "benchmark_trace", "with_load", "Benchmark",
]

RULES = ("vllm", "inferencex")
"""Whose definition a random length or an open-loop arrival follows (vLLM's is the default)."""
KINDS = ("closed", "poisson", "gamma")
PROMPTS_PER_CLIENT = 10
"""A closed loop's default prompts per client (InferenceX: ``--num-prompts $((CONC * 10))``)."""
DEFAULT_OPEN_PROMPTS = 1000
"""An open loop's default number of prompts (``vllm bench serve --num-prompts`` default)."""


class LoadError(InputError):
    """A benchmark load model is incomplete or out of range (one line naming the problem)."""


def _positive_int(v, what: str) -> int:
    if not (is_int(v) or isinstance(v, np.integer)) or int(v) < 1:
        raise LoadError(f"{what}={v!r} must be an integer >= 1")
    return int(v)


@dataclass(frozen=True)
class LoadModel:
    """How a benchmark client sends its requests.

    ``kind``: ``closed`` (``max_concurrency`` clients, every request available at t = 0) or an open loop,
    ``poisson`` / ``gamma`` (``request_rate`` requests/s, ``burstiness`` the gamma shape; poisson: 1),
    with at most ``max_concurrency`` in flight when it is > 0 (vLLM's semaphore; 0: unbounded).
    ``num_prompts``: requests sent in all. ``arrival_rule``: whose open-loop arrivals (:data:`RULES`).
    """

    kind: str
    num_prompts: int
    max_concurrency: int = 0
    request_rate: float = math.inf
    burstiness: float = 1.0
    arrival_rule: str = "vllm"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise LoadError(f"load kind {self.kind!r}: one of {', '.join(KINDS)}")
        _positive_int(self.num_prompts, "num_prompts")
        limits.check("requests", self.num_prompts, "num_prompts", LoadError)
        if self.arrival_rule not in RULES:
            raise LoadError(f"arrival rule {self.arrival_rule!r}: one of {', '.join(RULES)}")
        if self.kind == "closed":
            if isinstance(self.max_concurrency, bool) or not isinstance(self.max_concurrency, (int, np.integer)) \
                    or self.max_concurrency < 1:
                raise LoadError(f"a closed loop needs its concurrency: max_concurrency={self.max_concurrency!r} must be an integer >= 1")
            limits.check("max_num_seqs", self.max_concurrency, "max_concurrency", LoadError)
            if not math.isinf(self.request_rate):
                raise LoadError("a closed loop sends every request at once: give no request_rate")
            return
        if not (isinstance(self.request_rate, (int, float)) and math.isfinite(self.request_rate) and self.request_rate > 0):
            raise LoadError(f"an open loop needs its rate: request_rate={self.request_rate!r} must be a positive finite number (requests/s)")
        if not (isinstance(self.burstiness, (int, float)) and self.burstiness > 0 and not math.isnan(self.burstiness)):
            raise LoadError(f"burstiness={self.burstiness!r} must be a positive number (1: Poisson; inf: constant intervals)")
        if self.kind == "poisson" and self.burstiness != 1.0:
            raise LoadError(f"a poisson load has burstiness 1 (got {self.burstiness!r}); use gamma:RATE:N:BURSTINESS")
        if isinstance(self.max_concurrency, bool) or not isinstance(self.max_concurrency, (int, np.integer)) or self.max_concurrency < 0:
            raise LoadError(f"max_concurrency={self.max_concurrency!r} must be an integer >= 0 (0: no cap)")

    @property
    def closed(self) -> bool:
        return self.kind == "closed"

    def describe(self) -> str:
        if self.closed:
            return f"closed loop: {self.max_concurrency} clients, {self.num_prompts} prompts"
        shape = "" if self.kind == "poisson" else f", burstiness {self.burstiness:g}"
        cap = f", at most {self.max_concurrency} in flight" if self.max_concurrency else ""
        return f"open loop: {self.kind} at {self.request_rate:g} req/s{shape}, {self.num_prompts} prompts ({self.arrival_rule} rule){cap}"


def closed_loop(max_concurrency: int, num_prompts: int | None = None) -> LoadModel:
    """C clients and N prompts (default N = :data:`PROMPTS_PER_CLIENT` × C)."""
    c = _positive_int(max_concurrency, "max_concurrency")
    return LoadModel("closed", PROMPTS_PER_CLIENT * c if num_prompts is None else num_prompts, max_concurrency=c)


def open_loop(request_rate: float, num_prompts: int | None = None, burstiness: float = 1.0, *, rule: str = "vllm",
              max_concurrency: int = 0) -> LoadModel:
    """Gamma arrivals at ``request_rate`` req/s (``burstiness`` 1: poisson); N default :data:`DEFAULT_OPEN_PROMPTS`."""
    kind = "poisson" if burstiness == 1.0 else "gamma"
    return LoadModel(kind, DEFAULT_OPEN_PROMPTS if num_prompts is None else num_prompts, max_concurrency=max_concurrency,
                     request_rate=request_rate, burstiness=burstiness, arrival_rule=rule)


def _number(text: str, what: str, spec: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise LoadError(f"--load {spec!r}: {what} {text!r} is not a number") from None


def _count(text: str, what: str, spec: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise LoadError(f"--load {spec!r}: {what} {text!r} is not an integer") from None


def parse_load(spec: str, *, arrival_rule: str = "vllm") -> LoadModel:
    """``closed:C[:N]``, ``poisson:RATE[:N]`` or ``gamma:RATE:N:BURSTINESS`` (rate in requests/s)."""
    parts = [p.strip() for p in str(spec).split(":")]
    kind, args = parts[0], parts[1:]
    if kind not in KINDS:
        raise LoadError(f"--load {spec!r}: start with closed:C[:N], poisson:RATE[:N] or gamma:RATE:N:BURSTINESS")
    if kind == "closed":
        if not args or not args[0] or len(args) > 2:
            raise LoadError(f"--load {spec!r}: a closed loop needs its concurrency: closed:C[:N]")
        return closed_loop(_count(args[0], "concurrency", spec), _count(args[1], "N", spec) if len(args) > 1 else None)
    if not args or not args[0]:
        raise LoadError(f"--load {spec!r}: an open loop needs its rate: {kind}:RATE" + ("[:N]" if kind == "poisson" else ":N:BURSTINESS"))
    if (kind == "poisson" and len(args) > 2) or (kind == "gamma" and len(args) != 3):
        raise LoadError(f"--load {spec!r}: expected " + ("poisson:RATE[:N]" if kind == "poisson" else "gamma:RATE:N:BURSTINESS"))
    rate = _number(args[0], "rate", spec)
    n = _count(args[1], "N", spec) if len(args) > 1 else None
    burstiness = _number(args[2], "burstiness", spec) if kind == "gamma" else 1.0
    if kind == "gamma" and burstiness == 1.0:
        return LoadModel("gamma", DEFAULT_OPEN_PROMPTS if n is None else n, request_rate=rate, burstiness=1.0, arrival_rule=arrival_rule)
    return open_loop(rate, n, burstiness, rule=arrival_rule)


def arrival_times_ms(load: LoadModel, seed: int = 0) -> np.ndarray:
    """When each request becomes available to the client (ms from the benchmark's start).

    Closed loop: all at 0. Open loop, vLLM's rule (``get_request`` in ``vllm/benchmarks/serve.py``):
    N intervals ``gamma(shape=B, scale=1/(R·B))`` drawn from ``np.random.seed(seed)``'s stream, cumulated
    (the first request too waits one), rescaled so the last send is exactly N/R; B = inf gives constant
    intervals 1/R. InferenceX's rule (``get_request`` in its ``benchmark_serving.py``, vLLM's older one):
    the first request at 0, then one gamma interval before each next, no rescaling.
    """
    n = load.num_prompts
    if load.closed:
        return np.zeros(n)
    rate, b = float(load.request_rate), float(load.burstiness)
    rng = np.random.RandomState(int(seed))  # the legacy global stream both clients draw from
    if math.isinf(b):
        gaps = np.full(n, 1.0 / rate)
    else:
        gaps = rng.gamma(shape=b, scale=1.0 / (rate * b), size=n)
    if load.arrival_rule == "inferencex":
        return np.concatenate([[0.0], np.cumsum(gaps[: n - 1])]) * 1000.0
    delays = np.cumsum(gaps)
    if delays[-1] != 0:
        delays = delays * ((n / rate) / delays[-1])
    return delays * 1000.0


def length_bounds(isl, osl, range_ratio: float, rule: str = "vllm") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Inclusive (input low, input high, output low, output high) around nominal lengths (arrays or ints).

    vLLM (``RandomDataset.get_sampling_params``): input [⌊L(1−r)⌋, ⌈L(1+r)⌉] (jaxsim counts no special
    tokens: vLLM first subtracts the tokenizer's), output the same with both ends at least 1.
    InferenceX (``sample_random_requests``): [int(L·r), L]; jaxsim raises a 0 low end to 1 (the engine
    serves no empty request; InferenceX's range ratio 0 draws U{0 .. L}).
    """
    isl, osl, r = np.asarray(isl, np.int64), np.asarray(osl, np.int64), float(range_ratio)
    if rule == "inferencex":
        out = (np.maximum(np.floor(isl * r), 1), isl, np.maximum(np.floor(osl * r), 1), osl)
    else:
        out = (np.floor(isl * (1 - r)), np.ceil(isl * (1 + r)), np.maximum(np.floor(osl * (1 - r)), 1), np.maximum(np.ceil(osl * (1 + r)), 1))
    return tuple(np.asarray(x).astype(np.int64) for x in out)


def draw_lengths(isl, osl, range_ratio: float = 0.0, rule: str = "vllm", seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each request's (input, output) lengths drawn around its nominal ones (arrays of N), integer-uniform
    on :func:`length_bounds`, inputs first, then outputs: vLLM ``np.random.default_rng(seed).integers(lo,
    hi + 1)``; InferenceX ``np.random.seed(seed); np.random.randint(lo, hi + 1)``. With one nominal pair
    these are the clients' own draws."""
    ilo, ihi, olo, ohi = length_bounds(isl, osl, range_ratio, rule)
    if rule == "inferencex":
        rs = np.random.RandomState(int(seed))
        return rs.randint(ilo, ihi + 1).astype(np.int64), rs.randint(olo, ohi + 1).astype(np.int64)
    rng = np.random.default_rng(int(seed))
    inp = rng.integers(ilo, ihi + 1)
    return inp.astype(np.int64), rng.integers(olo, ohi + 1).astype(np.int64)


def check_lengths(isl, osl, range_ratio, rule: str, where: str = "lengths") -> None:
    """One line naming the problem when a range ratio or rule is out of range, or draws an empty prompt."""
    r = range_ratio
    if not is_number(r) or not (0.0 <= r < 1.0):
        raise LoadError(f"{where}: range_ratio={r!r} must be in [0, 1)")
    if rule not in RULES:
        raise LoadError(f"{where}: length rule {rule!r}: one of {', '.join(RULES)}")
    ilo = length_bounds(isl, osl, r, rule)[0]
    if (ilo < 1).any():
        bad = int(np.asarray(isl).ravel()[np.argmax(np.asarray(ilo).ravel() < 1)])
        raise LoadError(f"{where}: isl={bad} with range_ratio={r:g} can draw an empty prompt")


@dataclass(frozen=True)
class Lengths:
    """Nominal ISL/OSL and how each request's lengths are drawn around them (``range_ratio`` r in [0, 1):
    :func:`length_bounds`; r = 0 with vLLM's rule: fixed)."""

    isl: int
    osl: int
    range_ratio: float = 0.0
    rule: str = "vllm"

    def __post_init__(self):
        hi = limits.LIMITS["tokens"].hi
        for what, v in (("isl", self.isl), ("osl", self.osl)):
            _positive_int(v, what)
            if v > hi:
                raise LoadError(f"{what}={v} exceeds {int(hi):,} tokens (docs/limits.md)")
        check_lengths(self.isl, self.osl, self.range_ratio, self.rule)

    def bounds(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """Inclusive (low, high) of the input and of the output lengths."""
        ilo, ihi, olo, ohi = (int(x) for x in length_bounds(self.isl, self.osl, self.range_ratio, self.rule))
        return (ilo, ihi), (olo, ohi)

    def draw(self, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (input, output) lengths (:func:`draw_lengths`)."""
        return draw_lengths(np.full(n, self.isl), np.full(n, self.osl), self.range_ratio, self.rule, seed)

    def describe(self) -> str:
        if self.range_ratio == 0 and self.rule == "vllm":
            return f"ISL {self.isl} / OSL {self.osl}"
        (ilo, ihi), (olo, ohi) = self.bounds()
        return f"ISL U{{{ilo}..{ihi}}} / OSL U{{{olo}..{ohi}}} ({self.rule} range ratio {self.range_ratio:g})"


def trace_lengths(trace: Trace, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The (input, output) lengths of a trace's first ``n`` requests in arrival order (repeated from the
    first when the trace is shorter)."""
    idx = np.arange(n) % len(trace)
    return trace.input_tokens[idx].astype(np.int64), trace.output_tokens[idx].astype(np.int64)


def mix_lengths(isl, osl, weight, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` requests from a workload mix of classes (ISL, OSL, weight): each class's count by its weight
    (largest remainders, so a 10 % class gets 10 % of the requests exactly when it can), in an order
    shuffled by ``np.random.default_rng(seed)``."""
    isl, osl = np.asarray(isl, np.int64).ravel(), np.asarray(osl, np.int64).ravel()
    w = np.maximum(np.asarray(weight, np.float64).ravel(), 0.0)
    share = n * w / w.sum()
    count = np.floor(share).astype(np.int64)
    rest = n - int(count.sum())
    if rest:
        count[np.argsort(-(share - count), kind="stable")[:rest]] += 1
    cls = np.repeat(np.arange(isl.size), count)
    if np.count_nonzero(count) > 1:
        cls = np.random.default_rng(int(seed)).permutation(cls)
    return isl[cls], osl[cls]


def benchmark_trace(load: LoadModel, lengths: Lengths | Trace | tuple, *, seed: int = 0, name: str | None = None) -> Trace:
    """The requests of one benchmark run: the load's send-availability times and lengths from ``lengths``
    (a :class:`Lengths`, a trace's requests in order, or ``(input, output)`` arrays of N each). Not rebased:
    t = 0 is the benchmark's start (vLLM's first open-loop request arrives one interval after it)."""
    n = load.num_prompts
    if isinstance(lengths, Lengths):
        inp, out = lengths.draw(n, seed)
        what = lengths.describe()
    elif isinstance(lengths, Trace):
        inp, out = trace_lengths(lengths, n)
        what = f"lengths of {lengths.name}"
    else:
        inp, out = (np.asarray(x, np.int64) for x in lengths)
        if inp.shape != (n,) or out.shape != (n,):
            raise LoadError(f"{n} prompts but {inp.size} input and {out.size} output lengths")
        what = "given lengths"
    label = name or ("closed" if load.closed else load.kind)
    return make_trace(label, arrival_times_ms(load, seed), inp, out, source=f"{load.describe()}; {what}; seed {seed}",
                      rebase=False)


def with_load(config: ReplayConfig, load: LoadModel) -> ReplayConfig:
    """``config`` with the load's clients spread over its replicas: ``max_concurrency`` per replica =
    C / replicas (requests are routed round-robin, so each replica sees a closed loop of C / replicas
    clients). C must be a multiple of the replicas; an uncapped open loop leaves the config as it is. A
    disaggregated deployment keeps all C clients: one closed loop over the whole pipeline (a request holds its
    client from its send to its last token, :mod:`jaxsim.replay.pd_closed_loop`)."""
    if not load.max_concurrency:
        return config
    if config.mode != "aggregated":
        return dataclasses.replace(config, max_concurrency=load.max_concurrency)
    reps = config.pools[0].replicas
    if load.max_concurrency % reps:
        raise LoadError(f"{config.name}: {load.max_concurrency} clients do not split evenly over {reps} replicas; "
                        f"give a multiple of {reps}")
    return dataclasses.replace(config, max_concurrency=load.max_concurrency // reps)


@dataclass(frozen=True)
class Benchmark:
    """The benchmark a sweep point is replayed under (a sweep spec's ``[benchmark]``): for a point at
    concurrency C per worker, :meth:`load_model` gives a closed loop of C clients and
    ``prompts_per_client`` × C prompts (InferenceX's protocol: ``--max-concurrency C --num-prompts
    10C --request-rate inf``), or an open loop at ``request_rate`` req/s with at most C in flight
    (``vllm bench serve --request-rate R --max-concurrency C``); lengths around each workload class's
    ISL/OSL by ``range_ratio`` and ``length_rule``; every draw seeded by ``seed``."""

    load: str = "closed"
    prompts_per_client: int = PROMPTS_PER_CLIENT
    num_prompts: int | None = None  # per serving unit; None: prompts_per_client x C (closed), DEFAULT_OPEN_PROMPTS (open)
    request_rate: float | None = None  # requests/s per serving unit (open loops)
    burstiness: float = 1.0
    range_ratio: float = 0.0
    length_rule: str = "vllm"
    arrival_rule: str = "vllm"
    seed: int = 0

    def __post_init__(self):
        if self.load not in KINDS:
            raise LoadError(f"load {self.load!r}: one of {', '.join(KINDS)}")
        _positive_int(self.prompts_per_client, "prompts_per_client")
        if self.num_prompts is not None:
            _positive_int(self.num_prompts, "num_prompts")
        if self.load == "closed" and self.request_rate is not None:
            raise LoadError("a closed loop sends every request at once: give no request_rate (or load = \"poisson\")")
        if self.load != "closed" and self.request_rate is None:
            raise LoadError(f"an open loop ({self.load}) needs its rate: request_rate (requests/s per serving unit)")
        check_lengths(1024, 128, self.range_ratio, self.length_rule)
        self.load_model(1)  # the load's own checks (rate, burstiness, arrival rule)

    @property
    def closed(self) -> bool:
        return self.load == "closed"

    def load_model(self, concurrency: int, units: int = 1) -> LoadModel:
        """The load of a point at ``concurrency`` per worker, over ``units`` serving units (each with one
        worker): C·units clients (a cap on the open loop) and N·units prompts, rate·units."""
        c, u = _positive_int(concurrency, "concurrency"), _positive_int(units, "units")
        if self.closed:
            n = self.num_prompts if self.num_prompts is not None else self.prompts_per_client * c
            return LoadModel("closed", n * u, max_concurrency=c * u)
        n = self.num_prompts if self.num_prompts is not None else DEFAULT_OPEN_PROMPTS
        return LoadModel(self.load, n * u, max_concurrency=c * u, request_rate=float(self.request_rate) * u,
                         burstiness=self.burstiness, arrival_rule=self.arrival_rule)

    def describe(self) -> str:
        lengths = "" if self.range_ratio == 0 and self.length_rule == "vllm" else \
            f"; lengths {self.length_rule} range ratio {self.range_ratio:g}"
        if self.closed:
            n = f"{self.num_prompts} prompts" if self.num_prompts is not None else f"{self.prompts_per_client} x C prompts"
            return f"closed loop of C clients per worker, {n}, all C sent at t = 0{lengths}"
        return (f"open loop ({self.load}, {self.arrival_rule} rule) at {self.request_rate:g} req/s per serving unit, "
                f"at most C in flight per worker{lengths}")
