"""What GPUs cost: bundled list prices per system, the user's own prices, and what a throughput costs.

The bundled table (``jaxsim/data/prices/gpu_list_prices.csv``, sources and dates in the README beside it)
holds public **list prices** in US dollars per GPU-hour, one row per (system, basis): ``on-demand`` or
``reserved``. A sweep spec's ``[cost]`` table (``basis``, ``usd_per_gpu_hour = {system = usd}``) or the
``--price SYSTEM=USD`` option override them; a system with neither has no price (NaN cost columns).

Cost of a serving unit: ``usd_per_gpu_hour × gpus`` per hour; cost of output tokens:
``usd_per_gpu_hour / (output tokens/s per GPU × 3600 s) × 10⁶`` per million (plain Python / numpy, no JAX).
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

import numpy as np

from jaxsim import limits
from jaxsim.errors import InputError
from jaxsim.systems import list_systems

__all__ = ["PRICE_BASES", "DEFAULT_BASIS", "GpuPrice", "Prices", "list_prices", "bundled_price", "check_price",
           "parse_price_option", "usd_per_million_tokens", "gpu_name"]

PRICE_BASES = ("on-demand", "reserved")
DEFAULT_BASIS = "on-demand"
SECONDS_PER_HOUR = 3600.0
TOKENS_PER_MILLION = 1e6


@dataclass(frozen=True)
class GpuPrice:
    """One bundled list price: US dollars per GPU-hour of ``system`` on ``basis``, where it was read and when."""

    system: str
    basis: str
    usd_per_gpu_hour: float
    provider: str
    offer: str
    source: str
    read_on: str

    def describe(self) -> str:
        return f"{self.provider} {self.basis} list price, {self.source}, read {self.read_on}"


@functools.cache
def list_prices() -> tuple[GpuPrice, ...]:
    """Every bundled list price (``jaxsim/data/prices/gpu_list_prices.csv``)."""
    text = resources.files("jaxsim.data").joinpath("prices", "gpu_list_prices.csv").read_text(encoding="utf-8")
    return tuple(GpuPrice(r["system"], r["basis"], float(r["usd_per_gpu_hour"]), r["provider"], r["offer"], r["source"], r["read_on"])
                 for r in csv.DictReader(text.splitlines()))


def bundled_price(system: str, basis: str = DEFAULT_BASIS) -> GpuPrice | None:
    """The bundled list price of ``system`` on ``basis``, or None when the table has none."""
    return next((p for p in list_prices() if p.system == system and p.basis == basis), None)


def check_price(system: str, usd: object, where: str) -> float:
    """A user's price for ``system``: a known system and a finite number > 0 (one-line :class:`InputError`
    naming ``where`` otherwise)."""
    if system not in list_systems():
        raise InputError(f"{where}: unknown system {system!r} (known: {', '.join(list_systems())})")
    msg = limits.problem("usd_per_gpu_hour", usd)
    if msg is not None:
        raise InputError(f"{where}: the price of {system} in US dollars per GPU-hour {msg}")
    return float(usd)


def parse_price_option(text: str, where: str = "--price") -> tuple[str, float]:
    """``SYSTEM=USD`` (e.g. ``b200_sxm=4.5``) → (system, price), checked by :func:`check_price`."""
    system, sep, value = str(text).partition("=")
    if not sep or not system.strip():
        raise InputError(f"{where} {text!r}: expected SYSTEM=USD_PER_GPU_HOUR, e.g. b200_sxm=4.5")
    try:
        usd = float(value)
    except ValueError:
        raise InputError(f"{where} {text!r}: {value!r} is not a number of US dollars per GPU-hour") from None
    return system.strip(), check_price(system.strip(), usd, where)


@dataclass(frozen=True)
class Prices:
    """The $/GPU-hour a sweep or a sizing uses: the bundled list prices of ``basis``, with ``overrides``
    ((system, usd) pairs, checked) taking precedence."""

    basis: str = DEFAULT_BASIS
    overrides: tuple[tuple[str, float], ...] = ()

    def __post_init__(self):
        if self.basis not in PRICE_BASES:
            raise InputError(f"price basis must be {' or '.join(PRICE_BASES)} (got {self.basis!r})")
        for system, usd in self.overrides:
            check_price(system, usd, "price")

    def with_overrides(self, more: Mapping[str, float]) -> Prices:
        """These prices with ``more`` (system → usd) replacing or adding overrides."""
        merged = dict(self.overrides)
        merged.update(more)
        return Prices(self.basis, tuple(sorted(merged.items())))

    def usd_per_gpu_hour(self, system: str) -> float:
        """The price of one GPU-hour of ``system`` (NaN when neither an override nor the table has one)."""
        own = dict(self.overrides)
        if system in own:
            return float(own[system])
        p = bundled_price(system, self.basis)
        return p.usd_per_gpu_hour if p is not None else float("nan")

    def source(self, system: str) -> str:
        """Where the price of ``system`` comes from, in words."""
        if system in dict(self.overrides):
            return "given by the user"
        p = bundled_price(system, self.basis)
        return p.describe() if p is not None else "no price"

    def describe(self, systems) -> dict[str, dict]:
        """Price and source per system (JSON-able; NaN prices as None)."""
        out = {}
        for s in systems:
            usd = self.usd_per_gpu_hour(s)
            out[s] = {"usd_per_gpu_hour": usd if math.isfinite(usd) else None, "basis": self.basis, "source": self.source(s)}
        return out


def usd_per_million_tokens(usd_per_gpu_hour, tokens_per_s_per_gpu) -> np.ndarray:
    """US dollars per million output tokens at ``tokens_per_s_per_gpu`` (NaN where it is not positive and finite,
    or the price is NaN)."""
    price = np.asarray(usd_per_gpu_hour, np.float64)
    rate = np.asarray(tokens_per_s_per_gpu, np.float64)
    ok = np.isfinite(rate) & (rate > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ok, price / np.where(ok, rate, 1.0) / SECONDS_PER_HOUR * TOKENS_PER_MILLION, np.nan)


def gpu_name(system: str) -> str:
    """A system id as people name the GPU: ``b200_sxm`` → ``B200``, ``h100_pcie`` → ``H100 PCIe``, ``gb200`` → ``GB200``."""
    head, *rest = str(system).split("_")
    tail = [{"pcie": "PCIe", "sxm": "", "server": ""}.get(r, r) for r in rest]
    return " ".join([head.upper(), *[t for t in tail if t]])
