"""Sweep specs (TOML) and their lazy expansion.

A spec names axes: profiles and their tensor-parallel layouts, serving modes (aggregated, or
disaggregated x prefill : y decode workers), nextn with acceptance, scheduler settings, target
concurrency and workloads, plus an SLA and a GPU budget (format: ``docs/sweep.md``,
example: ``configs/quickstart.toml``).

:func:`plan_sweep` validates every distinct *binding* (profile deployment × mode × nextn × acceptance ×
scheduler envelope) once, in plain Python: :func:`binding_grid` lists each profile axis's points (a
:class:`BindingKey` each; ``itertools.product`` over the spec's axes), :func:`deployment_config` builds each
point's :class:`~jaxsim.rules.config.DeploymentConfig` directly and :func:`bind_key` checks and binds it
(:func:`jaxsim.rules.config.check_config`, :func:`jaxsim.rules.validate.validate_config`,
:func:`jaxsim.deploy.binding.bind`). Invalid bindings are counted with their reasons. The valid ones are typed
columns (:class:`Bindings`) and form the outer digit of a mixed-radix index (binding, concurrency,
workload); :meth:`SweepPlan.inputs` decodes a range of config indices into arrays without creating a
Python object per config.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
import tomllib
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Float64, Int64

from jaxsim import acceptance as acc
from jaxsim import schema as sc
from jaxsim._jax import ensure_x64
from jaxsim.cost import DEFAULT_BASIS, PRICE_BASES, Prices, check_price
from jaxsim.deploy.binding import Binding, bind
from jaxsim.errors import BindingError, InputError, JaxsimError, QueryError
from jaxsim.fields import is_int, is_number
from jaxsim.kernels.buckets import pow2_bucket
from jaxsim.kernels.rounds import RoundTable
from jaxsim.overhead import OverheadError, ServingOverhead, read_overhead
from jaxsim.profile.model import DATA_SOURCES, ModelProfile
from jaxsim.profile.resolve import load_bundle, resolve_profile_dir
from jaxsim.replay.loads import KINDS, RULES, Benchmark, LoadError, length_bounds
from jaxsim.rules.config import DeploymentConfig, RoleConfig, check_config
from jaxsim.rules.validate import validate_config
from jaxsim.sla import SLA, canonical_keys
from jaxsim.sweep import evaluate as ev

__all__ = [
    "MODES", "EVALUATE", "RECORDED", "PROFILE_NEXTN", "DEFAULT_BLOCK_SIZE", "MAX_WORKLOAD_CLASSES", "SpecError", "ProfileAxis",
    "Acceptance", "Workload", "SweepSpec", "Invalid", "BindingKey", "Bindings", "TableGroup", "SweepPlan", "spec_from_dict",
    "load_spec", "binding_grid", "deployment_config", "bind_key", "plan_sweep", "trace_classes",
]

MODES = ("aggregated", "disaggregated")
EVALUATE = ("steady", "replay", "auto")
"""How a sweep evaluates its points: the analytic steady state (the fast screen), a batched replay of each point's
benchmark load (``[benchmark]``), or ``auto``: the steady state, and a replay for the points it flags ``kv_preemption``
(requests in flight that outgrow the KV pool at their peak, where vLLM preempts and the steady state does not model it)."""
RECORDED = "recorded"
PROFILE_NEXTN = "profile"
DEFAULT_BLOCK_SIZE = 16
MAX_WORKLOAD_CLASSES = 64


class SpecError(BindingError):
    """A sweep spec is malformed (one line naming the file and the key)."""


# ----------------------------------------------------------------------------------------------------
# spec model


@dataclass(frozen=True)
class ProfileAxis:
    """One ``[[profile]]`` entry: a bundled profile name or a directory, and its parallel layouts: the TP
    sizes and MoE layouts (``moe_tp``, ``moe_ep``) to bind; None = every value the profile's deployments
    record (an imported MoE profile sweeps its recorded layouts with no extra keys)."""

    ref: str
    tp: tuple[int, ...] | None = None
    label: str = ""
    moe_tp: tuple[int, ...] | None = None
    moe_ep: tuple[int, ...] | None = None
    overhead: ServingOverhead = ServingOverhead()  # serving overhead outside the forward passes (zero unless set)
    dp: tuple[int, ...] | None = None  # attention data-parallel ranks per worker (None: every value recorded)
    concurrency: tuple[int, ...] | None = None  # this profile's concurrencies (a subset of [scheduler]'s); None = all
    workloads: tuple[str, ...] | None = None  # the workloads (names) this profile is swept on; None = all
    prefix_caching: bool = True  # vLLM's prefix caching (a workload's prefix_hit_ratio applies only with it on)
    async_scheduling: bool = False  # vLLM's async scheduling (a prompt sent to a busy engine waits the passes scheduled before it)

    def inner(self, spec: SweepSpec) -> int:
        """Configs per binding of this profile: its concurrencies x its workloads."""
        return len(self.concurrency or spec.concurrency) * len(self.workloads or spec.workloads)


@dataclass(frozen=True)
class Acceptance:
    """One acceptance setting: ``preset`` (name), ``accepted`` (mean accepted drafts) or ``rates``."""

    kind: str
    value: Any
    label: str

    def config_fields(self) -> dict:
        """The deployment-config fields for this setting (a preset is resolved to its rates here)."""
        if self.kind == "preset":
            return {"accept_rates": tuple(float(x) for x in acc.get_preset(self.value).conditional_rates)}
        if self.kind == "accepted":
            return {"accepted_tokens": float(self.value)}
        return {"accept_rates": tuple(float(x) for x in self.value)}


@dataclass(frozen=True)
class Workload:
    """A request mix: classes (ISL, OSL) with probability weights (one class = fixed lengths)."""

    name: str
    isl: tuple[int, ...]
    osl: tuple[int, ...]
    weight: tuple[float, ...]
    prefix_hit_ratio: float = 0.0  # expected share of prompt tokens read from the prefix cache (steady state)

    @property
    def mean_isl(self) -> float:
        w = np.asarray(self.weight) / sum(self.weight)
        return float(np.dot(w, self.isl))

    @property
    def mean_osl(self) -> float:
        w = np.asarray(self.weight) / sum(self.weight)
        return float(np.dot(w, self.osl))


@dataclass(frozen=True)
class SweepSpec:
    """A parsed sweep spec (axes are tuples; see docs/sweep.md)."""

    name: str
    profiles: tuple[ProfileAxis, ...]
    modes: tuple[str, ...]
    ratios: tuple[tuple[int, int], ...]
    nextn: tuple[Any, ...]
    acceptance: tuple[Acceptance, ...]
    concurrency: tuple[int, ...]
    max_num_seqs: tuple[int | None, ...]
    max_num_batched_tokens: tuple[int | None, ...]
    workloads: tuple[Workload, ...]
    sla: SLA
    gpu_budget: int | None
    block_size: int
    kv_transfer_gbps: float | None
    evaluate: str = "steady"  # how points are evaluated: the steady state, a replay of its benchmark load, or auto (EVALUATE)
    benchmark: Benchmark = Benchmark()  # the load a point is replayed under (evaluate = "replay", --verify-top)
    cost: Prices = field(default_factory=Prices)  # $/GPU-hour per system (bundled list prices, [cost] overrides)
    source: str = field(default="<spec>", compare=False)
    base_dir: Path | None = field(default=None, compare=False)

    def digest(self) -> str:
        """sha256 of the spec's content (source path excluded): identifies a sweep's work directory."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("source", "base_dir")}
        blob = json.dumps(d, default=lambda o: o.__dict__, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


# ----------------------------------------------------------------------------------------------------
# parsing


def _fmt(x: float) -> str:
    return f"{x:g}"


_RATE = sc.Num(finite=True, ge=0.0, le=1.0)
_ACCEPT_KEYS = sc.Table({k: sc.Field(sc.Custom(lambda doc, v, path: v)) for k in ("preset", "accepted_tokens", "rates")})


def _acceptance(doc: sc.Doc, v: Any, path: str) -> Acceptance:
    """A preset name, a mean accepted-token count or a list of per-position rates (bare or as a one-key table)."""
    if isinstance(v, dict):
        _ACCEPT_KEYS.read(doc, v, path)
        if len(v) != 1:
            raise doc.error(path, "give exactly one of preset, accepted_tokens, rates")
        (k, x), = v.items()
        if k == "accepted_tokens":
            if not is_number(x):
                raise doc.error(sc.sub(path, k), f"expected a number, got {doc.got(x)}")
            x = float(x)
        v = x
    if isinstance(v, str):
        try:
            acc.get_preset(sc.Str().read(doc, v, path))
        except JaxsimError as e:
            if isinstance(e, SpecError):
                raise
            raise doc.error(path, str(e)) from None
        return Acceptance("preset", v, f"preset:{v}")
    if is_number(v):
        a = sc.Num(finite=True, ge=0.0).read(doc, v, path)
        return Acceptance("accepted", a, f"accepted={_fmt(a)}")
    if isinstance(v, list):
        rates = sc.Array(_RATE, min_len=1, max_len=acc.MAX_DRAFT_TOKENS,
                         empty=f"give 1..{acc.MAX_DRAFT_TOKENS} per-position conditional rates").read(doc, v, path)
        return Acceptance("rates", rates, "rates=" + "/".join(_fmt(p) for p in rates))
    raise doc.error(path, f"expected a preset name, a mean accepted-token count or a list of rates, got {doc.got(v)}")


def _ratio(doc: sc.Doc, v: Any, path: str) -> tuple[int, int]:
    if isinstance(v, str) and v.count(":") == 1:
        a, b = v.split(":")
        if a.strip().isdigit() and b.strip().isdigit() and 1 <= int(a) <= 1024 and 1 <= int(b) <= 1024:
            return int(a), int(b)
    if isinstance(v, list) and len(v) == 2 and all(is_int(x) and 1 <= x <= 1024 for x in v):
        return int(v[0]), int(v[1])
    raise doc.error(path, f"expected 'x:y' with x prefill and y decode workers (1..1024), got {v!r}")


def _overhead(doc: sc.Doc, v: Any, path: str) -> ServingOverhead:
    """``overhead = {fixed_ms = ..., per_prompt_token_ms = ..., per_output_token_ms = ...}`` or the JSON
    file ``jaxsim calibrate --benchmark`` writes (relative to the spec's folder)."""
    if isinstance(v, str):
        base_dir = doc.context.get("base_dir")
        p = Path(v).expanduser()
        v = base_dir / p if base_dir is not None and not p.is_absolute() else p
    try:
        return read_overhead(v, path)
    except OverheadError as e:
        raise doc.error("", str(e)) from None


def _trace_workload(doc: sc.Doc, d: dict, path: str) -> tuple[list, list, list]:
    from jaxsim.replay.traces import list_traces, load_trace  # noqa: PLC0415

    ref, base_dir = d["trace"], doc.context.get("base_dir")
    p = Path(ref).expanduser()
    if ref not in list_traces() and not p.is_absolute() and base_dir is not None and (base_dir / p).is_file():
        ref = str(base_dir / p)
    try:
        tr = load_trace(ref)
    except JaxsimError as e:
        raise doc.error(f"{path}.trace", str(e)) from None
    if d.get("prefix_hit_ratio") == "measured":
        d["prefix_hit_ratio"] = _measured_hit_ratio(doc, ref, path)
    return trace_classes(tr.input_tokens, tr.output_tokens, d["bins"])


def _measured_hit_ratio(doc: sc.Doc, ref: str, path: str) -> float:
    """The share of a Mooncake trace's prompt tokens an unbounded prefix cache serves
    (:func:`jaxsim.replay.prefix_cache.measured_hit_ratio`, at the trace's own 512-token hash blocks)."""
    from jaxsim.replay.prefix_cache import measured_hit_ratio, read_hash_ids  # noqa: PLC0415
    from jaxsim.replay.traces import bundled_trace_path, list_traces, sniff_format  # noqa: PLC0415

    p = bundled_trace_path(ref) if ref in list_traces() else Path(ref)
    try:
        kind = sniff_format(p)
    except JaxsimError as e:
        raise doc.error(f"{path}.prefix_hit_ratio", str(e)) from None
    if kind != "mooncake":
        raise doc.error(f"{path}.prefix_hit_ratio", f"'measured' needs a Mooncake trace with hash_ids ({ref} is not one)")
    try:
        rows = read_hash_ids(p)
        lengths = [json.loads(x)["input_length"] for x in p.read_text().splitlines() if x.strip()]
    except JaxsimError as e:
        raise doc.error(f"{path}.prefix_hit_ratio", str(e)) from None
    return measured_hit_ratio(rows, lengths)


def trace_classes(isl: np.ndarray, osl: np.ndarray, bins: int) -> tuple[list, list, list]:
    """Empirical (ISL, OSL) distribution → up to bins² classes: quantile bins per axis, each class the
    medians of its requests, weighted by its share of requests."""
    isl = np.asarray(isl, np.int64)
    osl = np.asarray(osl, np.int64)
    q = np.linspace(0, 1, bins + 1)[1:-1]
    bi = np.searchsorted(np.quantile(isl, q), isl, side="right") if bins > 1 else np.zeros(isl.size, int)
    bo = np.searchsorted(np.quantile(osl, q), osl, side="right") if bins > 1 else np.zeros(osl.size, int)
    out_i, out_o, out_w = [], [], []
    for a in range(bins):
        for b in range(bins):
            m = (bi == a) & (bo == b)
            if m.any():
                out_i.append(int(np.median(isl[m])))
                out_o.append(int(np.median(osl[m])))
                out_w.append(float(m.sum()) / isl.size)
    return out_i, out_o, out_w


def _request_class(doc: sc.Doc, row: Any, path: str) -> tuple[int, int, float]:
    if not isinstance(row, list) or len(row) != 3:
        raise doc.error(path, f"expected [isl, osl, weight], got {row!r}")
    return (_TOKENS.read(doc, row[0], f"{path}[0]"), _TOKENS.read(doc, row[1], f"{path}[1]"),
            sc.Num(finite=True, gt=0.0).read(doc, row[2], f"{path}[2]"))


def _workload(doc: sc.Doc, path: str, d: dict) -> list[Workload]:
    """One [[workload]] table → its workloads (fixed isl x osl give one per pair)."""
    kinds = [k for k in ("isl", "requests", "trace") if k in d]
    if len(kinds) != 1 or (("isl" in d) != ("osl" in d)):
        raise doc.error(path, "give isl + osl, or requests = [[isl, osl, weight], ...], or trace = NAME|PATH")
    name = d.get("name", f"workload{path[len('workload['):-1]}")
    if d.get("prefix_hit_ratio") == "measured" and "trace" not in d:
        raise doc.error(f"{path}.prefix_hit_ratio", "'measured' needs trace = NAME|PATH (a Mooncake trace with hash_ids)")
    if "isl" in d:
        isls, osls = d["isl"], d["osl"]
        hit = float(d.get("prefix_hit_ratio", 0.0))
        return [Workload(name if len(isls) == len(osls) == 1 else f"{name}-{a}x{b}", (a,), (b,), (1.0,), hit)
                for a in isls for b in osls]
    if "requests" in d:
        isl, osl, w = (list(c) for c in zip(*d["requests"]))
    else:
        isl, osl, w = _trace_workload(doc, d, path)
    if len(isl) > MAX_WORKLOAD_CLASSES:
        raise doc.error(path, f"at most {MAX_WORKLOAD_CLASSES} request classes (got {len(isl)})")
    return [Workload(name, tuple(isl), tuple(osl), tuple(w), float(d.get("prefix_hit_ratio", 0.0)))]


def _hit_ratio(doc: sc.Doc, v: Any, path: str) -> float | str:
    """``prefix_hit_ratio``: a share of prompt tokens in [0, 1), or "measured" (from the trace's hash_ids)."""
    if v == "measured":
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= float(v) < 1.0:
        raise doc.error(path, f"expected a number in [0, 1) or \"measured\", got {v!r}")
    return float(v)


def _make_spec(doc: sc.Doc, path: str, d: dict) -> SweepSpec:
    workloads = tuple(w for ws in d["workload"] for w in ws)
    names = [w.name for w in workloads]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise doc.error("workload", f"workload names must be unique ({dup!r} repeats)")
    serving, spec, sch = d["serving"], d["speculation"], d["scheduler"]
    for i, axis in enumerate(d["profile"]):
        extra = sorted(set(axis.concurrency or ()) - set(sch["concurrency"]))
        if extra:
            raise doc.error(f"profile[{i}].concurrency", f"{extra} not in [scheduler] concurrency {list(sch['concurrency'])}")
        unknown = [n for n in axis.workloads or () if n not in names]
        if unknown:
            raise doc.error(f"profile[{i}].workloads", f"unknown workload {unknown[0]!r} (the spec's: {', '.join(names)})")
    recorded = lambda axis: tuple(None if x == RECORDED else x for x in axis)  # noqa: E731
    return SweepSpec(
        name=d.get("name", Path(doc.source).stem),
        profiles=d["profile"],
        modes=serving.get("mode", ("aggregated",)),
        ratios=tuple(dict.fromkeys(serving.get("ratios", ((1, 1),)))),
        nextn=spec.get("nextn", (PROFILE_NEXTN,)),
        acceptance=tuple(dict.fromkeys(spec.get("acceptance", ()))),
        concurrency=sch["concurrency"],
        max_num_seqs=recorded(sch.get("max_num_seqs", (RECORDED,))),
        max_num_batched_tokens=recorded(sch.get("max_num_batched_tokens", (RECORDED,))),
        workloads=workloads,
        sla=SLA(**d.get("sla", {})),
        gpu_budget=d.get("gpu_budget"),
        block_size=d.get("block_size", DEFAULT_BLOCK_SIZE),
        kv_transfer_gbps=d.get("kv_transfer_gbps"),
        evaluate=d.get("evaluate", "steady"),
        benchmark=d.get("benchmark", Benchmark()),
        cost=d.get("cost", Prices()),
        source=doc.source,
        base_dir=doc.context.get("base_dir"),
    )


def _gpu_prices(doc: sc.Doc, v: Any, path: str) -> tuple[tuple[str, float], ...]:
    """``{system = usd per GPU-hour, ...}``: known systems, finite prices > 0."""
    if not isinstance(v, dict):
        raise doc.error(path, f"expected a table of system = US dollars per GPU-hour, e.g. {{b200_sxm = 4.5}}, got {doc.got(v)}")
    out = []
    for system, usd in v.items():
        try:
            out.append((system, check_price(system, usd, sc.sub(path, system))))
        except JaxsimError as e:
            raise doc.error(sc.sub(path, system), str(e).split(": ", 1)[-1]) from None
    return tuple(sorted(out))


_TOKENS = sc.Int(lo=1, limit="tokens")
_SLA_MS = sc.Field(sc.Num(finite=True, gt=0.0, limit="ms"))
_SLA = sc.Table({k: sc.Field(sc.Num(finite=True, ge=0.0)) if k == "min_tokens_per_s_per_user" else _SLA_MS
                 for k in SLA.__dataclass_fields__})


def _benchmark(doc: sc.Doc, path: str, d: dict) -> Benchmark:
    try:
        return Benchmark(**d)
    except LoadError as e:
        raise doc.error(path, str(e)) from None


def _sla(doc: sc.Doc, v: Any, path: str) -> dict:
    """The ``[sla]`` table; deprecated keys (:data:`jaxsim.sla.DEPRECATED_KEYS`) are renamed, with a note on stderr."""
    if isinstance(v, dict):
        try:
            v, notes = canonical_keys(v, f"{doc.source}: {path}")
        except InputError as e:
            raise doc.error("", str(e).removeprefix(f"{doc.source}: ")) from None
        for note in notes:
            print(note, file=sys.stderr)
    return _SLA.read(doc, v, path)
_SPEC = sc.Table({
    "name": sc.Field(sc.Str()),
    "block_size": sc.Field(sc.Int(lo=1, limit="block_size")),
    "gpu_budget": sc.Field(sc.Int(lo=1, limit="gpus")),
    "kv_transfer_gbps": sc.Field(sc.Num(finite=True, gt=0.0, limit="gbps")),
    "profile": sc.Field(sc.Array(sc.Table({
        "name": sc.Field(sc.Str(), required="required (a bundled profile name or a profile directory)"),
        "tp": sc.Field(sc.Axis(sc.Int(lo=1, limit="parallel"))),
        "moe_tp": sc.Field(sc.Axis(sc.Int(lo=1, limit="parallel"))),
        "moe_ep": sc.Field(sc.Axis(sc.Int(lo=1, limit="parallel"))),
        "dp": sc.Field(sc.Axis(sc.Int(lo=1, limit="parallel"))),
        "label": sc.Field(sc.Str()),
        "overhead": sc.Field(sc.Custom(_overhead)),
        "concurrency": sc.Field(sc.Axis(sc.Int(lo=1, limit="max_num_seqs"))),
        "workloads": sc.Field(sc.Array(sc.Str(), min_len=1, empty="expected a non-empty array of workload names")),
        "prefix_caching": sc.Field(sc.Bool()),
        "async_scheduling": sc.Field(sc.Bool()),
    }, lambda doc, path, d: ProfileAxis(d["name"], d.get("tp"), d.get("label", Path(d["name"]).name or d["name"]),
                                        d.get("moe_tp"), d.get("moe_ep"), d.get("overhead", ServingOverhead()), d.get("dp"),
                                        tuple(dict.fromkeys(d["concurrency"])) if "concurrency" in d else None,
                                        tuple(dict.fromkeys(d["workloads"])) if "workloads" in d else None,
                                        bool(d.get("prefix_caching", True)), bool(d.get("async_scheduling", False)))),
        min_len=1, empty="give at least one [[profile]] table (name = bundled name or directory)"),
        required="give at least one [[profile]] table (name = bundled name or directory)"),
    "serving": sc.Field(sc.Table({
        "mode": sc.Field(sc.Axis(sc.Literal(MODES))),
        "ratios": sc.Field(sc.Array(sc.Custom(_ratio), min_len=1, empty="expected a non-empty array of 'x:y'")),
    }), default={}),
    "speculation": sc.Field(sc.Table({
        "nextn": sc.Field(sc.Axis(sc.Int(lo=0, hi=acc.MAX_DRAFT_TOKENS, also=(PROFILE_NEXTN,)))),
        "acceptance": sc.Field(sc.Array(sc.Custom(_acceptance))),
    }), default={}),
    "scheduler": sc.Field(sc.Table({
        "concurrency": sc.Field(sc.Axis(sc.Int(lo=1, limit="max_num_seqs")),
                                required="required: target concurrency per (decode) worker, e.g. [1, 8, 32]"),
        "max_num_seqs": sc.Field(sc.Axis(sc.Int(lo=1, limit="max_num_seqs", also=(RECORDED,)))),
        "max_num_batched_tokens": sc.Field(sc.Axis(sc.Int(lo=1, limit="tokens", also=(RECORDED,)))),
    }), required="required: target concurrency per (decode) worker, e.g. [1, 8, 32]"),
    "workload": sc.Field(sc.Array(sc.Table({
        "name": sc.Field(sc.Str()),
        "isl": sc.Field(sc.Axis(_TOKENS)),
        "osl": sc.Field(sc.Axis(_TOKENS)),
        "requests": sc.Field(sc.Array(sc.Custom(_request_class), min_len=1, empty="expected a non-empty array of [isl, osl, weight]")),
        "trace": sc.Field(sc.Str()),
        "bins": sc.Field(sc.Int(lo=1, hi=8), default=3),
        "prefix_hit_ratio": sc.Field(sc.Custom(_hit_ratio)),
    }, _workload), min_len=1, empty="give at least one [[workload]] table"), required="give at least one [[workload]] table"),
    "sla": sc.Field(sc.Custom(_sla)),
    "evaluate": sc.Field(sc.Literal(EVALUATE)),
    "benchmark": sc.Field(sc.Table({
        "load": sc.Field(sc.Literal(KINDS)),
        "prompts_per_client": sc.Field(sc.Int(lo=1, hi=1000)),
        "num_prompts": sc.Field(sc.Int(lo=1, limit="requests")),
        "request_rate": sc.Field(sc.Num(finite=True, gt=0.0)),
        "burstiness": sc.Field(sc.Num(gt=0.0)),
        "range_ratio": sc.Field(sc.Num(finite=True, ge=0.0)),
        "length_rule": sc.Field(sc.Literal(RULES)),
        "arrival_rule": sc.Field(sc.Literal(RULES)),
        "seed": sc.Field(sc.Int(lo=0, limit="seed")),
    }, _benchmark)),
    "cost": sc.Field(sc.Table({
        "basis": sc.Field(sc.Literal(PRICE_BASES)),
        "usd_per_gpu_hour": sc.Field(sc.Custom(_gpu_prices)),
    }, lambda doc, path, d: Prices(d.get("basis", DEFAULT_BASIS), d.get("usd_per_gpu_hour", ())))),
}, _make_spec)


def spec_from_dict(obj: Mapping[str, Any], *, source: str = "<spec>", base_dir: str | os.PathLike | None = None) -> SweepSpec:
    """Build a spec from parsed TOML; one-line :class:`SpecError` naming the key on any mistake."""
    doc = sc.Doc(source, SpecError, base_dir=None if base_dir is None else Path(base_dir))
    return _SPEC.read(doc, dict(obj))


def load_spec(path: str | os.PathLike) -> SweepSpec:
    """Read a sweep spec TOML; relative profile directories and trace files resolve against its folder."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{p}: cannot read sweep spec: {getattr(e, 'strerror', None) or e}") from None
    try:
        obj = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{p}: invalid TOML: {' '.join(str(e).split())}") from None
    return spec_from_dict(obj, source=str(p), base_dir=p.parent)


# ----------------------------------------------------------------------------------------------------
# plan: bindings validated once, configs decoded lazily


@dataclass(frozen=True)
class Invalid:
    """Invalid bindings sharing one rule: how many configs they stand for, and one example."""

    rule: str
    bindings: int
    configs: int
    example: str


@dataclass(frozen=True)
class BindingKey:
    """One point of a spec's binding grid: a profile deployment (TP, system, backend version) × serving
    (mode; x prefill : y decode workers) × speculation (nextn, acceptance) × scheduler envelope."""

    profile: ProfileAxis
    tp: int
    system: str
    version: str | None
    mode: str
    prefill_workers: int  # x (0 when aggregated)
    decode_workers: int  # y (1 when aggregated)
    nextn: int
    acceptance: Acceptance | None  # None: autoregressive, or nextn > 0 with no acceptance setting (refused)
    max_num_seqs: int | None  # None = the profile's recorded value
    max_num_batched_tokens: int | None
    moe_tp: int = 1
    moe_ep: int = 1
    dp: int = 1  # attention data-parallel ranks of the worker (each an engine of tp GPUs)

    @property
    def disaggregated(self) -> bool:
        return self.mode == "disaggregated"

    @property
    def layout(self) -> str:
        """``tp=T`` (dense, or MoE with moe_tp = tp), else ``tp=T [dp=D] moe_tp=M moe_ep=E``."""
        pure = self.moe_ep == 1 and self.moe_tp in (1, self.tp) and self.dp == 1
        dp = f" dp={self.dp}" if self.dp != 1 else ""
        return f"tp={self.tp}" if pure else f"tp={self.tp}{dp} moe_tp={self.moe_tp} moe_ep={self.moe_ep}"

    @property
    def gpus(self) -> int:
        """GPUs of one serving unit (an attention-DP worker: tp x dp)."""
        return (self.prefill_workers + self.decode_workers) * self.tp * self.dp if self.disaggregated else self.tp * self.dp

    def describe(self) -> str:
        """How refusals name this binding (a missing acceptance is refused for every serving mode at once)."""
        if self.nextn > 0 and self.acceptance is None:
            return f"{self.profile.label} {self.layout} nextn={self.nextn}"
        serving = f" {self.prefill_workers}:{self.decode_workers}" if self.disaggregated else ""
        accept = f" {self.acceptance.label}" if self.acceptance else ""
        return f"{self.profile.label} {self.layout} {self.mode}{serving} nextn={self.nextn}{accept}"


@dataclass(frozen=True)
class Bindings:
    """The valid bindings of a plan as typed columns (leading axis ``*b``; one binding: scalars).

    Label columns (``profile``, ``system``, ``mode``, ``acceptance``) are codes into
    :attr:`SweepPlan.labels`, ``data_source`` a code into ``DATA_SOURCES``. The unprefixed envelope and KV
    pool are the decode (or aggregated) role's, ``prefill_*`` the prefill role's (aggregated: the engine's).
    """

    profile: Int64[ArrayLike, "*b"]
    system: Int64[ArrayLike, "*b"]
    mode: Int64[ArrayLike, "*b"]
    acceptance: Int64[ArrayLike, "*b"]
    acceptance_id: Int64[ArrayLike, "*b"]  # row of SweepPlan.rates
    prefill_workers: Int64[ArrayLike, "*b"]
    decode_workers: Int64[ArrayLike, "*b"]
    prefill_tp: Int64[ArrayLike, "*b"]
    tp: Int64[ArrayLike, "*b"]
    moe_tp: Int64[ArrayLike, "*b"]  # the MoE layout of the (decode or aggregated) deployment
    moe_ep: Int64[ArrayLike, "*b"]
    dp: Int64[ArrayLike, "*b"]  # attention data-parallel ranks per worker (each an engine at 1/dp of the concurrency)
    gpus: Int64[ArrayLike, "*b"]  # one serving unit
    replicas: Int64[ArrayLike, "*b"]  # serving units in the GPU budget (1 without one)
    nextn: Int64[ArrayLike, "*b"]
    max_num_seqs: Int64[ArrayLike, "*b"]
    prefill_max_num_seqs: Int64[ArrayLike, "*b"]
    max_num_batched_tokens: Int64[ArrayLike, "*b"]
    prefill_max_num_batched_tokens: Int64[ArrayLike, "*b"]
    kv_blocks: Int64[ArrayLike, "*b"]
    prefill_kv_blocks: Int64[ArrayLike, "*b"]
    kv_state_blocks: Int64[ArrayLike, "*b"]  # fixed blocks per request (grouped caches; 0 when linear)
    block_size: Int64[ArrayLike, "*b"]
    max_model_len: Int64[ArrayLike, "*b"]
    kv_bytes_per_token: Int64[ArrayLike, "*b"]
    prefill_table: Int64[ArrayLike, "*b"]  # index into SweepPlan.tables
    decode_table: Int64[ArrayLike, "*b"]
    group: Int64[ArrayLike, "*b"]  # index into SweepPlan.groups
    data_source: Int64[ArrayLike, "*b"]
    kv_transfer_bytes_per_s: Float64[ArrayLike, "*b"]  # the P/D link (1.0 when aggregated)

    @staticmethod
    def stack(rows: Sequence[Bindings]) -> Bindings:
        """One column per field from single bindings (int64; the link bandwidth float64)."""
        return Bindings(**{f.name: np.asarray([getattr(r, f.name) for r in rows],
                                              np.float64 if f.name == "kv_transfer_bytes_per_s" else np.int64)
                           for f in fields(Bindings)})

    def take(self, index: np.ndarray) -> Bindings:
        """The bindings at ``index`` (columns)."""
        return Bindings(**{k: v[index] for k, v in vars(self).items()})

    def row(self, b: int) -> Bindings:
        """Binding ``b`` as Python scalars."""
        return Bindings(**{k: v[b].item() for k, v in vars(self).items()})

    def __len__(self) -> int:
        return int(np.shape(self.tp)[0])


class TableGroup(NamedTuple):
    """A contiguous range of configs whose bindings share their round tables and serving mode."""

    start: int  # first config
    stop: int  # end config (exclusive)
    prefill_table: int
    decode_table: int
    disaggregated: bool


@dataclass(eq=False)
class SweepPlan:
    """The validated bindings of a spec and everything needed to evaluate its configs chunk by chunk.

    Config index i decodes as (binding b, concurrency c, workload w) with w fastest; bindings are
    ordered so that configs sharing tables and mode are contiguous (``groups``).
    """

    spec: SweepSpec
    labels: dict[str, list[str]]
    bindings: Bindings
    rates: np.ndarray  # [A, 5] per acceptance id
    rates_nextn: np.ndarray  # [A]
    accepted_mean: np.ndarray  # [A] expected accepted drafts per round
    tables: list[RoundTable]
    groups: list[TableGroup]
    invalid: list[Invalid]
    wl_isl: np.ndarray  # [nW, W]
    wl_osl: np.ndarray
    wl_weight: np.ndarray
    wl_mean_isl: np.ndarray
    wl_mean_osl: np.ndarray
    wl_hit_ratio: np.ndarray  # [nW] expected prefix-cache hit share of prompt tokens
    num_invalid_configs: int = 0
    profile_models: dict[str, str] = field(default_factory=dict)  # profile label → model id
    points: np.ndarray | None = None  # grid positions (binding x concurrency x workload) evaluated, when profiles restrict their axes

    @property
    def inner(self) -> int:
        return len(self.spec.concurrency) * len(self.spec.workloads)

    @property
    def num_bindings(self) -> int:
        return len(self.bindings)

    @property
    def num_configs(self) -> int:
        """Configs that will be evaluated (valid bindings × concurrency × workloads, or the points of
        profiles restricting their concurrencies / workloads)."""
        return self.num_bindings * self.inner if self.points is None else int(self.points.size)

    def grid_index(self, idx: np.ndarray) -> np.ndarray:
        """Config indices → positions in the dense grid (binding, concurrency, workload; workload fastest)."""
        idx = np.asarray(idx, np.int64)
        return idx if self.points is None else self.points[idx]

    @property
    def num_classes(self) -> int:
        return int(self.wl_isl.shape[1])

    @property
    def max_output_tokens(self) -> int:
        return int(self.wl_osl.max())

    def rounds_table(self) -> jnp.ndarray:
        """Expected rounds per acceptance setting up to the longest output (bucketed to a power of two)."""
        m = pow2_bucket(self.max_output_tokens, 64)
        return ev.expected_rounds_table(jnp.asarray(self.rates), jnp.asarray(self.rates_nextn), m)

    def decode_index(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Config indices → (binding, concurrency position, workload position)."""
        nw = len(self.spec.workloads)
        b, r = np.divmod(self.grid_index(idx), self.inner)
        c, w = np.divmod(r, nw)
        return b, c, w

    def inputs(self, idx: np.ndarray) -> ev.ConfigInputs:
        """Numpy :class:`~jaxsim.sweep.evaluate.ConfigInputs` for config indices ``idx``."""
        b, c, w = self.decode_index(np.asarray(idx, np.int64))
        B = self.bindings.take(b)
        return ev.ConfigInputs(
            prefill_workers=B.prefill_workers,
            decode_workers=B.decode_workers,
            prefill_gpus=B.prefill_tp,
            decode_gpus=B.tp,
            nextn=B.nextn,
            acceptance_id=B.acceptance_id,
            max_num_seqs=B.max_num_seqs,
            max_num_batched_tokens=B.max_num_batched_tokens,
            prefill_max_num_batched_tokens=B.prefill_max_num_batched_tokens,
            kv_blocks=B.kv_blocks,
            prefill_kv_blocks=B.prefill_kv_blocks,
            kv_state_blocks=B.kv_state_blocks,
            block_size=B.block_size,
            max_model_len=B.max_model_len,
            kv_bytes_per_token=B.kv_bytes_per_token,
            kv_transfer_bytes_per_s=B.kv_transfer_bytes_per_s,
            concurrency=-(-np.asarray(self.spec.concurrency, np.int64)[c] // B.dp),  # per attention-DP rank (ceil)
            **dict(zip(("isl", "osl"), self.benchmark_lengths(self.wl_isl[w], self.wl_osl[w]))),
            weight=self.wl_weight[w],
            prefix_hit_ratio=self.wl_hit_ratio[w] * self.prefix_caching[B.profile],
            async_scheduling=self.async_scheduling[B.profile],
            prompts_per_client=self.prompts_per_client(np.asarray(self.spec.concurrency, np.int64)[c]),
            equal_lengths=(np.count_nonzero(self.wl_weight[w] > 0, axis=1) == 1) & (self.spec.benchmark.range_ratio == 0),
            **{f"overhead_{k}": v for k, v in zip(("fixed_ms", "per_prompt_token_ms", "per_output_token_ms"), self.overheads[B.profile].T)},
        )

    @property
    def prefix_caching(self) -> np.ndarray:
        """[profile label] whether each profile axis serves with prefix caching (``prefix_caching``, on by default)."""
        return self._profile_flag("prefix_caching", True)

    @property
    def async_scheduling(self) -> np.ndarray:
        """[profile label] whether each profile axis's engines schedule asynchronously (``async_scheduling``, off by default)."""
        return self._profile_flag("async_scheduling", False)

    def _profile_flag(self, name: str, default: bool) -> np.ndarray:
        """[profile label] the boolean ``[[profile]]`` key ``name`` of each profile axis (``default`` for a label no axis has)."""
        by_label = {a.label: getattr(a, name) for a in self.spec.profiles}
        return np.array([by_label.get(lab, default) for lab in self.labels["profile"]] or [default], bool)

    @property
    def overheads(self) -> np.ndarray:
        """[profile label, 3] serving overhead terms (fixed, per prompt token, per output token; ms) of each profile axis."""
        by_label = {a.label: a.overhead.terms for a in self.spec.profiles}
        return np.array([by_label.get(lab, (0.0, 0.0, 0.0)) for lab in self.labels["profile"]] or [(0.0, 0.0, 0.0)], np.float64)

    def benchmark_lengths(self, isl: np.ndarray, osl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The mean lengths the spec's benchmark sends for workload classes ``isl``/``osl``: the classes
        themselves (fixed, or vLLM's range ratio, symmetric about them), or the mean of InferenceX's
        U{⌊rL⌋ .. L} under ``length_rule = "inferencex"`` (the steady state prices the requests sent)."""
        bench = self.spec.benchmark
        if bench.length_rule != "inferencex":
            return isl, osl
        ilo, ihi, olo, ohi = length_bounds(isl, osl, bench.range_ratio, "inferencex")
        return (ilo + ihi + 1) // 2, (olo + ohi + 1) // 2

    def prompts_per_client(self, concurrency: np.ndarray) -> np.ndarray:
        """Per config: the prompts each client of its closed-loop benchmark sends (its prompt waves; 0 for
        an open-loop benchmark, whose TTFT is the steady state's)."""
        bench = self.spec.benchmark
        c = np.maximum(np.asarray(concurrency, np.float64), 1.0)
        if not bench.closed:
            return np.zeros_like(c)
        return np.asarray(bench.num_prompts, np.float64) / c if bench.num_prompts is not None else np.full_like(c, bench.prompts_per_client)

    def input_columns(self, idx: np.ndarray) -> OrderedDict[str, np.ndarray]:
        """Per-config input columns for the results (label columns as integer codes into ``labels``)."""
        idx = np.asarray(idx, np.int64)
        b, c, w = self.decode_index(idx)
        B = self.bindings.take(b)
        cols: OrderedDict[str, np.ndarray] = OrderedDict()
        cols["config_id"] = idx
        for k in ("profile", "data_source", "system", "mode"):
            cols[k] = getattr(B, k).astype(np.int32)
        for k in ("prefill_workers", "decode_workers", "prefill_tp", "tp", "moe_tp", "moe_ep", "dp", "gpus", "replicas", "nextn"):
            cols[k] = getattr(B, k)
        cols["acceptance"] = B.acceptance.astype(np.int32)
        cols["accepted_tokens_mean"] = self.accepted_mean[B.acceptance_id]
        cols["max_num_seqs"] = B.max_num_seqs
        cols["max_num_batched_tokens"] = B.max_num_batched_tokens
        cols["concurrency_target"] = np.asarray(self.spec.concurrency, np.int64)[c]
        cols["workload"] = w.astype(np.int32)
        cols["isl_mean"] = self.wl_mean_isl[w]
        cols["osl_mean"] = self.wl_mean_osl[w]
        return cols

    def gpu_hour_prices(self) -> np.ndarray:
        """US dollars per GPU-hour per system code (``labels["system"]``; NaN: no price)."""
        return np.array([self.spec.cost.usd_per_gpu_hour(s) for s in self.labels["system"]], np.float64)

    def chunks(self, chunk_size: int) -> list[tuple[int, int, int]]:
        """(group, start, stop) config ranges of at most ``chunk_size``, never crossing a group."""
        out = []
        for g, group in enumerate(self.groups):
            for s in range(group.start, group.stop, chunk_size):
                out.append((g, s, min(s + chunk_size, group.stop)))
        return out

    def summary(self) -> dict:
        """Counts for reports (JSON-able)."""
        return {
            "spec": self.spec.source,
            "name": self.spec.name,
            "configs_total": self.num_configs + self.num_invalid_configs,
            "configs_evaluated": self.num_configs,
            "configs_invalid": self.num_invalid_configs,
            "bindings_valid": self.num_bindings,
            "bindings_invalid": sum(i.bindings for i in self.invalid),
            "invalid": [i.__dict__ for i in self.invalid],
            "sla": self.spec.sla.limits(),
            "prices": self.spec.cost.describe(self.labels["system"]),
            "profile_models": dict(self.profile_models),
            "workload_classes": {w.name: len(w.isl) for w in self.spec.workloads},
        }


# ---- the grid of binding points


def _servings(spec: SweepSpec) -> list[tuple[str, int, int]]:
    """(mode, x prefill workers, y decode workers): aggregated first, then each disaggregated ratio."""
    out = [("aggregated", 0, 1)] if "aggregated" in spec.modes else []
    if "disaggregated" in spec.modes:
        out += [("disaggregated", x, y) for x, y in spec.ratios]
    return out


class _Layout(NamedTuple):
    """One parallel layout of a profile axis, with the (system, backend version) it was measured on and the
    deployments' speculative depth K there."""

    tp: int
    moe_tp: int
    moe_ep: int
    system: str
    version: str | None
    k: int
    dp: int = 1


def _wanted(values: tuple[int, ...] | None, v: int) -> bool:
    return values is None or v in values


def _layouts(axis: ProfileAxis, profile: ModelProfile) -> list[_Layout]:
    """The parallel layouts of one profile axis: for each TP (the axis's, else every one the profile records),
    every (moe_tp, moe_ep) the profile records at that TP within the axis's moe lists, each with every
    (system, version) measured at it. A TP (or MoE layout) the axis asks for and the profile lacks is one
    point with the requested layout, so that binding it names what the profile has."""
    deps = profile.deployments
    out: list[_Layout] = []
    for tp in axis.tp if axis.tp is not None else tuple(sorted({d.tp for d in deps})):
        at_tp = [d for d in deps if d.tp == tp and _wanted(axis.moe_tp, d.moe_tp) and _wanted(axis.moe_ep, d.moe_ep)
                 and _wanted(axis.dp, d.dp)]
        moe = sorted({(d.dp, d.moe_tp, d.moe_ep) for d in at_tp}, key=lambda m: (m[0], m[2], -m[1]))
        if not moe:
            moe = [((axis.dp or (1,))[0], (axis.moe_tp or (1,))[0], (axis.moe_ep or (1,))[0])]
        for dp, moe_tp, moe_ep in moe:
            here = [d for d in at_tp if (d.dp, d.moe_tp, d.moe_ep) == (dp, moe_tp, moe_ep)]
            idents = list(dict.fromkeys((d.system, d.backend_version) for d in here)) or [(deps[0].system, deps[0].backend_version)]
            for system, version in idents:
                k = max((d.num_draft_tokens for d in here if (d.system, d.backend_version) == (system, version)), default=0)
                out.append(_Layout(tp, moe_tp, moe_ep, system, version, k, dp))
    return out


def binding_grid(spec: SweepSpec, axis: ProfileAxis, profile: ModelProfile) -> Iterator[BindingKey]:
    """Every binding point of one profile axis, in axis order: layout (TP, MoE TP/EP) and identity, serving,
    nextn ("profile": the deployment's K), acceptance (only when nextn > 0), max_num_seqs, max_num_batched_tokens."""
    for lay in _layouts(axis, profile):
        for (mode, x, y), nextn in itertools.product(_servings(spec), spec.nextn):
            k = lay.k if nextn == PROFILE_NEXTN else nextn
            accs = (spec.acceptance or (None,)) if k > 0 else (None,)
            for a, mns, mbt in itertools.product(accs, spec.max_num_seqs, spec.max_num_batched_tokens):
                yield BindingKey(axis, lay.tp, lay.system, lay.version, mode, x, y, k, a, mns, mbt, lay.moe_tp, lay.moe_ep, lay.dp)


def _grid_size(spec: SweepSpec, axis: ProfileAxis) -> int:
    """Binding points counted for a profile axis that cannot be loaded (one per listed TP, or one)."""
    return (
        len(axis.tp or (1,))
        * len(axis.moe_tp or (1,))
        * len(axis.moe_ep or (1,))
        * len(axis.dp or (1,))
        * len(_servings(spec))
        * len(spec.nextn)
        * max(len(spec.acceptance), 1)
        * len(spec.max_num_seqs)
        * len(spec.max_num_batched_tokens)
    )


# ---- one binding point: config, validation, binding


def deployment_config(spec: SweepSpec, root: Path, profile: ModelProfile, key: BindingKey) -> DeploymentConfig:
    """The deployment config of one binding point, as a TOML config stating the same would read
    (unchecked: :func:`jaxsim.rules.config.check_config` checks it). Disaggregated serving gives the
    prefill role the token budget only; the decode role gets the whole envelope."""
    envelope = {"max_num_seqs": key.max_num_seqs, "max_num_batched_tokens": key.max_num_batched_tokens}
    layout = {"tp": key.tp, "dp": key.dp, "moe_tp": key.moe_tp, "moe_ep": key.moe_ep}
    if key.disaggregated:
        roles = (RoleConfig("prefill", **layout, replicas=key.prefill_workers, max_num_batched_tokens=key.max_num_batched_tokens),
                 RoleConfig("decode", **layout, replicas=key.decode_workers, **envelope))
    else:
        roles = (RoleConfig("aggregated", **layout, **envelope),)
    return DeploymentConfig(
        model=profile.model, system=key.system, roles=roles, profile=str(root), backend_version=key.version,
        mode=key.mode, nextn=key.nextn, block_size=spec.block_size,
        kv_transfer_gbps=spec.kv_transfer_gbps if key.disaggregated else None,
        source=f"{spec.source} [{key.describe()}]",
        **(key.acceptance.config_fields() if key.acceptance is not None else {}),
    )


def bind_key(spec: SweepSpec, root: Path, profile: ModelProfile, key: BindingKey) -> Binding | str:
    """Validate one binding point: the sweep's own rules (an acceptance setting for nextn > 0, the GPU
    budget), then the config's checks and :func:`jaxsim.rules.validate.validate_config`. The
    :class:`~jaxsim.deploy.binding.Binding`, or the first problem (``<rule>: <why>``)."""
    if key.nextn > 0 and key.acceptance is None:
        return "acceptance-missing: nextn > 0 needs [speculation] acceptance values"
    if key.dp > 1 and key.disaggregated:
        return (f"attention-dp: {key.layout} is served aggregated only (each of the dp ranks an engine at 1/dp of the "
                "concurrency); disaggregated attention-DP workers are not modelled")
    if spec.gpu_budget is not None and key.gpus > spec.gpu_budget:
        return f"gpu-budget: one serving unit needs {key.gpus} GPUs, more than the budget of {spec.gpu_budget}"
    cfg = deployment_config(spec, root, profile, key)
    try:
        problems = validate_config(check_config(cfg))
        return problems[0] if problems else bind(cfg)
    except (JaxsimError, ValueError, QueryError) as e:
        return str(e)


# ---- what the plan accumulates


def _rule(problem: str) -> str:
    head = problem.split(":", 1)[0].strip()
    return head if head and " " not in head else "binding"


class _Refusals:
    """Refused bindings by rule (in order of first refusal): counts, and the first one as the example."""

    def __init__(self, configs_per_binding: int):
        self.configs_per_binding = configs_per_binding
        self.by_rule: dict[str, Invalid] = {}

    def add(self, problem: str, what: str, bindings: int = 1) -> None:
        rule = _rule(problem)
        seen = self.by_rule.get(rule, Invalid(rule, 0, 0, f"{what}: {problem}"))
        self.by_rule[rule] = replace(seen, bindings=seen.bindings + bindings,
                                     configs=seen.configs + bindings * self.configs_per_binding)


class _Codes:
    """Integer codes by first appearance: label strings per kind, acceptance settings (row 0: none) and
    round tables (by identity: a binding cache hands out one object per distinct table)."""

    def __init__(self):
        self.labels: dict[str, list[str]] = {"profile": [], "system": [], "mode": list(MODES), "acceptance": [], "workload": [],
                                             "data_source": list(DATA_SOURCES)}
        self.acceptance: list[tuple[int, tuple[float, ...]]] = [(0, (0.0,) * acc.MAX_DRAFT_TOKENS)]
        self.tables: list[RoundTable] = []
        self._table_ids: dict[int, int] = {}
        self.models: dict[str, str] = {}  # profile label → model id

    def label(self, kind: str, value: str) -> int:
        lst = self.labels[kind]
        if value not in lst:
            lst.append(value)
        return lst.index(value)

    def acceptance_id(self, nextn: int, rates: np.ndarray) -> int:
        key = (nextn, tuple(float(v) for v in rates))
        if key not in self.acceptance:
            self.acceptance.append(key)
        return self.acceptance.index(key)

    def table(self, t: RoundTable) -> int:
        if id(t) not in self._table_ids:
            self._table_ids[id(t)] = len(self.tables)
            self.tables.append(t)
        return self._table_ids[id(t)]


# ---- the plan's steps


def _binding_row(spec: SweepSpec, key: BindingKey, b: Binding, profile: ModelProfile, profile_code: int,
                 acceptance_id: int, codes: _Codes) -> Bindings:
    """One valid binding's row (labels and tables get their codes here, in binding order)."""
    pre, dec = (b.prefill, b.decode) if key.disaggregated else (b.aggregated, b.aggregated)
    return Bindings(
        profile=profile_code, system=codes.label("system", key.system), mode=codes.label("mode", key.mode),
        acceptance=codes.label("acceptance", key.acceptance.label if key.acceptance else "none"), acceptance_id=acceptance_id,
        prefill_workers=key.prefill_workers, decode_workers=key.decode_workers, prefill_tp=pre.deployment.tp, tp=dec.deployment.tp,
        moe_tp=dec.deployment.moe_tp, moe_ep=dec.deployment.moe_ep, dp=dec.deployment.dp,
        gpus=key.gpus, replicas=(spec.gpu_budget // key.gpus) if spec.gpu_budget else 1, nextn=key.nextn,
        max_num_seqs=dec.max_num_seqs, prefill_max_num_seqs=pre.max_num_seqs,
        max_num_batched_tokens=dec.max_num_batched_tokens, prefill_max_num_batched_tokens=pre.max_num_batched_tokens,
        kv_blocks=dec.blocks.num_gpu_blocks, prefill_kv_blocks=pre.blocks.num_gpu_blocks, kv_state_blocks=dec.blocks.state_blocks,
        block_size=b.block_size, max_model_len=b.context_length, kv_bytes_per_token=pre.kv_bytes_per_token or 0,
        prefill_table=codes.table(pre.table), decode_table=codes.table(dec.table), group=0,
        data_source=DATA_SOURCES.index(profile.source), kv_transfer_bytes_per_s=float(b.kv_transfer_bytes_per_s or 1.0),
    )


def _plan_profile(spec: SweepSpec, axis: ProfileAxis, codes: _Codes, refusals: _Refusals) -> list[Bindings]:
    """The valid bindings of one ``[[profile]]`` axis, in grid order; every refusal goes to ``refusals``."""
    profile_code = codes.label("profile", axis.label)
    try:
        root = resolve_profile_dir(axis.ref, spec.base_dir)
        profile = load_bundle(root).profile
    except JaxsimError as e:
        refusals.add(str(e), f"profile {axis.ref!r}", _grid_size(spec, axis))
        return []
    codes.models[axis.label] = profile.model
    rows = []
    for key in binding_grid(spec, axis, profile):
        bound = bind_key(spec, root, profile, key)
        if isinstance(bound, str):
            refusals.add(bound, key.describe())
            continue
        acceptance_id = codes.acceptance_id(key.nextn, bound.accept_rates)
        roles = (bound.prefill, bound.decode) if key.disaggregated else (bound.aggregated,)
        missing = next((r.blocks.problem for r in roles if r.blocks.num_gpu_blocks is None), None)
        if missing is not None:
            refusals.add(missing if missing.split(":", 1)[0] in ("grouped-cache", "block-size") else f"grouped-cache: {missing}",
                         key.describe())
            continue
        rows.append(_binding_row(spec, key, bound, profile, profile_code, acceptance_id, codes))
    return rows


def _group_by_tables(rows: list[Bindings], inner: int) -> tuple[Bindings, list[TableGroup]]:
    """Bindings ordered so that configs sharing (prefill table, decode table, mode) are contiguous (stable),
    with their groups."""
    b = Bindings.stack(rows)
    b = b.take(np.lexsort((b.mode, b.decode_table, b.prefill_table)))
    key = np.stack([b.prefill_table, b.decode_table, b.mode], axis=1)
    starts = np.flatnonzero(np.r_[len(b) > 0, (key[1:] != key[:-1]).any(axis=1)])
    stops = np.r_[starts[1:], len(b)]
    groups = [TableGroup(int(s) * inner, int(e) * inner, int(b.prefill_table[s]), int(b.decode_table[s]), bool(b.mode[s] == 1))
              for s, e in zip(starts, stops)]
    return replace(b, group=np.repeat(np.arange(len(starts), dtype=np.int64), stops - starts)), groups


def _workload_arrays(workloads: tuple[Workload, ...]) -> dict[str, np.ndarray]:
    """The workloads' classes padded to the largest mix (repeating the first class, with weight 0)."""
    wmax = max(len(w.isl) for w in workloads)
    return dict(
        wl_isl=np.array([list(w.isl) + [w.isl[0]] * (wmax - len(w.isl)) for w in workloads], np.int64),
        wl_osl=np.array([list(w.osl) + [w.osl[0]] * (wmax - len(w.osl)) for w in workloads], np.int64),
        wl_weight=np.array([list(w.weight) + [0.0] * (wmax - len(w.weight)) for w in workloads], np.float64),
        wl_mean_isl=np.array([w.mean_isl for w in workloads]),
        wl_mean_osl=np.array([w.mean_osl for w in workloads]),
        wl_hit_ratio=np.array([w.prefix_hit_ratio for w in workloads], np.float64),
    )


def _points(spec: SweepSpec, labels: list[str], bindings: Bindings, groups: list[TableGroup]):
    """(grid positions kept, groups over them) when a profile restricts its concurrencies or workloads,
    else (None, groups)."""
    if all(a.concurrency is None and a.workloads is None for a in spec.profiles):
        return None, groups
    conc, names = list(spec.concurrency), [w.name for w in spec.workloads]
    keep = {}
    for a in spec.profiles:
        c = np.isin(conc, a.concurrency or conc)
        w = np.isin(names, a.workloads or names)
        keep[a.label] = keep.get(a.label, np.zeros((len(conc), len(names)), bool)) | (c[:, None] & w[None, :])
    mask = np.stack([keep[labels[int(p)]] for p in bindings.profile]) if len(bindings) else np.zeros((0, len(conc), len(names)), bool)
    points = np.flatnonzero(mask.ravel()).astype(np.int64)
    cut = lambda x: int(np.searchsorted(points, x))  # noqa: E731
    kept = [g._replace(start=cut(g.start), stop=cut(g.stop)) for g in groups]
    return points, [g for g in kept if g.stop > g.start]


def plan_sweep(spec: SweepSpec) -> SweepPlan:
    """Validate every distinct binding once and lay out the config index space (plain Python)."""
    ensure_x64()
    inner = len(spec.concurrency) * len(spec.workloads)
    codes, refusals = _Codes(), _Refusals(configs_per_binding=inner)
    rows = []
    for axis in spec.profiles:
        refusals.configs_per_binding = axis.inner(spec)
        rows += _plan_profile(spec, axis, codes, refusals)
    bindings, groups = _group_by_tables(rows, inner)
    points, groups = _points(spec, codes.labels["profile"], bindings, groups)
    for wl in spec.workloads:
        codes.label("workload", wl.name)
    rates = np.array([list(r) for _, r in codes.acceptance], np.float64)
    rates_nextn = np.array([k for k, _ in codes.acceptance], np.int64)
    invalid = list(refusals.by_rule.values())
    return SweepPlan(
        spec=spec,
        labels=codes.labels,
        bindings=bindings,
        rates=rates,
        rates_nextn=rates_nextn,
        accepted_mean=acc.tail_probabilities(rates, rates_nextn)[:, 1:].sum(axis=1),
        tables=codes.tables,
        groups=groups,
        invalid=invalid,
        **_workload_arrays(spec.workloads),
        num_invalid_configs=sum(i.configs for i in invalid),
        profile_models=dict(codes.models),
        points=points,
    )
