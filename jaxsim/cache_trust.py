"""Which on-disk cache folders and entries jaxsim trusts: nothing another user could have planted runs.

Loading a compiled executable (jaxsim's executable cache, JAX's own compilation cache) runs native code
and, for jaxsim's entries, unpickles; so:

* **Folders**: the cache root (``$JAXSIM_CACHE_DIR``, default ``~/.cache/jaxsim/xla``) and its
  ``jaxsim-executables`` folder are created 0700 and used only when they are real folders (not symbolic
  links) owned by this user and not writable by group or others. Anything else is refused with one line
  on stderr, and jaxsim goes on without that cache (compiling is always correct).
* **Entries**: each executable-cache entry is sealed with an HMAC-SHA256 under a per-user key (32 random
  bytes in ``~/.cache/jaxsim/key/hmac-key``, folder 0700, file 0600, owned by the user); an entry whose
  seal does not verify, or that names another cache key, is a miss, and its bytes are never unpickled.
  Entries and temporary files are opened with ``O_NOFOLLOW`` and must be plain files owned by the user.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import sys
from pathlib import Path

KEY_BYTES = 32
_warned: set[str] = set()


def warn_once(message: str) -> None:
    """One line on stderr, once per process and message."""
    if message not in _warned:
        _warned.add(message)
        print(f"warning: {' '.join(message.split())}", file=sys.stderr)


def default_cache_root() -> Path:
    """``$JAXSIM_CACHE_DIR``, else ``~/.cache/jaxsim/xla``."""
    return Path(os.environ.get("JAXSIM_CACHE_DIR") or Path(os.path.expanduser("~")) / ".cache" / "jaxsim" / "xla")


def private_dir_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a folder jaxsim may trust (None when it is): not a real folder, owned by another
    user, or writable by group or others."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != os.getuid():
        return f"is owned by another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def trusted_dir(path: str | os.PathLike, what: str, *, create: bool = True, quiet: bool = False) -> Path | None:
    """``path`` created (mode 0700) when missing, if it is a folder jaxsim may trust; else None, with one
    line on stderr naming the folder and why (unless ``quiet``)."""
    p = Path(path)
    if create and not os.path.lexists(p):
        try:
            os.makedirs(p, mode=0o700, exist_ok=True)
        except OSError as e:
            if not quiet:
                warn_once(f"{what} {p}: cannot be created ({e.strerror or e}); running without it")
            return None
    why = private_dir_problem(p)
    if why is not None:
        if not quiet:
            warn_once(f"{what} {p}: {why}; not used (running without it)")
        return None
    return p


def key_dir() -> Path:
    return Path(os.path.expanduser("~")) / ".cache" / "jaxsim" / "key"


def _read_key(path: Path) -> bytes | None:
    data = read_own_file(path, private=True, max_bytes=KEY_BYTES)
    return data if data is not None and len(data) == KEY_BYTES else None


_key_cache: dict[str, bytes | None] = {}


def user_key() -> bytes | None:
    """This user's cache key (created on first use), or None (with one line on stderr) when its folder
    cannot be made private."""
    d = key_dir()
    if str(d) in _key_cache:
        return _key_cache[str(d)]
    key = None
    if trusted_dir(d, "jaxsim cache key folder") is not None:
        path = d / "hmac-key"
        if os.lstat(d).st_mode & 0o077:
            warn_once(f"jaxsim cache key folder {d}: readable by group or others; the executable cache is not used (chmod 700 it)")
        else:
            key = _read_key(path)
            if key is None and not os.path.lexists(path):
                key = _create_key(d, path)
            if key is None:
                warn_once(f"jaxsim cache key {path}: not a 0600 file of {KEY_BYTES} bytes owned by this user; "
                          "the executable cache is not used (remove the file to make a new key)")
    _key_cache[str(d)] = key
    return key


def _create_key(d: Path, path: Path) -> bytes | None:
    import tempfile  # noqa: PLC0415

    try:
        fd, tmp = tempfile.mkstemp(prefix=".hmac-key.", dir=d)  # 0600, O_EXCL|O_NOFOLLOW
    except OSError:
        return None
    try:
        os.write(fd, secrets.token_bytes(KEY_BYTES))
        os.fsync(fd)
        try:
            os.link(tmp, path)  # never replaces a key another process made first
        except FileExistsError:
            pass
    except OSError:
        return None
    finally:
        os.close(fd)
        os.unlink(tmp)
    return _read_key(path)


MAGIC = b"jaxsim-executable-v2\n"


def seal(key: bytes, body: bytes) -> bytes:
    """``MAGIC + HMAC-SHA256(key, body) + body``."""
    return MAGIC + hmac.new(key, body, hashlib.sha256).digest() + body


def unseal(key: bytes, data: bytes) -> bytes | None:
    """The body of a :func:`seal`\\ ed blob when its seal verifies under ``key``; else None."""
    n = len(MAGIC)
    if not data.startswith(MAGIC) or len(data) < n + 32:
        return None
    mac, body = data[n:n + 32], data[n + 32:]
    return body if hmac.compare_digest(mac, hmac.new(key, body, hashlib.sha256).digest()) else None


def read_own_file(path: str | os.PathLike, *, private: bool = False, max_bytes: int | None = None) -> bytes | None:
    """A plain file owned by this user, read without following a symbolic link; None otherwise (also when
    ``private`` and others may read or write it, or when it holds more than ``max_bytes``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or (private and st.st_mode & 0o077):
            return None
        if max_bytes is not None and st.st_size > max_bytes:
            return None
        with open(fd, "rb", closefd=False) as f:
            return f.read() if max_bytes is None else f.read(max_bytes + 1)
    finally:
        os.close(fd)


__all__ = ["MAGIC", "default_cache_root", "key_dir", "private_dir_problem", "read_own_file", "seal", "trusted_dir", "unseal",
           "user_key", "warn_once"]
