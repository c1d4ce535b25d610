"""Sweep specs (TOML) and their lazy expansion.

A spec names axes: profiles and their tensor-parallel layouts, serving modes (aggregated, or
disaggregated x prefill : y decode workers), nextn with acceptance, scheduler settings, target
concurrency and workloads, plus an SLA and a GPU budget (format: ``docs/sweep.md``,
example: ``configs/quickstart.toml``).

:func:`plan_sweep` validates every distinct *binding* (profile deployment × mode × nextn × acceptance ×
scheduler envelope) once, in plain Python, through :func:`jaxsim.rules.validate.validate_config` /
:func:`jaxsim.deploy.binding.bind`. Invalid bindings are counted with their reasons. The valid ones form the
outer digit of a mixed-radix index (binding, concurrency, workload); :meth:`SweepPlan.inputs` decodes a
range of config indices into arrays without creating a Python object per config.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from jaxsim import acceptance as acc
from jaxsim import schema as sc
from jaxsim._jax import ensure_x64
from jaxsim.deploy.binding import bind
from jaxsim.rules.config import config_from_dict
from jaxsim.rules.validate import validate_config
from jaxsim.errors import BindingError, JaxsimError, QueryError
from jaxsim.kernels.buckets import pow2_bucket
from jaxsim.kernels.rounds import RoundTable
from jaxsim.profile.model import DATA_SOURCES
from jaxsim.profile.resolve import load_bundle, resolve_profile_dir
from jaxsim.sla import SLA
from jaxsim.sweep import evaluate as ev

__all__ = [
    "MODES", "RECORDED", "PROFILE_NEXTN", "DEFAULT_BLOCK_SIZE", "MAX_WORKLOAD_CLASSES", "SpecError", "ProfileAxis",
    "Acceptance", "Workload", "SweepSpec", "Invalid", "SweepPlan", "spec_from_dict", "load_spec", "plan_sweep",
    "trace_classes",
]

MODES = ("aggregated", "disaggregated")
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
    """One ``[[profile]]`` entry: a bundled profile name or a directory, and its TP layouts (None = all)."""

    ref: str
    tp: tuple[int, ...] | None = None
    label: str = ""


@dataclass(frozen=True)
class Acceptance:
    """One acceptance setting: ``preset`` (name), ``accepted`` (mean accepted drafts) or ``rates``."""

    kind: str
    value: Any
    label: str

    def config_fields(self) -> dict:
        """The deployment-config fields for this setting (a preset is resolved to its rates here)."""
        if self.kind == "preset":
            return {"accept_rates": [float(x) for x in acc.get_preset(self.value).conditional_rates]}
        if self.kind == "accepted":
            return {"accepted_tokens": float(self.value)}
        return {"accept_rates": [float(x) for x in self.value]}


@dataclass(frozen=True)
class Workload:
    """A request mix: classes (ISL, OSL) with probability weights (one class = fixed lengths)."""

    name: str
    isl: tuple[int, ...]
    osl: tuple[int, ...]
    weight: tuple[float, ...]

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
            if isinstance(x, bool) or not isinstance(x, (int, float)):
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
    if isinstance(v, (int, float)) and not isinstance(v, bool):
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
    if isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 1024 for x in v):
        return int(v[0]), int(v[1])
    raise doc.error(path, f"expected 'x:y' with x prefill and y decode workers (1..1024), got {v!r}")


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
    return trace_classes(tr.input_tokens, tr.output_tokens, d["bins"])


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
    if "isl" in d:
        isls, osls = d["isl"], d["osl"]
        return [Workload(name if len(isls) == len(osls) == 1 else f"{name}-{a}x{b}", (a,), (b,), (1.0,)) for a in isls for b in osls]
    if "requests" in d:
        isl, osl, w = (list(c) for c in zip(*d["requests"]))
    else:
        isl, osl, w = _trace_workload(doc, d, path)
    if len(isl) > MAX_WORKLOAD_CLASSES:
        raise doc.error(path, f"at most {MAX_WORKLOAD_CLASSES} request classes (got {len(isl)})")
    return [Workload(name, tuple(isl), tuple(osl), tuple(w))]


def _make_spec(doc: sc.Doc, path: str, d: dict) -> SweepSpec:
    workloads = tuple(w for ws in d["workload"] for w in ws)
    names = [w.name for w in workloads]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise doc.error("workload", f"workload names must be unique ({dup!r} repeats)")
    serving, spec, sch = d["serving"], d["speculation"], d["scheduler"]
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
        source=doc.source,
        base_dir=doc.context.get("base_dir"),
    )


_TOKENS = sc.Int(lo=1, limit="tokens")
_SLA_MS = sc.Field(sc.Num(finite=True, gt=0.0, limit="ms"))
_SPEC = sc.Table({
    "name": sc.Field(sc.Str()),
    "block_size": sc.Field(sc.Int(lo=1, limit="block_size")),
    "gpu_budget": sc.Field(sc.Int(lo=1, limit="gpus")),
    "kv_transfer_gbps": sc.Field(sc.Num(finite=True, gt=0.0, limit="gbps")),
    "profile": sc.Field(sc.Array(sc.Table({
        "name": sc.Field(sc.Str(), required="required (a bundled profile name or a profile directory)"),
        "tp": sc.Field(sc.Axis(sc.Int(lo=1, limit="parallel"))),
        "label": sc.Field(sc.Str()),
    }, lambda doc, path, d: ProfileAxis(d["name"], d.get("tp"), d.get("label", Path(d["name"]).name or d["name"]))),
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
    }, _workload), min_len=1, empty="give at least one [[workload]] table"), required="give at least one [[workload]] table"),
    "sla": sc.Field(sc.Table({k: sc.Field(sc.Num(finite=True, ge=0.0)) if k == "min_tokens_per_s_per_user" else _SLA_MS
                              for k in SLA.__dataclass_fields__})),
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

# integer columns of the per-binding table (one row per valid binding)
_BINDING_INT = (
    "profile", "system", "mode", "acceptance", "acceptance_id", "prefill_workers", "decode_workers", "prefill_tp", "tp",
    "gpus", "replicas", "nextn", "max_num_seqs", "prefill_max_num_seqs", "max_num_batched_tokens", "prefill_max_num_batched_tokens",
    "kv_blocks", "prefill_kv_blocks", "block_size", "max_model_len", "kv_bytes_per_token", "prefill_table",
    "decode_table", "group", "data_source",
)


@dataclass(frozen=True)
class Invalid:
    """Invalid bindings sharing one rule: how many configs they stand for, and one example."""

    rule: str
    bindings: int
    configs: int
    example: str


@dataclass(eq=False)
class SweepPlan:
    """The validated bindings of a spec and everything needed to evaluate its configs chunk by chunk.

    Config index i decodes as (binding b, concurrency c, workload w) with w fastest; bindings are
    ordered so that configs sharing tables and mode are contiguous (``groups``).
    """

    spec: SweepSpec
    labels: dict[str, list[str]]
    bindings: dict[str, np.ndarray]
    rates: np.ndarray  # [A, 5] per acceptance id
    rates_nextn: np.ndarray  # [A]
    accepted_mean: np.ndarray  # [A] expected accepted drafts per round
    link_bytes_per_s: np.ndarray  # [B]
    tables: list[RoundTable]
    groups: list[tuple[int, int, int, int, bool]]  # (first config, end config, prefill table, decode table, disagg)
    invalid: list[Invalid]
    wl_isl: np.ndarray  # [nW, W]
    wl_osl: np.ndarray
    wl_weight: np.ndarray
    wl_mean_isl: np.ndarray
    wl_mean_osl: np.ndarray
    num_invalid_configs: int = 0

    @property
    def inner(self) -> int:
        return len(self.spec.concurrency) * len(self.spec.workloads)

    @property
    def num_bindings(self) -> int:
        return int(self.bindings["tp"].shape[0])

    @property
    def num_configs(self) -> int:
        """Configs that will be evaluated (valid bindings × concurrency × workloads)."""
        return self.num_bindings * self.inner

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
        b, r = np.divmod(idx, self.inner)
        c, w = np.divmod(r, nw)
        return b, c, w

    def inputs(self, idx: np.ndarray) -> ev.ConfigInputs:
        """Numpy :class:`~jaxsim.sweep.evaluate.ConfigInputs` for config indices ``idx``."""
        b, c, w = self.decode_index(np.asarray(idx, np.int64))
        B = self.bindings
        conc = np.asarray(self.spec.concurrency, np.int64)[c]
        i64 = lambda k: B[k][b].astype(np.int64)  # noqa: E731
        return ev.ConfigInputs(
            prefill_workers=i64("prefill_workers"),
            decode_workers=i64("decode_workers"),
            prefill_gpus=i64("prefill_tp"),
            decode_gpus=i64("tp"),
            nextn=i64("nextn"),
            acceptance_id=i64("acceptance_id"),
            max_num_seqs=i64("max_num_seqs"),
            max_num_batched_tokens=i64("max_num_batched_tokens"),
            prefill_max_num_batched_tokens=i64("prefill_max_num_batched_tokens"),
            kv_blocks=i64("kv_blocks"),
            prefill_kv_blocks=i64("prefill_kv_blocks"),
            block_size=i64("block_size"),
            max_model_len=i64("max_model_len"),
            kv_bytes_per_token=i64("kv_bytes_per_token"),
            kv_transfer_bytes_per_s=self.link_bytes_per_s[b],
            concurrency=conc,
            isl=self.wl_isl[w],
            osl=self.wl_osl[w],
            weight=self.wl_weight[w],
        )

    def input_columns(self, idx: np.ndarray) -> "OrderedDict[str, np.ndarray]":
        """Per-config input columns for the results (label columns as integer codes into ``labels``)."""
        idx = np.asarray(idx, np.int64)
        b, c, w = self.decode_index(idx)
        B = self.bindings
        cols: OrderedDict[str, np.ndarray] = OrderedDict()
        cols["config_id"] = idx
        for k in ("profile", "data_source", "system", "mode"):
            cols[k] = B[k][b].astype(np.int32)
        for k in ("prefill_workers", "decode_workers", "prefill_tp", "tp", "gpus", "replicas", "nextn"):
            cols[k] = B[k][b].astype(np.int64)
        cols["acceptance"] = B["acceptance"][b].astype(np.int32)
        cols["accepted_tokens_mean"] = self.accepted_mean[B["acceptance_id"][b]]
        cols["max_num_seqs"] = B["max_num_seqs"][b].astype(np.int64)
        cols["max_num_batched_tokens"] = B["max_num_batched_tokens"][b].astype(np.int64)
        cols["concurrency_target"] = np.asarray(self.spec.concurrency, np.int64)[c]
        cols["workload"] = w.astype(np.int32)
        cols["isl_mean"] = self.wl_mean_isl[w]
        cols["osl_mean"] = self.wl_mean_osl[w]
        return cols

    def chunks(self, chunk_size: int) -> list[tuple[int, int, int]]:
        """(group, start, stop) config ranges of at most ``chunk_size``, never crossing a group."""
        out = []
        for g, (lo, hi, *_rest) in enumerate(self.groups):
            for s in range(lo, hi, chunk_size):
                out.append((g, s, min(s + chunk_size, hi)))
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
        }


def _rule(problem: str) -> str:
    head = problem.split(":", 1)[0].strip()
    return head if head and " " not in head else "binding"


def _profile_deployments(ref: str, base: Path | None):
    root = resolve_profile_dir(ref, base)
    return root, load_bundle(root)


def plan_sweep(spec: SweepSpec) -> SweepPlan:
    """Validate every distinct binding once and lay out the config index space (plain Python)."""
    ensure_x64()
    labels: dict[str, list[str]] = {"profile": [], "system": [], "mode": [], "acceptance": [], "workload": [],
                                    "data_source": list(DATA_SOURCES)}

    def code(kind: str, value: str) -> int:
        lst = labels[kind]
        if value not in lst:
            lst.append(value)
        return lst.index(value)

    for m in ("aggregated", "disaggregated"):
        code("mode", m)
    inner = len(spec.concurrency) * len(spec.workloads)
    invalid: "OrderedDict[str, list]" = OrderedDict()

    def refuse(problem: str, what: str, n_bind: int = 1) -> None:
        rule = _rule(problem)
        slot = invalid.setdefault(rule, [0, 0, f"{what}: {problem}"])
        slot[0] += n_bind
        slot[1] += n_bind * inner

    acc_rows: list[tuple] = [(0, (0.0,) * acc.MAX_DRAFT_TOKENS)]
    rows: list[dict] = []
    links: list[float] = []
    table_ids: dict[int, int] = {}
    tables: list[RoundTable] = []

    def table_index(t: RoundTable) -> int:
        key = id(t)
        if key not in table_ids:
            table_ids[key] = len(tables)
            tables.append(t)
        return table_ids[key]

    n_acc = max(len(spec.acceptance), 1)
    serve = [("aggregated", 0, 1)] if "aggregated" in spec.modes else []
    if "disaggregated" in spec.modes:
        serve += [("disaggregated", x, y) for x, y in spec.ratios]
    for pa in spec.profiles:
        plabel = code("profile", pa.label)
        try:
            root, bundle = _profile_deployments(pa.ref, spec.base_dir)
        except JaxsimError as e:
            n = len(pa.tp or (1,)) * len(serve) * len(spec.nextn) * n_acc * len(spec.max_num_seqs) * len(spec.max_num_batched_tokens)
            refuse(str(e), f"profile {pa.ref!r}", n)
            continue
        prof = bundle.profile
        tps = pa.tp if pa.tp is not None else tuple(sorted({d.tp for d in prof.deployments}))
        for tp in tps:
            deps = [d for d in prof.deployments if d.tp == tp]
            idents = list(dict.fromkeys((d.system, d.backend_version) for d in deps)) or [(prof.deployments[0].system, prof.deployments[0].backend_version)]
            for system, version in idents:
                k_profile = max((d.num_draft_tokens for d in deps if (d.system, d.backend_version) == (system, version)), default=0)
                for mode, x, y in serve:
                    for nextn in spec.nextn:
                        k = k_profile if nextn == PROFILE_NEXTN else nextn
                        accs = list(spec.acceptance) if k > 0 else [None]
                        if k > 0 and not accs:
                            refuse("acceptance-missing: nextn > 0 needs [speculation] acceptance values", f"{pa.label} tp={tp} nextn={k}",
                                   len(spec.max_num_seqs) * len(spec.max_num_batched_tokens))
                            continue
                        for a in accs:
                            for mns in spec.max_num_seqs:
                                for mbt in spec.max_num_batched_tokens:
                                    what = f"{pa.label} tp={tp} {mode}{f' {x}:{y}' if mode == 'disaggregated' else ''} nextn={k}" + (
                                        f" {a.label}" if a else "")
                                    row = _bind_row(spec, root, prof, system, version, tp, mode, x, y, k, a, mns, mbt, refuse, what)
                                    if row is None:
                                        continue
                                    b, gpus = row
                                    rates = tuple(float(v) for v in b.accept_rates)
                                    key = (k, rates)
                                    if key not in acc_rows:
                                        acc_rows.append(key)
                                    pr = b.prefill if mode == "disaggregated" else b.aggregated
                                    dr = b.decode if mode == "disaggregated" else b.aggregated
                                    if dr.kv.num_gpu_blocks is None or pr.kv.num_gpu_blocks is None:
                                        refuse("grouped-cache: the sweep needs a linear KV cache with a block count", what)
                                        continue
                                    rows.append(dict(
                                        profile=plabel, system=code("system", system), mode=code("mode", mode),
                                        acceptance=code("acceptance", a.label if a else "none"), acceptance_id=acc_rows.index(key),
                                        prefill_workers=x, decode_workers=y, prefill_tp=pr.deployment.tp, tp=dr.deployment.tp,
                                        gpus=gpus, replicas=(spec.gpu_budget // gpus) if spec.gpu_budget else 1, nextn=k,
                                        max_num_seqs=dr.max_num_seqs, prefill_max_num_seqs=pr.max_num_seqs,
                                        max_num_batched_tokens=dr.max_num_batched_tokens,
                                        prefill_max_num_batched_tokens=pr.max_num_batched_tokens,
                                        kv_blocks=dr.kv.num_gpu_blocks, prefill_kv_blocks=pr.kv.num_gpu_blocks,
                                        block_size=b.block_size, max_model_len=b.context_length,
                                        kv_bytes_per_token=pr.kv_bytes_per_token or 0,
                                        prefill_table=table_index(pr.table),
                                        decode_table=table_index(dr.table), group=0,
                                        data_source=DATA_SOURCES.index(prof.source),
                                    ))
                                    links.append(float(b.kv_transfer_bytes_per_s or 1.0))

    # order bindings so configs sharing (prefill table, decode table, mode) are contiguous
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["prefill_table"], rows[i]["decode_table"], rows[i]["mode"], i))
    rows = [rows[i] for i in order]
    links = [links[i] for i in order]
    groups: list[tuple[int, int, int, int, bool]] = []
    for i, row in enumerate(rows):
        key = (row["prefill_table"], row["decode_table"], row["mode"] == 1)
        if not groups or groups[-1][2:] != key:
            groups.append((i * inner, (i + 1) * inner, *key))
        else:
            groups[-1] = (groups[-1][0], (i + 1) * inner, *key)
        row["group"] = len(groups) - 1
    bindings = {k: np.asarray([r[k] for r in rows], dtype=np.int64) for k in _BINDING_INT}

    for wl in spec.workloads:
        code("workload", wl.name)
    wmax = max(len(w.isl) for w in spec.workloads)
    wl_isl = np.array([list(w.isl) + [w.isl[0]] * (wmax - len(w.isl)) for w in spec.workloads], np.int64)
    wl_osl = np.array([list(w.osl) + [w.osl[0]] * (wmax - len(w.osl)) for w in spec.workloads], np.int64)
    wl_w = np.array([list(w.weight) + [0.0] * (wmax - len(w.weight)) for w in spec.workloads], np.float64)
    rates = np.array([list(r) for _, r in acc_rows], np.float64)
    rates_k = np.array([k for k, _ in acc_rows], np.int64)
    inv = [Invalid(rule, n_b, n_c, ex) for rule, (n_b, n_c, ex) in invalid.items()]
    return SweepPlan(
        spec=spec,
        labels=labels,
        bindings=bindings,
        rates=rates,
        rates_nextn=rates_k,
        accepted_mean=acc.tail_probabilities(rates, rates_k)[:, 1:].sum(axis=1),
        link_bytes_per_s=np.asarray(links, np.float64),
        tables=tables,
        groups=groups,
        invalid=inv,
        wl_isl=wl_isl,
        wl_osl=wl_osl,
        wl_weight=wl_w,
        wl_mean_isl=np.array([w.mean_isl for w in spec.workloads]),
        wl_mean_osl=np.array([w.mean_osl for w in spec.workloads]),
        num_invalid_configs=sum(i.configs for i in inv),
    )


def _bind_row(spec, root, prof, system, version, tp, mode, x, y, k, a, mns, mbt, refuse, what):
    """Validate one binding with jaxsim.rules.validate; (Binding, GPUs per serving unit) or None (refused)."""
    gpus = tp if mode == "aggregated" else (x + y) * tp
    if spec.gpu_budget is not None and gpus > spec.gpu_budget:
        refuse(f"gpu-budget: one serving unit needs {gpus} GPUs, more than the budget of {spec.gpu_budget}", what)
        return None
    sched: dict = {"tp": tp}
    if mns is not None:
        sched["max_num_seqs"] = mns
    if mbt is not None:
        sched["max_num_batched_tokens"] = mbt
    if mode == "aggregated":
        roles = {"aggregated": sched}
    else:
        pre = {"tp": tp, "replicas": x}
        if mbt is not None:
            pre["max_num_batched_tokens"] = mbt
        roles = {"prefill": pre, "decode": {**sched, "replicas": y}}
    obj: dict = {
        "model": prof.model, "system": system, "profile": str(root), "mode": mode, "nextn": k,
        "block_size": spec.block_size, "roles": roles,
    }
    if version is not None:
        obj["backend_version"] = version
    if a is not None:
        obj.update(a.config_fields())
    if spec.kv_transfer_gbps is not None and mode == "disaggregated":
        obj["kv_transfer_gbps"] = spec.kv_transfer_gbps
    try:
        cfg = config_from_dict(obj, source=f"{spec.source} [{what}]")
        problems = validate_config(cfg)
        if problems:
            refuse(problems[0], what)
            return None
        return bind(cfg), gpus
    except (JaxsimError, ValueError, QueryError) as e:
        refuse(str(e), what)
        return None
