"""Profiles and the selection order, without a GPU."""
import json

import pytest

from mixed_gemm.codegen import KernelConfig
from mixed_gemm.codegen.catalog import default_catalog
from mixed_gemm.select import PROFILE_ENV, SCHEDULE_ENV, Profile, choose_config, gpu_slug
from mixed_gemm.select import choose as C
from mixed_gemm.select import profiles as P

KEY = ("f16", 4, "int", 128, 4096, 4096)


def _entry(m, schedule, **kw):
    e = dict(dtype="f16", bits=4, zero_mode="int", group_size=128, n=4096, k=4096, m=m, schedule=schedule, us=1.0)
    e.update(kw)
    return e


@pytest.mark.parametrize("name,slug", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA GeForce RTX 4090", "geforce_rtx_4090"), ("NVIDIA H200", "h200"), ("Tesla T4", "t4"), ("", "unknown"),
])
def test_gpu_slug(name, slug):
    assert gpu_slug(name) == slug


def test_lookup_takes_the_nearest_bucket_in_log_space():
    p = Profile(entries=[_entry(1, "a"), _entry(16, "b"), _entry(256, "c"), _entry(4096, "d")])
    got = {m: p.lookup(KEY, m) for m in (1, 2, 4, 8, 32, 64, 128, 512, 1024, 2048, 8192)}
    assert got == {1: "a", 2: "a", 4: "b", 8: "b", 32: "b", 64: "c", 128: "c", 512: "c", 1024: "d", 2048: "d",
                   8192: "d"}  # 4, 64, 1024: ties (equal octaves each side): the larger bucket wins
    assert p.lookup(("f16", 4, "int", 64, 4096, 4096), 16) is None  # another group size: no entry


def test_add_replaces_merge_and_round_trip(tmp_path):
    p = Profile({"name": "NVIDIA H100 80GB HBM3"}, {"nvcc": "13.0"}, [_entry(1, "a"), _entry(16, "b")])
    p.add(_entry(16, "b2"))
    other = Profile(entries=[_entry(16, "b3"), _entry(64, "c")])
    p.merge(other)
    assert [(e["m"], e["schedule"]) for e in p.entries] == [(1, "a"), (16, "b3"), (64, "c")]
    p.save(tmp_path / "x.json")
    q = Profile.load(tmp_path / "x.json")
    assert q.entries == p.entries and q.gpu == p.gpu and q.versions == p.versions
    assert q.has(KEY, 64) and not q.has(KEY, 32)


def test_load_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read it as JSON"):
        Profile.load(bad)
    bad.write_text(json.dumps({"format": 99, "entries": []}))
    with pytest.raises(ValueError, match="format 1"):
        Profile.load(bad)


def test_profile_env_must_exist(monkeypatch, tmp_path):
    monkeypatch.setenv(PROFILE_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(FileNotFoundError, match=PROFILE_ENV):
        P.find_profile("NVIDIA H100 80GB HBM3")


def test_find_profile_prefers_user_then_shipped(monkeypatch, tmp_path):
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    monkeypatch.setenv("MIXED_GEMM_CACHE_DIR", str(tmp_path))
    shipped = P.find_profile("NVIDIA H100 80GB HBM3")
    assert shipped is not None and shipped.name == "h100.json"
    Profile(entries=[_entry(1, "a")]).save(tmp_path / "profiles" / "h100.json")
    assert P.find_profile("NVIDIA H100 80GB HBM3") == tmp_path / "profiles" / "h100.json"
    assert P.find_profile("Imaginary GPU 9000") is None


def test_shipped_profiles_parse_and_name_catalog_kernels():
    from mixed_gemm._paths import profiles_dir

    compiled = {c.kernel_name for c in default_catalog()}
    files = sorted(profiles_dir().glob("*.json"))
    assert files, "no shipped profile"
    for path in files:
        prof = Profile.load(path)
        assert prof.gpu.get("name") and prof.gpu.get("compute_capability")
        for e in prof.entries:
            c = KernelConfig.from_schedule(e["schedule"], dtype=e["dtype"], bits=e["bits"], zero_mode=e["zero_mode"])
            assert c.method == "dequant_mm" or c.kernel_name in compiled, (path.name, e)


def test_choose_order(monkeypatch):
    prof = Profile(entries=[_entry(16, "t32x64x128_w1x1x4_s4_kfused2")])
    monkeypatch.setattr(C, "device_profile", lambda device_index: prof)
    monkeypatch.delenv(SCHEDULE_ENV, raising=False)
    kw = dict(n=4096, k=4096, bits=4, zero_mode="int", dtype="f16", group_size=128, device_index=0)
    assert choose_config(8, **kw).schedule == "t32x64x128_w1x1x4_s4_kfused2"           # profile
    assert choose_config(8, **dict(kw, n=8192)).schedule.startswith("t16x64x128")      # heuristics
    monkeypatch.setenv(SCHEDULE_ENV, "dequant_mm")
    assert choose_config(8, **kw).method == "dequant_mm"                                # override
    monkeypatch.setenv(SCHEDULE_ENV, "t1x2")
    with pytest.raises(ValueError, match=SCHEDULE_ENV):
        choose_config(8, **kw)


@pytest.mark.parametrize("schedule", ["t16x64x128_w1x1x4_s4", "t128x256x64_w2x4x1_s3_kfused4_sw8",
                                      "t64x128x64_w2x2x1_s4_sw2", "t16x64x128_w1x1x4_s6_kparallel3", "dequant_mm"])
def test_schedule_round_trip(schedule):
    c = KernelConfig.from_schedule(schedule, dtype="bf16", bits=8, zero_mode="offset")
    assert c.schedule == schedule and c.name.endswith(schedule) and c.dtype == "bf16"
    assert KernelConfig.from_schedule(c.schedule, dtype="bf16", bits=8, zero_mode="offset") == c


def test_dequant_mm_takes_no_tile():
    with pytest.raises(ValueError, match="dequant_mm takes no tile"):
        KernelConfig(method="dequant_mm", tile=(16, 64, 128), warps=(1, 1, 4))
    with pytest.raises(ValueError, match="split_k_mode must be one of"):
        KernelConfig(split_k_mode="atomic", split_k=2)
