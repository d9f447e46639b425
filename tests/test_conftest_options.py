"""The suite's own options (tests/conftest.py): the xdist workers spread over GPUs, the shards."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).parent / "conftest.py"
PROBE = f"""
import importlib.util, os
spec = importlib.util.spec_from_file_location("suite_conftest", {str(CONFTEST)!r})
module = importlib.util.module_from_spec(spec)
try:
    spec.loader.exec_module(module)
except Exception as e:  # the UsageError of a bad setting
    print(type(e).__name__, e)
print("visible", os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
"""


def _probe(**env):
    base = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "PYTEST_XDIST_WORKER")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("worker,gpus,want", [("gw0", "2", "0"), ("gw5", "2", "1"), ("gw6", "4", "2"),
                                              ("gw3", "1", "0")])
def test_worker_sees_one_gpu(worker, gpus, want):
    assert f"visible {want}" in _probe(PYTEST_XDIST_WORKER=worker, MIXED_GEMM_TEST_GPUS=gpus)


def test_no_spread_outside_xdist_or_without_the_setting():
    assert "visible unset" in _probe(MIXED_GEMM_TEST_GPUS="2")  # the main process (no worker id)
    assert "visible unset" in _probe(PYTEST_XDIST_WORKER="gw3")


@pytest.mark.parametrize("bad", ["0", "two", "-1"])
def test_bad_gpu_count_is_a_usage_error_naming_the_setting(bad):
    out = _probe(PYTEST_XDIST_WORKER="gw1", MIXED_GEMM_TEST_GPUS=bad)
    assert "UsageError" in out and "MIXED_GEMM_TEST_GPUS" in out and "visible unset" in out


def test_shards_are_disjoint_and_cover_the_collection(tmp_path):
    (tmp_path / "test_many.py").write_text("import pytest\n@pytest.mark.parametrize('i', range(40))\n"
                                           "def test_i(i):\n    pass\n")
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    seen = []
    for index in (1, 2, 3):
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                              str(tmp_path)], env={**os.environ, "MIXED_GEMM_TEST_SHARD": f"{index}/3"},
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
        seen.append({line for line in out.stdout.splitlines() if "::test_i[" in line})
    assert all(seen) and sum(map(len, seen)) == 40 and len(set().union(*seen)) == 40
