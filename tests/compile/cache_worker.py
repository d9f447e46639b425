"""One process of tests/compile/test_cache_processes.py: builds kernels through the real cache
(mixed_gemm.compile.cache, background) with a stand-in for nvcc, against a shared cache folder.

    python cache_worker.py MODE LOG READY_DIR GO_FILE NAME [NAME ...]

The stand-in compiler appends ``<name> <pid>`` to LOG for every build it starts (O_APPEND: one
short line per write, whole), writes :func:`blob` of the source in two halves with a pause
between them (so that racing processes overlap), and in the ``hang-*`` modes stops for good at
the point named (``hang-compile``: half the binary written; ``hang-meta``: binary complete,
meta.json half written), touching ``LOG.hang`` so the test knows where to kill it.

The worker touches ``READY_DIR/<pid>`` once imported and waits for GO_FILE, so that every
process starts building at once. MODE ``block`` builds each name from three threads
(:func:`~mixed_gemm.compile.cache.build_spec`); ``async`` submits each to
:mod:`~mixed_gemm.compile.background` (twice: one request per name) while a thread builds the
first name directly. Prints ``<name> <sha256 of the bytes loaded>`` per name.
"""
from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
import types
from pathlib import Path

if __name__ == "__main__":
    # The build machinery imports no torch; the package root does (9 s on a loaded 2-core machine).
    # A bare package module in its place lets each worker start in well under a second.
    _pkg = types.ModuleType("mixed_gemm")
    _pkg.__path__ = [str(Path(__file__).resolve().parents[2] / "mixed_gemm")]
    sys.modules["mixed_gemm"] = _pkg

from mixed_gemm.compile import BuildSpec, background, cache  # noqa: E402
from mixed_gemm.compile.fatbin import FATBIN_MAGIC_BYTES  # noqa: E402
from mixed_gemm.compile.nvcc import key_flags  # noqa: E402

ARCH = ("-gencode=arch=compute_90,code=sm_90",)
TOOLS = {"nvcc": "99.9.999", "cutlass": "9.9.9"}


def source(name: str) -> str:
    return f'extern "C" __global__ void {name}(float* p) {{ p[0] = {len(name)}.f; }}\n'


def blob(text: str) -> bytes:
    """What the stand-in compiler writes for a source: deterministic, 2 KiB and more."""
    return FATBIN_MAGIC_BYTES + hashlib.sha256(text.encode()).digest() * 64


def spec(name: str) -> BuildSpec:
    return BuildSpec(name, lambda: source(name), ARCH)


def _hang(log: Path) -> None:
    log.with_suffix(".hang").touch()
    time.sleep(600)  # killed by the test long before


def install_fake_toolchain(mode: str, log: Path) -> None:
    """Point the cache at the stand-in compiler and a fixed toolchain (no nvcc, no CUTLASS)."""

    def compile_fatbin(src, out, flags):
        text = Path(src).read_text()
        with open(log, "a") as f:
            f.write(f"{Path(src).stem} {os.getpid()}\n")
        data = blob(text)
        with open(out, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            if mode == "hang-compile":
                _hang(log)
            time.sleep(0.3)
            f.write(data[len(data) // 2:])
        return ""

    atomic_write = cache._atomic_write

    def slow_atomic_write(path: Path, data: bytes) -> None:
        if mode == "hang-meta" and path.name == "meta.json":
            with open(cache._tmp_path(path), "xb") as f:
                f.write(data[: len(data) // 2])
            _hang(log)
        atomic_write(path, data)

    cache.compile_fatbin = compile_fatbin
    cache._atomic_write = slow_atomic_write
    cache.compile_flags = lambda extra=(), *, arch_flags, output="fatbin": key_flags(extra, arch_flags=arch_flags,
                                                                                    output=output)
    cache.toolchain = lambda: (dict(TOOLS), "")
    cache.find_nvcc = lambda: Path("/fake/bin/nvcc")


def main(argv: list[str]) -> int:
    mode, log, ready, go, *names = argv
    log, ready, go = Path(log), Path(ready), Path(go)
    install_fake_toolchain(mode, log)
    (ready / str(os.getpid())).touch()
    deadline = time.monotonic() + 120
    while not go.exists():
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        time.sleep(0.002)
    paths: dict[str, Path] = {}
    errors: list[BaseException] = []

    def build(name: str) -> None:
        try:
            paths[name] = cache.build_spec(spec(name))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    if mode == "async":
        direct = threading.Thread(target=build, args=(names[0],))
        direct.start()
        futures = {name: background.submit(spec(name)) for name in names}
        assert all(background.submit(spec(name)) is futures[name] for name in names)  # one request per name
        direct.join()
        if not errors:
            assert futures[names[0]].result(timeout=120) == paths[names[0]]
        for name, future in futures.items():
            paths[name] = future.result(timeout=120)
    else:
        threads = [threading.Thread(target=build, args=(name,)) for name in names for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    for name in names:
        print(name, hashlib.sha256(cache.load_bytes(paths[name])).hexdigest(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
