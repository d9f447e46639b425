"""Locating nvcc and the CUTLASS headers, and running nvcc."""
from __future__ import annotations

import functools
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Sequence

from .. import _paths
from ..codegen import render_template
from .errors import BuildError

log = logging.getLogger(__name__)

# CUTLASS template errors can run to megabytes; the exception message keeps the head (where the
# first error is) and BuildError.stderr keeps everything.
_MAX_MESSAGE_CHARS = 20_000

_NVCC_NAMES = ("nvcc.exe", "nvcc") if os.name == "nt" else ("nvcc",)

# Builds started from a background thread run niced: an eager decode loop is bound by its own
# host thread, and a compiler at the same priority takes its core (docs/notes/end-to-end.md).
BACKGROUND_NICE = 10
_background = threading.local()


def run_in_background(flag: bool) -> None:
    """Mark this thread's nvcc runs as background work (lower CPU priority) or not."""
    _background.on = flag


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_nvcc() -> Path:
    """``$CUDA_HOME/bin/nvcc``, else ``$CUDA_PATH/bin/nvcc``, else ``nvcc`` on ``PATH``."""
    tried = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if not root:
            tried.append(f"${var} (unset)")
            continue
        for exe in _NVCC_NAMES:
            candidate = Path(root).expanduser() / "bin" / exe
            if _executable(candidate):
                return candidate
        tried.append(f"${var}/bin ({Path(root) / 'bin'}: no nvcc)")
    for exe in _NVCC_NAMES:
        found = shutil.which(exe)
        if found:
            return Path(found)
    tried.append("PATH (no nvcc)")
    raise BuildError(
        "nvcc not found; looked in " + ", ".join(tried) + ". Install the CUDA toolkit (12.4 or "
        "newer) and set CUDA_HOME to its root (e.g. export CUDA_HOME=/usr/local/cuda) or put its "
        "bin/ directory on PATH."
    )


@functools.lru_cache(maxsize=None)
def _nvcc_version_of(nvcc: str) -> str:
    try:
        proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True, errors="replace")
    except OSError as exc:
        raise BuildError(f"could not run {nvcc} --version: {exc}") from exc
    out = proc.stdout + proc.stderr
    # "Cuda compilation tools, release 13.0, V13.0.88"
    match = re.search(r"\bV(\d+\.\d+\.\d+)", out) or re.search(r"release (\d+\.\d+)", out)
    if proc.returncode != 0 or not match:
        raise BuildError(f"could not read the version of {nvcc} (exit {proc.returncode}):\n{out}")
    return match.group(1)


def nvcc_version() -> str:
    """Version of the nvcc that :func:`find_nvcc` picks, e.g. ``"13.0.88"`` (cached per path)."""
    return _nvcc_version_of(str(find_nvcc()))


@functools.lru_cache(maxsize=None)
def cutlass_include_dir() -> Path:
    """The CUTLASS/CuTe headers shipped by the ``nvidia-cutlass`` wheel."""
    try:
        import cutlass_library
    except ImportError as exc:
        raise BuildError(
            "the CUTLASS headers come from the nvidia-cutlass package: pip install nvidia-cutlass"
        ) from exc
    include = Path(cutlass_library.source_path) / "include"
    if not (include / "cutlass" / "cutlass.h").is_file():
        raise BuildError(
            f"nvidia-cutlass is installed but {include}/cutlass/cutlass.h is missing; "
            "reinstall it: pip install --force-reinstall nvidia-cutlass"
        )
    return include


@functools.lru_cache(maxsize=None)
def cutlass_version() -> str:
    """``MAJOR.MINOR.PATCH`` from the headers' ``cutlass/version.h`` (what nvcc actually sees)."""
    header = cutlass_include_dir() / "cutlass" / "version.h"
    text = header.read_text(errors="replace")
    parts = {}
    for field in ("MAJOR", "MINOR", "PATCH"):
        match = re.search(rf"#define\s+CUTLASS_{field}\s+(\d+)", text)
        if not match:
            raise BuildError(f"no CUTLASS_{field} in {header}")
        parts[field] = match.group(1)
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"


# What nvcc writes: a fatbin (loaded with cuModuleLoadData) or a shared library (kernel plus host
# code, loaded with ctypes: the CUTLASS 3.x families build their kernel parameters on the host).
# A library binds the shared cudart (libcudart.so.13, which torch's CUDA build has loaded by the
# time one is opened) instead of linking its own static copy: that copy was ~85% of a stripped
# library's packaged bytes (docs/notes/build.md, "Kernel packages and cold calls").
OUTPUTS = {"fatbin": (("--fatbin",), ".fatbin"),
           "shared": (("--shared", "-Xcompiler=-fPIC", "-cudart=shared"), ".so")}


def output_suffix(output: str) -> str:
    if output not in OUTPUTS:
        raise ValueError(f"output: must be one of {tuple(OUTPUTS)}, got {output!r}")
    return OUTPUTS[output][1]


def _base_flags(output: str, verbose: bool) -> list[str]:
    output_suffix(output)
    # nvcc's -O sets the host compiler's level only (cicc and ptxas optimize device code either
    # way: the same SASS at -O1 and -O3). A kernel library's host code builds Params once per
    # weight and M bucket, so -O1 there cuts its gcc time without costing a launch anything.
    host_opt = "-O1" if output == "shared" else "-O3"
    flags = ["-std=c++17", host_opt, *OUTPUTS[output][0], "--expt-relaxed-constexpr", "-DNDEBUG"]
    if verbose:
        flags.append("-Xptxas=-v")  # per-kernel register/spill report on stderr
    return flags


def _include_flags() -> list[str]:
    return [f"-I{cutlass_include_dir()}", f"-I{_paths.templates_dir()}"]


def key_flags(extra: Sequence[str] = (), *, arch_flags: Sequence[str], output: str = "fatbin") -> list[str]:
    """The flags that feed the cache key: :func:`compile_flags` without the include directories
    (so no toolchain is needed to compute it)."""
    return _base_flags(output, False) + list(arch_flags) + list(extra)


def compile_flags(
    extra: Sequence[str] = (), *, arch_flags: Sequence[str], verbose: bool = False, output: str = "fatbin"
) -> list[str]:
    """Full nvcc flag list for a build (everything but ``-o`` and the source file).
    ``arch_flags`` (``-gencode=...``) belong to the kernel family being built."""
    return _base_flags(output, verbose) + _include_flags() + list(arch_flags) + list(extra)


def _run_nvcc(cmd: list[str], source_path: Path, cwd: str | os.PathLike | None = None) -> str:
    return _run_together([cmd], source_path, cwd)


def _run_together(cmds: Sequence[list[str]], source_path: Path, cwd: str | os.PathLike | None = None) -> str:
    """Run nvcc commands at the same time; their joined (usually empty) output, or a BuildError
    for the first that failed, carrying its whole output."""
    procs = []
    for cmd in cmds:
        log.debug("running %s", shlex.join(cmd))
        try:
            procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                                errors="replace", cwd=cwd)))
            if getattr(_background, "on", False) and hasattr(os, "setpriority"):
                try:  # nvcc's children (cicc, ptxas) inherit it; a race with the first fork costs nothing
                    os.setpriority(os.PRIO_PROCESS, procs[-1][1].pid, BACKGROUND_NICE)
                except OSError:
                    pass
        except OSError as exc:
            for _, p in procs:
                p.kill()
            raise BuildError(f"could not run {cmd[0]}: {exc}", source_path=source_path, cmd=cmd) from exc
    outputs, failed = [], None
    for cmd, proc in procs:
        out = proc.communicate()[0].strip()
        outputs.append(out)
        if proc.returncode != 0 and failed is None:
            failed = (cmd, proc.returncode, out)
    if failed is not None:
        cmd, rc, out = failed
        shown = out
        if len(shown) > _MAX_MESSAGE_CHARS:
            shown = shown[:_MAX_MESSAGE_CHARS] + f"\n... [{len(out) - _MAX_MESSAGE_CHARS} more characters in BuildError.stderr]"
        raise BuildError(f"nvcc failed (exit {rc}) compiling {source_path}\ncommand: {shlex.join(cmd)}\n{shown}",
                         source_path=source_path, cmd=cmd, stderr=out)
    output = "\n".join(o for o in outputs if o)
    if output:
        log.debug("nvcc output for %s:\n%s", source_path, output)
    return output


def compile_fatbin(source_path: str | os.PathLike, out_path: str | os.PathLike, flags: Sequence[str]) -> str:
    """Compile ``source_path`` to ``out_path`` with ``flags`` (see :func:`compile_flags`): a fatbin,
    or with the ``"shared"`` output's flags a kernel library (:func:`compile_shared`).

    Returns nvcc's (usually empty) output, e.g. the
    ``-Xptxas=-v`` report; raises :class:`BuildError` carrying nvcc's error text and the source
    path on failure.
    """
    source_path = Path(source_path)
    if all(f in flags for f in OUTPUTS["shared"][0]):
        return compile_shared(source_path, out_path, flags)
    cmd = [str(find_nvcc()), *flags, "-o", str(out_path), str(source_path)]
    return _run_nvcc(cmd, source_path)


# The preprocessor symbol of a kernel library's host pass (see compile_shared).
HOST_PASS_MACRO = "MIXED_GEMM_HOST_PASS"


def compile_shared(source_path: str | os.PathLike, out_path: str | os.PathLike, flags: Sequence[str]) -> str:
    """A kernel library (``output="shared"``) in two nvcc processes that run side by side:

    - the device pass, ``--fatbin``, sees the kernels and none of the host code (its cicc is most
      of a CUTLASS 3.x kernel's build: ``-split-compile`` measured no faster, one kernel);
    - the host pass, ``-c -D{HOST_PASS_MACRO}``, sees the host code and none of the kernels;

    then the host object and the fatbin (embedded as the hidden symbol ``mg_fatbin`` by
    ``templates/common/embed_fatbin.cpp.j2``) link into one ``.so``. The contract for such a
    source: kernels are defined only when ``{HOST_PASS_MACRO}`` is not, and the host code loads
    them from ``mg_fatbin`` at run time (``cudaLibraryLoadData``, ``cudaLibraryGetKernel``).
    """
    source_path, out_path = Path(source_path), Path(out_path)
    shared = OUTPUTS["shared"][0]
    common = [f for f in flags if f not in shared]
    nvcc = str(find_nvcc())
    with tempfile.TemporaryDirectory(prefix=".split-", dir=out_path.parent) as tmp:
        fatbin, host, blob = Path(tmp) / "device.fatbin", Path(tmp) / "host.o", Path(tmp) / "embed.cpp"
        device = [nvcc, *common, "--fatbin", "-o", str(fatbin), str(source_path)]
        host_cmd = [nvcc, *common, "-c", "-Xcompiler=-fPIC", f"-D{HOST_PASS_MACRO}", "-o", str(host),
                    str(source_path)]
        out = _run_together([device, host_cmd], source_path)
        blob.write_text(render_template("common/embed_fatbin.cpp.j2", fatbin=fatbin.name, symbol="mg_fatbin",
                                        source=source_path.name))
        link = [nvcc, *[f for f in common if not f.startswith("-I")], *shared, "-o", str(out_path.resolve()),
                str(host), str(blob)]
        _run_nvcc(link, source_path, cwd=tmp)
    return out


def compile_cubin(
    source_path: str | os.PathLike,
    out_path: str | os.PathLike | None = None,
    *,
    arch: str = "sm_90",
    extra: Sequence[str] = (),
    verbose: bool = False,
) -> Path:
    """Compile one architecture's cubin (for ``cuobjdump -sass``/``nvdisasm``); not cached.

    ``out_path`` defaults to the source path with suffix ``.<arch>.cubin``.
    """
    source_path = Path(source_path)
    out = Path(out_path) if out_path is not None else source_path.with_suffix(f".{arch}.cubin")
    _run_nvcc(_cubin_command(source_path, out, arch, verbose, _include_flags(), extra), source_path)
    return out


def _cubin_command(source_path: Path, out: Path, arch: str, verbose: bool, includes: Sequence[str],
                   extra: Sequence[str] = ()) -> list[str]:
    flags = ["-std=c++17", "-O3", "--cubin", "--expt-relaxed-constexpr", "-DNDEBUG"] + (["-Xptxas=-v"] if verbose else [])
    return [str(find_nvcc()), *flags, *includes, f"-arch={arch}", *extra, "-o", str(out), str(source_path)]


def ptxas_usage(source_path: str | os.PathLike, *, arch: str = "sm_90a",
                templates: str | os.PathLike | None = None) -> tuple[int, int]:
    """``(registers, spill store bytes)`` that ptxas reports for the kernel of ``source_path`` (the
    largest of each where the source holds several), compiled as :func:`compile_cubin` does;
    ``templates``: another tree's template folder in place of this package's (comparing commits).
    What a kernel's occupancy rests on: a template change that moves it moves the kernel's speed
    away from what its profile entry measured."""
    source_path = Path(source_path)
    includes = _include_flags() if templates is None else [f"-I{cutlass_include_dir()}", f"-I{templates}"]
    with tempfile.TemporaryDirectory() as tmp:
        text = _run_nvcc(_cubin_command(source_path, Path(tmp) / "k.cubin", arch, True, includes), source_path)
    regs = [int(v) for v in re.findall(r"Used (\d+) registers", text)]
    if not regs:
        raise BuildError(f"ptxas reported no register use for {source_path}", source_path=source_path, stderr=text)
    return max(regs), max([int(v) for v in re.findall(r"(\d+) bytes spill stores", text)] or [0])
