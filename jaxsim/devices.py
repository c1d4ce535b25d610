"""Local devices: use every CPU core as a JAX device and shard the query/config axis across them."""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

_FLAG = "--xla_force_host_platform_device_count"


def use_all_cpu_cores() -> None:
    """Expose each CPU core as a host device (call before the first JAX computation).

    XLA runs one vmapped gather kernel on one thread; splitting the batch axis over host devices
    uses every core. A count the user already set in XLA_FLAGS is kept.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if _FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={max(1, os.cpu_count() or 1)}".strip()


def batch_sharding() -> NamedSharding:
    """Sharding of a leading batch axis over all local devices (1-D mesh ``batch``)."""
    return NamedSharding(Mesh(np.array(jax.local_devices()), ("batch",)), PartitionSpec("batch"))


def num_devices() -> int:
    return len(jax.local_devices())


def shard(*arrays: np.ndarray):
    """Place equally long arrays (length divisible by the device count) split over local devices."""
    sh = batch_sharding()
    return tuple(jax.device_put(a, sh) for a in arrays)


def enable_compilation_cache() -> None:
    """Persist compiled kernels across CLI runs (``$JAXSIM_CACHE_DIR``, default ~/.cache/jaxsim/xla)."""
    path = os.environ.get("JAXSIM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "jaxsim", "xla")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
