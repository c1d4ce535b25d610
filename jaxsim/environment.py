"""The process environment, checked before any work: a broken setting is one line naming it (exit 2),
never an internal error after the computation.

* ``JAX_PLATFORMS`` and ``XLA_FLAGS``: XLA aborts the process on a flag it does not know, and JAX raises
  (or asserts) on a platform it cannot start. When either is set, a short probe process starts JAX with
  them first; a failure names the variable and XLA's or JAX's reason. A setting that worked once is
  remembered (in the trusted cache folder) and not probed again.
* ``JAXSIM_EXECUTABLE_CACHE_MAX_MB`` (the executable cache's size cap) must be a number of megabytes >= 0.
* Arguments (file names) must be valid UTF-8: refused up front, before anything is computed.
* A console that cannot print UTF-8 (an ASCII locale) gets ``?`` for the characters it lacks instead
  of an encoding error.
* SIGTERM ends the process like Ctrl-C does, through the clean-up of every temporary file.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys

from jaxsim.errors import InputError

KNOWN_PLATFORMS = ("cpu", "cuda", "rocm", "gpu", "tpu", "metal", "interpreter")
_PROBE = "import jax; jax.devices()"
_OWN_FLAG = re.compile(r"\s*--xla_force_host_platform_device_count=\d+")


def user_xla_flags() -> str:
    """``XLA_FLAGS`` as the user set it (without the host device count jaxsim adds)."""
    return _OWN_FLAG.sub("", os.environ.get("XLA_FLAGS", "")).strip()


def check_arguments(argv: list[str]) -> None:
    """Every argument must be valid UTF-8 (a file name that is not is refused before any work)."""
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"argument {os.fsencode(arg)!r} is not valid UTF-8; jaxsim needs UTF-8 file names and "
                             "arguments (rename the file)") from None


def console_safe_streams() -> None:
    """stdout/stderr that cannot encode a character print ``?`` for it instead of raising."""
    for stream in (sys.stdout, sys.stderr):
        enc = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if enc not in ("utf8", "utf16", "utf32") and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="replace")
            except (ValueError, OSError):
                pass


def terminate_cleanly() -> None:
    """SIGTERM raises SystemExit(143) in the main thread: ``finally`` blocks (temporary files) run."""

    def _handler(signum, frame):
        raise SystemExit(128 + signum)

    try:
        signal.signal(signal.SIGTERM, _handler)
    except ValueError:  # not the main thread
        pass


def _probe_key(platforms: str, flags: str) -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        versions = f"{version('jax')}/{version('jaxlib')}"
    except PackageNotFoundError:
        versions = "?"
    blob = "\0".join((platforms, os.environ.get("XLA_FLAGS", ""), versions, sys.executable, flags))
    return hashlib.sha256(blob.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _reason(output: str) -> str:
    """XLA's first logged error, or the last line of JAX's traceback."""
    for line in output.splitlines():
        m = re.match(r"[EF]\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] (.*)", line)
        if m:
            return m.group(1).strip()
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    return last if last not in ("AssertionError", "AssertionError:") else "no backend could be initialized"


def executable_cache_max_bytes() -> int:
    """The executable cache's size cap: ``$JAXSIM_EXECUTABLE_CACHE_MAX_MB`` (default 2048 MB); anything
    but a number >= 0 is an :class:`~jaxsim.errors.InputError`."""
    raw = os.environ.get("JAXSIM_EXECUTABLE_CACHE_MAX_MB", "2048")
    try:
        mb = float(raw)
    except ValueError:
        mb = -1.0
    if not mb >= 0 or mb == float("inf"):
        raise InputError(f"JAXSIM_EXECUTABLE_CACHE_MAX_MB={raw!r}: must be a size in megabytes >= 0")
    return int(mb * 2**20)


def check_jax_environment() -> None:
    """Before any work: ``JAX_PLATFORMS`` names platforms JAX can start here and ``XLA_FLAGS`` parses;
    an :class:`~jaxsim.errors.InputError` naming the variable otherwise."""
    executable_cache_max_bytes()
    platforms = os.environ.get("JAX_PLATFORMS", "").strip()
    flags = user_xla_flags()
    if not platforms and not flags:
        return
    for name in filter(None, (p.strip() for p in platforms.split(","))):
        if name.lower() not in KNOWN_PLATFORMS:
            raise InputError(f"JAX_PLATFORMS={platforms!r}: unknown platform {name!r}; use cpu (or cuda, rocm, tpu where "
                             "JAX's plugin for it is installed), or unset it")
    from jaxsim.cache_trust import default_cache_root, trusted_dir  # noqa: PLC0415

    folder = trusted_dir(default_cache_root() / "jaxsim-env", "jaxsim cache folder", quiet=True)
    stamp = None if folder is None else folder / f"{_probe_key(platforms, flags)}.ok"
    if stamp is not None and stamp.is_file():
        return
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, errors="replace", timeout=300,
                           env=os.environ.copy())
    except (OSError, subprocess.TimeoutExpired):
        return  # no verdict: go on (the real start-up reports what it finds)
    if r.returncode != 0:
        reason = _reason(r.stderr + r.stdout)
        if flags and ("XLA_FLAGS" in reason or "flag" in reason.lower()):
            raise InputError(f"XLA_FLAGS={flags!r}: XLA refuses it ({reason}); fix or unset it")
        if platforms:
            raise InputError(f"JAX_PLATFORMS={platforms!r}: JAX cannot start it here ({reason}); unset it or use JAX_PLATFORMS=cpu")
        raise InputError(f"XLA_FLAGS={flags!r}: JAX cannot start with it ({reason}); fix or unset it")
    if stamp is not None:
        try:
            stamp.touch()
        except OSError:
            pass


__all__ = ["KNOWN_PLATFORMS", "check_arguments", "check_jax_environment", "console_safe_streams", "executable_cache_max_bytes", "terminate_cleanly",
           "user_xla_flags"]
