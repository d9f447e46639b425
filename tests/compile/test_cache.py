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
from mixed_gemm.compile import (
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
from mixed_gemm.compile.fatbin import FATBIN_MAGIC_BYTES

# Including a CUTLASS header proves that the include path reaches nvcc.
TRIVIAL = '#include <cutlass/cutlass.h>\nextern "C" __global__ void k(float* p) { p[0] = 1.f; }\n'
SECOND = TRIVIAL.replace("1.f", "2.f")
BROKEN = 'extern "C" __global__ void k(float* p) { p[0] = this_is_not_declared; }\n'
# What the sm80 family builds for: the cache itself takes any arch flags.
ARCH = ("-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90")


def _build(name, source, **kw):
    return build_fatbin(name, source, arch_flags=kw.pop("arch_flags", ARCH), **kw)


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
        path = _build("trivial", TRIVIAL)
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
    assert set(meta["toolchain"]) == {"nvcc", "cutlass"} and all(meta["toolchain"].values())
    assert meta["flags"] == compile_flags(arch_flags=ARCH)


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
    assert _build("trivial", TRIVIAL) == path
    assert path.stat().st_mtime_ns == mtime


def test_build_many_with_progress(in_real_cache, monkeypatch):
    root, trivial_path = in_real_cache
    compiled = []
    real_compile = cache.compile_fatbin

    def counting(src, out, flags, **kw):
        compiled.append(Path(src).name)
        return real_compile(src, out, flags)

    monkeypatch.setattr(cache, "compile_fatbin", counting)
    paths = build_many([("trivial", TRIVIAL, dict(arch_flags=ARCH)), ("second", SECOND, dict(arch_flags=ARCH))],
                       jobs=2, progress=True)
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

    def fake_compile(src, out, flags, **kw):
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
    path = _build("k", TRIVIAL)
    good = path.read_bytes()
    corrupt(path.parent)
    assert _build("k", TRIVIAL) == path
    assert fake_compiler == ["k", "k"]
    assert path.read_bytes() == good
    assert _build("k", TRIVIAL) == path and len(fake_compiler) == 2  # healthy again


def test_source_rewritten_only_when_different(fake_compiler):
    path = _build("k", TRIVIAL)
    src = path.parent / "k.cu"
    os.utime(src, ns=(1, 1))  # a sentinel mtime that any rewrite would replace
    _truncate_fatbin(path.parent)
    _build("k", TRIVIAL)
    assert src.stat().st_mtime_ns == 1
    src.write_text("// edited by hand\n")
    _truncate_fatbin(path.parent)
    _build("k", TRIVIAL)
    assert src.read_text() == TRIVIAL


def test_key_covers_included_templates(fake_compiler, tmp_path, monkeypatch):
    templates = tmp_path / "templates"
    (templates / "sub").mkdir(parents=True)
    (templates / "gemm.cuh").write_text('#include "sub/epilogue.h"\n// v1\n')
    (templates / "sub" / "epilogue.h").write_text('#include "cutlass/cutlass.h"\n// v1\n')
    (templates / "other.cuh").write_text("// v1\n")
    monkeypatch.setattr(_paths, "templates_dir", lambda: templates)
    flags = compile_flags(arch_flags=ARCH)
    assert f"-I{templates}" in flags
    source = '#include "gemm.cuh"\n' + TRIVIAL

    keys = [cache_key(source, flags)]

    def key_changed():
        keys.append(cache_key(source, flags))
        return keys[-1] != keys[-2]

    (templates / "other.cuh").write_text("// v2\n")
    assert not key_changed()  # a header nothing includes
    (templates / "gemm.cuh").write_text('#include "sub/epilogue.h"\n// v2\n')
    assert key_changed()
    (templates / "sub" / "epilogue.h").write_text("// v2\n")  # included through gemm.cuh
    assert key_changed()
    (templates / "gemm.cuh").write_text('#include "sub/epilogue.h"\n#include "other.cuh"\n')
    assert key_changed()
    (templates / "other.cuh").write_text("// v3\n")  # now included
    assert key_changed()
    assert cache_key(source, flags) == keys[-1]  # deterministic
    assert cache_key(SECOND, flags) != cache_key(TRIVIAL, flags)
    assert cache_key(source, flags + ["-DX"]) != keys[-1]

    first = _build("k", source)
    (templates / "sub" / "epilogue.h").write_text("// v3\n")
    second = _build("k", source)
    assert first.parent != second.parent and fake_compiler == ["k", "k"]
    assert first.exists()  # the old entry stays valid for whoever still has the old templates


def test_extra_flags_change_the_entry(fake_compiler):
    a = _build("k", TRIVIAL)
    b = _build("k", TRIVIAL, extra_flags=["-DMIXED_GEMM_TEST=1"])
    assert a != b
    assert json.loads((b.parent / "meta.json").read_text())["flags"][-1] == "-DMIXED_GEMM_TEST=1"


@pytest.mark.parametrize("name", ["", "a/b", "../up", ".hidden", "with space"])
def test_bad_names(fake_compiler, name):
    with pytest.raises(ValueError):
        _build(name, TRIVIAL)


def test_build_many_first_failure_raised(fake_compiler):
    items = [(name, src, dict(arch_flags=ARCH)) for name, src in [("good1", TRIVIAL), ("bad", "// FAIL\n"), ("good2", SECOND)]]
    with pytest.raises(BuildError, match="FAIL"):
        build_many(items, jobs=2, progress=False)
    entries = {p.name.split("-")[0]: p for p in _entries(_paths.cache_dir())}
    assert _entry_files(entries["bad"]) == {"bad.cu"}


# --- real nvcc failures and concurrent processes --------------------------------------------


@requires_nvcc
def test_compile_error_reported(tmp_cache):
    with pytest.raises(BuildError) as info:
        _build("broken", BROKEN)
    message = str(info.value)
    (entry,) = _entries(tmp_cache)
    assert "this_is_not_declared" in message and "error" in message
    assert str(entry / "broken.cu") in message
    assert info.value.source_path == entry / "broken.cu"
    # The source stays for inspection; nothing that could pass for a build is left behind.
    assert _entry_files(entry) == {"broken.cu"}
    with pytest.raises(BuildError):
        _build("broken", BROKEN)  # failures are not cached as successes


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
    procs = [ctx.Process(target=build_fatbin, args=("race", TRIVIAL), kwargs=dict(arch_flags=ARCH)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]

    assert len(log.read_text().split()) == 1
    (entry,) = _entries(tmp_cache)
    assert _entry_files(entry) == {"race.cu", "race.fatbin", "meta.json"}
    monkeypatch.setattr(cache, "compile_fatbin", lambda *a, **kw: pytest.fail("entry should be valid"))
    path = _build("race", TRIVIAL)
    assert path == entry / "race.fatbin"
    assert fatbin_targets(path.read_bytes()) == ["sm_80", "compute_90", "sm_90"]


# --- what feeds the key, and loading without a toolchain ------------------------------------


def test_key_covers_only_what_the_source_includes(fake_compiler, tmp_path, monkeypatch):
    templates = tmp_path / "templates"
    for rel in ("common/c.cuh", "fam_a/a.cuh", "fam_b/b.cuh"):
        (templates / rel).parent.mkdir(parents=True, exist_ok=True)
        (templates / rel).write_text("// v1\n")
    (templates / "fam_a/a.cuh").write_text('#include "common/c.cuh"\n')
    monkeypatch.setattr(_paths, "templates_dir", lambda: templates)
    flags = ["-O3"]
    source = '#include "fam_a/a.cuh"\n' + TRIVIAL
    key = cache_key(source, flags)
    (templates / "fam_b/b.cuh").write_text("// v2\n")  # another family's template
    assert cache_key(source, flags) == key
    (templates / "fam_a/a.cuh").write_text('#include "common/c.cuh"\n// v2\n')
    assert cache_key(source, flags) != key
    key = cache_key(source, flags)
    (templates / "common/c.cuh").write_text("// v2\n")
    assert cache_key(source, flags) != key


def test_toolchain_is_recorded_and_a_new_one_rebuilds(fake_compiler, monkeypatch):
    path = _build("k", TRIVIAL)
    meta = json.loads((path.parent / "meta.json").read_text())
    assert meta["toolchain"]["nvcc"] == "99.9.999" and meta["toolchain"]["cutlass"]
    assert _build("k", TRIVIAL) == path and fake_compiler == ["k"]
    monkeypatch.setattr(cache, "nvcc_version", lambda: "99.9.1000")
    assert _build("k", TRIVIAL) == path and fake_compiler == ["k", "k"]  # same entry, rebuilt
    assert json.loads((path.parent / "meta.json").read_text())["toolchain"]["nvcc"] == "99.9.1000"


def test_verified_entry_loads_without_toolchain(fake_compiler, monkeypatch):
    path = _build("k", TRIVIAL)
    monkeypatch.setattr(cache, "toolchain", lambda: (None, "nvcc not found; CUTLASS headers missing"))
    monkeypatch.setattr(cache, "compile_fatbin", lambda *a, **kw: pytest.fail("no compile without a toolchain"))
    assert _build("k", TRIVIAL) == path
    with pytest.raises(BuildError, match="no verified build .* and no toolchain to build one: nvcc not found"):
        _build("k", SECOND)
    _flip_fatbin_byte(path.parent)
    with pytest.raises(BuildError, match="no toolchain"):  # a damaged entry is never loaded
        _build("k", TRIVIAL)


_HIDDEN = """
import json, sys
import cutlass_library
cutlass_library.source_path = "/nonexistent/cutlass"  # the headers are gone
from mixed_gemm.compile import BuildError, build_fatbin, cutlass_include_dir, find_nvcc
for probe in (find_nvcc, cutlass_include_dir):
    try:
        probe()
        sys.exit(f"{probe.__name__} still works: the toolchain is not hidden")
    except BuildError:
        pass
print(build_fatbin("trivial", sys.argv[1], arch_flags=json.loads(sys.argv[2])))
"""


@requires_nvcc
def test_real_entry_loads_with_nvcc_and_cutlass_hidden(in_real_cache, tmp_path):
    root, path = in_real_cache
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    nvcc_dir = str(find_nvcc().parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not os.path.exists(os.path.join(p, "nvcc")) and p != nvcc_dir)
    env["MIXED_GEMM_CACHE_DIR"] = str(root)
    import sys

    out = subprocess.run([sys.executable, "-c", _HIDDEN, TRIVIAL, json.dumps(list(ARCH))], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    assert Path(out.stdout.strip().splitlines()[-1]) == path


# --- shared-library entries (families whose host code builds the launch, e.g. sm90a) ----------

LIBRARY = 'extern "C" int mg_answer() { return 42; }\n'


@requires_nvcc
def test_shared_library_entry_builds_loads_and_hits(tmp_cache, monkeypatch):
    """``output="shared"``: a ``.so`` entry beside fatbin entries of the same name and source, keyed
    apart, verified like them (a damaged one is rebuilt), and loadable with ctypes."""
    import ctypes

    path = _build("lib", LIBRARY, output="shared")
    assert path.suffix == ".so" and path.read_bytes()[:4] == b"\x7fELF"
    assert ctypes.CDLL(str(path)).mg_answer() == 42
    assert "--shared" in json.loads((path.parent / "meta.json").read_text())["flags"]
    fatbin = _build("lib", LIBRARY)  # the same source as a fatbin: another entry
    assert fatbin.parent != path.parent and fatbin.suffix == ".fatbin"
    calls = []
    monkeypatch.setattr(cache, "compile_fatbin", lambda *a, **kw: calls.append(a))
    assert _build("lib", LIBRARY, output="shared") == path and calls == []  # a hit runs no nvcc
    with pytest.raises(ValueError, match="output: must be one of"):
        _build("lib", LIBRARY, output="cubin")


def test_build_many_caps_kernel_libraries_by_memory(tmp_cache, monkeypatch):
    """Kernel libraries start first but no more at once than memory holds; fatbins fill the rest."""
    import threading
    import time

    running, peak, order = [0], [0], []
    lock = threading.Lock()

    def fake_build(name, source, **kw):
        with lock:
            order.append(name)
            if kw.get("output") == "shared":
                running[0] += 1
                peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            if kw.get("output") == "shared":
                running[0] -= 1
        return Path(name)

    monkeypatch.setattr(cache, "build_fatbin", fake_build)
    monkeypatch.setattr(cache, "library_slots", lambda: 2)
    items = [(f"f{i}", "", dict(arch_flags=ARCH)) for i in range(3)]
    items += [(f"lib{i}", "", dict(arch_flags=ARCH, output="shared")) for i in range(5)]
    paths = build_many(items, jobs=4, progress=False)
    assert [p.name for p in paths] == [name for name, _, _ in items]  # input order
    later = min(order.index(f"lib{i}") for i in (2, 3, 4))
    assert peak[0] == 2 and max(order.index("lib0"), order.index("lib1"), order.index("f0")) < later
