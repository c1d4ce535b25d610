"""Rank-local KV-cache geometry by attention kind, read off a model's bytes-per-sequence function.

An engine's KV cache grows differently per kind of layer:

* full attention (GQA, MHA, MLA): bytes per token, for every token of the context;
* sliding-window attention (window W): bytes per token, but only for the last W tokens of a sequence;
* linear attention / state-space layers (Gated DeltaNet, Mamba): a recurrent state of fixed size per
  sequence, whatever its length.

So the bytes of one sequence of L tokens are ``state + full·L + window·min(L, W)``. :func:`kv_geometry`
recovers the four numbers from the op model's own ``get_kvcache_bytes_per_sequence(L)`` (the slope far
beyond every window, the slope of the first tokens, where that slope changes, and the constant) and
checks that the function is exactly of that form. :meth:`KvGeometry.cache_groups` writes it as the
reference's grouped cache layout (``FpmCacheGroup``): one attention group per kind of attention layer and
one per-sequence state group, recorded as a ``convolution`` group whose single block spans max_model_len
tokens (one page per sequence, at any length).

Plain integers, no JAX and no op-model import: the importer passes the function in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from jaxsim.errors import JaxsimError
from jaxsim.profile.model import CacheGroup

__all__ = ["ATTENTION_BLOCK_TOKENS", "KvGeometry", "kv_geometry", "layer_kinds"]

ATTENTION_BLOCK_TOKENS = 16
"""Block of the attention groups of a grouped layout (vLLM's default CUDA block size)."""
PROBE_TOKENS = 1 << 20
"""A context far beyond every sliding window, where only full-attention layers still grow."""


@dataclass(frozen=True)
class KvGeometry:
    """Bytes of one sequence of L tokens on one rank: ``state + full·L + window·min(L, window_tokens)``."""

    full_bytes_per_token: int
    window_bytes_per_token: int = 0
    window_tokens: int = 0
    state_bytes: int = 0
    full_layers: int = 0
    window_layers: int = 0
    state_layers: int = 0

    @property
    def linear(self) -> bool:
        """Only full attention: a linear cache of ``full_bytes_per_token``."""
        return self.window_bytes_per_token == 0 and self.state_bytes == 0

    def sequence_bytes(self, tokens: int) -> int:
        return self.state_bytes + self.full_bytes_per_token * tokens + self.window_bytes_per_token * min(tokens, self.window_tokens)

    def fixed_bytes(self) -> int:
        """Bytes a sequence holds beyond its full-attention tokens once past the window."""
        return self.state_bytes + self.window_bytes_per_token * self.window_tokens

    def cache_groups(self, max_model_len: int, block_tokens: int = ATTENTION_BLOCK_TOKENS) -> tuple[CacheGroup, ...]:
        """The reference's grouped layout of this geometry (page = one block of all the group's layers)."""
        out = []
        if self.full_bytes_per_token:
            out.append(CacheGroup("full_attention", "attention", max(self.full_layers, 1), block_tokens,
                                  block_tokens * self.full_bytes_per_token))
        if self.window_bytes_per_token:
            out.append(CacheGroup("sliding_attention", "attention", max(self.window_layers, 1), block_tokens,
                                  block_tokens * self.window_bytes_per_token, self.window_tokens))
        if self.state_bytes:
            out.append(CacheGroup("recurrent_state", "convolution", max(self.state_layers, 1), int(max_model_len),
                                  self.state_bytes, 1))
        return tuple(out)

    def describe(self) -> str:
        parts = [f"full attention {self.full_bytes_per_token:,} B/token" + (f" ({self.full_layers} layers)" if self.full_layers else "")]
        if self.window_bytes_per_token:
            parts.append(f"sliding window {self.window_bytes_per_token:,} B/token over the last {self.window_tokens:,} tokens"
                         + (f" ({self.window_layers} layers)" if self.window_layers else ""))
        if self.state_bytes:
            parts.append(f"recurrent state {self.state_bytes:,} B/sequence" + (f" ({self.state_layers} layers)" if self.state_layers else ""))
        return "; ".join(parts)


def layer_kinds(config: Mapping) -> dict[str, int]:
    """Layers per kind from a Hugging Face config's ``layer_types`` (text_config first): full, window, state."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    types = text.get("layer_types") or config.get("layer_types") or []
    if not isinstance(types, list) or not types:
        n = int(text.get("num_hidden_layers") or 0)
        return {"full": n, "window": 0, "state": 0}
    kinds = {"full": 0, "window": 0, "state": 0}
    for t in types:
        t = str(t)
        kinds["window" if "sliding" in t else "state" if ("linear" in t or "mamba" in t or "ssm" in t) else "full"] += 1
    return kinds


def kv_geometry(bytes_per_sequence: Callable[[int], float], *, what: str,
                layers: Mapping[str, int] | None = None) -> KvGeometry:
    """The geometry of ``bytes_per_sequence`` (bytes of one sequence of L tokens on one rank); JaxsimError
    naming ``what`` when the function is not of the form ``state + full·L + window·min(L, W)``."""
    def f(n: int) -> int:
        return int(round(float(bytes_per_sequence(n))))

    far = f(PROBE_TOKENS + 1) - f(PROBE_TOKENS)
    near = f(2) - f(1)
    if far < 0 or near < far:
        raise JaxsimError(f"{what}: KV bytes per sequence do not grow like attention caches (slope {near} B/token "
                          f"at 1 token, {far} B/token at {PROBE_TOKENS:,})")
    window = 0
    if near > far:  # the first L whose next token adds only the full-attention slope
        lo, hi = 1, PROBE_TOKENS
        while lo < hi:
            mid = (lo + hi) // 2
            if f(mid + 1) - f(mid) == far:
                hi = mid
            else:
                lo = mid + 1
        window = lo
    win_rate = near - far
    state = f(PROBE_TOKENS) - far * PROBE_TOKENS - win_rate * window
    lay = dict(layers or {})
    geo = KvGeometry(far, win_rate, window, state, lay.get("full", 0), lay.get("window", 0) if win_rate else 0,
                     lay.get("state", 0) if state else 0)
    probes = sorted({1, 2, 3, max(window, 1), window + 1, window + 2, 4096, PROBE_TOKENS // 3, PROBE_TOKENS})
    bad = next((n for n in probes if abs(f(n) - geo.sequence_bytes(n)) > 1), None)
    if state < 0 or bad is not None:
        raise JaxsimError(f"{what}: KV bytes per sequence are not full attention + a sliding window + a per-sequence "
                          f"state ({f(bad) if bad else state} B at {bad or 0} tokens vs {geo.describe()})")
    return geo
