"""Processes starting cold against one kernel cache (tests/compile/cache_worker.py, a stand-in for
nvcc): in the ``block`` and ``async`` JIT modes, several processes (three threads each in ``block``)
asking for the same kernels at once build each exactly once, every one of them loads the right
bytes, and the cache holds complete, verified entries and nothing else. A build killed mid-write
(while compiling, or while writing meta.json) leaves nothing that loads, does not hold up the
process waiting on its lock, and the next build replaces it and clears its leftovers."""
from __future__ import annotations

import collections
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cache_worker  # noqa: E402

from mixed_gemm.compile import cache  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(cache_worker.__file__)
NAMES = ("gemv_a", "gemv_bb", "dequant_ccc")


class Run:
    """Worker processes sharing one cache folder, started together by a go file."""

    def __init__(self, tmp_path: Path, cache_dir: Path):
        self.tmp, self.cache_dir = tmp_path, cache_dir
        self.log = tmp_path / "builds.log"
        self.ready, self.go = tmp_path / "ready", tmp_path / "go"
        self.ready.mkdir(exist_ok=True)
        self.log.touch()

    def start(self, mode: str, names=NAMES) -> subprocess.Popen:
        env = dict(os.environ, MIXED_GEMM_CACHE_DIR=str(self.cache_dir), MIXED_GEMM_JIT="block",
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        return subprocess.Popen([sys.executable, str(WORKER), mode, str(self.log), str(self.ready), str(self.go),
                                 *names], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def release(self, procs, timeout=120.0) -> None:
        """Wait until every process in ``procs`` is ready, then let all of them go at once."""
        deadline = time.monotonic() + timeout
        while len(list(self.ready.iterdir())) < len(procs):
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
            assert time.monotonic() < deadline, "workers never got ready"
            time.sleep(0.02)
        self.go.touch()

    def builds(self) -> collections.Counter:
        return collections.Counter(line.split()[0] for line in self.log.read_text().splitlines())

    def hang_mark(self) -> Path:
        return self.log.with_suffix(".hang")


def _finish(proc: subprocess.Popen, timeout=120) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-4000:]
    return dict(line.split() for line in out.splitlines())


def _expected(name: str) -> str:
    return hashlib.sha256(cache_worker.blob(cache_worker.source(name))).hexdigest()


def _check_entries(cache_dir: Path, names) -> None:
    """One entry per name holding exactly its source, binary and meta.json (no temporary file, no
    split folder), the binary's bytes those meta.json records and the stand-in compiler wrote."""
    entries = sorted(p for p in cache_dir.iterdir() if p.is_dir())
    assert sorted(e.name.rsplit("-", 1)[0] for e in entries) == sorted(names)
    for entry in entries:
        name = entry.name.rsplit("-", 1)[0]
        assert {p.name for p in entry.iterdir()} == {f"{name}.cu", f"{name}.fatbin", "meta.json"}
        data = (entry / f"{name}.fatbin").read_bytes()
        meta = json.loads((entry / "meta.json").read_text())
        assert meta["sha256"] == hashlib.sha256(data).hexdigest() == _expected(name) and meta["size"] == len(data)
    assert not [p for p in cache_dir.iterdir() if p.is_file() and not p.name.endswith(".lock")]


@pytest.fixture
def fake_toolchain(monkeypatch):
    """This process sees the cache as the workers do (their stand-in toolchain); compiling fails."""
    monkeypatch.setattr(cache, "toolchain", lambda: (dict(cache_worker.TOOLS), ""))
    monkeypatch.setattr(cache, "compile_fatbin", lambda *a, **k: pytest.fail("a verified entry was rebuilt"))


@pytest.mark.parametrize("mode", ["block", "async"])
def test_cold_processes_build_each_kernel_once(mode, tmp_path, tmp_cache, fake_toolchain, reaper):
    run = Run(tmp_path, tmp_cache)
    procs = [run.start(mode) for _ in range(3)]
    reaper.extend(procs)
    run.release(procs)
    results = [_finish(p) for p in procs]
    assert run.builds() == {name: 1 for name in NAMES}  # one build per kernel, whoever asked first
    for result in results:  # every process (and thread) loaded the right bytes
        assert result == {name: _expected(name) for name in NAMES}
    _check_entries(tmp_cache, NAMES)
    for name in NAMES:  # and this process finds them verified, without compiling
        spec = cache_worker.spec(name)
        assert cache.build_spec(spec) == cache.lookup(name, spec.source(), arch_flags=spec.arch_flags)


def _stuck(run: Run, mode: str, name: str) -> subprocess.Popen:
    """A worker whose build of ``name`` stopped mid-write (``mode``), holding the entry's lock."""
    proc = run.start(mode, names=[name])
    run.release([proc])
    deadline = time.monotonic() + 120
    while not run.hang_mark().exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    return proc


def _kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


@pytest.fixture
def reaper():
    """Workers a failing test leaves behind (a stuck one sleeps for minutes) are killed."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("where", ["hang-compile", "hang-meta"])
def test_killed_build_releases_the_lock_and_is_replaced(where, tmp_path, tmp_cache, fake_toolchain, reaper):
    """A process waiting on the entry's lock starts no build while the stuck one holds it, takes
    the lock when that one is killed, rebuilds the entry and clears the killed build's leftovers."""
    run = Run(tmp_path, tmp_cache)
    name = NAMES[0]
    reaper.append(stuck := _stuck(run, where, name))
    reaper.append(waiting := run.start("block", names=[name]))
    deadline = time.monotonic() + 120
    while len(list(run.ready.iterdir())) < 2:  # the waiting process is past its imports
        assert waiting.poll() is None and time.monotonic() < deadline, waiting.communicate()
        time.sleep(0.02)
    time.sleep(1.0)
    assert waiting.poll() is None and run.builds() == {name: 1}  # no second build while the lock is held
    _kill(stuck)
    assert _finish(waiting) == {name: _expected(name)}
    assert run.builds() == {name: 2}  # the killed attempt, then the one that replaced it
    _check_entries(tmp_cache, [name])  # the killed build's temporary file is gone
    spec = cache_worker.spec(name)
    assert cache.build_spec(spec) == cache.lookup(name, spec.source(), arch_flags=spec.arch_flags)


@pytest.mark.parametrize("where", ["hang-compile", "hang-meta"])
def test_killed_build_leaves_nothing_that_loads(where, tmp_path, tmp_cache, fake_toolchain, monkeypatch, reaper):
    """After the kill, with no other process around, the entry reads as a miss: lookup finds
    nothing and a JIT-off build refuses it rather than load it. The next build is verified and
    leaves no leftovers."""
    from mixed_gemm.compile import JitDisabledError

    run = Run(tmp_path, tmp_cache)
    name = NAMES[1]
    reaper.append(stuck := _stuck(run, where, name))
    _kill(stuck)
    spec = cache_worker.spec(name)
    (entry,) = (p for p in tmp_cache.iterdir() if p.is_dir())
    assert any(p.name.endswith(".tmp") for p in entry.iterdir())  # the partial file
    assert not (entry / "meta.json").exists()
    if where == "hang-meta":  # the binary is complete; only meta.json, written last, is missing
        assert (entry / f"{name}.fatbin").read_bytes() == cache_worker.blob(spec.source())
    assert cache.lookup(name, spec.source(), arch_flags=spec.arch_flags) is None
    monkeypatch.setenv("MIXED_GEMM_JIT", "off")
    with pytest.raises(JitDisabledError):
        cache.build_spec(spec)
    reaper.append(again := run.start("block", names=[name]))
    assert _finish(again) == {name: _expected(name)}
    assert run.builds() == {name: 2}
    _check_entries(tmp_cache, [name])
