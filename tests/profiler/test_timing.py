"""profiler.timing.time_cold's flush argument (CPU): an unknown kind is refused by name before any
CUDA work; the kinds it takes are the ones bench/moe_l2_probe.py offers."""
import pytest

from mixed_gemm.profiler.timing import FLUSHES, time_cold


def test_time_cold_refuses_an_unknown_flush_before_touching_the_gpu():
    with pytest.raises(ValueError, match=r"flush must be one of \('write', 'read'\), got 'evict'"):
        time_cold({"noop": lambda: None}, rounds=1, flush="evict")


def test_the_write_flush_stays_the_default():
    assert FLUSHES[0] == "write" and time_cold.__defaults__[-1] == "write"
