"""Issue 24: nothing another user plants runs, nothing a user owns is deleted, no stale result is served.

Each test reproduces one probe of the issue and asserts what must (not) happen: the planted code's side
effect did not happen, the victim file is unchanged, the stale chunk was not served. Probes that need a
second user plant their files as ``nobody`` (a ``sh`` child started with ``runuser``: ``nobody`` cannot run
this checkout's Python) and run only as root."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import jaxsim._jax as jx
from jaxsim import cache_trust, outputs
from jaxsim.cli.main import app
from jaxsim.sweep import OutputExistsError, run_sweep
from jaxsim.sweep import resume as rs
from jaxsim.sweep.run import work_dir_for
from jaxsim.sweep.spec import spec_from_dict

ROOT = Path(__file__).resolve().parents[1]
EXCERPT = ROOT / "tests" / "data" / "fpm_qwen3_32b_tp1_excerpt"
TABLES = ROOT / "tests" / "goldens" / "public" / "tables"
runner = CliRunner()

IS_ROOT = os.geteuid() == 0
try:
    NOBODY = pwd.getpwnam("nobody")
except KeyError:
    NOBODY = None
RUNUSER = shutil.which("runuser")
needs_second_user = pytest.mark.skipif(not (IS_ROOT and NOBODY and RUNUSER),
                                       reason="plants files as a second user: needs root, 'nobody' and runuser")


def as_nobody(script: str) -> None:
    """Run a shell script as the second user (it plants files; it cannot run this checkout's Python)."""
    r = subprocess.run([RUNUSER, "-u", "nobody", "--", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


@pytest.fixture
def shared(tmp_path):
    """A world-writable sticky folder (like /tmp) that both users reach."""
    d = Path(tempfile.mkdtemp(prefix="jaxsim-shared-", dir="/tmp"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def cli(args, *, env=None, cwd=None, timeout=600):
    """The real command line in a child process (start-up checks, signals, exit codes)."""
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    for k, v in (env or {}).items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    return subprocess.run([sys.executable, "-m", "jaxsim", *map(str, args)], env=e, cwd=cwd, capture_output=True, text=True,
                          errors="replace", timeout=timeout)


def one_line_error(r, rc=2) -> str:
    assert r.returncode == rc, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr[-2000:]
    return lines[0]


def tree(d: Path) -> dict:
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else None) for p in sorted(d.rglob("*"))}


# ----------------------------------------------------------------------------------------------------
# 1. the executable cache runs nothing it did not write


class _Plant:
    """A pickle whose loading makes a folder (standing in for ``os.system``)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _kernel(x, k):
    return {"total": x.sum() * k, "doubled": 2.0 * x}


def _args(n=8):
    return (np.linspace(-1.0, 2.0, n), np.float64(3.0))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An executable cache under tmp_path (0700) and this test's own cache key (HOME in tmp_path)."""
    old = jax.config.jax_compilation_cache_dir
    root = tmp_path / "xla"
    root.mkdir(mode=0o700)
    jax.config.update("jax_compilation_cache_dir", str(root))
    monkeypatch.setenv("JAXSIM_EXECUTABLE_CACHE", "1")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    yield root / "jaxsim-executables"
    jax.config.update("jax_compilation_cache_dir", old)


def test_a_planted_pickle_under_an_entry_name_is_never_unpickled(cache_dir, tmp_path):
    """Observed: a pickle whose __reduce__ calls os.system, placed as <name>-<key>.bin, ran on the next replay."""
    args = _args()
    jx.compile_cached("t-kernel", jx.jit_x64(_kernel), args)  # makes the folder and this user's key
    entry = cache_dir / f"t-kernel-{jx.executable_key('t-kernel', args)}.bin"
    assert entry.is_file()
    ran = tmp_path / "planted-code-ran"
    for payload in (pickle.dumps(_Plant(ran)), pickle.dumps((_Plant(ran), None, [0]))):
        entry.write_bytes(payload)
        assert jx.load_executable("t-kernel", args) is None
        assert not ran.exists()
    exe = jx.compile_cached("t-kernel", jx.jit_x64(_kernel), args)  # a miss: compiled again and stored, sealed
    np.testing.assert_allclose(np.asarray(exe(*args)["doubled"]), 2.0 * args[0])
    assert entry.read_bytes().startswith(cache_trust.MAGIC) and jx.load_executable("t-kernel", args) is not None
    assert not ran.exists()


def test_an_entry_moved_to_another_name_or_sealed_with_another_key_is_a_miss(cache_dir):
    """Observed: another user swapped an entry between two runs (os.replace) and their code ran."""
    a, b = _args(8), _args(16)
    jx.compile_cached("t-kernel", jx.jit_x64(_kernel), a)
    jx.compile_cached("t-kernel", jx.jit_x64(_kernel), b)
    ea = cache_dir / f"t-kernel-{jx.executable_key('t-kernel', a)}.bin"
    eb = cache_dir / f"t-kernel-{jx.executable_key('t-kernel', b)}.bin"
    assert jx.load_executable("t-kernel", b) is not None
    shutil.copyfile(ea, eb)  # a genuine entry of this user, under another entry's name
    assert jx.load_executable("t-kernel", b) is None
    body = cache_trust.unseal(cache_trust.user_key(), ea.read_bytes())
    assert body is not None
    ea.write_bytes(cache_trust.seal(os.urandom(32), body))  # the same bytes sealed by someone else's key
    assert jx.load_executable("t-kernel", a) is None


def test_cache_folders_writable_by_others_or_symbolic_links_are_refused_in_one_line(cache_dir, capsys):
    root = cache_dir.parent
    root.chmod(0o777)
    assert jx.executable_dir() is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(root) in err[0] and "writable by group or others" in err[0]
    root.chmod(0o700)
    elsewhere = root.parent / "user-folder"
    elsewhere.mkdir()
    cache_dir.symlink_to(elsewhere)
    assert jx.executable_dir() is None
    assert "is a symbolic link" in capsys.readouterr().err
    jx.compile_cached("t-kernel", jx.jit_x64(_kernel), _args())
    assert list(elsewhere.iterdir()) == []  # nothing stored through the link


@needs_second_user
def test_a_cache_folder_of_another_user_is_refused(cache_dir, capsys):
    root = cache_dir.parent
    os.chown(root, NOBODY.pw_uid, NOBODY.pw_gid)
    assert jx.executable_dir() is None
    assert "owned by another user" in capsys.readouterr().err
    assert not cache_dir.exists()


@pytest.mark.slow
@needs_second_user
def test_a_shared_cache_folder_made_by_another_user_is_not_used(shared, tmp_path):
    """Observed: with a shared JAXSIM_CACHE_DIR created by another user, that user's entries ran as the victim."""
    cache = shared / "cache"
    plant = pickle.dumps(_Plant(tmp_path / "planted-code-ran"))
    (shared / "plant.bin").write_bytes(plant)
    (shared / "plant.bin").chmod(0o644)
    as_nobody(f"umask 000; mkdir -p {cache}/jaxsim-executables && chmod 777 {cache} {cache}/jaxsim-executables && "
              f"for n in replay-start sweep-evaluate-chunk; do cp {shared}/plant.bin {cache}/jaxsim-executables/$n-{'0' * 40}.bin; done")
    q = tmp_path / "q.csv"
    q.write_text("workload_kind,batch_size,total_prefill_tokens,total_kv_read_tokens\ndecode,4,0,20000\n")
    r = cli(["round", "qwen3-32b-bf16-b300", "--tp", "2", "--queries", q, "--output", tmp_path / "o.csv"],
            env={"JAXSIM_CACHE_DIR": str(cache), "JAXSIM_EXECUTABLE_CACHE": "1"})
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and str(cache) in warnings[0] and "not used" in warnings[0]
    assert (tmp_path / "o.csv").is_file() and not (tmp_path / "planted-code-ran").exists()
    assert all(p.lstat().st_uid == NOBODY.pw_uid for p in cache.rglob("*"))  # the victim wrote nothing there


@pytest.mark.slow
def test_new_cache_and_key_folders_are_private(tmp_path):
    cache = tmp_path / "new" / "xla"
    r = cli(["trace", "synth", "--n", "3", "--output", tmp_path / "t.csv"],
            env={"JAXSIM_CACHE_DIR": str(cache), "HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    home = tmp_path / "home"
    jx_env = dict(os.environ, HOME=str(home), PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", "from jaxsim import cache_trust as c; assert c.user_key()"], env=jx_env, check=True)
    key = home / ".cache" / "jaxsim" / "key" / "hmac-key"
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700 and stat.S_IMODE(key.stat().st_mode) == 0o600


# ----------------------------------------------------------------------------------------------------
# 2. temporary files: unpredictable names, never followed through a link, never published if swapped


@pytest.mark.slow
@needs_second_user
def test_links_planted_at_predictable_temp_names_are_never_followed(shared, tmp_path):
    """Observed: another user pre-created .res.csv.{2..32768}.partial -> victim.txt; trace synth overwrote the
    root-owned 0600 victim with the CSV and made it 0644."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    # links at the names of the PIDs the next processes will get, made without starting a process (each
    # would take a PID) and handed to the second user
    last = int(Path("/proc/loadavg").read_text().split()[-1])
    for pid in range(last + 1, last + 2001):
        for name in (f".res.csv.{pid}.partial", f"res.csv.{pid}.tmp"):
            (shared / name).symlink_to(victim)
            os.lchown(shared / name, NOBODY.pw_uid, NOBODY.pw_gid)
    r = cli(["trace", "synth", "--n", "5", "--output", shared / "res.csv"])
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    out = shared / "res.csv"
    assert out.read_text().startswith("arrival_ms") and out.stat().st_uid == 0 and not out.is_symlink()
    planted = [p for p in shared.iterdir() if p.is_symlink()]
    assert len(planted) == 2 * 2000  # another user's files: not ours to remove


def test_a_temp_file_swapped_for_a_link_while_writing_is_not_published(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    target = tmp_path / "out" / "r.csv"
    with pytest.raises(outputs.OutputError, match="replaced or removed by someone else"):
        with outputs.atomic(target) as tmp:
            tmp.write_text("a,b\n")
            os.unlink(tmp)
            os.symlink(victim, tmp)
    assert victim.read_text() == "precious\n" and not target.exists()


def test_temp_names_are_unpredictable_exclusive_and_private_until_published(tmp_path):
    target = tmp_path / "r.csv"
    (fd1, t1), (fd2, t2) = outputs.create_temp(target), outputs.create_temp(target)
    try:
        assert t1 != t2 and t1.parent == t2.parent == tmp_path
        assert outputs._temp_pattern(target.name).fullmatch(t1.name) and t1.name.endswith(".partial")
        assert stat.S_IMODE(os.fstat(fd1).st_mode) == 0o600
        old = os.umask(0o027)
        try:
            outputs.publish(fd1, t1, target)
        finally:
            os.umask(old)
        assert stat.S_IMODE(target.stat().st_mode) == 0o640 and not t1.exists()  # the umask is respected
    finally:
        os.close(fd1)
        os.close(fd2)
        t2.unlink()


def test_only_our_own_stale_temp_files_are_removed(tmp_path):
    d = tmp_path
    old = time.time() - 2 * outputs.STALE_AFTER_S
    stale, fresh, legacy = d / ".r.csv.abcd1234.partial", d / ".r.csv.zzzz9999.partial", d / ".r.csv.4242.partial"
    stale_dir, other_name, not_ours = d / ".r.csv.dir_1234.partial", d / ".r.csv.backup", d / "r.csv.abcd1234.partial"
    victim = d / "victim"
    victim.write_text("precious")
    link = d / ".r.csv.link1234.partial"
    link.symlink_to(victim)
    for p in (stale, fresh, legacy, other_name, not_ours):
        p.write_text("x")
    stale_dir.mkdir()
    (stale_dir / "profile.json").write_text("{}")
    for p in (stale, legacy, stale_dir, other_name, not_ours):
        os.utime(p, (old, old))
    os.utime(link, (old, old), follow_symlinks=False)
    gone = outputs.remove_stale_temps(d, "r.csv")
    assert sorted(p.name for p in gone) == sorted([stale.name, legacy.name, stale_dir.name])
    assert fresh.exists() and other_name.exists() and not_ours.exists() and link.is_symlink() and victim.read_text() == "precious"


@pytest.mark.slow
@needs_second_user
def test_stale_temp_files_of_another_user_are_left_alone(shared):
    as_nobody(f"cd {shared} && echo x > .r.csv.abcd1234.partial && touch -d '2 hours ago' .r.csv.abcd1234.partial")
    assert outputs.remove_stale_temps(shared, "r.csv") == []
    assert (shared / ".r.csv.abcd1234.partial").exists()


# ----------------------------------------------------------------------------------------------------
# 3. --force replaces only what jaxsim wrote


IMPORT_OPTS = ["--model-revision", "abc", "--system", "b300_sxm", "--architecture", "Qwen3ForCausalLM",
               "--kv-bytes-per-token", "262144"]


def _import_args(d: Path, output) -> list[str]:
    return ["import", "fpm-log", str(d / "fpm_metrics_detail.csv"), "--model-card", str(d / "dynamo_model_card_runtime.json"),
            "--vllm-metadata", str(d / "vllm_metadata.json"), *IMPORT_OPTS, "--output", str(output)]


@pytest.fixture
def run_dir(tmp_path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(EXCERPT, d)
    (d / "notes.txt").write_text("unrelated work of the user\n")
    return d


def test_import_force_never_deletes_the_folder_holding_its_input(run_dir):
    """Observed: import fpm-log D/fpm_metrics_detail.csv ... --output D --force deleted the log and everything in D."""
    before = tree(run_dir)
    r = runner.invoke(app, [*_import_args(run_dir, run_dir), "--force"])
    assert r.exit_code == 2 and "an input of this command" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert tree(run_dir) == before


@pytest.mark.slow
def test_output_dot_and_its_parents_and_home_are_refused(run_dir, tmp_path, monkeypatch):
    """Observed: --output . with the current folder deleted it (and exited 70)."""
    before = tree(run_dir)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(EXCERPT, elsewhere)
    r = cli([*_import_args(elsewhere, "."), "--force"], cwd=run_dir)
    assert "is the working directory" in one_line_error(r)
    r = cli([*_import_args(elsewhere, ".."), "--force"], cwd=run_dir)
    assert "holds the working directory" in one_line_error(r)
    monkeypatch.setenv("HOME", str(run_dir))
    r = runner.invoke(app, [*_import_args(elsewhere, run_dir), "--force"])
    assert r.exit_code == 2 and "is the home directory" in r.stderr
    assert tree(run_dir) == before


def test_calibrate_force_never_deletes_the_folder_holding_its_log(run_dir):
    """Observed: calibrate PROFILE --log D2/fpm_metrics_detail.csv --output D2 --force deleted D2."""
    before = tree(run_dir)
    r = runner.invoke(app, ["calibrate", "qwen3-32b-bf16-b300", "--log", str(run_dir / "fpm_metrics_detail.csv"),
                            "--output", str(run_dir), "--force"])
    assert r.exit_code == 2 and "an input of this command" in r.stderr
    assert tree(run_dir) == before


def test_force_replaces_a_folder_jaxsim_wrote_and_no_other(run_dir, tmp_path):
    mine = tmp_path / "profile"
    assert runner.invoke(app, _import_args(run_dir, mine)).exit_code == 0
    assert outputs.is_jaxsim_dir(mine)
    r = runner.invoke(app, [*_import_args(run_dir, mine), "--force"])
    assert r.exit_code == 0, r.output
    users = tmp_path / "users-folder"
    users.mkdir()
    (users / "thesis.tex").write_text("years of work")
    r = runner.invoke(app, [*_import_args(run_dir, users), "--force"])
    assert r.exit_code == 2 and "was not written by jaxsim" in r.stderr
    assert (users / "thesis.tex").read_text() == "years of work"


@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_force_never_replaces_an_input_file_through_a_link(tmp_path, link):
    q = tmp_path / "q.csv"
    text = "workload_kind,batch_size,total_prefill_tokens,total_kv_read_tokens\ndecode,4,0,20000\n"
    q.write_text(text)
    out = tmp_path / "out.csv"
    os.link(q, out) if link == "hard" else out.symlink_to(q)
    r = runner.invoke(app, ["round", "qwen3-32b-bf16-b300", "--tp", "2", "--queries", str(q), "--output", str(out), "--force"])
    assert r.exit_code == 2 and "is an input of this command" in r.stderr
    assert q.read_text() == text


# ----------------------------------------------------------------------------------------------------
# 4. the pruner deletes only its own entries


def test_the_pruner_deletes_only_entries_it_named(cache_dir, tmp_path):
    """Observed: with jaxsim-executables a symlink to a user folder, JAXSIM_EXECUTABLE_CACHE_MAX_MB=2 deleted the
    user's firmware.bin and notes.bin."""
    jx.compile_cached("t-kernel", jx.jit_x64(_kernel), _args())
    (entry,) = cache_dir.glob("t-kernel-*.bin")
    users = {cache_dir / "firmware.bin": b"F" * 4096, cache_dir / "notes.bin": b"N" * 4096,
             cache_dir.parent / "thesis-cache": b"T" * 4096}
    for p, data in users.items():
        p.write_bytes(data)
    jax_entry = cache_dir.parent / f"jit_f-{'a' * 64}-cache"
    jax_entry.write_bytes(b"J" * 4096)
    gone = jx.prune_executables(cache_dir, 0)
    assert {entry, jax_entry} <= set(gone)  # one cap for jaxsim's entries and JAX's, and nothing else:
    assert all(jx.ENTRY_NAME.fullmatch(p.name) or jx.JAX_ENTRY_NAME.fullmatch(p.name) for p in gone)
    assert all(p.read_bytes() == data for p, data in users.items())


def test_a_symlinked_executable_folder_is_never_pruned(cache_dir, tmp_path, monkeypatch):
    users = tmp_path / "user-folder"
    users.mkdir()
    files = {users / "firmware.bin": b"F" * 4096, users / f"t-kernel-{'0' * 40}.bin": b"looks like an entry"}
    for p, data in files.items():
        p.write_bytes(data)
    cache_dir.symlink_to(users)
    monkeypatch.setenv("JAXSIM_EXECUTABLE_CACHE_MAX_MB", "0")
    jx.compile_cached("t-kernel", jx.jit_x64(_kernel), _args())
    assert jx.prune_executables(cache_dir, 0) == []
    assert all(p.read_bytes() == data for p, data in files.items()) and len(list(users.iterdir())) == 2


# ----------------------------------------------------------------------------------------------------
# 5. resume: keyed by every input's content, chunks checksummed


def _spec(profile_dir: Path) -> dict:
    return {
        "name": "resume", "gpu_budget": 4,
        "profile": [{"name": str(profile_dir), "label": "ar"}],
        "serving": {"mode": ["aggregated"]},
        "scheduler": {"concurrency": list(range(1, 97))},
        "workload": [{"name": f"w{i}", "isl": [128 * (i + 1)], "osl": [64]} for i in range(12)],
        "sla": {"mean_ttft_ms": 800, "mean_tpot_ms": 25},
    }


class _Killed(Exception):
    pass


def _kill_after(n):
    def hook(k):
        if k >= n - 1:
            raise _Killed

    return hook


@pytest.fixture
def profile_copy(tmp_path) -> Path:
    d = tmp_path / "ar_core"
    shutil.copytree(TABLES / "ar_core", d)
    return d


def _scale_latencies(d: Path, factor: float) -> None:
    """Change a profile table's latencies and fix its sidecar's hash (a consistent, different table)."""
    t = pq.read_table(d / "fpm_forward_perf.parquet")
    i = t.column_names.index("latency_ms")
    t = t.set_column(i, "latency_ms", pa.array(t.column("latency_ms").to_numpy() * factor))
    pq.write_table(t, d / "fpm_forward_perf.parquet", compression="zstd")
    sc = json.loads((d / "fpm_forward_perf.metadata.json").read_text())
    sc["parquet_sha256"] = hashlib.sha256((d / "fpm_forward_perf.parquet").read_bytes()).hexdigest()
    (d / "fpm_forward_perf.metadata.json").write_text(json.dumps(sc, indent=1))


def _run(spec, out, **kw):
    return run_sweep(spec, out, top=3, chunk_size=256, devices=jax.devices()[:1], **kw)


def test_resume_after_an_input_changed_is_refused_and_force_starts_again(profile_copy, tmp_path):
    """Observed: a sweep killed after 8 chunks, its tables then changed (sidecar hash fixed), resumed with
    exit 0 and mixed old and new rows."""
    spec = spec_from_dict(_spec(profile_copy), source="resume.toml")
    out = tmp_path / "r.parquet"
    with pytest.raises(_Killed):
        _run(spec, out, on_chunk=_kill_after(2))
    assert len(list(work_dir_for(out).glob("chunk-*.arrow"))) == 2
    _scale_latencies(profile_copy, 2.0)
    spec = spec_from_dict(_spec(profile_copy), source="resume.toml")
    with pytest.raises(OutputExistsError, match="different sweep.*pass --force"):
        _run(spec, out)
    res = _run(spec, out, force=True)
    assert res.chunks_reused == 0
    fresh = tmp_path / "fresh" / "r.parquet"
    _run(spec, fresh)
    assert out.read_bytes() == fresh.read_bytes()  # nothing of the old tables survives


def test_a_truncated_or_edited_chunk_is_recomputed_not_served(profile_copy, tmp_path, capsys):
    """Observed: a chunk edited by hand (x10) was served as is; a truncated one failed every rerun with an unnamed
    ArrowInvalid (exit 70) after redoing all other work."""
    spec = spec_from_dict(_spec(profile_copy), source="resume.toml")
    ref = tmp_path / "ref" / "r.parquet"
    _run(spec, ref)
    out = tmp_path / "r.parquet"
    with pytest.raises(_Killed):
        _run(spec, out, on_chunk=_kill_after(3))
    work = work_dir_for(out)
    c0, c1 = rs.chunk_path(work, 0), rs.chunk_path(work, 1)
    t = pa.ipc.open_file(pa.py_buffer(c0.read_bytes())).read_all()
    y = t.column_names.index("output_tokens_per_s_per_gpu")
    t = t.set_column(y, "output_tokens_per_s_per_gpu", pa.array(t.column(y).to_numpy() * 10))
    c0.write_bytes(rs._ipc_bytes(t))  # a valid Arrow file with other numbers
    c1.write_bytes(c1.read_bytes()[:100])  # truncated
    res = _run(spec, out)
    assert res.chunks_reused == 1
    err = capsys.readouterr().err
    assert f"{c0}: truncated or changed" in err and f"{c1}: truncated or changed" in err
    assert out.read_bytes() == ref.read_bytes()


def test_a_chunk_changed_after_its_check_is_refused_naming_the_file(profile_copy, tmp_path):
    spec = spec_from_dict(_spec(profile_copy), source="resume.toml")
    out = tmp_path / "r.parquet"
    with pytest.raises(_Killed):
        _run(spec, out, on_chunk=_kill_after(2))
    work = work_dir_for(out)
    path = rs.chunk_path(work, 1)
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(rs.ChunkError, match=f"{path}: sweep chunk is truncated or was changed"):
        rs.read_chunk(work, 1)


@pytest.mark.slow
def test_cli_resume_over_a_truncated_chunk_exits_0_with_the_fresh_result(profile_copy, tmp_path):
    spec_path = tmp_path / "resume.toml"
    d = _spec(profile_copy)
    lines = [f'name = "{d["name"]}"', f"gpu_budget = {d['gpu_budget']}", "[[profile]]", f'name = "{profile_copy}"', 'label = "ar"',
             "[serving]", 'mode = ["aggregated"]', "[scheduler]", f"concurrency = {d['scheduler']['concurrency']}",
             "[sla]", "mean_ttft_ms = 800", "mean_tpot_ms = 25"]
    for w in d["workload"]:
        lines += ["[[workload]]", f'name = "{w["name"]}"', f"isl = {w['isl']}", f"osl = {w['osl']}"]
    spec_path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.parquet"
    from jaxsim.sweep import load_spec

    with pytest.raises(_Killed):
        run_sweep(load_spec(spec_path), out, top=3, chunk_size=256, on_chunk=_kill_after(2))
    c = rs.chunk_path(work_dir_for(out), 0)
    c.write_bytes(c.read_bytes()[:64])
    r = cli(["sweep", spec_path, "--output", out, "--top", "3", "--chunk-size", "256", "--quiet"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "recomputing" in r.stderr and "ArrowInvalid" not in r.stderr
    fresh = tmp_path / "fresh.parquet"
    r = cli(["sweep", spec_path, "--output", fresh, "--top", "3", "--chunk-size", "256", "--quiet"])
    assert r.returncode == 0 and out.read_bytes() == fresh.read_bytes()


# ----------------------------------------------------------------------------------------------------
# 6. one log validation for import and calibrate


def _log_with(run_dir: Path, edit) -> Path:
    p = run_dir / "fpm_metrics_detail.csv"
    lines = p.read_text().splitlines()
    p.write_text("\n".join(edit(lines)) + "\n")
    return p


def _set_latency(lines, row, value):
    lines = list(lines)
    lines[row] = lines[row].rsplit(",", 1)[0] + f",{value}"
    return lines


@pytest.mark.parametrize("value", ["0", "-3.5", "nan"])
def test_non_positive_latencies_are_refused_by_import_and_calibrate_naming_the_row(run_dir, tmp_path, value):
    """Observed: calibrate on zero and negative latencies wrote a profile (inf % errors); import refused them in
    5 lines naming its internal temp folder."""
    log = _log_with(run_dir, lambda ls: _set_latency(ls, 7, value))
    for args in (_import_args(run_dir, tmp_path / "imp"),
                 ["calibrate", "qwen3-32b-bf16-b300", "--log", str(log), "--output", str(tmp_path / "cal")]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, r.output
        msg = r.stderr.strip()
        assert len(msg.splitlines()) == 1 and f"{log}: row 7" in msg and "latency_ms" in msg, msg
        assert ".partial" not in msg and "Traceback" not in r.output
    assert not (tmp_path / "imp").exists() and not (tmp_path / "cal").exists()


def test_a_duplicated_column_is_refused_by_import_and_calibrate(run_dir, tmp_path):
    """Observed: a duplicated latency_ms column was accepted (the last one won)."""
    log = _log_with(run_dir, lambda ls: [ls[0] + ",latency_ms"] + [ln + ",5.0" for ln in ls[1:]])
    for args in (_import_args(run_dir, tmp_path / "imp"),
                 ["calibrate", "qwen3-32b-bf16-b300", "--log", str(log), "--output", str(tmp_path / "cal")]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and "column 'latency_ms' appears twice" in r.stderr and str(log) in r.stderr, r.output
    assert not (tmp_path / "imp").exists() and not (tmp_path / "cal").exists()


def test_a_duplicated_json_key_is_refused(tmp_path):
    from jaxsim.errors import TableError
    from jaxsim.importers.fpm_log import read_fpm_log

    rec = {"counter_id": 1, "worker_id": "w", "dp_rank": 0, "wall_time": 0.02,
           "scheduled_requests": {"num_prefill_requests": 0, "sum_prefill_tokens": 0, "sum_prefill_kv_tokens": 0,
                                  "num_decode_requests": 4, "sum_decode_kv_tokens": 4000}}
    line = json.dumps(rec)[:-1] + ', "wall_time": 9.0}'
    p = tmp_path / "fpm.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(TableError, match=r"line 1: .*'wall_time' appears twice"):
        read_fpm_log(p)


@pytest.mark.slow
def test_a_one_pass_log_to_calibrate_is_one_line(run_dir, tmp_path):
    """Observed: a one-pass log to calibrate exited 70 (cannot reshape array of size 0)."""
    log = _log_with(run_dir, lambda ls: ls[:2])
    r = cli(["calibrate", "qwen3-32b-bf16-b300", "--log", log, "--output", tmp_path / "cal"])
    assert "too few passes to calibrate" in one_line_error(r) and str(log) in r.stderr
    assert not (tmp_path / "cal").exists()


# ----------------------------------------------------------------------------------------------------
# 7. user and environment errors exit 2 in one line, before any work


@pytest.mark.slow
@pytest.mark.parametrize("platforms", ["gpu", "cuda", "tpu", "bogus"])
def test_a_platform_jax_cannot_start_is_named_before_any_work(tmp_path, platforms):
    pytest.importorskip("jax")
    if any(d.platform != "cpu" for d in jax.devices()):
        pytest.skip("an accelerator is present: the platform may start")
    out = tmp_path / "t.csv"
    r = cli(["trace", "synth", "--n", "3", "--output", out], env={"JAX_PLATFORMS": platforms})
    assert f"JAX_PLATFORMS='{platforms}'" in one_line_error(r) and not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("flags", ["garbage", "--xla_bogus_flag=1", "--xla_cpu_enable_fast_math=maybe"])
def test_broken_xla_flags_are_named_before_any_work(tmp_path, flags):
    out = tmp_path / "t.csv"
    r = cli(["trace", "synth", "--n", "3", "--output", out], env={"XLA_FLAGS": flags, "JAXSIM_CACHE_DIR": str(tmp_path / "c")})
    assert f"XLA_FLAGS={flags!r}" in one_line_error(r) and not out.exists()


@pytest.mark.slow
def test_a_non_utf8_file_name_is_refused_up_front(tmp_path):
    bad = os.fsdecode(bytes(tmp_path) + b"/r\xff.parquet")
    r = cli(["replay", ROOT / "configs" / "deployment_llama_h200.toml", "--trace", "mooncake_tiny", "--output", bad])
    assert "not valid UTF-8" in one_line_error(r) and "\\xff" in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_an_ascii_console_does_not_crash_profiles_list():
    """Observed: LC_ALL=C jaxsim profiles list exited 70 on the '…' it prints."""
    r = cli(["profiles", "list"], env={"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": None})
    assert r.returncode == 0, r.stderr
    assert "qwen3-32b-bf16-b300" in r.stdout


# ----------------------------------------------------------------------------------------------------
# 8. leftovers: no temporary file after any exit; a read-only cache still loads


def test_a_failed_cache_save_leaves_no_temporary_file(cache_dir, monkeypatch):
    jx.compile_cached("t-kernel", jx.jit_x64(_kernel), _args(8))
    before = sorted(p.name for p in cache_dir.iterdir())

    def broken(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_trust, "seal", broken)
    jx.compile_cached("t-kernel", jx.jit_x64(_kernel), _args(16))  # compiled; storing it fails quietly
    assert sorted(p.name for p in cache_dir.iterdir()) == before


def test_a_read_only_cache_still_loads(cache_dir, monkeypatch):
    """Observed: os.utime failing on a read-only cache made every entry a miss (9.3 s instead of 2.6 s)."""
    jx.compile_cached("t-kernel", jx.jit_x64(_kernel), _args())

    def read_only(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "utime", read_only)
    assert jx.load_executable("t-kernel", _args()) is not None


def _start_long_write(out: Path, env=None):
    e = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    p = subprocess.Popen([sys.executable, "-m", "jaxsim", "trace", "synth", "--n", "10000000", "--output", str(out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=e)
    deadline = time.time() + 180
    while time.time() < deadline and not any(q.name.endswith(".partial") for q in out.parent.iterdir()):
        time.sleep(0.05)
    assert any(q.name.endswith(".partial") for q in out.parent.iterdir()), "the writer never started"
    return p


@pytest.mark.slow
def test_sigterm_while_writing_leaves_no_temporary_file(tmp_path):
    out = tmp_path / "t.csv"
    p = _start_long_write(out)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_what_kill_9_leaves_is_removed_by_a_later_run(tmp_path):
    """Observed: kill -9 during a merge left .X.parquet.PID.partial (234 MB), never cleaned by a later run."""
    out = tmp_path / "t.csv"
    p = _start_long_write(out)
    p.kill()
    p.wait(timeout=60)
    (left,) = [q for q in tmp_path.iterdir() if q.name.endswith(".partial")]
    old = time.time() - 2 * outputs.STALE_AFTER_S
    os.utime(left, (old, old))
    r = cli(["trace", "synth", "--n", "3", "--output", out])
    assert r.returncode == 0, r.stderr
    assert [q.name for q in tmp_path.iterdir()] == ["t.csv"]
