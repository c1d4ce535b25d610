"""Named speculative-decoding acceptance presets (``jaxsim/data/acceptance/vllm_eagle3_acceptance_mtbench.csv``).

Source: vLLM's acceptance-length test baselines (Apache-2.0; see ``jaxsim/data/ATTRIBUTION.md``): greedy
MT-Bench runs with K = ``num_spec_tokens`` drafts, reporting ``accepted_per_draft_posN`` = (drafts accepted at
position N) / (rounds). Conditional per-position rates follow as p_N = pos_N / pos_{N-1} (pos_0 = 1), so the
mean accepted length 1 + p1 + p1 p2 + ... equals 1 + sum(pos_N). Rows without per-position data (the MTP
rows) are lowered from their mean acceptance length a with ``rates_from_accepted(a - 1, K)``. Rows marked
``verified_in_upstream_file=no`` are unconfirmed: ``AcceptancePreset.verified`` is False.
"""

from __future__ import annotations

import csv
import functools
import io
import re
from dataclasses import dataclass
from importlib import resources

import numpy as np

from jaxsim.errors import QueryError
from jaxsim.rules.acceptance import MAX_DRAFT_TOKENS, rates_from_accepted

CSV_NAME = "vllm_eagle3_acceptance_mtbench.csv"


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


@functools.lru_cache(maxsize=None)
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
