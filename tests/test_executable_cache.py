"""The on-disk executable cache (jaxsim._jax.compile_cached): a warm process loads an executable instead
of tracing, lowering and compiling it; a stale or damaged entry is a miss, never an error."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float64, Int64

import jaxsim._jax as jx
from jaxsim.devices import batch_sharding, num_devices

ROOT = Path(__file__).resolve().parents[1]


class Out(eqx.Module):
    total: Float64[Array, ""]
    doubled: Float64[Array, " n"]
    count: Int64[Array, ""]


def _kernel(x, k):
    return Out(total=jnp.sum(x) * k, doubled=2.0 * x, count=jnp.sum(x > 0).astype(jnp.int64))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    old = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    monkeypatch.setenv("JAXSIM_EXECUTABLE_CACHE", "1")
    yield tmp_path / "jaxsim-executables"
    jax.config.update("jax_compilation_cache_dir", old)


class _NoLowering:
    """A jitted function that must not be traced (the executable has to come from the cache)."""

    def lower(self, *a, **k):
        raise AssertionError("traced and lowered although a cached executable exists")


def _args(n=8):
    return (np.linspace(-1.0, 2.0, n), np.float64(3.0))


def test_second_compile_loads_the_stored_executable(cache_dir):
    args = _args()
    first = jx.compile_cached("t-kernel", jx.jit_x64(_kernel), args)
    assert len(list(cache_dir.glob("t-kernel-*.bin"))) == 1
    again = jx.compile_cached("t-kernel", _NoLowering(), args)
    a, b = first(*args), again(*args)
    assert isinstance(b, Out)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    np.testing.assert_allclose(np.asarray(b.total), np.sum(args[0]) * 3.0)


def test_other_shapes_or_statics_are_other_entries(cache_dir):
    jx.compile_cached("t-kernel", jx.jit_x64(_kernel), _args(8))
    with pytest.raises(AssertionError, match="traced and lowered"):
        jx.compile_cached("t-kernel", _NoLowering(), _args(16))
    assert jx.executable_key("t", _args(8), {"slots": 8}) != jx.executable_key("t", _args(8), {"slots": 16})
    assert jx.executable_key("t", _args(8)) != jx.executable_key("u", _args(8))
    assert jx.executable_key("t", _args(8)) == jx.executable_key("t", _args(8))


def test_a_damaged_entry_is_recompiled_and_replaced(cache_dir):
    args = _args()
    jx.compile_cached("t-kernel", jx.jit_x64(_kernel), args)
    (path,) = cache_dir.glob("t-kernel-*.bin")
    path.write_bytes(b"not an executable")
    assert jx.load_executable("t-kernel", args) is None
    exe = jx.compile_cached("t-kernel", jx.jit_x64(_kernel), args)
    np.testing.assert_array_equal(np.asarray(exe(*args).doubled), 2.0 * args[0])
    assert jx.load_executable("t-kernel", args) is not None


def test_sharded_arguments_keep_their_devices(cache_dir):
    if num_devices() < 2:
        pytest.skip("needs 2 devices")
    n = 2 * num_devices()
    args = (jax.device_put(np.arange(n, dtype=np.float64), batch_sharding()), np.float64(1.0))
    jx.compile_cached("t-kernel", jx.jit_x64(_kernel), args)
    exe = jx.compile_cached("t-kernel", _NoLowering(), args)
    np.testing.assert_array_equal(np.asarray(exe(*args).doubled), 2.0 * np.arange(n))
    one = _args(n)  # the same shapes unplaced: another entry, on one device
    jx.compile_cached("t-kernel", jx.jit_x64(_kernel), one)
    np.testing.assert_array_equal(np.asarray(jx.compile_cached("t-kernel", _NoLowering(), one)(*one).doubled), 2.0 * one[0])


def test_cache_off_writes_nothing(tmp_path, monkeypatch):
    old = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    try:
        monkeypatch.setenv("JAXSIM_EXECUTABLE_CACHE", "0")
        assert jx.executable_dir() is None
        jx.compile_cached("t-kernel", jx.jit_x64(_kernel), _args())
        assert not (tmp_path / "jaxsim-executables").exists()
    finally:
        jax.config.update("jax_compilation_cache_dir", old)


@pytest.mark.slow
def test_replay_cli_loads_its_executable_in_a_second_process(tmp_path):
    """Two real processes: the second loads the replay executable (no compilation) and writes
    the same per-request results."""
    env = dict(os.environ, JAXSIM_CACHE_DIR=str(tmp_path / "xla"), JAXSIM_EXECUTABLE_CACHE="1")
    cfg = ROOT / "configs" / "deployment_calibrated.toml"
    runs = []
    for i in range(2):
        out = tmp_path / f"r{i}.parquet"
        cmd = [sys.executable, "-m", "jaxsim", "replay", str(cfg), "--trace", "mooncake_tiny", "--output", str(out), "--json"]
        r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode in (0, 3), r.stderr[-3000:]
        runs.append(json.loads(r.stdout[r.stdout.index("{"):])["timings"])
    assert runs[0]["compilations"] >= 1 and runs[0]["executables_loaded"] == 0
    assert runs[1]["compilations"] == 0 and runs[1]["executables_loaded"] == runs[0]["compilations"]
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "r0.parquet").equals(pq.read_table(tmp_path / "r1.parquet"))


@pytest.mark.slow
def test_sweep_cli_reuses_its_sharded_executable(tmp_path):
    """The sweep's evaluator (config axis split over every CPU core) is stored by the first process and
    loaded, not rebuilt, by the second; the results are byte-identical. A first run without the
    executable cache fills JAX's own compilation cache: what is stored must still be a fresh compilation
    (an executable JAX restored from its cache fails when reloaded a second time)."""
    spec = ROOT / "configs" / "quickstart.toml"
    exe_dir = tmp_path / "xla" / "jaxsim-executables"
    stamps = []
    for i, on in enumerate(("0", "1", "1")):
        env = dict(os.environ, JAXSIM_CACHE_DIR=str(tmp_path / "xla"), JAXSIM_EXECUTABLE_CACHE=on)
        cmd = [sys.executable, "-m", "jaxsim", "sweep", str(spec), "--top", "1", "--output", str(tmp_path / f"s{i}.parquet")]
        r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        files = sorted(exe_dir.glob("sweep-evaluate-chunk-*.bin")) if exe_dir.exists() else []
        assert len(files) == (on == "1")
        stamps.extend(f.stat().st_ino for f in files)
    assert stamps[0] == stamps[1]  # loaded, not compiled and stored again (a save replaces the file)
    for i in (1, 2):
        assert (tmp_path / "s0.parquet").read_bytes() == (tmp_path / f"s{i}.parquet").read_bytes()


def test_an_entry_that_fails_when_called_is_replaced_by_a_fresh_compilation(cache_dir):
    """An entry that deserializes but cannot run (as JAX-cache-restored executables once did) is deleted
    on its first call, and a fresh compilation answers that call and is stored in its place."""
    args = _args()
    jx.compile_cached("t-kernel", jx.jit_x64(_kernel), args)
    (path,) = cache_dir.glob("t-kernel-*.bin")
    exe = jx.compile_cached("t-kernel", jx.jit_x64(_kernel), args)
    assert isinstance(exe, jx._Loaded)

    def broken(*a):
        raise RuntimeError("NOT_FOUND: Function wrapped_iota not found")

    exe._exe = broken
    path.write_bytes(b"will be replaced")
    out = exe(*args)
    np.testing.assert_array_equal(np.asarray(out.doubled), 2.0 * args[0])
    assert jx.load_executable("t-kernel", args) is not None  # the fresh compilation was stored again
    np.testing.assert_array_equal(np.asarray(exe(*args).doubled), 2.0 * args[0])


def test_the_cache_keeps_the_most_recently_used_entries_under_its_cap(cache_dir, monkeypatch):
    """Entries beyond the size cap go, least recently used first; loading an entry makes it recent."""
    import time

    sizes = {}
    for n in (4, 8, 16):
        jx.compile_cached("t-kernel", jx.jit_x64(_kernel), _args(n))
        (new,) = set(cache_dir.glob("*.bin")) - set(sizes)
        sizes[new] = new.stat().st_size
        time.sleep(0.02)
    first = next(iter(sizes))
    assert jx.load_executable("t-kernel", _args(4)) is not None  # touches the oldest entry: now the newest
    cap = sum(sizes.values()) - 1  # one entry must go: the least recently used is the n=8 one
    gone = jx.prune_executables(cache_dir, cap)
    assert len(gone) == 1 and gone[0] != first and first.exists()
    assert jx.load_executable("t-kernel", _args(8)) is None and jx.load_executable("t-kernel", _args(16)) is not None
    monkeypatch.setenv("JAXSIM_EXECUTABLE_CACHE_MAX_MB", "0")
    jx.compile_cached("t-kernel", jx.jit_x64(_kernel), _args(32))  # a save prunes down to the cap
    assert list(cache_dir.glob("*.bin")) == []


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["two gigabytes", "-5", "nan"])
def test_a_bad_cache_cap_is_a_one_line_error(bad, tmp_path):
    env = dict(os.environ, JAXSIM_CACHE_DIR=str(tmp_path / "xla"), JAXSIM_EXECUTABLE_CACHE="1", JAXSIM_EXECUTABLE_CACHE_MAX_MB=bad)
    cmd = [sys.executable, "-m", "jaxsim", "sweep", str(ROOT / "configs" / "quickstart.toml"), "--output", str(tmp_path / "s.parquet")]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip() == f"error: JAXSIM_EXECUTABLE_CACHE_MAX_MB={bad!r}: must be a size in megabytes >= 0"
    assert not (tmp_path / "s.parquet").exists()


def test_a_compiled_round_table_is_stored_and_loaded_identically(cache_dir, monkeypatch):
    """A profile cell's host-side lookup arrays (compile_decode / compile_prefill, a second for a large
    cell) are stored once and loaded by later calls bit for bit; a damaged entry is computed again."""
    import jaxsim.kernels.rounds as rounds
    from jaxsim.profile.resolve import cell_rows, choose_deployment, load_bundle, resolve_profile_dir

    bundle = load_bundle(str(resolve_profile_dir("qwen3-32b-bf16-b300-calibrated")))
    cell = cell_rows(bundle, choose_deployment(bundle, tp=2))
    fresh = rounds._compiled_supports(cell)
    (entry,) = cache_dir.glob("round-table-*.bin")

    def computed(*a, **k):
        raise AssertionError("computed again although a stored entry exists")

    originals = rounds.compile_prefill, rounds.compile_decode
    monkeypatch.setattr(rounds, "compile_prefill", computed)
    monkeypatch.setattr(rounds, "compile_decode", computed)
    loaded = rounds._compiled_supports(cell)
    for a, b in zip(fresh, loaded):
        for f in dataclasses.fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y, equal_nan=True), f.name
    entry.write_bytes(entry.read_bytes()[:-7] + b"damaged")
    with pytest.raises(AssertionError, match="computed again"):
        rounds._compiled_supports(cell)  # the seal no longer verifies: a miss
    monkeypatch.setattr(rounds, "compile_prefill", originals[0])
    monkeypatch.setattr(rounds, "compile_decode", originals[1])
    again = rounds._compiled_supports(cell)
    assert np.array_equal(again[1].coef, fresh[1].coef)
    assert rounds._compiled_supports(cell)[1].coef.tobytes() == fresh[1].coef.tobytes()  # stored again


def _gathers(rows, at):
    return rows[at, 3] + rows[at, 2] * 2


def _gathers_again(rows, at):  # the same computation, traced apart (JAX would reuse _gathers' executable)
    return rows[at, 3] + 2 * rows[at, 2]


def _masks() -> dict[int, set]:
    out = {}
    for tid in jx._threads():
        try:
            out[tid] = os.sched_getaffinity(tid)
        except OSError:
            pass
    return out


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs CPU affinity control and two cores")
def test_serial_ops_compiles_no_split_operation_and_gives_threads_their_masks_back(tmp_path, monkeypatch):
    """XLA:CPU splits a small gather from a large array over two threads (its cost model prices the whole array);
    with SERIAL_OPS nothing is split, the results are the same, and every thread's CPU mask is what it was."""
    monkeypatch.setenv("JAXSIM_EXECUTABLE_CACHE", "0")
    rows = np.arange(131_073 * 7, dtype=np.int64).reshape(131_073, 7)
    at = (np.arange(64, dtype=np.int64) * 977) % 131_073
    before = _masks()
    [plain], _, _ = jx.compile_all([("t-gathers", jx.jit_x64(_gathers), (rows, at), None, {})])
    [serial], compiled, _ = jx.compile_all([("t-gathers-serial", jx.jit_x64(_gathers_again), (rows, at), None, {jx.SERIAL_OPS: True})])
    assert compiled == 1
    assert "outer_dimension_partitions" in plain.as_text()  # what XLA does by default on two cores
    assert "outer_dimension_partitions" not in serial.as_text()
    np.testing.assert_array_equal(np.asarray(serial(rows, at)), np.asarray(plain(rows, at)))
    np.testing.assert_array_equal(np.asarray(serial(rows, at)), rows[at, 3] + rows[at, 2] * 2)
    after = _masks()
    assert all(after[t] == m for t, m in before.items() if t in after)
    assert all(m == os.sched_getaffinity(0) for m in after.values())
