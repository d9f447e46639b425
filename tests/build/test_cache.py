"""The fatbin cache: real builds, hits, rebuilds of damaged entries, keys, failures, concurrency."""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mixed_gemm import _paths
from mixed_gemm.build import (
    BuildError,
    build_fatbin,
    build_many,
    cache,
    cache_key,
    compile_flags,
    fatbin_targets,
    find_nvcc,
    load_bytes,
)
from mixed_gemm.build.fatbin import FATBIN_MAGIC_BYTES

# Including a CUTLASS header proves that the include path reaches nvcc.
TRIVIAL = '#include <cutlass/cutlass.h>\nextern "C" __global__ void k(float* p) { p[0] = 1.f; }\n'
SECOND = TRIVIAL.replace("1.f", "2.f")
BROKEN = 'extern "C" __global__ void k(float* p) { p[0] = this_is_not_declared; }\n'


requires_nvcc = pytest.mark.nvcc  # skipped without nvcc (tests/conftest.py)


def _entry_files(entry: Path) -> set[str]:
    return {p.name for p in entry.iterdir()}


def _entries(cache_root: Path) -> list[Path]:
    return sorted(p for p in cache_root.iterdir() if p.is_dir())


# --- one real nvcc build, shared -------------------------------------------------------------


@pytest.fixture(scope="module")
def real_build(tmp_path_factory):
    """(cache dir, fatbin path) of TRIVIAL built once for the module with the real nvcc."""
    try:
        find_nvcc()
    except BuildError:
        pytest.skip("nvcc not found")
    root = tmp_path_factory.mktemp("real-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MIXED_GEMM_CACHE_DIR", str(root))
        path = build_fatbin("trivial", TRIVIAL)
    return root, path


@pytest.fixture
def in_real_cache(real_build, monkeypatch):
    monkeypatch.setenv("MIXED_GEMM_CACHE_DIR", str(real_build[0]))
    return real_build


def test_real_build_entry(real_build):
    root, path = real_build
    data = path.read_bytes()
    assert data[:4] == FATBIN_MAGIC_BYTES  # 0xBA55ED50 little-endian
    assert fatbin_targets(data) == ["sm_80", "compute_90", "sm_90"]
    assert load_bytes(path) == data

    entry = path.parent
    meta = json.loads((entry / "meta.json").read_text())
    assert entry.parent == root and entry.name == f"trivial-{meta['key'][:16]}"
    assert _entry_files(entry) == {"trivial.cu", "trivial.fatbin", "meta.json"}  # no temp files
    assert (entry / "trivial.cu").read_text() == TRIVIAL
    assert meta["name"] == "trivial"
    assert meta["sha256"] == hashlib.sha256(data).hexdigest() and meta["size"] == len(data)
    assert meta["nvcc_version"] and meta["cutlass_version"]
    assert meta["flags"] == compile_flags()


def test_real_build_cuobjdump(real_build):
    cuobjdump = shutil.which("cuobjdump") or shutil.which("cuobjdump", path=str(find_nvcc().parent))
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed (fatbin_targets covers the same ground)")
    out = subprocess.run(
        [cuobjdump, "--list-elf", str(real_build[1])], capture_output=True, text=True, check=True
    ).stdout
    assert "sm_80" in out and "sm_90" in out


def test_hit_runs_no_compile(in_real_cache, monkeypatch):
    _, path = in_real_cache
    mtime = path.stat().st_mtime_ns

    def no_compile(*args, **kwargs):
        raise AssertionError("cache hit expected, but nvcc was run")

    monkeypatch.setattr(cache, "compile_fatbin", no_compile)
    assert build_fatbin("trivial", TRIVIAL) == path
    assert path.stat().st_mtime_ns == mtime


def test_build_many_with_progress(in_real_cache, monkeypatch):
    root, trivial_path = in_real_cache
    compiled = []
    real_compile = cache.compile_fatbin

    def counting(src, out, flags):
        compiled.append(Path(src).name)
        return real_compile(src, out, flags)

    monkeypatch.setattr(cache, "compile_fatbin", counting)
    paths = build_many([("trivial", TRIVIAL), ("second", SECOND)], jobs=2, progress=True)
    assert paths[0] == trivial_path  # input order, and the first one was a hit
    assert paths[1].name == "second.fatbin" and paths[1].parent.parent == root
    assert compiled == ["second.cu"]
    assert fatbin_targets(paths[1].read_bytes()) == ["sm_80", "compute_90", "sm_90"]
    assert build_many([]) == []


# --- the cache logic, with a stand-in for nvcc -----------------------------------------------


@pytest.fixture
def fake_compiler(tmp_cache, monkeypatch):
    """Replace nvcc with a function writing a deterministic blob; returns the list of calls."""
    calls: list[str] = []

    def fake_compile(src, out, flags):
        calls.append(Path(src).stem)
        text = Path(src).read_text()
        if "FAIL" in text:
            raise BuildError(f"fake nvcc failed on {src}: error: FAIL", source_path=Path(src))
        Path(out).write_bytes(FATBIN_MAGIC_BYTES + hashlib.sha256(text.encode()).digest() * 64)
        return ""

    monkeypatch.setattr(cache, "compile_fatbin", fake_compile)
    monkeypatch.setattr(cache, "nvcc_version", lambda: "99.9.999")
    monkeypatch.setattr(cache, "find_nvcc", lambda: Path("/fake/bin/nvcc"))
    return calls


def _truncate_fatbin(entry):
    f = entry / "k.fatbin"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _flip_fatbin_byte(entry):
    f = entry / "k.fatbin"
    data = bytearray(f.read_bytes())
    data[100] ^= 0xFF
    f.write_bytes(bytes(data))


def _edit_meta(**changes):
    def corrupt(entry):
        meta = json.loads((entry / "meta.json").read_text())
        meta.update(changes)
        (entry / "meta.json").write_text(json.dumps(meta))

    return corrupt


CORRUPTIONS = {
    "truncated fatbin": _truncate_fatbin,
    "empty fatbin": lambda e: (e / "k.fatbin").write_bytes(b""),
    "missing fatbin": lambda e: (e / "k.fatbin").unlink(),
    "bit flip in fatbin": _flip_fatbin_byte,
    "missing meta": lambda e: (e / "meta.json").unlink(),
    "truncated meta": lambda e: (e / "meta.json").write_text((e / "meta.json").read_text()[:40]),
    "meta not an object": lambda e: (e / "meta.json").write_text("[]"),
    "meta not utf-8": lambda e: (e / "meta.json").write_bytes(b"\xff\xfe{"),
    "meta wrong sha": _edit_meta(sha256="0" * 64),
    "meta wrong size": _edit_meta(size=1),
    "meta wrong key": _edit_meta(key="f" * 64),
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_damaged_entry_is_rebuilt(fake_compiler, corrupt):
    path = build_fatbin("k", TRIVIAL)
    good = path.read_bytes()
    corrupt(path.parent)
    assert build_fatbin("k", TRIVIAL) == path
    assert fake_compiler == ["k", "k"]
    assert path.read_bytes() == good
    assert build_fatbin("k", TRIVIAL) == path and len(fake_compiler) == 2  # healthy again


def test_source_rewritten_only_when_different(fake_compiler):
    path = build_fatbin("k", TRIVIAL)
    src = path.parent / "k.cu"
    os.utime(src, ns=(1, 1))  # a sentinel mtime that any rewrite would replace
    _truncate_fatbin(path.parent)
    build_fatbin("k", TRIVIAL)
    assert src.stat().st_mtime_ns == 1
    src.write_text("// edited by hand\n")
    _truncate_fatbin(path.parent)
    build_fatbin("k", TRIVIAL)
    assert src.read_text() == TRIVIAL


def test_key_covers_templates(fake_compiler, tmp_path, monkeypatch):
    templates = tmp_path / "templates"
    (templates / "sub").mkdir(parents=True)
    (templates / "gemm.cuh").write_text("// v1\n")
    (templates / "sub" / "epilogue.h").write_text("// v1\n")
    (templates / "README.txt").write_text("not a template\n")
    monkeypatch.setattr(_paths, "templates_dir", lambda: templates)
    flags = compile_flags()
    assert f"-I{templates}" in flags

    keys = [cache_key(TRIVIAL, flags)]

    def key_changed():
        keys.append(cache_key(TRIVIAL, flags))
        return keys[-1] != keys[-2]

    (templates / "README.txt").write_text("edited\n")
    assert not key_changed()  # only .cuh/.h/.j2 count
    (templates / "gemm.cuh").write_text("// v2\n")
    assert key_changed()
    (templates / "sub" / "epilogue.h").write_text("// v2\n")
    assert key_changed()
    (templates / "kernel.cu.j2").write_text("{{ x }}\n")
    assert key_changed()
    (templates / "gemm.cuh").rename(templates / "gemm2.cuh")
    assert key_changed()
    assert cache_key(TRIVIAL, flags) == keys[-1]  # deterministic
    assert cache_key(SECOND, flags) != keys[-1]
    assert cache_key(TRIVIAL, flags + ["-DX"]) != keys[-1]

    first = build_fatbin("k", TRIVIAL)
    (templates / "gemm2.cuh").write_text("// v3\n")
    second = build_fatbin("k", TRIVIAL)
    assert first.parent != second.parent and fake_compiler == ["k", "k"]
    assert first.exists()  # the old entry stays valid for whoever still has the old templates


def test_extra_flags_change_the_entry(fake_compiler):
    a = build_fatbin("k", TRIVIAL)
    b = build_fatbin("k", TRIVIAL, extra_flags=["-DMIXED_GEMM_TEST=1"])
    assert a != b
    assert json.loads((b.parent / "meta.json").read_text())["flags"][-1] == "-DMIXED_GEMM_TEST=1"


@pytest.mark.parametrize("name", ["", "a/b", "../up", ".hidden", "with space"])
def test_bad_names(fake_compiler, name):
    with pytest.raises(ValueError):
        build_fatbin(name, TRIVIAL)


def test_build_many_first_failure_raised(fake_compiler):
    items = [("good1", TRIVIAL), ("bad", "// FAIL\n"), ("good2", SECOND)]
    with pytest.raises(BuildError, match="FAIL"):
        build_many(items, jobs=2, progress=False)
    entries = {p.name.split("-")[0]: p for p in _entries(_paths.cache_dir())}
    assert _entry_files(entries["bad"]) == {"bad.cu"}


# --- real nvcc failures and concurrent processes --------------------------------------------


@requires_nvcc
def test_compile_error_reported(tmp_cache):
    with pytest.raises(BuildError) as info:
        build_fatbin("broken", BROKEN)
    message = str(info.value)
    (entry,) = _entries(tmp_cache)
    assert "this_is_not_declared" in message and "error" in message
    assert str(entry / "broken.cu") in message
    assert info.value.source_path == entry / "broken.cu"
    # The source stays for inspection; nothing that could pass for a build is left behind.
    assert _entry_files(entry) == {"broken.cu"}
    with pytest.raises(BuildError):
        build_fatbin("broken", BROKEN)  # failures are not cached as successes


@requires_nvcc
def test_two_processes_build_one_entry(tmp_cache, tmp_path, monkeypatch):
    # A wrapper nvcc that logs each compile and holds it for a second, so that the two processes
    # overlap: without the file lock both would miss the cache and compile.
    real = find_nvcc()
    log = tmp_path / "compiles.log"
    wrapper = tmp_path / "cuda" / "bin" / "nvcc"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *--fatbin*) echo "$$" >> "{log}"; sleep 1;; esac\n'
        f'exec "{real}" "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(wrapper.parent.parent))

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=build_fatbin, args=("race", TRIVIAL)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]

    assert len(log.read_text().split()) == 1
    (entry,) = _entries(tmp_cache)
    assert _entry_files(entry) == {"race.cu", "race.fatbin", "meta.json"}
    monkeypatch.setattr(cache, "compile_fatbin", lambda *a: pytest.fail("entry should be valid"))
    path = build_fatbin("race", TRIVIAL)
    assert path == entry / "race.fatbin"
    assert fatbin_targets(path.read_bytes()) == ["sm_80", "compute_90", "sm_90"]
