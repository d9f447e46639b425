"""Content-addressed on-disk cache of compiled fatbins and kernel shared libraries.

An entry is ``cache_dir()/<name>-<key[:16]>/`` with ``<name>.cu``, the binary (``<name>.fatbin``
or ``<name>.so``) and ``meta.json``. ``meta.json`` is written last and records the binary's sha256, so an entry is
either complete and verified or rebuilt: a crash, a full disk or a concurrent writer can leave
junk behind but never a hit on it (which is also why no fsync is needed). The next build of the
entry removes that junk (temporary files, a kernel library's split folder).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Optional, Sequence, Tuple

from filelock import FileLock
from tqdm.auto import tqdm

from .. import _paths
from . import packages
from .deps import template_deps
from .errors import BuildError
from .policy import compile_refused, jit_mode
from .nvcc import compile_fatbin, compile_flags, cutlass_version, find_nvcc, key_flags, nvcc_version, output_suffix

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class BuildSpec(NamedTuple):
    """What the runtime needs to get one kernel's binary: its ``name`` (from its config), a thunk
    rendering its ``source`` (called only when a key or a build needs it), the nvcc ``-gencode``
    ``arch_flags`` of its family and the ``output`` kind (``"fatbin"`` or ``"shared"``)."""

    name: str
    source: Callable[[], str]
    arch_flags: Sequence[str]
    output: str = "fatbin"


def cache_key(source: str, flags: Sequence[str]) -> str:
    """sha256 (hex) over the source, the flags and every file of ``templates/`` the source
    includes (:func:`~.deps.template_deps`, with their relative paths since kernels ``#include``
    them by name). It names the cache entry and a kernel package's entry and needs no toolchain,
    so a verified binary loads on a machine without nvcc or the CUTLASS headers; the toolchain
    that built it is recorded beside it (see :func:`build_fatbin`).
    """
    h = hashlib.sha256()

    def feed(data: bytes | str) -> None:
        # Length-prefix every field so that no two different inputs concatenate to the same bytes.
        if isinstance(data, str):
            data = data.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    feed("mixed_gemm-fatbin-v3")
    feed(source)
    # Include directories enter through what they hold (template bytes below; CUTLASS through the
    # recorded toolchain), not their absolute paths, so a cache built on one machine is valid on another.
    feed(json.dumps([f for f in flags if not f.startswith("-I")]))
    for rel, path in template_deps(source):
        feed(rel)
        feed(path.read_bytes())
    return h.hexdigest()


def toolchain() -> Tuple[Optional[dict], str]:
    """``({"nvcc": version, "cutlass": version}, "")`` when both are installed, else ``(None, why)``."""
    try:
        return {"nvcc": nvcc_version(), "cutlass": cutlass_version()}, ""
    except BuildError as exc:
        return None, str(exc)


def _tmp_path(path: Path) -> Path:
    # Same directory, so os.replace is an atomic rename on one filesystem; a unique name rather
    # than tempfile.mkstemp because mkstemp's 0600 mode would make a shared cache unreadable.
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = _tmp_path(path)
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read_valid(entry: Path, binary: Path, name: str, key: str, tools: Optional[dict]) -> bool:
    """True when meta.json parses, matches ``name``/``key`` (and ``tools``, the installed toolchain,
    unless None), and the binary's bytes match it."""
    try:
        meta = json.loads((entry / "meta.json").read_bytes())
        data = binary.read_bytes()
    except (OSError, ValueError):
        return False
    return (
        isinstance(meta, dict)
        and meta.get("name") == name
        and meta.get("key") == key
        and (tools is None or meta.get("toolchain") == tools)
        and meta.get("size") == len(data)
        and meta.get("sha256") == hashlib.sha256(data).hexdigest()
    )


def _remove_leftovers(entry: Path) -> None:
    """Delete what killed builds of ``entry`` left in it: :func:`_tmp_path` files and
    :func:`~.nvcc.compile_shared`'s ``.split-*`` folders. Only with the entry's lock held: every
    writer of an entry holds it, so none of these belongs to a build still running."""
    for path in entry.iterdir():
        if path.name.startswith(".split-") and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.name.startswith(".") and path.name.endswith(".tmp"):
            path.unlink(missing_ok=True)


def _build_entry(entry: Path, binary: Path, name: str, key: str, source: str, flags: list[str],
                 tools: dict) -> Path:
    entry.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(entry)
    meta_path = entry / "meta.json"
    # Drop the old meta first: from here until the new one lands the entry must read as invalid.
    meta_path.unlink(missing_ok=True)

    src = entry / f"{name}.cu"
    src_bytes = source.encode()
    try:
        same = src.read_bytes() == src_bytes
    except OSError:
        same = False
    if not same:  # rewriting identical text would only churn mtimes seen by editors and tools
        _atomic_write(src, src_bytes)

    tmp = _tmp_path(binary)
    try:
        compile_fatbin(src, tmp, flags)
        data = tmp.read_bytes()
        if not data:
            raise BuildError(f"nvcc exited 0 but wrote an empty {binary.suffix} for {src}", source_path=src)
        os.replace(tmp, binary)
    finally:
        tmp.unlink(missing_ok=True)

    meta = {
        "name": name,
        "key": key,
        "nvcc": str(find_nvcc()),
        "toolchain": tools,
        "flags": flags,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
    }
    _atomic_write(meta_path, (json.dumps(meta, indent=2) + "\n").encode())
    return binary


def locate(name: str, source: str, arch_flags: Sequence[str], extra_flags: Sequence[str] = (),
           output: str = "fatbin") -> Tuple[str, Path, Path]:
    """``(cache key, cache entry folder, binary path in it)`` of a kernel (nothing is read)."""
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"kernel name {name!r} must match {_NAME_RE.pattern}")
    key = cache_key(source, key_flags(extra_flags, arch_flags=arch_flags, output=output))
    entry = _paths.cache_dir() / f"{name}-{key[:16]}"
    return key, entry, entry / f"{name}{output_suffix(output)}"


def lookup(name: str, source: str, *, arch_flags: Sequence[str], extra_flags: Sequence[str] = (),
           output: str = "fatbin") -> Optional[Path]:
    """The binary :func:`build_fatbin` would return without compiling -- a verified entry of an
    installed kernel package, else of the kernel cache -- or None."""
    key, entry, binary = locate(name, source, arch_flags, extra_flags, output)
    packaged = packages.find(name, key, arch_flags)
    if packaged is not None:
        return packaged
    tools, _ = toolchain()
    return binary if _read_valid(entry, binary, name, key, tools) else None


def build_fatbin(
    name: str,
    source: str,
    *,
    arch_flags: Sequence[str],
    extra_flags: Sequence[str] = (),
    output: str = "fatbin",
) -> Path:
    """The binary of ``source`` (CUDA C++ text) for ``arch_flags``: a fatbin (``output="shared"``:
    a shared library). Looked up in order: the installed kernel packages (:mod:`.packages`), the
    kernel cache, and only then compiled with nvcc into the cache (unless ``$MIXED_GEMM_JIT=off``:
    :class:`~.policy.JitDisabledError`).

    ``name`` names the entry and its files (letters, digits, ``_.-``). A verified entry loads
    without any toolchain; where nvcc and the CUTLASS headers are installed, a cache entry built by
    other versions of them is rebuilt. Safe to call from several threads and processes at once:
    builds of one entry are serialized on a file lock.
    """
    key, entry, binary = locate(name, source, arch_flags, extra_flags, output)
    packaged = packages.find(name, key, arch_flags)
    if packaged is not None:
        return packaged
    tools, missing = toolchain()
    root = entry.parent

    # Lock-free fast path: meta.json is written last and verified against the fatbin's bytes, so a
    # reader racing a writer sees either a verified entry or a miss, never a half-written fatbin.
    if _read_valid(entry, binary, name, key, tools):
        return binary
    if jit_mode() == "off":
        raise compile_refused(name, str(root), packages.summary())
    if tools is None:
        raise BuildError(f"{name}: not in an installed kernel package, no verified build in the kernel cache "
                         f"{root}, and no toolchain to build one: {missing}")
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f"{entry.name}.lock")):
        if _read_valid(entry, binary, name, key, tools):  # another process built it while we waited
            return binary
        if entry.exists():
            log.info("rebuilding invalid cache entry %s", entry)
        flags = compile_flags(extra_flags, arch_flags=arch_flags, output=output)
        return _build_entry(entry, binary, name, key, source, flags, tools)


def build_spec(spec: BuildSpec) -> Path:
    """:func:`build_fatbin` of a :class:`BuildSpec`."""
    return build_fatbin(spec.name, spec.source(), arch_flags=spec.arch_flags, output=spec.output)


# Peak memory of one kernel library's build: its device pass (cicc, 5.1 GB for an sm90a GEMM) and
# host pass (1.9 GB) run at the same time (measured on the H100 machine, docs/notes/build.md).
LIBRARY_BUILD_BYTES = 7 * 2**30


def library_slots() -> int:
    """How many kernel-library builds fit in the memory available now (at least one)."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):  # not Linux: no cap beyond --jobs
        return os.cpu_count() or 1
    return max(1, available // LIBRARY_BUILD_BYTES)


def build_many(
    items: Iterable[tuple[str, str, dict]], *, jobs: int | None = None, progress: bool = True
) -> list[Path]:
    """:func:`build_fatbin` for each ``(name, source, keyword arguments)``, ``jobs`` at a time;
    paths in input order.

    nvcc does the work in subprocesses, so threads are enough. Kernel libraries (``output="shared"``,
    a minute of nvcc where a fatbin takes seconds) start first, so no long build is left for the
    end, and no more of them at once than memory holds (:func:`library_slots`): the rest wait
    behind the fatbins. On the first failure the builds not yet started are cancelled, the running
    ones finish, and that first error is raised.
    """
    items = list(items)
    if not items:
        return []
    jobs = max(1, jobs or os.cpu_count() or 1)
    is_library = [kw.get("output", "fatbin") == "shared" for _, _, kw in items]
    libraries = [i for i, lib in enumerate(is_library) if lib]
    slots = min(jobs, library_slots())
    order = libraries[:slots] + [i for i, lib in enumerate(is_library) if not lib] + libraries[slots:]
    gate = threading.BoundedSemaphore(slots)

    def build(i):
        name, src, kw = items[i]
        if not is_library[i]:
            return build_fatbin(name, src, **kw)
        with gate:
            return build_fatbin(name, src, **kw)

    results: list[Path | None] = [None] * len(items)
    first_error: BaseException | None = None
    failed: list[str] = []
    # disable=None lets tqdm hide itself when stderr is not a terminal (CI logs).
    with ThreadPoolExecutor(max_workers=min(jobs, len(items))) as pool, tqdm(
        total=len(items), desc="nvcc", unit="kernel", disable=None if progress else True
    ) as bar:
        futures = {pool.submit(build, i): i for i in order}
        for fut in as_completed(futures):
            i = futures[fut]
            if fut.cancelled():
                continue
            exc = fut.exception()
            if exc is None:
                results[i] = fut.result()
                bar.set_postfix_str(items[i][0], refresh=False)
                bar.update(1)
                continue
            failed.append(items[i][0])
            if first_error is None:
                first_error = exc
                for other in futures:
                    other.cancel()
    if first_error is not None:
        if len(failed) > 1:
            log.error("%d kernels failed to build: %s", len(failed), ", ".join(failed))
        if isinstance(first_error, BuildError):
            raise first_error
        raise BuildError(f"building {failed[0]} failed: {first_error!r}") from first_error
    return results  # type: ignore[return-value]


def load_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of a built fatbin (for ``cuModuleLoadData``/``cuLibraryLoadData``)."""
    return Path(path).read_bytes()


def build_specs(specs: Iterable[BuildSpec], *, jobs: int | None = None, progress: bool = False) -> dict[str, Path]:
    """:func:`build_many` of :class:`BuildSpec` s, each name once: ``{name: binary}``."""
    unique = {}
    for spec in specs:
        unique.setdefault(spec.name, spec)
    paths = build_many([(s.name, s.source(), dict(arch_flags=s.arch_flags, output=s.output)) for s in unique.values()],
                       jobs=jobs, progress=progress)
    return dict(zip(unique, paths))
