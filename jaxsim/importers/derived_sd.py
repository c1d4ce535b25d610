"""DERIVED EAGLE-3 speculative-round profiles from a measured autoregressive (AR) profile.

No public measured speculative-round table exists, so these rounds are computed, not measured. For a round
of K draft tokens over ``b`` requests with total past KV ``k`` (the measured-round coordinates):

    round_ms(b, k) = decode_ms(b, k) * (1 + c * K) + K * b * mu

* ``decode_ms(b, k)``: the measured AR decode row at exactly (b, k) (rows keep the AR table's coordinates,
  reductions and sample counts);
* verification of K+1 positions per request = one measured decode step plus K extra query tokens per
  request, each costing ``mu`` ms: the measured marginal cost of a query token when the pass is weight-
  bandwidth bound, ``mu = (prefill_ms(1, T0, 0) - decode_ms(1, k1)) / (T0 - 1)`` with T0 the smallest
  measured batch-1 cold prefill of at least 128 tokens and k1 the lowest measured batch-1 decode KV (both
  looked up with the compiled kernels);
* K draft steps, each ``c`` (default 0.05) times the target's decode step: EAGLE-3 drafts with one decoder
  layer plus the LM head, a few percent of a 64-layer target step (EAGLE's LLaMA2-chat-70B MT-Bench log:
  a whole draft+verify round costs ~1.25 plain steps);
* prefill rows: the measured AR prefill times (1 + c) (the draft also runs once over the prompt).

Every derived profile says DERIVED in its provenance, its resources' provenance, its table sidecar and its
rows (``model_support_level`` "derived"). The draft identity is nominal and its revision a placeholder.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

import jaxsim
from jaxsim.errors import ProfileError
from jaxsim.importers.fpm_log import BinnedRows, merge_columns, table_columns, write_profile_dir
from jaxsim.kernels import rounds, status
from jaxsim.profile import Deployment, ExecutionProfile, ModelProfile, load_profile_dir
from jaxsim.profile.model import HEX40
from jaxsim.profile.table import SD_POLICY

DRAFT_STEP_RELATIVE_COST = 0.05
MIN_PROBE_TOKENS = 128


@dataclass(frozen=True)
class DerivationParams:
    """The constants behind one derived deployment (all latencies in ms)."""

    tp: int
    num_draft_tokens: int
    draft_step_cost: float
    marginal_token_ms: float
    probe_prefill_tokens: int
    probe_prefill_ms: float
    probe_decode_kv: int
    probe_decode_ms: float

    def describe(self) -> str:
        return (
            f"TP{self.tp}: mu = (prefill(1, {self.probe_prefill_tokens}, 0) = {self.probe_prefill_ms:.4f} ms - "
            f"decode(1, {self.probe_decode_kv}) = {self.probe_decode_ms:.4f} ms) / {self.probe_prefill_tokens - 1} = "
            f"{self.marginal_token_ms:.6f} ms per extra query token"
        )


def _cell_rows(bundle, deployment: Deployment) -> BinnedRows:
    """The deployment's rows with their reduction sample counts, as BinnedRows (AR coordinates)."""
    cell = bundle.cell(deployment)
    t = bundle.table_for(deployment)
    ids = np.isin(t.column("cell_id"), list(cell.cell_ids))
    ident = t.column("tp") == deployment.tp
    rows = ids & ident & (t.column("execution_profile") == "full") & (t.column("kv_seed_regime") != "fake_fallback")
    kind = t.column("workload_kind")
    names = t.arrow.column_names
    count = t.column("source_sample_count") if "source_sample_count" in names else np.ones(t.num_rows, np.int64)
    b, tok, kv, lat = t.column("batch_size"), t.column("total_prefill_tokens"), t.column("total_kv_read_tokens"), t.column("latency_ms")
    d = np.flatnonzero(rows & (kind == "decode"))
    d = d[np.lexsort((kv[d], b[d]))]
    p = np.flatnonzero(rows & (kind == "prefill"))
    p = p[np.lexsort((tok[p], kv[p], b[p]))]
    return BinnedRows(b[d], kv[d], lat[d], count[d], b[p], tok[p], kv[p], lat[p], count[p])


def marginal_token_ms(rows: BinnedRows, *, tp: int, num_draft_tokens: int, draft_step_cost: float) -> DerivationParams:
    """mu from the measured table via the compiled kernels (see the module docstring)."""
    cold = (rows.prefill_batch == 1) & (rows.prefill_kv == 0) & (rows.prefill_tokens >= MIN_PROBE_TOKENS)
    if not cold.any():
        raise ProfileError(f"TP{tp}: no batch-1 cold prefill row with >= {MIN_PROBE_TOKENS} tokens to measure the per-token cost")
    t0 = int(rows.prefill_tokens[cold].min())
    b1 = rows.decode_batch == 1
    if not b1.any():
        raise ProfileError(f"TP{tp}: no batch-1 decode curve to measure the per-token cost")
    k1 = int(rows.decode_kv[b1].min())
    table = rounds.compile_round_table(rows)
    lp, cp = rounds.prefill_batch(table, np.array([1]), np.array([t0]), np.array([0]))
    ld, cd = rounds.decode_batch(table, np.array([1]), np.array([k1]))
    if not (status.is_supported(int(cp[0])) and status.is_supported(int(cd[0]))):
        raise ProfileError(f"TP{tp}: the per-token probe points are not in measured support")
    lp, ld = float(lp[0]), float(ld[0])
    mu = (lp - ld) / (t0 - 1)
    if not mu > 0:
        raise ProfileError(f"TP{tp}: measured per-token cost is not positive ({mu!r} ms); cannot derive rounds")
    return DerivationParams(tp, num_draft_tokens, draft_step_cost, mu, t0, lp, k1, ld)


def round_latency_ms(decode_ms: np.ndarray, batch: np.ndarray, p: DerivationParams) -> np.ndarray:
    """The derived whole-round latency at measured decode rows (module docstring formula)."""
    k = p.num_draft_tokens
    return decode_ms * (1.0 + p.draft_step_cost * k) + k * batch.astype(np.float64) * p.marginal_token_ms


def nominal_draft(model: str, num_draft_tokens: int, draft_step_cost: float) -> tuple[str, str]:
    """(draft_model, draft_revision) of a derived profile: a nominal id and a 40-hex placeholder.

    The revision is the sha1 of the derivation's defining text, so it changes when the derivation does.
    """
    name = f"jaxsim-derived/{model.split('/')[-1]}-eagle3-draft"
    text = f"jaxsim derived eagle3 v1|{model}|K={num_draft_tokens}|c={draft_step_cost!r}|probe>={MIN_PROBE_TOKENS}"
    return name, hashlib.sha1(text.encode("utf-8")).hexdigest()


def derive_speculative(
    source: str | os.PathLike, *, num_draft_tokens: int, draft_step_cost: float = DRAFT_STEP_RELATIVE_COST,
) -> tuple[ModelProfile, dict, list[DerivationParams]]:
    """Derived SD profile, its table columns and the per-deployment constants, from a measured AR profile dir."""
    if not 1 <= int(num_draft_tokens) <= 5:
        raise ProfileError(f"num_draft_tokens must be in 1..5 (got {num_draft_tokens})")
    bundle = load_profile_dir(source)
    prof = bundle.profile
    if not HEX40.fullmatch(prof.model_revision):
        raise ProfileError(f"{source}: model_revision {prof.model_revision!r} is not 40-hex; a speculative-round identity needs one")
    draft_model, draft_rev = nominal_draft(prof.model, num_draft_tokens, draft_step_cost)
    ep = ExecutionProfile("speculative_round", "eagle3", int(num_draft_tokens), draft_model, draft_rev, "model_step_cuda")
    deps, parts, params = [], [], []
    for d in prof.deployments:
        if d.is_speculative:
            raise ProfileError(f"{source}: {d.describe()} is already speculative; derive from an autoregressive profile")
        rows = _cell_rows(bundle, d)
        p = marginal_token_ms(rows, tp=d.tp, num_draft_tokens=int(num_draft_tokens), draft_step_cost=draft_step_cost)
        res = replace(d.resources, provenance=(
            f"DERIVED speculative profile: reuses the measured deployment's scheduler envelope and observed KV pool "
            f"unchanged (draft weights and draft KV are not subtracted, as for measured rounds). Source: {d.resources.provenance}"
        ))
        sd = replace(d, resources=res, execution_profile=ep)
        deps.append(sd)
        params.append(p)
        cols = table_columns(
            sd, model=prof.model, model_revision=prof.model_revision, binned=rows,
            cell_id=f"derived-eagle3-k{num_draft_tokens}-tp{d.tp}",
            latency_decode=round_latency_ms(rows.decode_latency_ms, rows.decode_batch, p),
            latency_prefill=rows.prefill_latency_ms * (1.0 + draft_step_cost),
        )
        n = len(cols["latency_ms"])
        cols["timing_boundary"] = ["derived_from_measured_ar_passes"] * n
        cols["model_support_level"] = ["derived"] * n
        parts.append(cols)
    columns = merge_columns(parts)
    provenance = (
        f"DERIVED, NOT MEASURED: EAGLE-3 speculative rounds with K={num_draft_tokens} computed by jaxsim "
        f"{jaxsim.__version__} (jaxsim.importers.derived_sd) from the measured autoregressive profile "
        f"'{Path(source).name}'. round_ms(b, k) = decode_ms(b, k) x (1 + c x K) + K x b x mu at every measured decode "
        f"row (verification of K+1 positions per request = the measured decode step plus K extra query tokens of "
        f"measured marginal cost mu; K draft steps of c = {draft_step_cost:g} x the decode step); prefill rows = "
        f"measured prefill x (1 + c). {'; '.join(x.describe() for x in params)}. draft_model {draft_model} is nominal "
        f"and draft_revision {draft_rev} a placeholder (sha1 of the derivation text). Source provenance: {prof.provenance}"
    )
    profile = ModelProfile.from_dict(
        replace(prof, provenance=provenance, deployments=tuple(deps), data_source="derived").to_dict(), source="derived profile"
    )
    return profile, columns, params


def write_derived_profile(
    output: str | os.PathLike, source: str | os.PathLike, *, num_draft_tokens: int,
    draft_step_cost: float = DRAFT_STEP_RELATIVE_COST, force: bool = False,
) -> Path:
    """Derive and write a speculative-round profile directory (validated on write)."""
    profile, columns, _ = derive_speculative(source, num_draft_tokens=num_draft_tokens, draft_step_cost=draft_step_cost)
    return write_profile_dir(
        output, profile, columns, measurement_policy=SD_POLICY, force=force,
        extra_sidecar={"provenance": f"DERIVED (not measured) EAGLE-3 K={num_draft_tokens} rounds; see profile.json provenance"},
    )
