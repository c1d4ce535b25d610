"""Local devices: use every CPU core as a JAX device and shard the query/config axis across them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jax.sharding import Mesh, NamedSharding

# JAX is imported inside the functions that need it: the CLI calls use_all_cpu_cores and
# enable_compilation_cache at start-up, and commands that compile nothing must not pay for importing JAX.

_FLAG = "--xla_force_host_platform_device_count"


def use_all_cpu_cores() -> None:
    """Expose each CPU core as a host device (call before the first JAX computation).

    XLA runs one vmapped gather kernel on one thread; splitting the batch axis over host devices
    uses every core. A count the user already set in XLA_FLAGS is kept.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if _FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={max(1, os.cpu_count() or 1)}".strip()


def _mesh(devices: Sequence | None = None) -> Mesh:
    """A 1-D mesh (axis ``batch``) over ``devices`` (default: all local devices)."""
    from jaxsim._jax import ensure_x64

    ensure_x64()
    import jax
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(list(devices or jax.local_devices())), ("batch",))


def batch_sharding(devices: Sequence | None = None) -> NamedSharding:
    """Sharding of a leading batch axis split over ``devices`` (default: all local devices)."""
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(_mesh(devices), PartitionSpec("batch"))


def replicated(devices: Sequence | None = None) -> NamedSharding:
    """A whole copy on each of ``devices`` (default: all local devices), beside :func:`batch_sharding`."""
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(_mesh(devices), PartitionSpec())


def num_devices() -> int:
    import jax

    return len(jax.local_devices())


def shard(*arrays):
    """Place equally long arrays (length divisible by the device count) split over local devices."""
    import jax

    sh = batch_sharding()
    return tuple(jax.device_put(a, sh) for a in arrays)


def shard_if_even(*trees):
    """Pytrees with one leading (item) axis split over the local devices when its length divides
    evenly (every CPU core once :func:`use_all_cpu_cores` was called); otherwise returned as they are."""
    import jax

    n = jax.tree.leaves(trees[0])[0].shape[0]
    if num_devices() < 2 or n % num_devices():
        return trees
    sh = batch_sharding()
    return tuple(jax.tree.map(lambda x: jax.device_put(x, sh), t) for t in trees)


def enable_compilation_cache() -> None:
    """Persist compiled kernels across CLI runs (``$JAXSIM_CACHE_DIR``, default ~/.cache/jaxsim/xla), the
    small ones too: a CLI run compiles a few dozen tiny functions (table conversions, capacity numbers)
    whose 20–100 ms each add up (sweep_large's planning: 0.6 → 0.4 s with them cached). The folder is
    created 0700 and used only if this user owns it and nobody else can write it (JAX loads native code
    from it): otherwise one line on stderr and no persistent cache (:mod:`jaxsim.cache_trust`)."""
    from jaxsim.cache_trust import default_cache_root, trusted_dir

    path = trusted_dir(default_cache_root(), "jaxsim cache folder")
    if path is None:
        return
    path = str(path)
    import sys

    if "jax" in sys.modules:  # already imported: set the options directly
        import jax

        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    else:  # JAX reads these when it is imported (later, and only by commands that compile)
        os.environ["JAX_COMPILATION_CACHE_DIR"] = path
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
