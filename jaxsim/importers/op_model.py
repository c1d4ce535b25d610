"""MODELLED profiles from NVIDIA aiconfigurator's op-level forward-pass model (optional extra ``opmodel``).

aiconfigurator-core (Apache-2.0) prices one engine iteration from op-level silicon data (GEMM, attention,
communication tables measured per GPU) for ~100 model configs on ~15 GPUs. This importer asks it for the
latency of every table row of a schema-7 profile and writes the result as a ``modelled`` profile:

* decode: a curve for every batch 1..``max_num_seqs`` over ONE shared total-KV grid (1..16, then 1/8-octave
  steps; a shared grid keeps the compiled lookup small), each curve from k = b to min(b x (max_model_len - 1),
  pool); row (b, k) = the op model's decode step of ``b`` requests at the mean past KV s = k / b
  (``decode_step_latency(b, s, osl=0)``, attention over s + 1 positions), linear in s between the contexts
  the curve is priced at (:func:`decode_curve_ms`: every integer s up to 16, so a fractional s there is
  interpolated between its neighbouring integers as :func:`at_mean_context` does, then 1/8-octave steps;
  within 0.4 % of pricing every row's two integer neighbours, with about a third of the op-model queries);
* prefill: every batch 1..``max_prefill_batch``, each over a per-request new-token grid (1..16, then 1/8-octave
  steps to ``max_num_batched_tokens / b``) x cached-prefix grid (0, then 1/2-octave steps from 16 to
  ``max_model_len``); row (b, b x t, b x p) = ``predict_prefill_latency(b, isl=t + p, prefix=p)`` (chunked
  prefill with prefix reads);
* speculative rounds (EAGLE-3, ``--nextn K --draft-config``): the op model prices multi-token prediction
  natively but has no EAGLE-3 path (its ``compile`` takes ``nextn``, no speculation kind), so a round at (b, k)
  is composed from op-model pieces (:func:`round_latency_ms`): the target's verify pass priced the way the op
  model prices its own MTP verify (one decode step of b x (K+1) query tokens at mean past KV s, without MTP
  layers) plus K decode steps of the draft model (its config.json, at the target's TP) at batch b and context
  s. MTP rounds are refused: the FPM schema has no MTP round identity;
* resources: KV bytes/token and the KV pool at ``gpu_memory_utilization`` from the op model's memory
  estimate (weights, activations and runtime overhead subtracted), stated as modelled.

Everything here is lazily imported: jaxsim works without the extra, and this module's entry points raise a
one-line install hint when aiconfigurator-core is missing.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import jaxsim
from jaxsim import limits
from jaxsim.errors import JaxsimError
from jaxsim.importers.fpm_log import (
    BinnedRows,
    merge_columns,
    table_columns,
    write_profile_dir,
)
from jaxsim.importers.kv_geometry import KvGeometry, kv_geometry, layer_kinds
from jaxsim.profile.memory_breakdown import MEMORY_NAME, memory_breakdown_doc
from jaxsim.profile.model import (
    FMHA_QUANT_MODES,
    GEMM_QUANT_MODES,
    KV_CACHE_DTYPES,
    MOE_QUANT_MODES,
    Deployment,
    ExecutionProfile,
    ModelProfile,
    Resources,
    RuntimeMemory,
)
from jaxsim.profile.table import AR_POLICY, SD_POLICY
from jaxsim.rules.memory_fit import memory_fit_problems, request_fit_problems

INSTALL_HINT = "aiconfigurator-core is not installed: pip install -e '.[opmodel]' (or pip install aiconfigurator-core==0.12.0)"
PINNED_VERSION = "0.12.0"
BACKEND = "vllm"
DATA_SOURCE = "modelled"

DENSE_TOKENS = 16  # every integer up to here on the decode total-KV and prefill new-token grids
DECODE_KV_STEPS_PER_OCTAVE = 8
DECODE_CONTEXT_STEPS_PER_OCTAVE = 8  # the mean past contexts each decode curve is priced at (then linear in between)
PREFILL_TOKEN_STEPS_PER_OCTAVE = 8
PREFILL_PREFIX_STEPS_PER_OCTAVE = 2
MIN_PREFIX_TOKENS = 16


PRECISION_FALLBACK = {"fp8_block": "fp8"}
"""``--precision-fallback``: a block-quantised MoE precision the op model cannot price at a layout (its quant block
does not divide the per-rank MoE width) -> the per-tensor mode of the same width whose silicon data it prices the
MoE GEMMs with instead (the other precisions stay the checkpoint's). aiconfigurator's accuracy harness prices the
silicon sample's rows this way: with their ``fp8`` labels."""
UNPRICEABLE_BLOCK = "Invalid quantized MoE configuration"


BLOCK_GEMM_DATA = ("per-tensor", "collected")
"""``--block-gemm-data``: which of the op model's GEMM silicon tables prices the dense GEMMs of a block-scaled FP8
checkpoint (``fp8_block`` GEMM ops: attention projections and other dense layers; the MoE experts keep their own
fp8_block MoE data, which is not host-bound). ``per-tensor`` (the default): its per-tensor fp8 GEMM table.
``collected``: its fp8_block GEMM table, as aiconfigurator prices them.

Why per-tensor: the fp8_block GEMM tables of aiconfigurator-core 0.12.0 are host-bound at decode sizes. The smallest
GEMMs (m <= 16, n, k <= 1024) take 55 us on h100_sxm/h200_sxm and 150-250 us on Blackwell against 4-7 us per-tensor
(a 32 x 32 x 32 GEMM: 0.16 ms on b200_sxm), while vLLM runs decode passes in CUDA graphs, where no host cost is paid per
kernel. Where the block tables are kernel-bound (>= 1e12 FLOP) the two tables agree (median ratio 0.99 on b200_sxm and
h200_sxm, p10-p90 0.8-1.2). On the silicon sample's rows of the GPUs the overhead is fitted on (h100_sxm, h200_sxm;
516 rows) jaxsim's TPOT median / p90 abs error is 11.1 / 31.2 % with per-tensor data and 10.3 / 42.4 % with the
collected data (docs/accuracy.md). ``scripts/opmodel_fp8_block.py`` shows the data."""
DEFAULT_BLOCK_GEMM_DATA = BLOCK_GEMM_DATA[0]
BLOCK_GEMM_MODE, BLOCK_GEMM_PRICED_AS = "fp8_block", "fp8"


class OpModelError(JaxsimError):
    """Bad input for the op-model importer (one line, exit 2)."""


def _aic():
    """Import aiconfigurator-core (the pinned version) or raise the install hint."""
    try:
        import aiconfigurator_core  # noqa: F401
        from aiconfigurator_core.sdk import engine, memory, perf_database
    except ImportError:
        raise OpModelError(INSTALL_HINT) from None
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    return engine, memory, perf_database


def aic_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aiconfigurator-core")
    except PackageNotFoundError:
        raise OpModelError(INSTALL_HINT) from None


# ----------------------------------------------------------------------------------------------------
# catalogue


def _configs_dir() -> Path:
    _aic()
    import aiconfigurator_core

    return Path(aiconfigurator_core.__file__).parent / "model_configs"


def known_models() -> tuple[str, ...]:
    """Model ids whose config.json ships with aiconfigurator-core (``Org/Name``)."""
    names = []
    for p in _configs_dir().glob("*_config.json"):
        stem = p.name[: -len("_config.json")]
        if stem.endswith("_hf_quant"):
            continue
        names.append(stem.replace("--", "/", 1))
    return tuple(sorted(names))


def known_systems() -> tuple[str, ...]:
    """Systems with op-level data for the vLLM backend."""
    import aiconfigurator_core

    data = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    return tuple(sorted(p.name for p in data.iterdir() if (p / "gemm" / BACKEND).is_dir()))


def _model_config(model: str) -> tuple[dict, Path]:
    path = _configs_dir() / f"{model.replace('/', '--')}_config.json"
    if "/" not in model or not path.is_file():
        close = [m for m in known_models() if model.split("/")[-1].lower() in m.lower()][:5]
        hint = f" (did you mean {', '.join(close)}?)" if close else f" ({len(known_models())} known; see `jaxsim import op-model --list-models`)"
        raise OpModelError(f"unknown model {model!r}: aiconfigurator-core {aic_version()} ships no config for it{hint}")
    return json.loads(path.read_text(encoding="utf-8")), path


def _text_config(cfg: dict) -> dict:
    return cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg


def _resolve_version(system: str, backend_version: str | None) -> str:
    _, _, perf_database = _aic()
    if system not in known_systems():
        raise OpModelError(f"unknown system {system!r}: no op-level vLLM data (known: {', '.join(known_systems())})")
    slots = perf_database.get_version_slots(system, BACKEND)
    allowed = {v for v in (slots or {}).values() if v}
    requested = backend_version or "current"
    if requested in ("current", "previous", "next") and requested in (slots or {}) and slots[requested]:
        return str(slots[requested])
    if requested not in allowed:
        raise OpModelError(
            f"unknown backend version {requested!r} for {system}/vllm: the op model has {', '.join(sorted(allowed)) or 'none'}"
        )
    return requested


# ----------------------------------------------------------------------------------------------------
# grids


def _geometric(lo: int, hi: int, per_octave: int) -> list[int]:
    """Integers lo, lo*2^(1/n), ... <= hi (rounded, unique), always ending on hi."""
    if hi < lo:
        return []
    out, x = [], float(lo)
    ratio = 2.0 ** (1.0 / per_octave)
    while x < hi:
        out.append(int(round(x)))
        x *= ratio
    out.append(hi)
    return sorted(set(out))


def _dense_then_geometric(hi: int, per_octave: int) -> list[int]:
    dense = list(range(1, min(DENSE_TOKENS, hi) + 1))
    return sorted(set(dense + _geometric(DENSE_TOKENS, hi, per_octave))) if hi > DENSE_TOKENS else dense


def decode_kv_grid(top: int) -> np.ndarray:
    """The total-KV grid every decode curve shares: 1..16, then 1/8-octave steps, ending on ``top``.

    One grid for all batches keeps the compiled lookup small (its pieces are the union of the curves' KV
    values); a curve of batch b holds the grid values in [b, min(b x (max_model_len - 1), pool)].
    """
    return np.array(_dense_then_geometric(max(1, top), DECODE_KV_STEPS_PER_OCTAVE), np.int64)


def decode_curve_kv(grid: np.ndarray, batch: int, cap_per_request: int, pool: int) -> np.ndarray:
    """The grid values one batch's decode curve covers (at least one past token per request)."""
    return grid[(grid >= batch) & (grid <= min(batch * cap_per_request, pool))]


def prefill_token_grid(cap: int) -> np.ndarray:
    """Per-request new tokens of one prefill batch: 1..16, then 1/8-octave steps, ending on ``cap``."""
    return np.array(_dense_then_geometric(max(1, cap), PREFILL_TOKEN_STEPS_PER_OCTAVE), np.int64)


def prefill_prefix_grid(cap: int) -> np.ndarray:
    return np.array([0] + _geometric(MIN_PREFIX_TOKENS, cap, PREFILL_PREFIX_STEPS_PER_OCTAVE), np.int64)


# ----------------------------------------------------------------------------------------------------
# request and engine


@dataclass(frozen=True)
class ParallelLayout:
    """One parallel layout to price: attention TP (and attention DP) x MoE TP x MoE EP.

    ``moe_tp`` None: the MoE width ``tp x dp`` divided by ``moe_ep`` (``tp4`` = TP4 with moe_tp 4;
    ``tp4:ep4`` = TEP4, moe_tp 1 x moe_ep 4). Dense models: moe_tp 1 and moe_ep 1 whatever is given.
    """

    tp: int
    moe_ep: int = 1
    moe_tp: int | None = None
    dp: int = 1

    def describe(self) -> str:
        out = f"tp{self.tp}" + (f":dp{self.dp}" if self.dp != 1 else "") + (f":ep{self.moe_ep}" if self.moe_ep != 1 else "")
        return out + (f":moetp{self.moe_tp}" if self.moe_tp is not None and self.moe_tp != self.tp * self.dp // self.moe_ep else "")


@dataclass(frozen=True)
class OpModelRequest:
    """Everything one import needs (CLI options, validated by :func:`resolve_request`).

    The layouts priced are one pure-TP layout per ``tp`` then ``layouts`` (``--layout``), in that order.
    """

    model: str
    system: str
    tp: tuple[int, ...]
    backend_version: str | None = None
    kv_cache_dtype: str | None = None
    gemm_quant_mode: str | None = None
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_prefill_batch: int = 16
    max_model_len: int | None = None
    num_draft_tokens: int = 0
    draft_config: Path | None = None
    moe_quant_mode: str | None = None
    layouts: tuple[ParallelLayout, ...] = ()
    precision_fallback: bool = False  # --precision-fallback: see PRECISION_FALLBACK
    block_gemm_data: str = DEFAULT_BLOCK_GEMM_DATA  # --block-gemm-data: see BLOCK_GEMM_DATA

    @property
    def all_layouts(self) -> tuple[ParallelLayout, ...]:
        return tuple(dict.fromkeys(tuple(ParallelLayout(t) for t in self.tp) + tuple(self.layouts)))


@dataclass(frozen=True)
class Layout:
    """A validated layout: the deployment's parallel identity (moe_tp/moe_ep as the profile records them)."""

    tp: int
    moe_tp: int
    moe_ep: int
    dp: int = 1

    def describe(self) -> str:
        return f"tp={self.tp}" + (f" dp={self.dp}" if self.dp != 1 else "") + f" moe_tp={self.moe_tp} moe_ep={self.moe_ep}"


@dataclass(frozen=True)
class ResolvedRequest:
    req: OpModelRequest
    backend_version: str
    config: dict
    config_path: Path
    config_sha256: str
    architecture: str
    context_length: int
    max_model_len: int
    num_experts: int
    draft_dir: Path | None = None
    draft_name: str | None = None
    draft_sha1: str | None = None
    layouts: tuple[Layout, ...] = ()
    checkpoint_modes: dict = field(default_factory=dict)


def resolve_request(req: OpModelRequest) -> ResolvedRequest:
    """Validate the request against the op model's catalogue; OpModelError (one line) on bad input."""
    _aic()
    cfg, path = _model_config(req.model)
    version = _resolve_version(req.system, req.backend_version)
    text = _text_config(cfg)
    arch = (cfg.get("architectures") or ["unknown"])[0]
    n_exp = int(text.get("num_experts") or text.get("num_local_experts") or text.get("n_routed_experts") or 0)
    layouts = _resolve_layouts(req, text, n_exp)
    _check_options(req)
    ctx = int(text.get("max_position_embeddings") or cfg.get("max_position_embeddings") or 0)
    if ctx < 1:
        raise OpModelError(f"{path.name}: no max_position_embeddings; pass --max-model-len")
    mml = int(req.max_model_len or ctx)
    if not 2 <= mml <= ctx:
        raise OpModelError(f"--max-model-len must be in [2, {ctx}] ({req.model}'s max_position_embeddings; got {mml})")
    modes = checkpoint_modes(req.model)
    _check_quant(req, modes, n_exp)
    draft_dir, draft_name, draft_sha1 = _resolve_draft(req, cfg)
    return ResolvedRequest(
        req, version, cfg, path, hashlib.sha256(path.read_bytes()).hexdigest(), arch, ctx, mml, n_exp,
        draft_dir, draft_name, draft_sha1, layouts, modes,
    )


def _resolve_layouts(req: OpModelRequest, text: dict, n_exp: int) -> tuple[Layout, ...]:
    """Each requested layout checked and resolved (moe_tp/moe_ep as the deployment records them)."""
    heads = int(text.get("num_attention_heads") or 0)
    kv_heads = int(text.get("num_key_value_heads") or heads or 0)
    if not req.all_layouts:
        raise OpModelError("--tp: give at least one tensor-parallel size (or --layout)")
    out: list[Layout] = []
    for lay in req.all_layouts:
        tp, where = lay.tp, f"--layout {lay.describe()}" if lay not in [ParallelLayout(t) for t in req.tp] else f"--tp {lay.tp}"
        if tp < 1 or lay.dp < 1 or lay.moe_ep < 1 or (lay.moe_tp is not None and lay.moe_tp < 1):
            raise OpModelError(f"{where}: parallel sizes must be positive")
        if heads and heads % tp:
            raise OpModelError(f"--tp {tp} does not divide {req.model}'s {heads} attention heads")
        if kv_heads and kv_heads % tp and tp % kv_heads:
            raise OpModelError(f"--tp {tp} does not divide {req.model}'s {kv_heads} KV heads (nor is a multiple of them)")
        width = tp * lay.dp
        if lay.dp != 1 and not n_exp:
            raise OpModelError(f"{where}: attention data parallelism (dp={lay.dp}) applies to MoE models ({req.model} is dense: "
                               "its DP ranks are independent engines; import TP and serve replicas)")
        if lay.dp != 1 and req.num_draft_tokens:
            raise OpModelError(f"{where}: speculative rounds (--nextn) need DP1 (the FPM speculative-round identity is pure TP)")
        if not n_exp:
            if lay.moe_ep != 1 or lay.moe_tp not in (None, 1, tp):
                raise OpModelError(f"{where}: {req.model} is dense (no experts): moe_ep/moe_tp apply to MoE models only")
            out.append(Layout(tp, 1, 1))
            continue
        if width % lay.moe_ep:
            raise OpModelError(f"{where}: moe_ep {lay.moe_ep} does not divide the MoE width tp x dp = {width}")
        moe_tp = width // lay.moe_ep if lay.moe_tp is None else lay.moe_tp
        if moe_tp * lay.moe_ep != width:
            raise OpModelError(f"{where}: moe_tp {moe_tp} x moe_ep {lay.moe_ep} = {moe_tp * lay.moe_ep} must equal tp x dp = "
                               f"{width} (the op model's parallelism rule)")
        if n_exp % lay.moe_ep:
            raise OpModelError(f"{where}: moe_ep {lay.moe_ep} does not divide {req.model}'s {n_exp} experts")
        if lay.dp != 1 and not (moe_tp == 1 and lay.moe_ep == width):
            raise OpModelError(f"{where} (tp={tp} dp={lay.dp} moe_tp={moe_tp} moe_ep={lay.moe_ep}): attention-DP layouts are "
                               f"imported with the experts spread over every rank (moe_tp 1, moe_ep = tp x dp = {width}), e.g. "
                               f"tp{tp}:dp{lay.dp}:ep{width}")
        if lay.dp == 1 and not (moe_tp == tp and lay.moe_ep == 1) and not (moe_tp == 1 and lay.moe_ep == tp):
            raise OpModelError(f"{where} (tp={tp} moe_tp={moe_tp} moe_ep={lay.moe_ep}): FPM profiles record MoE layouts TP "
                               "(moe_tp = tp), TEP (moe_tp 1, moe_ep = tp) or, with attention DP, moe_tp 1 and moe_ep = tp x dp only")
        out.append(Layout(tp, moe_tp, lay.moe_ep, lay.dp))
    return tuple(dict.fromkeys(out))


def _check_options(req: OpModelRequest) -> None:
    """Precision names, the memory fraction and the scheduler envelope (bounded: docs/limits.md)."""
    for opt, v, names in (("--gemm-quant-mode", req.gemm_quant_mode, GEMM_QUANT_MODES),
                          ("--moe-quant-mode", req.moe_quant_mode, MOE_QUANT_MODES),
                          ("--kv-cache-dtype", req.kv_cache_dtype, KV_CACHE_DTYPES)):
        if v is not None and v not in names:
            raise OpModelError(f"{opt} {v!r}: expected one of {', '.join(names)}")
    if req.block_gemm_data not in BLOCK_GEMM_DATA:
        raise OpModelError(f"--block-gemm-data {req.block_gemm_data!r}: expected one of {', '.join(BLOCK_GEMM_DATA)}")
    if not 0.0 < req.gpu_memory_utilization <= 1.0:
        raise OpModelError(f"--gpu-memory-utilization must be in (0, 1] (got {req.gpu_memory_utilization})")
    for name, v, kind in (("--max-num-seqs", req.max_num_seqs, "op_model_seqs"),
                          ("--max-num-batched-tokens", req.max_num_batched_tokens, "tokens"),
                          ("--max-prefill-batch", req.max_prefill_batch, "op_model_prefill_batch")):
        msg = limits.problem(kind, v)
        if msg is not None:
            raise OpModelError(f"{name} {msg} (docs/limits.md: {limits.LIMITS[kind].what})")


def checkpoint_modes(model: str) -> dict[str, str]:
    """The checkpoint's own precisions as the op model reads them from its config (no mode forced):
    gemm_quant_mode, moe_quant_mode, kv_cache_dtype."""
    _aic()
    from aiconfigurator_core.sdk.config_builders import build_model_config
    from aiconfigurator_core.sdk.models import get_model

    try:
        m = get_model(model, build_model_config(1, 1, 1, 1, 1), BACKEND)
    except Exception as e:  # noqa: BLE001 - the op model's own refusal, one line
        raise OpModelError(f"{model}: the op model cannot read its checkpoint ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    mc = m.config
    moe = getattr(mc, "moe_quant_mode", None)
    return {"gemm_quant_mode": mc.gemm_quant_mode.name, "moe_quant_mode": moe.name if moe is not None else "bfloat16",
            "kv_cache_dtype": mc.kvcache_quant_mode.name}


def _check_quant(req: OpModelRequest, modes: dict[str, str], n_exp: int) -> None:
    """A forced precision must be one the checkpoint can be served in: its own, or, for weights the checkpoint
    keeps in bfloat16, any mode (a quantised version of the same weights, priced by the op model)."""
    if req.moe_quant_mode is not None and not n_exp:
        raise OpModelError(f"--moe-quant-mode {req.moe_quant_mode}: {req.model} is dense (no experts)")
    for opt, key, want in (("--gemm-quant-mode", "gemm_quant_mode", req.gemm_quant_mode),
                           ("--moe-quant-mode", "moe_quant_mode", req.moe_quant_mode)):
        own = modes[key]
        if want is None or want == own or own == "bfloat16":
            continue
        stem = req.model.split("/")[-1].lower()
        siblings = [m for m in known_models() if m != req.model and stem in m.lower()][:3]
        hint = f"; quantised checkpoints the op model ships: {', '.join(siblings)}" if siblings else ""
        raise OpModelError(f"{opt} {want}: {req.model}'s checkpoint is quantised {own} ({key.replace('_quant_mode', '')} "
                           f"weights); it has no {want} weights (use its own mode, the default{hint})")


def _resolve_draft(req: OpModelRequest, cfg: dict) -> tuple[Path | None, str | None, str | None]:
    if req.num_draft_tokens:
        if not 1 <= req.num_draft_tokens <= 5:
            raise OpModelError(f"--nextn must be in 1..5 (got {req.num_draft_tokens})")
        if req.draft_config is None and not mtp_layers(cfg):
            raise OpModelError(
                f"--nextn {req.num_draft_tokens}: {req.model} has no multi-token-prediction layers "
                "(num_nextn_predict_layers / mtp_num_hidden_layers = 0) for the op model to price; for EAGLE-3 pass the "
                "draft model's config.json with --draft-config"
            )
        if req.draft_config is not None:
            return _draft(req.draft_config)
    elif req.draft_config is not None:
        raise OpModelError("--draft-config needs --nextn K (draft tokens per round, 1..5)")
    return None, None, None


def mtp_layers(cfg: dict) -> int:
    """Multi-token-prediction layers the checkpoint ships (0: none; the op model then cannot price MTP)."""
    text = _text_config(cfg)
    return int(text.get("num_nextn_predict_layers") or text.get("mtp_num_hidden_layers") or
               cfg.get("num_nextn_predict_layers") or cfg.get("mtp_num_hidden_layers") or 0)


def _draft(path: Path) -> tuple[Path, str, str]:
    p = Path(path)
    f = p / "config.json" if p.is_dir() else p
    try:
        raw = f.read_bytes()
        cfg = json.loads(raw)
    except OSError as e:
        raise OpModelError(f"{f}: cannot read the draft config: {e.strerror or e}") from None
    except ValueError as e:
        raise OpModelError(f"{f}: not JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(cfg, dict) or not cfg.get("architectures"):
        raise OpModelError(f"{f}: not a Hugging Face config.json (no architectures)")
    d = Path(tempfile.mkdtemp(prefix="jaxsim-draft-"))  # private (0700); removed when the process exits
    atexit.register(shutil.rmtree, d, True)
    (d / "config.json").write_bytes(raw)
    return d, str(cfg.get("_name_or_path") or f.parent.name or f.stem), hashlib.sha1(raw).hexdigest()


class Engine:
    """One compiled op-model engine (model, system, version, parallel layout, precisions)."""

    def __init__(self, model_path: str, system: str, version: str, tp: int, *, gemm: str | None, kv: str | None,
                 fmha: str | None, nextn: int = 0, moe_tp: int | None = None, moe_ep: int = 1, moe: str | None = None, dp: int = 1,
                 block_gemm_data: str = DEFAULT_BLOCK_GEMM_DATA):
        engine, _, perf_database = _aic()
        from aiconfigurator_core.sdk.config_builders import (
            apply_nextn,
            build_model_config,
        )
        from aiconfigurator_core.sdk.models import get_model

        moe_tp = tp if moe_tp is None else moe_tp
        cfg = build_model_config(tp_size=tp, pp_size=1, attention_dp_size=dp, moe_tp_size=moe_tp, moe_ep_size=moe_ep,
                                 gemm_quant_mode=gemm, kvcache_quant_mode=kv, fmha_quant_mode=fmha, moe_quant_mode=moe)
        apply_nextn(cfg, nextn)
        try:
            self.model = get_model(model_path, cfg, BACKEND)
        except AssertionError as e:
            raise OpModelError(f"{model_path} at tp={tp}" + (f" dp={dp}" if dp != 1 else "") + f" moe_tp={moe_tp} moe_ep={moe_ep}: "
                               "the op model refuses it: "
                               f"{' '.join(str(e).split())}") from None
        database = engine._maybe_load_database(system, BACKEND, version, None)
        if database is None:
            raise OpModelError(f"{system}/vllm/{version}: the op model's database did not load")
        spec = engine.build_engine_spec_json(self.model, model_path=model_path, system=system, backend=BACKEND,
                                             backend_version=version, kv_block_size=None, systems_path=None,
                                             nextn=cfg.nextn, database=database)
        self.block_gemms_repriced = 0
        if block_gemm_data == "per-tensor":
            spec, self.block_gemms_repriced = price_block_gemms_per_tensor(spec)
        import aiconfigurator_core

        self.nextn = int(nextn)
        self.handle = engine.EngineHandle(bytes(aiconfigurator_core.engine_spec_bincode_from_json(spec)))
        mc = self.model.config
        self.gemm = mc.gemm_quant_mode.name
        self.kv = mc.kvcache_quant_mode.name
        self.fmha = mc.fmha_quant_mode.name
        self.moe = mc.moe_quant_mode.name if getattr(mc, "moe_quant_mode", None) is not None else "bfloat16"
        self.comm = mc.comm_quant_mode.name if getattr(mc, "comm_quant_mode", None) is not None else "half"

    def decode_ms(self, batch: int, context: int) -> float:
        """One decode step: ``batch`` requests each with ``context`` past tokens."""
        return float(self.handle.decode_step_latency(int(batch), int(context), 0))

    def prefill_ms(self, batch: int, new_tokens: int, prefix: int) -> float:
        """One prefill pass: ``batch`` requests each with ``new_tokens`` new and ``prefix`` cached tokens."""
        return float(self.handle.predict_prefill_latency(int(batch), int(new_tokens + prefix), int(prefix)))


def price_block_gemms_per_tensor(spec_json: str) -> tuple[str, int]:
    """An op-model engine spec whose dense ``fp8_block`` GEMM ops are priced from the per-tensor ``fp8`` GEMM table
    (:data:`BLOCK_GEMM_DATA`), and how many op kinds were changed. Only ``Gemm`` ops: attention, MoE and
    communication ops keep their own precisions and tables."""
    spec = json.loads(spec_json)
    n = 0
    for key in ("context_ops", "generation_ops"):
        for op in spec.get(key, ()):
            gemm = op.get("Gemm") if isinstance(op, dict) else None
            if gemm is not None and gemm.get("quant_mode") == BLOCK_GEMM_MODE:
                gemm["quant_mode"] = BLOCK_GEMM_PRICED_AS
                n += 1
    return (json.dumps(spec) if n else spec_json), n


# ----------------------------------------------------------------------------------------------------
# one cell


@dataclass(frozen=True, eq=False)
class CellResult:
    """One priced layout: its table rows, KV geometry and modelled memory (rank-local)."""

    layout: Layout
    rows: BinnedRows
    latency_decode: np.ndarray
    geometry: KvGeometry
    resources: Resources
    memory: dict  # the op model's non-KV breakdown: weights, activations, runtime and comm overhead (bytes)
    gpu_memory_bytes: int
    engine_modes: dict
    seconds: float
    queries: int
    fallback: str = ""  # the precision fallback taken for this layout (empty: none), as provenance states it
    block_gemm_note: str = ""  # --block-gemm-data per-tensor, where it changed an op (empty: none)

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def pool_bytes(self) -> int:
        return self.resources.runtime_memory.kv_cache_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes per token of the full-attention layers (a linear cache's kv_bytes_per_token)."""
        return self.geometry.full_bytes_per_token

    @property
    def pool_tokens(self) -> int:
        """Full-attention tokens the pool holds when nothing else is in it (a linear cache's token count)."""
        return self.pool_bytes // max(self.geometry.full_bytes_per_token, 1)


def _memory(r: ResolvedRequest, lay: Layout, eng: Engine) -> tuple[int, dict, int]:
    """(KV pool bytes, non-KV breakdown, GPU memory bytes) from the op model's memory estimate."""
    _, memory, _ = _aic()
    req = r.req
    try:
        est = memory.estimate_kv_cache(
            req.model, req.system, BACKEND, r.backend_version, max_num_tokens=req.max_num_batched_tokens,
            max_batch_size=req.max_num_seqs, memory_fraction_kind="of_total",
            memory_fraction_value=req.gpu_memory_utilization, tp_size=lay.tp, attention_dp_size=lay.dp, moe_tp_size=lay.moe_tp,
            moe_ep_size=lay.moe_ep,
            gemm_quant_mode=eng.gemm, kvcache_quant_mode=eng.kv, fmha_quant_mode=eng.fmha,
            moe_quant_mode=eng.moe if r.num_experts else None, nextn=eng.nextn,
        )
    except ValueError as e:
        raise OpModelError(f"{req.model} {lay.describe()} on {req.system}: no KV pool: {str(e).splitlines()[0]}") from None
    pool = int(est["total_kv_size_bytes"])
    if pool < 1:
        raise OpModelError(f"{req.model} {lay.describe()} on {req.system}: weights leave no KV pool at "
                           f"gpu_memory_utilization {req.gpu_memory_utilization:g}")
    return pool, {k: int(v) for k, v in (est.get("memory_breakdown") or {}).items()}, int(est["total_gpu_capacity_bytes"])


def price_cell(r: ResolvedRequest, lay: Layout) -> CellResult:
    """Price every table row of one (model, system, layout) cell with the op model; OpModelError (one line) when
    the op model cannot price this configuration (missing silicon data, unsupported precision, ...) or its
    modelled memory is physically impossible."""
    req = r.req
    try:
        return _price_cell(r, lay)
    except (OpModelError, JaxsimError):
        raise
    except Exception as e:  # the op model's own errors (PerfDataNotAvailableError, ValueError, RuntimeError, ...)
        msg = " ".join(str(e).split())
        msg = msg if len(msg) <= 300 else msg[:297] + "..."
        moe = req.moe_quant_mode or r.checkpoint_modes.get("moe_quant_mode", "bfloat16")
        fallback = PRECISION_FALLBACK.get(moe) if UNPRICEABLE_BLOCK in msg else None
        if fallback is not None and req.precision_fallback:
            return _price_with_fallback(r, lay, moe, fallback, msg)
        hint = (f"; --precision-fallback prices the {moe} MoE weights with the op model's per-tensor {fallback} data instead"
                if fallback is not None else "")
        raise OpModelError(
            f"{req.model} {lay.describe()} on {req.system}/vllm/{r.backend_version}: the op model cannot price this "
            f"configuration ({type(e).__name__}: {msg}){hint}"
        ) from None


def _price_with_fallback(r: ResolvedRequest, lay: Layout, moe: str, fallback: str, why: str) -> CellResult:
    """One layout priced with the MoE precision ``fallback`` in place of ``moe`` (``--precision-fallback``)."""
    from dataclasses import replace

    r2 = replace(r, req=replace(r.req, moe_quant_mode=fallback, precision_fallback=False))
    cell = price_cell(r2, lay)
    note = (f"{lay.describe()}: the checkpoint's {moe} MoE weights cannot be priced by the op model at this layout ({why}); "
            f"its MoE GEMMs are priced with the op model's per-tensor {fallback} data instead (--precision-fallback; the "
            f"deployment records moe_quant_mode {fallback}, what was priced; the other precisions are the checkpoint's)")
    return replace(cell, fallback=note)


def _resources(r: ResolvedRequest, geo: KvGeometry, pool_bytes: int, mem: dict) -> Resources:
    """The deployment's modelled resources: the scheduler envelope, the KV layout by attention kind and the pool."""
    req = r.req
    breakdown = ", ".join(f"{k} {v}" for k, v in mem.items())
    memory = RuntimeMemory(
        kv_cache_bytes=pool_bytes, gpu_memory_utilization=req.gpu_memory_utilization, max_model_len=r.max_model_len,
        provenance=f"MODELLED KV pool (not observed): aiconfigurator-core {aic_version()} memory estimate at "
        f"gpu_memory_utilization {req.gpu_memory_utilization:g} of {req.system}: {pool_bytes} B (rank-local); {breakdown}",
    )
    prov = (f"MODELLED: scheduler envelope max_num_batched_tokens={req.max_num_batched_tokens}, max_num_seqs={req.max_num_seqs} "
            f"as requested; KV geometry from aiconfigurator-core {aic_version()}'s model: {geo.describe()}")
    if geo.linear:
        return Resources("linear", req.max_num_batched_tokens, req.max_num_seqs, prov, memory, geo.full_bytes_per_token)
    return Resources("grouped", req.max_num_batched_tokens, req.max_num_seqs, prov, memory,
                     cache_groups=geo.cache_groups(r.max_model_len))


def _price_cell(r: ResolvedRequest, lay: Layout) -> CellResult:
    t0 = time.perf_counter()
    req = r.req
    mtp = bool(req.num_draft_tokens) and r.draft_dir is None
    eng = Engine(req.model, req.system, r.backend_version, lay.tp, gemm=req.gemm_quant_mode, kv=req.kv_cache_dtype, fmha=None,
                 nextn=req.num_draft_tokens if mtp else 0, moe_tp=lay.moe_tp, moe_ep=lay.moe_ep, moe=req.moe_quant_mode, dp=lay.dp,
                 block_gemm_data=req.block_gemm_data)
    where = f"{req.model} {lay.describe()} on {req.system}"
    geo = kv_geometry(eng.model.get_kvcache_bytes_per_sequence, what=where, layers=layer_kinds(r.config))
    if geo.full_bytes_per_token < 1:
        raise OpModelError(f"{where}: no full-attention layers (KV {geo.describe()}): nothing to count scheduler blocks in")
    if req.num_draft_tokens and not geo.linear:
        raise OpModelError(f"{where}: speculative rounds need a linear KV cache (the reference's rule); this model's is "
                           f"grouped ({geo.describe()})")
    pool, mem, gpu_bytes = _memory(r, lay, eng)
    res = _resources(r, geo, pool, mem)
    problems = memory_fit_problems(res, gpu_bytes, non_kv_bytes=mem) + request_fit_problems(res, r.max_model_len)
    if problems:
        raise OpModelError(f"{where}: {problems[0]}; lower --max-model-len or raise --tp / --gpu-memory-utilization")
    rows, n = _price_rows(r, eng, geo, pool)
    lat_dec = rows.decode_latency_ms  # MTP: the op model's native round (verify of K+1 tokens + K MTP-layer steps)
    if req.num_draft_tokens and not mtp:
        lat_dec, n_extra = _speculative_rounds(r, lay, eng, rows)
        n += n_extra
    modes = {"gemm_quant_mode": eng.gemm, "kv_cache_dtype": eng.kv, "fmha_quant_mode": eng.fmha,
             "moe_quant_mode": eng.moe, "comm_quant_mode": eng.comm}
    note = ""
    if eng.block_gemms_repriced:
        note = (f"{lay.describe()}: the checkpoint's {BLOCK_GEMM_MODE} dense GEMMs ({eng.block_gemms_repriced} op kinds) are priced "
                f"with the op model's per-tensor {BLOCK_GEMM_PRICED_AS} GEMM data (--block-gemm-data per-tensor, the default: its "
                f"{BLOCK_GEMM_MODE} GEMM tables are host-bound at decode sizes, jaxsim.importers.op_model.BLOCK_GEMM_DATA; "
                f"--block-gemm-data collected prices them as aiconfigurator does); the deployment records gemm_quant_mode "
                f"{eng.gemm}, the checkpoint's")
    return CellResult(lay, rows, lat_dec, geo, res, mem, gpu_bytes, modes, time.perf_counter() - t0, n, block_gemm_note=note)


def pool_tokens_at(geo: KvGeometry, pool_bytes: int, batch: int) -> int:
    """Total full-attention tokens ``batch`` sequences can hold together in the pool, each past its window
    (its fixed window and state bytes taken out first): a decode curve's upper bound."""
    return max((pool_bytes - batch * geo.fixed_bytes()) // max(geo.full_bytes_per_token, 1), 0)


def decode_context_grid(top: int) -> np.ndarray:
    """The integer mean past contexts one decode curve is priced at: 1..16, then 1/8-octave steps, ending on ``top``."""
    return np.array(_dense_then_geometric(max(1, top), DECODE_CONTEXT_STEPS_PER_OCTAVE), np.int64)


def decode_curve_ms(decode, batch: int, total_kv: np.ndarray) -> tuple[np.ndarray, int]:
    """One decode curve: ``decode(batch, s)`` at the mean past KV ``s = total_kv / batch`` of every row, linear in
    ``s`` between the op model's prices at :func:`decode_context_grid` (every integer context up to 16, so
    there exactly :func:`at_mean_context`; beyond, 1/8-octave neighbours). Returns (latencies, queries)."""
    s = np.asarray(total_kv, np.float64) / batch
    grid = decode_context_grid(int(np.ceil(s.max())))
    lat = np.array([decode(batch, int(x)) for x in grid.tolist()], np.float64)
    return np.interp(s, grid.astype(np.float64), lat), int(grid.size)


def _price_rows(r: ResolvedRequest, eng: Engine, geo: KvGeometry, pool_bytes: int) -> tuple[BinnedRows, int]:
    """Decode curves for every batch the pool holds (each over the shared total-KV grid up to its own bound,
    priced by :func:`decode_curve_ms`) and prefill rows over the new-token x cached-prefix grid (module docstring)."""
    req = r.req
    cap = r.max_model_len - 1
    batches = [b for b in range(1, req.max_num_seqs + 1) if pool_tokens_at(geo, pool_bytes, b) >= b]
    bound = {b: min(b * cap, pool_tokens_at(geo, pool_bytes, b)) for b in batches}
    top = max(bound.values(), default=1)
    # every curve ends on its own bound: b requests at the full context (b x (max_model_len - 1)) or the pool
    grid = np.union1d(decode_kv_grid(top), np.asarray(sorted(set(bound.values())) or [1], np.int64))
    db, dk, dl = [], [], []
    n = 0
    for b in batches:
        ks = decode_curve_kv(grid, b, cap, bound[b])
        if ks.size == 0:
            continue
        lat, q = decode_curve_ms(eng.decode_ms, b, ks)
        n += q
        db.append(np.full(ks.size, b, np.int64))
        dk.append(ks)
        dl.append(lat)
    pb, pt, pk, pl = [], [], [], []
    for b in range(1, min(req.max_prefill_batch, req.max_num_batched_tokens, len(batches)) + 1):
        # the last per-request point is ceil(budget / b): b x t covers a whole budget split over b requests
        # (a real pass of b chunks summing to max_num_batched_tokens), at most b - 1 tokens beyond it
        t_cap = min(-(-req.max_num_batched_tokens // b), r.max_model_len - 1)
        for p in prefill_prefix_grid(r.max_model_len - 1):
            for t in prefill_token_grid(t_cap):
                pb.append(b)
                pt.append(b * int(t))
                pk.append(b * int(p))
                pl.append(eng.prefill_ms(b, int(t), int(p)))
                n += 1
    i64 = lambda v: np.asarray(v, np.int64)  # noqa: E731
    f64 = lambda v: np.asarray(v, np.float64)  # noqa: E731
    cat = lambda parts, dt: np.concatenate(parts).astype(dt) if parts else np.zeros(0, dt)  # noqa: E731
    rows = BinnedRows(cat(db, np.int64), cat(dk, np.int64), cat(dl, np.float64), np.ones(sum(map(len, db)), np.int64),
                      i64(pb), i64(pt), i64(pk), f64(pl), np.ones(len(pb), np.int64))
    return rows, n


def at_mean_context(fn, batch: int, total_kv: int) -> float:
    """``fn(batch, s)`` at the mean past KV per request ``s = total_kv / batch``: the op model takes integer
    contexts, so a fractional mean is linearly interpolated between its two neighbouring integers."""
    s0, rem = divmod(int(total_kv), int(batch))
    lo = fn(batch, s0)
    if rem == 0:
        return lo
    return lo + (fn(batch, s0 + 1) - lo) * (rem / batch)


def round_latency_ms(verify_ms: float, draft_step_ms: float, num_draft_tokens: int) -> float:
    """One EAGLE-3 round: the target's (K+1)-token verify pass plus K draft decode steps."""
    return verify_ms + num_draft_tokens * draft_step_ms


def _speculative_rounds(r: ResolvedRequest, lay: Layout, eng: Engine, rows: BinnedRows) -> tuple[np.ndarray, int]:
    """Round latency at every decode row (batch b, total past KV k): verify + K draft steps (module docstring)."""
    k = r.req.num_draft_tokens
    draft = Engine(str(r.draft_dir), r.req.system, r.backend_version, lay.tp,
                   gemm=eng.gemm if eng.gemm in ("bfloat16", "fp8") else None, kv=eng.kv, fmha=eng.fmha)
    cache: dict[tuple, float] = {}

    def one_round(b: int, s: int) -> float:
        if (b, s) not in cache:
            cache[(b, s)] = round_latency_ms(eng.decode_ms(b * (k + 1), s), draft.decode_ms(b, s), k)
        return cache[(b, s)]

    out = np.array([at_mean_context(one_round, b, kv) for b, kv in zip(rows.decode_batch.tolist(), rows.decode_kv.tolist())])
    return out, 2 * len(cache)


# ----------------------------------------------------------------------------------------------------
# profile


@dataclass(frozen=True, eq=False)
class OpModelImport:
    profile: ModelProfile
    columns: dict
    cells: tuple[CellResult, ...]
    speculative: bool
    summary: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)  # memory.json: non-KV bytes per deployment


def model_revision_placeholder(r: ResolvedRequest) -> str:
    """First 40 hex digits of the sha256 of the op model's config.json (NOT a Hugging Face revision)."""
    return r.config_sha256[:40]


def _deployment(r: ResolvedRequest, c: CellResult, rev: str) -> Deployment:
    """One cell's deployment: its layout, the precisions the op model priced, its resources and, for
    speculative imports, the round identity."""
    req, m, lay = r.req, c.engine_modes, c.layout
    ep = None
    if req.num_draft_tokens and r.draft_dir is None:
        ep = ExecutionProfile("speculative_round", "mtp", req.num_draft_tokens, f"{req.model} (MTP layers)", rev, "model_step_cuda")
    elif req.num_draft_tokens:
        ep = ExecutionProfile("speculative_round", "eagle3", req.num_draft_tokens, r.draft_name, r.draft_sha1, "model_step_cuda")
    return Deployment(
        system=req.system, backend=BACKEND, backend_version=r.backend_version, tp=lay.tp, dp=lay.dp, moe_tp=lay.moe_tp,
        moe_ep=lay.moe_ep, gemm_quant_mode=m["gemm_quant_mode"], moe_quant_mode=m["moe_quant_mode"] if r.num_experts else "bfloat16",
        fmha_quant_mode=m["fmha_quant_mode"] if m["fmha_quant_mode"] in FMHA_QUANT_MODES else "bfloat16",
        comm_quant_mode=m["comm_quant_mode"], kv_cache_dtype=m["kv_cache_dtype"], resources=c.resources, execution_profile=ep,
    )


def _table(r: ResolvedRequest, dep: Deployment, c: CellResult, rev: str) -> dict:
    """One cell's schema-7 rows, labelled as the op model's (modelled, single sample)."""
    lay = c.layout
    cell_id = f"opmodel-{r.req.system}-tp{lay.tp}" + (f"-dp{lay.dp}" if lay.dp > 1 else "") + (f"-ep{lay.moe_ep}" if lay.moe_ep > 1 else "")
    cols = table_columns(dep, model=r.req.model, model_revision=rev, binned=c.rows, cell_id=cell_id, latency_decode=c.latency_decode)
    n = len(cols["latency_ms"])
    cols["model_support_level"] = [DATA_SOURCE] * n
    cols["timing_boundary"] = ["aiconfigurator_op_model"] * n
    cols["aic_database_version"] = [r.backend_version] * n
    cols["measurement_reduction"] = ["single_sample"] * n
    strategy = "dp_attention_ep_moe" if lay.dp > 1 else "pure_tp" if lay.moe_ep == 1 else "tp_attention_ep_moe"
    cols["parallel_strategy"] = [strategy] * n
    cols.pop("source_sample_count")
    return cols


def _provenance(r: ResolvedRequest, rev: str, cells: Sequence[CellResult] = ()) -> str:
    req = r.req
    fallbacks = "".join(f" PRECISION FALLBACK: {c.fallback}." for c in cells if c.fallback)
    fallbacks += "".join(f" GEMM DATA: {c.block_gemm_note}." for c in cells if c.block_gemm_note)
    spec = ""
    if req.num_draft_tokens and r.draft_dir is None:
        spec = (
            f" Speculative rounds (multi-token prediction, K={req.num_draft_tokens}, the checkpoint's own MTP layers) priced "
            "natively by the op model (compiled with nextn=K: one decode step of b x (K+1) query tokens with the MTP "
            "layers' compute added); prefill rows and the KV pool from the same nextn=K model. draft_model names the "
            "model's MTP layers; draft_revision is the model_revision placeholder."
        )
    elif req.num_draft_tokens:
        spec = (
            f" Speculative rounds (EAGLE-3, K={req.num_draft_tokens}, draft config {r.draft_name}, sha1 {r.draft_sha1}): "
            "the op model has no EAGLE-3 path, so each round at (b, k) = the target's verify pass priced the way the op model "
            "prices its native MTP verify (a decode step of b x (K+1) query tokens at the mean past KV k/b, without MTP "
            "layers) + K decode steps of the draft model at the same batch and "
            "context (the draft at the target's TP); draft_revision is the sha1 of the draft config.json, not a Hub revision. Draft weights and KV "
            "are not subtracted from the modelled pool (as for measured rounds, whose pool is used as recorded). Prefill rows are the "
            "target's prefill only."
        )
    return (
        f"MODELLED, NOT MEASURED: every latency is aiconfigurator-core {aic_version()}'s op-level forward-pass model "
        f"(Apache-2.0, NVIDIA; op-level silicon data of {req.system}, vLLM database {r.backend_version}) priced by jaxsim "
        f"{jaxsim.__version__} (jaxsim.importers.op_model). Decode: every batch 1..max_num_seqs over one shared total-KV grid "
        f"(1..{DENSE_TOKENS}, then 1/{DECODE_KV_STEPS_PER_OCTAVE}-octave steps, plus each curve's end) from b to "
        f"min(b x (max_model_len - 1), the pool's full-attention tokens once every sequence holds its window and state); "
        f"row (b, k) = decode_step_latency(b, s, osl=0) at the mean past KV s = k/b, linear in s between the contexts "
        f"each curve is priced at (every integer up to {DENSE_TOKENS}, then 1/{DECODE_CONTEXT_STEPS_PER_OCTAVE}-octave steps). "
        f"Prefill: batches 1..{req.max_prefill_batch}, per-request new tokens 1..{DENSE_TOKENS} then "
        f"1/{PREFILL_TOKEN_STEPS_PER_OCTAVE}-octave steps to max_num_batched_tokens/b x cached prefix 0 "
        f"and 1/{PREFILL_PREFIX_STEPS_PER_OCTAVE}-octave steps from {MIN_PREFIX_TOKENS} to max_model_len "
        f"(predict_prefill_latency(b, t + p, p)). Parallel layouts: {', '.join(lay.describe() for lay in r.layouts)}.{_dp_note(r)} "
        f"Resources from the op model's memory estimate: the KV pool is its budget in bytes (GPU memory x "
        f"gpu_memory_utilization minus weights, activations and overheads, recorded per deployment in memory.json); the "
        f"KV layout by attention kind (full attention per token, sliding-window layers capped at their window, linear-"
        f"attention/state-space layers as one state per sequence: a grouped cache) from its bytes per sequence.{spec} "
        f"model_revision {rev} is a PLACEHOLDER: the first 40 hex digits of the sha256 of aiconfigurator-core's "
        f"{r.config_path.name} for {req.model} (no Hugging Face revision is recorded).{fallbacks}"
    )


def _dp_note(r: ResolvedRequest) -> str:
    if all(lay.dp == 1 for lay in r.layouts):
        return ""
    return (" Attention-DP layouts (dp > 1): a worker is dp attention ranks of tp GPUs each (tp x dp GPUs), the experts "
            "spread over all of them (moe_ep = tp x dp); the op model prices one rank's forward pass at batch b with every "
            "rank running the same batch (attention_dp_size = dp: its MoE layers see dp x b tokens), so each row is one "
            "rank's pass at its own batch and KV, and the KV pool is per rank.")


def _summary(r: ResolvedRequest, cells: Sequence[CellResult]) -> dict:
    req = r.req
    out = {"model": req.model, "system": req.system, "backend_version": r.backend_version, "data_source": DATA_SOURCE,
           "checkpoint_modes": dict(r.checkpoint_modes), "cells": []}
    for c in cells:
        res, lay = c.resources, c.layout
        out["cells"].append({
            "layout": lay.describe(), "tp": lay.tp, "dp": lay.dp, "moe_tp": lay.moe_tp, "moe_ep": lay.moe_ep, "seconds": round(c.seconds, 2),
            "queries": c.queries, "decode_rows": int(c.rows.decode_batch.size), "decode_curves": int(np.unique(c.rows.decode_batch).size),
            "prefill_rows": int(c.rows.prefill_batch.size), "cache_layout": res.cache_layout, "kv_pool_bytes": c.pool_bytes,
            "kv_pool_tokens": c.pool_tokens if c.geometry.linear else None, "kv_bytes_per_token": c.kv_bytes_per_token,
            "kv_geometry": c.geometry.describe(), "max_sequences_at_max_model_len": c.pool_bytes // c.geometry.sequence_bytes(r.max_model_len),
            "gpu_memory_bytes": c.gpu_memory_bytes, **c.memory, **c.engine_modes,
            **({"precision_fallback": c.fallback} if c.fallback else {}),
            **({"block_gemm_data": c.block_gemm_note} if c.block_gemm_note else {}),
        })
    return out


def import_op_model(req: OpModelRequest) -> OpModelImport:
    """Price every layout of ``req`` and package one profile (nothing written)."""
    r = resolve_request(req)
    rev = model_revision_placeholder(r)
    cells = [price_cell(r, lay) for lay in r.layouts]
    deps = [_deployment(r, c, rev) for c in cells]
    parts = [_table(r, d, c, rev) for d, c in zip(deps, cells)]
    profile = ModelProfile(
        schema_version=1, model=req.model, model_revision=rev, architecture=r.architecture,
        context_length=r.context_length, num_experts=r.num_experts, provenance=_provenance(r, rev, cells), deployments=tuple(deps),
        data_source=DATA_SOURCE,
    )
    profile = ModelProfile.from_dict(profile.to_dict(), source="op-model profile")
    memory = memory_breakdown_doc([(d, c.gpu_memory_bytes, c.memory) for d, c in zip(deps, cells)],
                                  f"{DATA_SOURCE}: aiconfigurator-core {aic_version()} memory estimate (non-KV bytes per rank)")
    return OpModelImport(profile, merge_columns(parts), tuple(cells), bool(req.num_draft_tokens), _summary(r, cells), memory)


def write_op_model(output: str | os.PathLike, result: OpModelImport, *, force: bool = False) -> Path:
    extra = {MEMORY_NAME: (json.dumps(result.memory, indent=1) + "\n").encode("utf-8")} if result.memory else None
    return write_profile_dir(
        output, result.profile, result.columns, measurement_policy=SD_POLICY if result.speculative else AR_POLICY,
        force=force, extra_sidecar={"provenance": f"{DATA_SOURCE}: aiconfigurator-core {aic_version()} op-level model; see profile.json"},
        extra_files=extra,
    )


def parse_layouts(text: str) -> tuple[ParallelLayout, ...]:
    """``--layout``: comma-separated layouts, each ``tpN`` with optional ``:epN`` (MoE expert parallel), ``:moetpN``
    and ``:dpN`` parts, e.g. ``tp8,tp8:ep8,tp4:ep4``."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        parts: dict[str, int] = {}
        for tok in item.split(":"):
            key = next((k for k in ("moetp", "tp", "ep", "dp") if tok.startswith(k)), None)
            if key is None or not tok[len(key):].isdigit() or key in parts:
                raise OpModelError(f"--layout {item!r}: expected tpN[:epN][:moetpN][:dpN] (e.g. tp4:ep4), got {tok!r}")
            parts[key] = int(tok[len(key):])
        if "tp" not in parts:
            raise OpModelError(f"--layout {item!r}: give the attention tensor-parallel size tpN (e.g. tp4:ep4)")
        out.append(ParallelLayout(parts["tp"], parts.get("ep", 1), parts.get("moetp"), parts.get("dp", 1)))
    if not out or len(set(out)) != len(out):
        raise OpModelError(f"--layout {text!r}: expected distinct comma-separated layouts, e.g. tp8,tp8:ep8")
    return tuple(out)


def parse_tp_list(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise OpModelError(f"--tp {text!r}: expected comma-separated integers, e.g. 1,2,4,8") from None
    if not out or len(set(out)) != len(out):
        raise OpModelError(f"--tp {text!r}: expected distinct comma-separated integers, e.g. 1,2,4,8")
    return out


__all__: Sequence[str] = (
    "INSTALL_HINT",
    "Engine",
    "OpModelError",
    "OpModelImport",
    "OpModelRequest",
    "PRECISION_FALLBACK",
    "ParallelLayout",
    "at_mean_context",
    "decode_context_grid",
    "decode_curve_ms",
    "checkpoint_modes",
    "decode_curve_kv",
    "decode_kv_grid",
    "import_op_model",
    "known_models",
    "known_systems",
    "parse_layouts",
    "parse_tp_list",
    "prefill_prefix_grid",
    "prefill_token_grid",
    "resolve_request",
    "round_latency_ms",
    "write_op_model",
)
