"""Package list for setuptools (everything else is in pyproject.toml): every sub-package of
mixed_gemm is found, so a new kernel family needs no entry here; templates/ and profiles/ ship as
the data packages mixed_gemm.templates and mixed_gemm.profiles (package-dir in pyproject.toml)."""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["mixed_gemm", "mixed_gemm.*"]) + ["mixed_gemm.templates", "mixed_gemm.profiles"])
