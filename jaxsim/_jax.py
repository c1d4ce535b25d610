"""JAX set-up in one place: jaxsim's timing math is float64 (int64 sentinels, nanosecond clocks).

Importing :mod:`jaxsim` does not import JAX (so ``jaxsim --help``, ``profiles list`` and ``validate``
start instantly). Every jaxsim module that builds or runs compiled code imports this module and calls
:func:`ensure_x64` (at import and at its compiled entry points), which turns x64 on and refuses to go on
if it is not on. Module-level compiled functions are built with :func:`jit_x64` (``jax.jit`` + the check
at every call), so switching x64 off after import cannot silently turn int64 inputs into int32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib
import io
import json
import os
import re
import stat
import sys
import time
from pathlib import Path

import jax
import numpy as np

from jaxsim.environment import executable_cache_max_bytes

__all__ = [
    "compile_all",
    "compile_cached",
    "compile_fresh",
    "executable_key",
    "prune_executables",
    "fresh_compilation",
    "ensure_x64",
    "jit_x64",
    "load_arrays",
    "load_executable",
    "save_arrays",
    "save_executable",
]


def ensure_x64() -> None:
    """Enable ``jax_enable_x64`` and check it took effect; raise RuntimeError when it did not."""
    if not jax.config.read("jax_enable_x64"):
        jax.config.update("jax_enable_x64", True)
    if not jax.config.read("jax_enable_x64") or jax.dtypes.canonicalize_dtype(np.float64) != np.float64:
        raise RuntimeError(
            "jaxsim needs JAX's 64-bit mode (jax_enable_x64): float64 timings and int64 clocks would "
            "silently lose precision without it; it could not be enabled in this process"
        )


class _X64Jit:
    """A ``jax.jit`` function that calls :func:`ensure_x64` before every call and lowering (in Python,
    before the arguments are converted: with x64 off, int64 inputs would silently become int32)."""

    def __init__(self, fun, **jit_kwargs):
        self._jitted = jax.jit(fun, **jit_kwargs)
        functools.update_wrapper(self, fun)

    def __call__(self, *args, **kwargs):
        ensure_x64()
        return self._jitted(*args, **kwargs)

    def lower(self, *args, **kwargs):
        ensure_x64()
        return self._jitted.lower(*args, **kwargs)

    def __getattr__(self, name):  # anything else (e.g. ``_cache_size``) is the jitted function's
        if name == "_jitted":
            raise AttributeError(name)
        return getattr(self._jitted, name)

    def __repr__(self) -> str:
        return f"jit_x64({getattr(self, '__qualname__', self._jitted)})"


def jit_x64(fun=None, **jit_kwargs):
    """``jax.jit`` for jaxsim's compiled entry points: checks x64 (:func:`ensure_x64`) at every call.
    Use as ``jit_x64(f, static_argnums=...)`` or as a decorator ``@jit_x64``."""
    if fun is None:
        return functools.partial(jit_x64, **jit_kwargs)
    return _X64Jit(fun, **jit_kwargs)


ensure_x64()


# ----------------------------------------------------------------------------------------------------
# executables kept on disk: a later process skips tracing and lowering, not only XLA's compilation


@functools.cache
def source_digest() -> str:
    """SHA-256 of every jaxsim source file: a cached executable is valid only for the code that built it."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def executable_dir() -> Path | None:
    """``<JAX compilation cache dir>/jaxsim-executables`` (created 0700); None when JAX's persistent cache
    is off, ``JAXSIM_EXECUTABLE_CACHE=0`` (the test suite sets it: a loaded executable is never traced, so
    its runtime annotation checks would not run), or either folder is not one jaxsim may trust (another
    user's, writable by others, a symbolic link: one line on stderr, :mod:`jaxsim.cache_trust`)."""
    from jaxsim.cache_trust import trusted_dir  # noqa: PLC0415

    base = jax.config.jax_compilation_cache_dir
    if not base or os.environ.get("JAXSIM_EXECUTABLE_CACHE", "1") == "0":
        return None
    executable_cache_max_bytes()  # a bad setting is the user's error, reported before anything compiles
    if trusted_dir(base, "jaxsim cache folder") is None:
        return None
    return trusted_dir(Path(base) / "jaxsim-executables", "jaxsim executable cache")


ENTRY_NAME = re.compile(r"[A-Za-z0-9_.-]+-[0-9a-f]{40}\.bin")
"""The names of the entries jaxsim writes (``<name>-<key>.bin``): the only files its pruner deletes there."""
JAX_ENTRY_NAME = re.compile(r"[A-Za-z0-9_.-]+-[0-9a-f]{64}-(?:cache|atime)")
"""The names of JAX's persistent compilation cache entries in the cache root (pruned under the same cap)."""
TEMP_NAME = re.compile(r"\.?[A-Za-z0-9_.-]+-[0-9a-f]{40}\.bin\.(?:[0-9]+\.tmp|[a-z0-9_]{8}\.partial)")
"""Temporary files of interrupted saves (this version's, and the ``.PID.tmp`` of earlier ones)."""


def _entry_path(d: Path, name: str, args: tuple, statics: dict | None) -> tuple[Path, str]:
    key = executable_key(name, args, statics)
    return d / f"{name}-{key}.bin", key


def _leaf_signature(x) -> str:
    aval = jax.typeof(x)
    return f"{aval.str_short()}:{getattr(aval, 'weak_type', False)}:{getattr(x, 'sharding', None)}"


def executable_key(name: str, args: tuple, statics: dict | None = None) -> str:
    """What an executable depends on: the code, JAX and its devices, the arguments' structure, shapes,
    dtypes and placement, and the static arguments."""
    import jaxlib  # noqa: PLC0415

    devices = jax.devices()
    parts = [
        name, source_digest(), jax.__version__, jaxlib.__version__, sys.version,
        devices[0].platform, getattr(devices[0].client, "platform_version", ""), ",".join(d.device_kind for d in devices),
        str(len(devices)), os.environ.get("XLA_FLAGS", ""), str(jax.config.read("jax_enable_x64")),
        repr(sorted((statics or {}).items())), str(jax.tree.structure(args)),
        *map(_leaf_signature, jax.tree.leaves(args)),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:40]


def _out_tree_record(out_tree):
    """A picklable description of an executable's output structure (treedefs of equinox Modules do not
    pickle): a recipe of its containers (tuples, lists, dicts, Modules by class) that
    :func:`_out_tree_from` rebuilds and checks; None for a structure it cannot describe."""
    try:
        recipe = _recipe(jax.tree.unflatten(out_tree, [0] * out_tree.num_leaves))
    except TypeError:
        return None
    return (recipe, str(out_tree)) if jax.tree.structure(_build(recipe)) == out_tree else None


def _recipe(node):
    if isinstance(node, (tuple, list)):
        return (type(node).__name__, [_recipe(x) for x in node])
    if isinstance(node, dict):
        return ("dict", {k: _recipe(v) for k, v in node.items()})
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        fields = {f.name: _recipe(getattr(node, f.name)) for f in dataclasses.fields(node)}
        return ("module", type(node).__module__, type(node).__qualname__, fields)
    if isinstance(node, int) and node == 0:
        return "leaf"
    raise TypeError(f"cannot describe output node {type(node).__name__}")


def _build(recipe):
    if recipe == "leaf":
        return 0
    kind = recipe[0]
    if kind in ("tuple", "list"):
        return (tuple if kind == "tuple" else list)(_build(x) for x in recipe[1])
    if kind == "dict":
        return {k: _build(v) for k, v in recipe[1].items()}
    _, module, qualname, fields = recipe
    cls = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    obj = object.__new__(cls)
    for name, sub in fields.items():
        object.__setattr__(obj, name, _build(sub))
    return obj


def _out_tree_from(record):
    recipe, text = record
    tree = jax.tree.structure(_build(recipe))
    if str(tree) != text:
        raise ValueError("output structure changed")
    return tree


class _Loaded:
    """A loaded executable that proves itself on its first call: when that call fails (an entry that
    deserialized but cannot run), the entry is deleted and ``rebuild()`` (a fresh compilation) takes over."""

    def __init__(self, exe, path: Path, rebuild):
        self._exe, self._path, self._rebuild, self._checked = exe, path, rebuild, False

    def __call__(self, *args):
        if self._checked:
            return self._exe(*args)
        try:
            out = jax.block_until_ready(self._exe(*args))
        except Exception:  # noqa: BLE001 (any failure of a cached executable: rebuild it)
            self._path.unlink(missing_ok=True)
            self._exe = self._rebuild()
            out = self._exe(*args)
        self._checked = True
        return out


def _read_entry(path: Path, name: str, key: str) -> tuple[bytes, dict] | None:
    """The payload and header of the entry at ``path`` when it is a plain file of this user sealed with
    this user's key (:mod:`jaxsim.cache_trust`) for exactly (``name``, ``key``); None otherwise. Nothing
    is unpickled before the seal is checked."""
    from jaxsim.cache_trust import read_own_file, unseal, user_key  # noqa: PLC0415

    secret = user_key()
    data = None if secret is None else read_own_file(path)
    body = None if data is None else unseal(secret, data)
    if body is None or len(body) < 8:
        return None
    n = int.from_bytes(body[:8], "big")
    try:
        header = json.loads(body[8:8 + n].decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(header, dict) or header.get("name") != name or header.get("key") != key:
        return None
    return body[8 + n:], header


def load_executable(name: str, args: tuple, statics: dict | None = None, rebuild=None):
    """The executable :func:`save_executable` stored for these arguments, or None (cache off, not stored,
    not sealed by this user, or unreadable: a stale or damaged entry is ignored and replaced by the next
    save). With ``rebuild`` (a function returning a freshly compiled executable), an entry whose first
    call fails is replaced by ``rebuild()``. A read-only cache still loads."""
    d = executable_dir()
    if d is None:
        return None
    path, key = _entry_path(d, name, args, statics)
    entry = _read_entry(path, name, key)
    if entry is None:
        return None
    payload, header = entry
    try:
        os.utime(path, follow_symlinks=False)  # recently used: pruned last (prune_executables)
    except OSError:
        pass  # a read-only cache: still a hit
    try:
        from jax.experimental import serialize_executable as se  # noqa: PLC0415

        by_id = {d.id: d for d in jax.devices()}
        in_tree = jax.tree.structure((tuple(args), {}))
        exe = se.deserialize_and_load(payload, in_tree, _out_tree_from(header["out_tree"]),
                                      execution_devices=[by_id[i] for i in header["device_ids"]])
    except Exception:  # noqa: BLE001 (our own entry that no longer loads, e.g. other devices: a miss)
        return None
    return exe if rebuild is None else _Loaded(exe, path, rebuild)


def save_executable(name: str, args: tuple, statics: dict | None, compiled) -> None:
    """Store ``compiled`` (built for ``args``/``statics``) for later processes, sealed with this user's
    key; silently skipped when the cache is off, the executable cannot be serialized, or the folder is
    not writable (no temporary file is left behind)."""
    from jaxsim.cache_trust import seal, user_key  # noqa: PLC0415
    from jaxsim.outputs import atomic_file  # noqa: PLC0415

    d = executable_dir()
    secret = None if d is None else user_key()
    if secret is None:
        return
    try:
        from jax.experimental import serialize_executable as se  # noqa: PLC0415

        record = _out_tree_record(compiled.out_tree)
        if record is None:
            return
        device_ids = [dev.id for dev in compiled._executable.xla_executable.local_devices()]
        payload, _, _ = se.serialize(compiled)
        path, key = _entry_path(d, name, args, statics)
        header = json.dumps({"name": name, "key": key, "out_tree": record, "device_ids": device_ids}).encode("utf-8")
        with atomic_file(path) as f:
            f.write(seal(secret, len(header).to_bytes(8, "big") + header + payload))
        prune_executables(d)
    except Exception:  # noqa: BLE001 (caching is an optimisation; compiling again is always correct)
        return


def load_arrays(name: str, key: str) -> dict[str, np.ndarray] | None:
    """The arrays :func:`save_arrays` stored under (``name``, ``key``: 40 hex digits), or None (cache off,
    not stored, not sealed by this user, unreadable). Host-side precomputation kept next to the executables
    (a profile cell's compiled lookup tables): read as plain arrays, never unpickled."""
    d = executable_dir()
    if d is None:
        return None
    path = d / f"{name}-{key}.bin"
    entry = _read_entry(path, name, key)
    if entry is None:
        return None
    try:
        with np.load(io.BytesIO(entry[0]), allow_pickle=False) as z:
            out = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError):
        return None
    with contextlib.suppress(OSError):
        os.utime(path, follow_symlinks=False)  # recently used: pruned last
    return out


def save_arrays(name: str, key: str, arrays: dict[str, np.ndarray]) -> None:
    """Store ``arrays`` for :func:`load_arrays`, sealed with this user's key; silently skipped when the
    cache is off or not writable (storing is an optimisation)."""
    from jaxsim.cache_trust import seal, user_key  # noqa: PLC0415
    from jaxsim.outputs import atomic_file  # noqa: PLC0415

    d = executable_dir()
    secret = None if d is None else user_key()
    if secret is None:
        return
    try:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        header = json.dumps({"name": name, "key": key}).encode("utf-8")
        with atomic_file(d / f"{name}-{key}.bin") as f:
            f.write(seal(secret, len(header).to_bytes(8, "big") + header + buf.getvalue()))
        prune_executables(d)
    except Exception:  # noqa: BLE001 (caching is an optimisation; computing again is always correct)
        return


def _own_entries(folder: Path, pattern: re.Pattern) -> list[tuple[int, int, Path]]:
    """(mtime, size, path) of the plain files of this user in ``folder`` named by ``pattern``; a folder
    that is a symbolic link is not listed."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return []
        listing = list(os.scandir(folder))
    except OSError:
        return []
    out = []
    for e in listing:
        if not pattern.fullmatch(e.name):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
            out.append((st.st_mtime_ns, st.st_size, Path(e.path)))
    return out


def prune_executables(d: Path, max_bytes: int | None = None) -> list[Path]:
    """Delete the least recently used entries (by modification time; a load touches its entry) until
    the cache holds at most ``max_bytes``; return what was deleted. The cap covers jaxsim's executables
    in ``d`` and JAX's compilation cache entries in its parent folder (the cache root) together. Only
    files of this user named as jaxsim and JAX name their entries are counted or deleted, never through
    a symbolic link. Every source change of jaxsim starts new entries, so without this the folder would
    only grow."""
    from jaxsim.outputs import STALE_AFTER_S  # noqa: PLC0415

    cap = executable_cache_max_bytes() if max_bytes is None else max_bytes
    for mtime_ns, _, f in _own_entries(d, TEMP_NAME):  # what killed saves left
        if time.time() - mtime_ns / 1e9 > STALE_AFTER_S:
            with contextlib.suppress(OSError):
                os.unlink(f)
    entries = _own_entries(d, ENTRY_NAME) + _own_entries(d.parent, JAX_ENTRY_NAME)
    total = sum(size for _, size, _ in entries)
    gone = []
    for _, size, f in sorted(entries, key=lambda e: e[0]):
        if total <= cap:
            break
        try:
            os.unlink(f)
        except OSError:
            continue
        total -= size
        gone.append(f)
    return gone


@contextlib.contextmanager
def fresh_compilation():
    """Within: XLA compiles, JAX's persistent compilation cache is neither read nor written. An executable
    JAX restored from that cache does not survive a second serialization (reloaded, it misses its
    kernels: ``Function wrapped_iota not found``), so only fresh compilations go to the executable cache.
    Process-wide while it lasts (compile only inside it); the cache is back on afterwards."""
    from jax.experimental.compilation_cache import compilation_cache as cc  # noqa: PLC0415

    was = jax.config.jax_enable_compilation_cache
    cc.reset_cache()
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", was)
        cc.reset_cache()


def key_statics(statics: dict | None, options: dict | None) -> dict | None:
    """What an executable's cache key records of its static arguments and XLA compiler options."""
    if not options:
        return statics
    return {**(statics or {}), "__xla_options__": repr(sorted(options.items()))}


SERIAL_OPS = "jaxsim_serial_ops"
"""A compiler option of jaxsim's own (not XLA's; taken out before XLA sees the options): compile so that no single
operation is split over threads. XLA:CPU's ``ParallelTaskAssigner`` splits an operation it prices as I/O bound over
up to sqrt(cores) threads (2 on the 2-core machine), and its cost model prices a fused gather by the whole array it
reads from: a gather of 64 cells of the 131,073 x 7 block-pool array is split in two, and each such split costs
about 1.5 us of thread synchronisation for work of about 0.1 us (measured: a loop of two such gathers, 3.2 vs
0.2 us per iteration). The replay engines run thousands of small steps and already use every core by running
replays on separate devices, so their executables ask for this. XLA takes sqrt(cores) from the CPU affinity of the
thread that runs its passes (one of JAX's own threads), so every thread of the process is held on a single core
(round robin) while such executables compile, then given its mask back: see :func:`_threads_on_single_cores` (a
:func:`compile_all` batch holding one such executable compiles all of its executables this way).
Results are the same either way (a split only divides independent output elements between threads)."""


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


@contextlib.contextmanager
def _threads_on_single_cores():
    """Hold each thread of the process on one core (round robin over the calling thread's cores) and afterwards give
    every thread, those started meanwhile too, its mask back (Linux; elsewhere nothing changes)."""
    get, put = getattr(os, "sched_getaffinity", None), getattr(os, "sched_setaffinity", None)
    saved: dict[int, set] = {}
    if get is not None and put is not None:
        with contextlib.suppress(OSError):
            mask = get(0)
            cores = sorted(mask)
            for j, tid in enumerate(_threads()):
                with contextlib.suppress(OSError):
                    saved[tid] = get(tid)
                    put(tid, {cores[j % len(cores)]})
    try:
        yield
    finally:
        if saved:
            for tid in _threads():
                with contextlib.suppress(OSError):
                    put(tid, saved.get(tid, mask))


def _xla_compile(lowered, options: dict | None):
    """``lowered.compile()`` with XLA compiler ``options`` (None: XLA's defaults; :data:`SERIAL_OPS` is jaxsim's
    own); options this XLA does not know are dropped (compiled with its defaults: same results, see
    :func:`compile_all`)."""
    options = {k: v for k, v in (options or {}).items() if k != SERIAL_OPS}
    if options:
        try:
            return lowered.compile(compiler_options=dict(options))
        except Exception as e:  # noqa: BLE001
            if "compile option" not in str(e):
                raise
    return lowered.compile()


def compile_all(specs) -> tuple[list, int, int]:
    """Executables for ``specs`` ((name, jitted fn, args, statics[, XLA compiler options]); args may be
    ``ShapeDtypeStruct``), in order: each loaded from the executable cache (no tracing; an entry whose
    first call fails is rebuilt) or traced and lowered one after the other, compiled by XLA in parallel
    threads outside JAX's persistent cache, and stored. Also returns how many were compiled and how many
    loaded. Compiler options change how long XLA takes and how fast the program runs, never what it
    computes (the replay tests compare with and without them bit for bit)."""
    out, todo = [None] * len(specs), []
    for i, (name, fn, args, statics, *rest) in enumerate(specs):
        options = rest[0] if rest else None
        out[i] = load_executable(name, args, key_statics(statics, options),
                                 rebuild=functools.partial(compile_fresh, name, fn, args, statics, options))
        if out[i] is None:
            todo.append((i, fn.lower(*args, **(statics or {})), options))
    if todo:
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

        serial = any((o or {}).get(SERIAL_OPS) for _, _, o in todo)
        with (_threads_on_single_cores() if serial else contextlib.nullcontext()), fresh_compilation(), \
                ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1))) as pool:
            compiled = list(pool.map(lambda t: _xla_compile(t[1], t[2]), todo))
        for (i, _, options), exe in zip(todo, compiled):
            name, _, args, statics, *_ = specs[i]
            save_executable(name, args, key_statics(statics, options), exe)
            out[i] = exe
    return out, len(todo), len(specs) - len(todo)


def compile_fresh(name: str, fn, args: tuple, statics: dict | None = None, options: dict | None = None):
    """Trace, lower and XLA-compile ``fn`` for ``args`` (outside JAX's persistent cache, with XLA compiler
    ``options``) and store it."""
    lowered = fn.lower(*args, **(statics or {}))
    with (_threads_on_single_cores() if (options or {}).get(SERIAL_OPS) else contextlib.nullcontext()), fresh_compilation():
        exe = _xla_compile(lowered, options)
    save_executable(name, args, key_statics(statics, options), exe)
    return exe


def compile_cached(name: str, fn, args: tuple, statics: dict | None = None):
    """``fn.lower(*args, **statics).compile()`` through the on-disk executable cache (:func:`compile_all`):
    a warm process loads the executable without tracing or lowering ``fn``."""
    return compile_all([(name, fn, args, statics)])[0][0]
