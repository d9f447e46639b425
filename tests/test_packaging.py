"""The wheel installs a working package: modules, templates/ and profiles/ data, console script.

Builds a wheel (no build isolation, so no network), installs it into a fresh venv and imports it
from outside the repository, where only the installed copy can be found.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "mixed_gemm"

# Things in a working tree that must not reach the build: setuptools reuses a stale build/ and
# *.egg-info, so files deleted or no longer matched by package-data would still ship. Dot
# directories at the top (.git, .venv, local caches and wheelhouses) only cost copying time.
_ROOT_JUNK = {"build", "dist", "venv"}

_CHECK = """
import json, sys, sysconfig
import mixed_gemm, mixed_gemm.compile, mixed_gemm.cli
from mixed_gemm import _paths
print(json.dumps({
    "prefix": sys.prefix,
    "purelib": sysconfig.get_path("purelib"),
    "file": mixed_gemm.__file__,
    "templates": str(_paths.templates_dir()),
    "profiles": str(_paths.profiles_dir()),
}))
"""


def _ignore(directory: str, names: list[str]) -> set[str]:
    ignored = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
    if Path(directory).resolve() == REPO:
        ignored |= {n for n in names if n in _ROOT_JUNK or n.startswith(".")}
    return ignored


def _run(cmd, hint: str = "", **kwargs) -> str:
    proc = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kwargs
    )
    assert proc.returncode == 0, f"{cmd} failed{hint}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def _exposes_source(path: Path) -> bool:
    """Whether ``path`` on the new venv's import path would let the source tree be imported: the
    repository root, or any directory directly holding a ``mixed_gemm`` source package (another
    checkout, a worktree). Site-packages directories are kept even inside the repository (CI's
    ``.ci/run`` puts its ``.venv`` with torch there); an installed ``mixed_gemm`` in one comes after
    the new venv's own purelib, and the test asserts that the import is the new copy."""
    if path.name in ("site-packages", "dist-packages"):
        return False
    return path == REPO or (path / PACKAGE / "__init__.py").is_file()


def _outer_paths() -> list[str]:
    """This interpreter's import path (torch, numpy, ... live there) minus the source tree.

    They are written as lines of a .pth file: ``site`` does not process .pth files inside
    directories added that way, so the outer venv's editable-install finder does not leak in."""
    paths = []
    for entry in sys.path:
        if not entry or not Path(entry).is_dir():
            continue
        resolved = Path(entry).resolve()
        if not _exposes_source(resolved):
            paths.append(str(resolved))
    return paths


def test_outer_paths_keep_site_packages_inside_the_repository(tmp_path, monkeypatch):
    """A fake checkout with its CI venv inside it: only the source tree entries are dropped."""
    repo = tmp_path / "repo"
    (repo / PACKAGE).mkdir(parents=True)
    (repo / PACKAGE / "__init__.py").touch()
    in_repo_site = repo / ".venv" / "lib" / "python3.11" / "site-packages"
    (in_repo_site / "torch").mkdir(parents=True)
    (in_repo_site / PACKAGE).mkdir()  # a regular (non-editable) install: still kept
    (in_repo_site / PACKAGE / "__init__.py").touch()
    tests_dir = repo / "tests"
    tests_dir.mkdir()
    other_checkout = tmp_path / "other-checkout"
    (other_checkout / PACKAGE).mkdir(parents=True)
    (other_checkout / PACKAGE / "__init__.py").touch()
    outside_site = tmp_path / "base" / "site-packages"
    outside_site.mkdir(parents=True)
    monkeypatch.setattr(sys.modules[__name__], "REPO", repo.resolve())
    monkeypatch.setattr(sys, "path", [
        "", str(repo), str(in_repo_site), str(tests_dir), str(other_checkout), str(outside_site),
        str(tmp_path / "missing"), str(repo / ".venv" / "lib" / "python3.11" / ".." / "python3.11" / "site-packages"),
    ])
    kept = [Path(p) for p in _outer_paths()]
    resolved = in_repo_site.resolve()
    assert kept == [resolved, tests_dir.resolve(), outside_site.resolve(), resolved]
    assert repo.resolve() not in kept and other_checkout.resolve() not in kept


# Files the code reads at run time, wherever they sit below the data directory: the templates
# that are rendered or #included (kernel sources, headers, the kernel-package skeleton) and the
# tuning profiles.
_NEEDED_SUFFIXES = {"templates": {".cuh", ".h", ".j2"}, "profiles": {".json"}}


def _relative_files(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def _expected_data_files() -> dict[str, set[str]]:
    """Per data package: ``__init__.py``, what its package-data globs select, and every file
    the code needs at run time (so a glob that misses one fails here, not on a user's machine)."""
    setuptools_cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    expected = {}
    for package, source_dir in setuptools_cfg["package-dir"].items():
        if not package.startswith(f"{PACKAGE}."):
            continue
        name = package.split(".", 1)[1]
        root = REPO / source_dir
        files = {"__init__.py"}
        for pattern in setuptools_cfg.get("package-data", {}).get(package, []):
            files |= {p.relative_to(root).as_posix() for p in root.glob(pattern) if p.is_file()}
        needed = _NEEDED_SUFFIXES.get(name, set())
        files |= {rel for rel in _relative_files(root) if Path(rel).suffix in needed}
        expected[name] = files
    return expected


def _repo_modules() -> set[str]:
    """Every module of the source package, as paths relative to it."""
    root = REPO / PACKAGE
    return {
        rel for rel in _relative_files(root)
        if rel.endswith(".py") and (root / rel).parent.joinpath("__init__.py").is_file()
    }


def test_wheel_installs_package_and_data(tmp_path):
    env = _clean_env()
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=_ignore, symlinks=True)
    wheels = tmp_path / "wheels"
    # Built from a copy: no stale build/ or *.egg-info, and nothing written into the work tree.
    _run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation"]
        + ["-w", wheels],
        hint="; without build isolation this needs setuptools>=77 here: "
        "pip install -e '.[test]'",
        cwd=src,
        env=env,
    )
    (wheel,) = wheels.glob("mixed_gemm-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], env=env)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / ("python.exe" if os.name == "nt" else "python")
    get_purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = Path(_run([python, "-c", get_purelib], env=env).strip())
    # --system-site-packages exposes the *base* interpreter's packages; when the tests run in a
    # venv (as CI does) torch & co. live in that venv, so its path goes after the new venv's own.
    (purelib / "_outer_env.pth").write_text("\n".join(_outer_paths()) + "\n")
    # pip comes from those outer paths too (--without-pip saves seconds of ensurepip).
    _run(
        [python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", wheel],
        env=env,
    )

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    info = json.loads(_run([python, "-c", _CHECK], cwd=outside, env=env).strip().splitlines()[-1])

    venv = venv.resolve()
    site = Path(info["purelib"]).resolve()
    assert Path(info["prefix"]).resolve() == venv and venv in site.parents
    installed = Path(info["file"]).resolve().parent
    assert installed == site / PACKAGE, f"imported {info['file']}, not the copy installed in {site}"

    # setup.py finds the packages: a sub-package it misses (no __init__.py, say) fails here.
    missing = _repo_modules() - _relative_files(installed)
    assert not missing, f"not in the wheel (give the folder an __init__.py; setup.py finds packages): {sorted(missing)}"

    expected = _expected_data_files()
    assert set(expected) >= {"templates", "profiles"}
    for name in ("templates", "profiles"):
        data_dir = Path(info[name]).resolve()
        assert data_dir == installed / name
        present = _relative_files(data_dir)
        assert expected[name] <= present, f"{name}: missing {sorted(expected[name] - present)}"

    # The console script runs from the venv too.
    script = bin_dir / ("mixed-gemm.exe" if os.name == "nt" else "mixed-gemm")
    assert str(Path(info["file"]).parent) in _run([script, "info"], cwd=outside, env=env)


def test_version_module_matches_pyproject():
    from mixed_gemm.version import __version__

    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"] == __version__
