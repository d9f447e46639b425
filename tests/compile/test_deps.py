"""The cache key's header scan finds exactly the project headers nvcc includes."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mixed_gemm import _paths
from mixed_gemm.compile import compile_flags, find_nvcc
from mixed_gemm.compile.deps import template_deps
from mixed_gemm.kernels import ALL_FAMILIES


def _nvcc_deps(tmp_path, source: str, arch_flags) -> set:
    """Headers nvcc reads for ``source``: the device pass and, where the source has one, the host
    library's pass (``MIXED_GEMM_HOST_PASS``: sm90s's host.cuh is included only there)."""
    src = tmp_path / "k.cu"
    src.write_text(source)
    flags = [f for f in compile_flags(arch_flags=arch_flags) if f.startswith(("-I", "-std", "--expt", "-D"))]
    passes = [[]] + ([["-DMIXED_GEMM_HOST_PASS"]] if "MIXED_GEMM_HOST_PASS" in source else [])
    root = _paths.templates_dir().resolve()
    deps = set()
    for extra in passes:
        out = subprocess.run([str(find_nvcc()), "-M", *flags, *extra, *arch_flags[:1], str(src)], capture_output=True,
                             text=True, check=True).stdout
        files = out.replace("\\\n", " ").split(":", 1)[1].split()
        paths = [Path(f).resolve() for f in files]
        deps |= {p.relative_to(root).as_posix() for p in paths if root in p.parents}
    return deps


@pytest.mark.nvcc
@pytest.mark.parametrize("fam", ALL_FAMILIES, ids=lambda f: f.name)
def test_scan_matches_nvcc_dependencies(tmp_path, fam):
    configs = fam.catalog()
    # One config of every distinct set of include lines the family renders (dequant_mm has two
    # templates, gemv includes per layout).
    seen, picked = set(), []
    for c in configs:
        head = tuple(line for line in fam.render(c).splitlines() if line.lstrip().startswith("#"))
        if head not in seen:
            seen.add(head)
            picked.append(c)
    for c in picked:
        source = fam.render(c)
        assert {rel for rel, _ in template_deps(source)} == _nvcc_deps(tmp_path, source, fam.arch_flags), c.kernel_name


def test_scan_is_transitive_and_ignores_foreign_headers(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.cuh").write_text('#include "b.cuh"\n#include "cutlass/cutlass.h"\n')
    (tmp_path / "a" / "b.cuh").write_text('  #  include "c/d.cuh"\n')  # beside the includer first
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "d.cuh").write_text('#include "a/x.cuh"\n')  # a cycle ends
    monkeypatch.setattr(_paths, "templates_dir", lambda: tmp_path)
    assert [rel for rel, _ in template_deps('#include "a/x.cuh"\n#include <cuda.h>\n')] == ["a/b.cuh", "a/x.cuh", "c/d.cuh"]
