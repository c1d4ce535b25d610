"""Speculative-decoding acceptance in plain Python/NumPy (no JAX): the bundled presets and the lowering of
every way of stating acceptance to per-position conditional rates, padded to one shape.

A deployment states acceptance as per-position conditional rates, a mean accepted-draft count or a preset
name (:func:`config_rates` lowers any of them). The compiled acceptance kernels (expected tokens per round,
sampled bursts) are in :mod:`jaxsim.kernels.acceptance`.

Presets (``jaxsim/data/acceptance/vllm_eagle3_acceptance_mtbench.csv``). Source: vLLM's acceptance-length
test baselines (Apache-2.0; see ``jaxsim/data/ATTRIBUTION.md``): greedy MT-Bench runs with K =
``num_spec_tokens`` drafts, reporting ``accepted_per_draft_posN`` = (drafts accepted at position N) /
(rounds). Conditional per-position rates follow as p_N = pos_N / pos_{N-1} (pos_0 = 1), so the mean
accepted length 1 + p1 + p1 p2 + ... equals 1 + sum(pos_N). Rows without per-position data (the MTP rows)
are lowered from their mean acceptance length a with ``rates_from_accepted(a - 1, K)``. Rows marked
``verified_in_upstream_file=no`` are unconfirmed: ``AcceptancePreset.verified`` is False.
"""

from __future__ import annotations

import csv
import functools
import io
import math
import re
from dataclasses import dataclass
from importlib import resources

import numpy as np

from jaxsim.errors import InputError, JaxsimError, QueryError

__all__ = [
    "MAX_DRAFT_TOKENS", "AcceptancePreset", "conditional_rates", "config_rates", "get_preset", "is_preset", "list_presets",
    "normalize_rates", "pad_rates", "preset_names", "preset_rates", "rates_from_accepted", "tail_probabilities",
]

MAX_DRAFT_TOKENS = 5
CSV_NAME = "vllm_eagle3_acceptance_mtbench.csv"


# ----------------------------------------------------------------------------------------------------
# lowering and checking rate vectors


def rates_from_accepted(accepted_tokens: float, num_draft_tokens: int) -> np.ndarray:
    """Lower a mean accepted-draft count a to rates [1]*floor(a) + [a - floor(a)] + zeros (length K)."""
    k = int(num_draft_tokens)
    a = float(accepted_tokens)
    if not (0.0 <= a <= k) or not math.isfinite(a):
        raise InputError(f"accepted_tokens={a} must be within [0, nextn={k}]")
    whole = int(math.floor(a))
    rates = [1.0] * whole + ([a - whole] if whole < k else [])
    rates += [0.0] * (k - len(rates))
    return np.asarray(rates[:k], dtype=np.float64)


def normalize_rates(rates, num_draft_tokens: int) -> np.ndarray:
    """Pad with zeros / drop extras to length K; each rate must be finite in [0, 1]."""
    r = [float(x) for x in rates][: int(num_draft_tokens)]
    for i, x in enumerate(r):
        if not (math.isfinite(x) and 0.0 <= x <= 1.0):
            raise InputError(f"accept_rates[{i}]={x} must be a finite probability in [0, 1]")
    r += [0.0] * (int(num_draft_tokens) - len(r))
    return np.asarray(r, dtype=np.float64)


def pad_rates(rates: np.ndarray) -> np.ndarray:
    """Pad a length-K rate vector to MAX_DRAFT_TOKENS with zeros (so every depth shares one shape)."""
    out = np.zeros(MAX_DRAFT_TOKENS)
    out[: len(rates)] = rates
    return out


def tail_probabilities(rates, num_draft_tokens, xp=np):
    """P(T ≥ t), t = 1..MAX_DRAFT_TOKENS + 1, of a round's tokens T = 1 + accepted drafts under chained
    conditional acceptance: 1, p_1, p_1·p_2, ... (rates beyond ``num_draft_tokens`` count as 0).

    ``rates`` [..., MAX_DRAFT_TOKENS] with ``num_draft_tokens`` broadcast over the leading axes; ``xp`` is
    the array namespace (numpy, or jax.numpy inside compiled code)."""
    k = xp.arange(MAX_DRAFT_TOKENS)
    surv = xp.cumprod(xp.where(k < xp.asarray(num_draft_tokens)[..., None], rates, 0.0), axis=-1)
    return xp.concatenate([xp.ones(surv.shape[:-1] + (1,)), surv], axis=-1)


def config_rates(nextn: int, *, accept_rates=None, accepted_tokens: float | None = None,
                 preset: str | None = None) -> np.ndarray:
    """A deployment config's acceptance (one of ``accept_rates``, ``accepted_tokens``, ``preset``, already
    validated) as conditional rates padded to MAX_DRAFT_TOKENS; zeros for an autoregressive deployment."""
    k = nextn
    if k == 0:
        return np.zeros(MAX_DRAFT_TOKENS)
    if accepted_tokens is not None:
        return pad_rates(rates_from_accepted(accepted_tokens, k))
    rates = accept_rates if accept_rates is not None else _preset_rates_or_none(preset or "")
    return pad_rates(normalize_rates(rates or (), k))


# ----------------------------------------------------------------------------------------------------
# presets


@dataclass(frozen=True)
class AcceptancePreset:
    """One measured acceptance baseline."""

    name: str
    method: str
    target_model: str
    draft_model: str
    num_spec_tokens: int
    dataset: str
    verified: bool
    mean_acceptance_length: float
    accepted_per_position: tuple[float, ...]
    conditional_rates: tuple[float, ...]
    rates_from: str
    source_ref: str
    notes: str

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def _dataset_tag(dataset: str) -> str:
    return {"philschmid/mt-bench": "mtbench"}.get(dataset, _slug(dataset.split("/")[-1]))


def conditional_rates(accepted_per_position: list[float]) -> tuple[float, ...]:
    """p_N = pos_N / pos_{N-1} with pos_0 = 1, clipped to [0, 1] (0 after a zero)."""
    out, prev = [], 1.0
    for pos in accepted_per_position:
        out.append(0.0 if prev <= 0 else min(1.0, max(0.0, pos / prev)))
        prev = pos
    return tuple(out)


@functools.cache
def _presets() -> tuple[AcceptancePreset, ...]:
    text = resources.files("jaxsim.data").joinpath("acceptance", CSV_NAME).read_text(encoding="utf-8")
    out: list[AcceptancePreset] = []
    for row in csv.DictReader(io.StringIO(text)):
        k = int(row["num_spec_tokens"])
        pos = []
        for n in range(1, k + 1):
            v = row.get(f"accepted_per_draft_pos{n}", "")
            if v == "":
                break
            pos.append(float(v))
        mean = float(row["mean_acceptance_length"])
        if len(pos) == k:
            rates, origin = conditional_rates(pos), "accepted_per_position"
        else:
            rates, origin = tuple(rates_from_accepted(min(max(mean - 1.0, 0.0), k), k).tolist()), "mean_acceptance_length"
        name = f"{row['method']}-{_dataset_tag(row['dataset'])}-{_slug(row['target_model'].split('/')[-1])}"
        out.append(AcceptancePreset(
            name=name, method=row["method"], target_model=row["target_model"], draft_model=row["draft_model"],
            num_spec_tokens=k, dataset=row["dataset"], verified=row["verified_in_upstream_file"].strip().lower() == "yes",
            mean_acceptance_length=mean, accepted_per_position=tuple(pos), conditional_rates=rates, rates_from=origin,
            source_ref=row["source_ref"], notes=row.get("notes", ""),
        ))
    return tuple(out)


def list_presets() -> list[AcceptancePreset]:
    """Every bundled acceptance preset (verified and unverified)."""
    return list(_presets())


def preset_names() -> list[str]:
    """Names of the bundled acceptance presets."""
    return [p.name for p in list_presets()]


def get_preset(name: str) -> AcceptancePreset:
    """The preset called ``name``; QueryError listing the names when unknown."""
    for p in _presets():
        if p.name == name:
            return p
    raise QueryError(f"unknown acceptance preset {name!r} (known: {', '.join(p.name for p in _presets())})")


def preset_rates(name: str, num_draft_tokens: int) -> np.ndarray:
    """The preset's conditional acceptance rates for K drafts: truncated, or zero-padded beyond the
    measured depth (no data there, so those drafts are assumed rejected)."""
    k = int(num_draft_tokens)
    if not 1 <= k <= MAX_DRAFT_TOKENS:
        raise QueryError(f"num_draft_tokens must be in 1..{MAX_DRAFT_TOKENS} (got {num_draft_tokens})")
    rates = list(get_preset(name).conditional_rates)[:k]
    return np.asarray(rates + [0.0] * (k - len(rates)), dtype=np.float64)


def _preset_rates_or_none(name: str) -> tuple[float, ...] | None:
    """A preset's conditional rates at its measured depth; None when there is no such preset."""
    try:
        return tuple(float(x) for x in get_preset(name).conditional_rates)
    except (JaxsimError, KeyError, ValueError):
        return None


def is_preset(name: str) -> bool:
    """Whether ``name`` is a bundled acceptance preset."""
    return _preset_rates_or_none(name) is not None
