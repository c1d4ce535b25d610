"""The binding rules of a deployment config as a whole (before any profile is read): mode and roles, backend
and version, nextn and acceptance, block size, context length, KV offload and transfer, overrides, and the GPU
memory the capacity rules need. Pure functions listing problem lines (``<rule>: <why> (<values>)``).
"""

from __future__ import annotations

import math

from jaxsim import acceptance, systems
from jaxsim.errors import JaxsimError
from jaxsim.profile.model import MAX_BYTES, UNSAFE_VERSION_LABELS
from jaxsim.rules.capacity import block_size_problem
from jaxsim.rules.config import MODES, REFUSED_OVERRIDES, DeploymentConfig
from jaxsim.rules.role_problems import FPM_FMHA_MODES

__all__ = ["MAX_NEXTN", "acceptance_problems", "config_problems", "gpu_memory_bytes"]

MAX_NEXTN = acceptance.MAX_DRAFT_TOKENS


def gpu_memory_bytes(cfg: DeploymentConfig) -> tuple[int | None, str | None]:
    """(GPU memory per rank in bytes, None) from the config or the system's spec sheet; (None, problem) when unknown."""
    if cfg.gpu_memory_bytes is not None:
        if cfg.gpu_memory_bytes > MAX_BYTES:
            return None, f"gpu-memory: gpu_memory_bytes must be <= 2**53 (got {cfg.gpu_memory_bytes})"
        return cfg.gpu_memory_bytes, None
    try:
        return systems.gpu_memory_bytes(cfg.system), None
    except JaxsimError:
        return None, (
            f"gpu-memory: system {cfg.system!r} has no bundled spec sheet (known: {', '.join(systems.list_systems())}); "
            "set gpu_memory_bytes"
        )


def acceptance_problems(cfg: DeploymentConfig) -> list[str]:
    """Exactly one acceptance when nextn > 0 (none otherwise), each within its range or a known preset."""
    out: list[str] = []
    given = [k for k in ("accept_rates", "accepted_tokens", "acceptance_preset") if getattr(cfg, k) is not None]
    if len(given) > 1:
        out.append(f"acceptance-exclusive: set only one of accept_rates, accepted_tokens, acceptance_preset (got {', '.join(given)})")
    if given and cfg.nextn == 0:
        out.append(f"acceptance-requires-nextn: {given[0]} requires nextn > 0 (nextn=0)")
    if cfg.nextn > 0 and not given:
        out.append(
            f"acceptance-missing: nextn={cfg.nextn} requires an explicit acceptance: accept_rates, accepted_tokens or acceptance_preset"
        )
    if cfg.accept_rates is not None:
        for i, r in enumerate(cfg.accept_rates):
            if not (math.isfinite(r) and 0.0 <= r <= 1.0):
                out.append(f"accept-rates-range: accept_rates[{i}]={r!r} must be a finite probability in [0, 1]")
    if cfg.accepted_tokens is not None:
        a = cfg.accepted_tokens
        if not (math.isfinite(a) and 0.0 <= a <= cfg.nextn):
            out.append(f"accepted-range: accepted_tokens={a!r} must be finite and within [0, nextn={cfg.nextn}]")
    if cfg.acceptance_preset is not None and not acceptance.is_preset(cfg.acceptance_preset):
        names = ", ".join(acceptance.preset_names())
        out.append(f"acceptance-preset: unknown acceptance_preset {cfg.acceptance_preset!r} (known: {names})")
    return out


def _mode_problems(cfg: DeploymentConfig) -> list[str]:
    if cfg.mode not in MODES:
        return [f"mode: mode must be 'aggregated' or 'disaggregated' (got {cfg.mode!r})"]
    want = ("aggregated",) if cfg.mode == "aggregated" else ("prefill", "decode")
    if tuple(sorted(cfg.role_names)) != tuple(sorted(want)):
        return [f"roles: mode {cfg.mode!r} needs exactly the roles {', '.join(want)} (got {', '.join(cfg.role_names) or 'none'})"]
    return []


def _backend_problems(cfg: DeploymentConfig) -> list[str]:
    out = []
    if cfg.backend != "vllm":
        out.append(f"backend: FPM profiles exist only for backend 'vllm' (got {cfg.backend!r})")
    bv = cfg.backend_version
    if bv is None or bv.lower() in UNSAFE_VERSION_LABELS or any(c.isspace() or c in "/\\\0" for c in bv):
        out.append(f"backend-version: fpm_profile requires a literal, path-safe backend_version (got {bv!r})")
    return out


def _memory_problems(cfg: DeploymentConfig) -> list[str]:
    """Block size, context length, KV offload and the P/D link."""
    out = []
    bp = block_size_problem(cfg.block_size)
    if bp:
        out.append(bp)
    if cfg.context_length is not None and cfg.context_length <= 0:
        out.append(f"context-length: context_length must be positive (got {cfg.context_length})")
    if cfg.kv_offload:
        out.append("kv-offload: FPM capacity is the recorded HBM pool; KV offload (kv_offload=true) is not supported")
    if cfg.kv_transfer_gbps is not None and not (math.isfinite(cfg.kv_transfer_gbps) and cfg.kv_transfer_gbps > 0):
        out.append(f"kv-transfer: kv_transfer_gbps must be finite and > 0 (got {cfg.kv_transfer_gbps!r})")
    if cfg.mode == "disaggregated" and cfg.kv_transfer_gbps is None and cfg.system not in systems.list_systems():
        out.append(f"kv-transfer: system {cfg.system!r} has no bundled spec sheet for the P/D link; set kv_transfer_gbps")
    return out


def _override_problems(cfg: DeploymentConfig) -> list[str]:
    out = []
    ov = cfg.overrides
    if ov.fmha_quant_mode is not None and ov.fmha_quant_mode not in FPM_FMHA_MODES:
        out.append(f"fmha-override: fpm_fmha_quant_mode must be bfloat16, fp8, or fp8_block (got {ov.fmha_quant_mode!r})")
    refused = [k for k in REFUSED_OVERRIDES if getattr(ov, k) is not None]
    if refused:
        out.append(
            f"unsupported-override: fpm_interpolation does not support EPLB, slots, moe_backend or moe_kernel_source "
            f"overrides (got {', '.join(f'overrides.{k}' for k in refused)})"
        )
    return out


def config_problems(cfg: DeploymentConfig) -> list[str]:
    """Every problem of the config as a whole, in order."""
    out = _mode_problems(cfg) + _backend_problems(cfg)
    if not (0 <= cfg.nextn <= MAX_NEXTN):
        out.append(f"nextn-range: nextn must be in 0..={MAX_NEXTN} (got {cfg.nextn})")
    return out + acceptance_problems(cfg) + _memory_problems(cfg) + _override_problems(cfg)
