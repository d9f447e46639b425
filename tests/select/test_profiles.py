"""Profiles and the selection order, without a GPU."""
import dataclasses
import json

import pytest

from mixed_gemm.cli.build import catalog
from mixed_gemm.kernels import Problem, base, parse_schedule
from mixed_gemm.select import PROFILE_ENV, SCHEDULE_ENV, Profile, choose, gpu_slug
from mixed_gemm.select import selection as C
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
    a, b, c, d = (1, "sm80:a"), (16, "sm80:b"), (256, "sm80:c"), (4096, "sm80:d")  # bare: sm80 (format 1)
    assert got == {1: a, 2: a, 4: b, 8: b, 32: b, 64: c, 128: c, 512: c, 1024: d, 2048: d,
                   8192: d}  # 4, 64, 1024: ties (equal octaves each side): the larger bucket wins
    assert p.lookup(("f16", 4, "int", 64, 4096, 4096), 16) is None  # another group size: no entry


def test_add_replaces_merge_and_round_trip(tmp_path):
    p = Profile({"name": "NVIDIA H100 80GB HBM3"}, {"nvcc": "13.0"}, [_entry(1, "a"), _entry(16, "b")])
    p.add(_entry(16, "b2"))
    other = Profile(entries=[_entry(16, "b3"), _entry(64, "c")])
    p.merge(other)
    assert [(e["m"], e["schedule"]) for e in p.entries] == [(1, "sm80:a"), (16, "sm80:b3"), (64, "sm80:c")]
    p.save(tmp_path / "x.json")
    q = Profile.load(tmp_path / "x.json")
    assert q.entries == p.entries and q.gpu == p.gpu and q.versions == p.versions
    assert q.has(KEY, 64) and not q.has(KEY, 32)
    assert q.entry(KEY, 64)["schedule"] == "sm80:c" and q.entry(KEY, 32) is None


def test_base_profile_underneath(tmp_path):
    Profile({"name": "NVIDIA H100 80GB HBM3"}, entries=[_entry(1, "a"), _entry(16, "b")]).save(tmp_path / "h100.json")
    top = Profile({"name": "NVIDIA H200"}, entries=[_entry(16, "c")], base="h100.json")
    top.save(tmp_path / "h200.json")
    assert json.loads((tmp_path / "h200.json").read_text())["base"] == "h100.json"
    q = Profile.load(tmp_path / "h200.json")  # own entries over the base's
    assert [(e["m"], e["schedule"]) for e in q.entries] == [(1, "sm80:a"), (16, "sm80:c")]
    own = Profile.load(tmp_path / "h200.json", with_base=False)
    assert [(e["m"], e["schedule"]) for e in own.entries] == [(16, "sm80:c")] and own.base == "h100.json"
    for bad, why in (("../h100.json", "beside it"), ("bad.json", "back to itself")):
        (tmp_path / "bad.json").write_text(json.dumps(dict(top.to_json(), base=bad)))
        with pytest.raises(ValueError, match=why):
            Profile.load(tmp_path / "bad.json")


def test_load_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read it as JSON"):
        Profile.load(bad)
    bad.write_text(json.dumps({"format": 99, "entries": []}))
    with pytest.raises(ValueError, match="format 1 or 2"):
        Profile.load(bad)
    entry = _entry(1, "a")
    del entry["dtype"], entry["m"]
    bad.write_text(json.dumps({"format": 2, "entries": [_entry(2, "b"), entry]}))
    with pytest.raises(ValueError, match=r"bad.json: entry 1 lacks dtype, m \(every entry needs"):
        Profile.load(bad)
    bad.write_text(json.dumps({"format": 2, "entries": [_entry(2, "sm99:t1")]}))
    with pytest.raises(ValueError, match="bad.json: entry 0: family: 'sm99'"):
        Profile.load(bad)
    bad.write_text(json.dumps({"format": 2, "entries": [_entry("many", "b")]}))
    with pytest.raises(ValueError, match="bad.json: entry 0"):
        Profile.load(bad)


def test_format_1_reads_as_sm80_and_saves_as_format_2(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format": 1, "entries": [_entry(1, "t16x64x128_w1x1x4_s4"), _entry(4096, "dequant_mm")]}))
    p = Profile.load(old)
    assert p.lookup(KEY, 1) == (1, "sm80:t16x64x128_w1x1x4_s4")
    assert p.lookup(KEY, 4096) == (4096, "dequant_mm:dequant_mm")
    p.save(tmp_path / "new.json")
    assert json.loads((tmp_path / "new.json").read_text())["format"] == 2


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

    compiled = {c.kernel_name for _, c in catalog()}
    files = sorted(profiles_dir().glob("*.json"))
    assert files, "no shipped profile"
    for path in files:
        prof = Profile.load(path)
        assert prof.gpu.get("name") and prof.gpu.get("compute_capability")
        for e in prof.entries:
            c = parse_schedule(e["schedule"], dtype=e["dtype"], bits=e["bits"], zero_mode=e["zero_mode"])
            assert c.kernel.kernel_name in compiled, (path.name, e)
        # Grouped (MoE) entries too, in both activation dtypes: a layer of another kind borrows them
        # (Profile.lookup_grouped), and a kernel package (JIT off) must hold what they name.
        for e in prof.grouped:
            for dtype in ("f16", "bf16"):
                c = parse_schedule(e["schedule"], dtype=dtype, bits=e["bits"], zero_mode=e["zero_mode"])
                assert c.stage == e["stage"] and c.kernel.kernel_name in compiled, (path.name, e)


def _problem(m, **kw):
    base_ = dict(m=m, n=4096, k=4096, dtype="f16", bits=4, zero_mode="int", group_size=128, layout="sm80")
    return Problem(**dict(base_, **kw))


@pytest.fixture
def h100(monkeypatch):
    """Selection as on an H100 (compute capability 9.0), with no profile unless a test sets one."""
    monkeypatch.setattr(base, "compute_capability", lambda i: (9, 0))
    monkeypatch.setattr(C, "device_profile", lambda device_index: None)
    monkeypatch.delenv(SCHEDULE_ENV, raising=False)


def test_choose_order(h100, monkeypatch):
    prof = Profile(entries=[_entry(16, "sm80:t32x64x128_w1x1x4_s4_kfused2")], path=None)
    monkeypatch.setattr(C, "device_profile", lambda device_index: prof)
    got = choose(_problem(8), 0)
    assert (got.family.name, got.schedule, got.source) == ("sm80", "sm80:t32x64x128_w1x1x4_s4_kfused2",
                                                           "profile profile M=16")
    got = choose(_problem(8, n=8192), 0)                                  # no entry: the nearest shape's
    assert (got.schedule, got.source) == ("sm80:t32x64x128_w1x1x4_s4_kfused2", "profile profile M=16 of 4096x4096")
    got = choose(_problem(8, bits=8), 0)                                    # no entry of this width: heuristics
    assert got.schedule.startswith("sm80:t16x64x128") and got.source == "heuristic"
    got = choose(_problem(8, dtype="bf16"), 0)                             # bf16 borrows the f16 entry
    assert (got.schedule, got.config.dtype) == ("sm80:t32x64x128_w1x1x4_s4_kfused2", "bf16")
    assert choose(_problem(4096, bits=8), 0).schedule == "dequant_mm:dequant_mm"  # sm80 passes on big M
    monkeypatch.setenv(SCHEDULE_ENV, "dequant_mm")
    got = choose(_problem(8), 0)
    assert (got.family.name, got.source) == ("dequant_mm", "override")
    monkeypatch.setenv(SCHEDULE_ENV, "sm80:t16x64x128_w1x1x4_s4_kfused4")
    assert choose(_problem(8), 0).config.split_k == 4
    monkeypatch.setenv(SCHEDULE_ENV, "t1x2")
    with pytest.raises(ValueError, match=SCHEDULE_ENV):
        choose(_problem(8), 0)


def test_override_that_cannot_run_raises(h100, monkeypatch):
    monkeypatch.setenv(SCHEDULE_ENV, "sm80:t16x64x128_w1x1x4_s4_sw8")
    with pytest.raises(ValueError, match=r"MIXED_GEMM_SCHEDULE=.*sm80 cannot run this problem: .*layout"):
        choose(_problem(8, layout="other"), 0)


def test_profile_entry_that_cannot_run_falls_back_with_reason(h100, monkeypatch):
    prof = Profile(entries=[_entry(16, "sm80:t16x64x128_w1x1x4_s4")])
    monkeypatch.setattr(C, "device_profile", lambda device_index: prof)
    monkeypatch.setattr(base, "compute_capability", lambda i: (7, 5))  # no family runs on a T4 here
    with pytest.raises(ValueError) as info:
        choose(_problem(16), 0)
    msg = str(info.value)
    assert msg.startswith("no kernel family can run M=16 N=4096 K=4096 f16/4-bit/int group 128")
    # one reason per family, and the profile entry's
    assert "profile profile M=16 entry sm80:t16x64x128_w1x1x4_s4" in msg
    assert "sm80: needs compute capability 8.0" in msg and "dequant_mm: needs compute capability 8.0" in msg


def test_no_family_reads_the_layout(h100):
    with pytest.raises(ValueError, match="sm80: reads the 'sm80' \\(4/8 bits\\) or 'sm90a' \\(4/8 bits\\) or 'lowbit'.*dequant_mm: reads the 'sm80'"):
        choose(_problem(16, layout="other"), 0)


def test_nearest_profiled_shape_for_an_unprofiled_one(h100, monkeypatch):
    prof = Profile(entries=[_entry(16, "sm80:t16x64x128_w1x1x4_s4_kfused4"),
                            _entry(16, "sm80:t16x128x128_w1x2x2_s4", n=28672, k=4096),
                            _entry(16, "sm80:t16x128x128_w1x1x4_s4_kfused8", n=8192, k=28672)], path=None)
    monkeypatch.setattr(C, "device_profile", lambda device_index: prof)
    assert prof.nearest_shape(("f16", 4, "int", 128, 14336, 4096))[4:] == (28672, 4096)
    assert prof.nearest_shape(("f16", 4, "int", 128, 1024, 4096))[4:] == (4096, 4096)
    assert prof.nearest_shape(("f16", 8, "int", 128, 1024, 4096)) is None  # another bit width: never
    # Another dtype / zero mode / group size: the nearest of the same bit width, shape first.
    assert prof.nearest_shape(("bf16", 4, "sym", 64, 28672, 4096))[4:] == (28672, 4096)
    got = choose(_problem(16, n=14336), 0)
    assert (got.schedule, got.source) == ("sm80:t16x128x128_w1x2x2_s4", "profile profile M=16 of 28672x4096")
    exact = choose(_problem(16), 0)
    assert exact.source == "profile profile M=16"  # its own entry first


def test_borrowed_entry_is_refitted_to_the_shape(h100, monkeypatch):
    prof = Profile(entries=[_entry(256, "sm80:t128x256x64_w2x4x1_s3_kparallel4", n=4096, k=14336)], path=None)
    monkeypatch.setattr(C, "device_profile", lambda device_index: prof)
    own = choose(_problem(256, n=4096, k=14336), 0)
    assert own.schedule == "sm80:t128x256x64_w2x4x1_s3_kparallel4"  # measured: used as is
    borrowed = choose(_problem(256, n=5120, k=13824), 0)
    assert (borrowed.schedule, borrowed.source) == ("sm80:t128x256x64_w2x4x1_s3_kparallel3",
                                                    "profile profile M=256 of 4096x14336")


def test_borrowed_decode_split_keeps_the_measured_cta_count(h100, monkeypatch):
    """Held-out sweep (docs/notes/selection.md): a gemv entry split 8 on 4096 rows (256 CTAs)
    serves 5120 rows in 6 slices (240), not 8 (320: 22.1 vs 16.9 µs); the sm80 thin tile keeps its
    factor there (the same move made it slower)."""
    prof = Profile(entries=[_entry(1, "gemv:m8_s2_w4x2_u8_ds_split8", n=4096, k=14336),
                            _entry(16, "sm80:t16x64x128_w1x1x8_s4_sm90a_kfused6", n=4096, k=14336)], path=None)
    monkeypatch.setattr(C, "device_profile", lambda device_index: prof)
    got = choose(_problem(1, n=5120, k=13824, layout="sm90a"), 0)
    assert (got.schedule, got.source) == ("gemv:m8_s2_w4x2_u8_ds_split6", "profile profile M=1 of 4096x14336")
    assert choose(_problem(1, n=4096, k=14336, layout="sm90a"), 0).schedule == "gemv:m8_s2_w4x2_u8_ds_split8"
    got = choose(_problem(16, n=5120, k=13824, layout="sm90a"), 0)
    assert got.schedule == "sm80:t16x64x128_w1x1x8_s4_sm90a_kfused6"


def test_an_entry_at_this_m_beats_this_shapes_entry_at_another_m(h100, monkeypatch):
    """A profile extended at large M for some shapes serves the others there: at M=256 the nearest
    shape measured at 256 wins over this shape's own M=16 entry (the best family changes with M)."""
    prof = Profile(entries=[_entry(16, "sm80:t16x64x128_w1x1x4_s4_kfused4"),
                            _entry(256, "sm90a:t128x128x128_coop_c2x1_s0_dp", n=8192, k=4096)], path=None)
    monkeypatch.setattr(C, "device_profile", lambda device_index: prof)
    p = _problem(256, layout="sm80+sm90a")
    got = choose(p, 0)
    assert (got.schedule, got.source) == ("sm90a:t128x128x128_coop_c2x1_s0_dp", "profile profile M=256 of 8192x4096")
    got = choose(_problem(16, layout="sm80+sm90a"), 0)  # its own bucket: its own entry
    assert (got.schedule, got.source) == ("sm80:t16x64x128_w1x1x4_s4_kfused4", "profile profile M=16")
    got = choose(_problem(64, layout="sm80+sm90a"), 0)  # nobody measured 64: this shape's nearest bucket
    assert got.source == "profile profile M=16"


def test_no_entry_serves_an_m_far_from_its_bucket(h100, monkeypatch):
    """Entries measured at M <= 32 (a decode sweep) do not pick the kernel of M=300: the heuristics do."""
    prof = Profile(entries=[_entry(32, "sm80:t32x64x128_w1x1x4_s4_kparallel4")], path=None)
    monkeypatch.setattr(C, "device_profile", lambda device_index: prof)
    assert choose(_problem(128), 0).source == "profile profile M=32"  # two octaves: still borrowed
    assert choose(_problem(300), 0).source == "heuristic"


def test_one_copy_weight_reads_a_dequant_mm_entry_from_its_copy_and_skips_sm80_tiles(h100, monkeypatch):
    """A profile measured on two copies names dequant_mm (sm80 copy) and sm80 tiles; the H100's one
    (sm90a) copy runs the same dequant_mm entry through its sm90a dequantize kernel, and an sm80
    tile entry it cannot read falls through to the heuristics (sm90a from 9 tokens, gemv below):
    measured on the other copy, it says nothing about the sm80 family's ``_sm90a`` tiles."""
    prof = Profile(entries=[_entry(4096, "dequant_mm:dequant_mm"), _entry(16, "sm80:t16x64x128_w1x1x4_s4_kfused4"),
                            _entry(4, "sm80:t16x64x128_w1x1x4_s4_kfused4")], path=None)
    monkeypatch.setattr(C, "device_profile", lambda device_index: prof)
    got = choose(_problem(4096, layout="sm90a"), 0)
    assert (got.schedule, got.source, got.config.layout) == ("dequant_mm:dequant_mm_sm90a", "profile profile M=4096", "sm90a")
    assert choose(_problem(16, layout="sm90a"), 0).schedule.startswith("sm90a:t128x32x128_coop")
    assert choose(_problem(4, layout="sm90a"), 0).family.name == "gemv"


@pytest.mark.parametrize("cc", [(9, 0), (8, 9)])
def test_low_bit_weights_select_gemv_then_sm80_then_dequant_mm_on_every_gpu(monkeypatch, cc):
    """The lowbit layout: the sm90a family (4/8 bits, its own layout) passes with a reason, gemv takes
    up to 8 tokens (1:2-sparse: 32), the sm80 family's _lowbit tiles 9-32, dequantize + cuBLAS the rest; a profile of
    int4 entries (on the sm80 layout) is not borrowed."""
    monkeypatch.setattr(base, "compute_capability", lambda i: cc)
    monkeypatch.setattr(C, "device_profile", lambda device_index: Profile(entries=[_entry(16, "sm80:t16x64x128_w1x1x4_s4")],
                                                                          path=None))
    monkeypatch.delenv(SCHEDULE_ENV, raising=False)
    for bits in (1, 2, 3, 7):
        for m in (1, 3, 16, 32, 33, 300):
            got = choose(_problem(m, bits=bits, group_size=64, layout="lowbit"), 0)
            want = "gemv" if m <= (32 if bits == 7 else 8) else "sm80" if m <= 32 else "dequant_mm"
            assert (got.family.name, got.source) == (want, "heuristic")
            assert got.config.layout == "lowbit"


def _grouped(tokens, schedule, stage="w13", n=28672, k=4096):
    return dict(dtype="f16", bits=4, zero_mode="int", group_size=128, experts=8, top_k=2, n=n, k=k, stage=stage,
                tokens=tokens, schedule=schedule, us=1.0)


def test_grouped_entries_round_trip_lookup_and_serve_the_plan(tmp_path):
    from mixed_gemm.kernels import MoeProblem, family
    from mixed_gemm.ops.moe_grouped import _profiled

    p = Profile({"name": "NVIDIA H100 80GB HBM3"}, entries=[_entry(1, "a")])
    p.add_grouped(_grouped(1, "moe_gemv:w13_s2_w4x1_u8_split2"))
    p.add_grouped(_grouped(16, "moe_gemv:w13_s1_w4x2_u8_m16_xe"))
    p.save(tmp_path / "h100.json")
    q = Profile.load(tmp_path / "h100.json")
    assert q.grouped == p.grouped and len(q.entries) == 1
    problem = MoeProblem(tokens=4, top_k=2, experts=8, n=28672, k=4096, dtype="f16", bits=4, zero_mode="int",
                         group_size=128, layout="sm90a", stage="w13")
    assert q.lookup_grouped(problem) == (16, "moe_gemv:w13_s1_w4x2_u8_m16_xe")  # log2 tie: the larger bucket
    assert q.lookup_grouped(dataclasses.replace(problem, tokens=2)) == (1, "moe_gemv:w13_s2_w4x1_u8_split2")
    assert q.lookup_grouped(dataclasses.replace(problem, experts=64)) is None  # another model: none
    # A weight kind nobody measured for this layer borrows the nearest measured kind of its width:
    # bf16 activations, GPTQ's symmetric or HQQ's float zeros, another group size; never another width.
    for kind in (dict(dtype="bf16"), dict(zero_mode="sym"), dict(zero_mode="float", group_size=64),
                 dict(dtype="bf16", zero_mode="offset", group_size=-1)):
        assert q.lookup_grouped(dataclasses.replace(problem, **kind)) == (16, "moe_gemv:w13_s1_w4x2_u8_m16_xe")
    assert q.lookup_grouped(dataclasses.replace(problem, bits=8)) is None
    r = Profile.load(tmp_path / "h100.json")
    r.add_grouped(dict(_grouped(16, "moe_gemv:w13_s2_w4x1_u8"), dtype="bf16"))
    assert r.lookup_grouped(dataclasses.replace(problem, dtype="bf16")) == (16, "moe_gemv:w13_s2_w4x1_u8")  # its own
    assert r.lookup_grouped(dataclasses.replace(problem, dtype="bf16", zero_mode="sym")) == (16, "moe_gemv:w13_s2_w4x1_u8")
    assert r.lookup_grouped(problem) == (16, "moe_gemv:w13_s1_w4x2_u8_m16_xe")
    # A kind measured at one token count only (a bf16 sweep at one token) serves the calls near it;
    # farther off the nearer measured kind does (a dtype counts as half a doubling of tokens).
    b = Profile.load(tmp_path / "h100.json")
    b.add_grouped(dict(_grouped(1, "moe_gemv:w13_s1_w2x4_u8_ds"), dtype="bf16"))
    bf16 = dataclasses.replace(problem, dtype="bf16")
    assert b.lookup_grouped(dataclasses.replace(bf16, tokens=1)) == (1, "moe_gemv:w13_s1_w2x4_u8_ds")
    assert b.lookup_grouped(dataclasses.replace(bf16, tokens=2)) == (1, "moe_gemv:w13_s1_w2x4_u8_ds")
    b.add_grouped(_grouped(2, "moe_gemv:w13_s1_w4x2_u8_ds"))  # fp16 measured at the call's own count
    assert b.lookup_grouped(dataclasses.replace(bf16, tokens=2)) == (2, "moe_gemv:w13_s1_w4x2_u8_ds")
    assert b.lookup_grouped(dataclasses.replace(bf16, tokens=16)) == (16, "moe_gemv:w13_s1_w4x2_u8_m16_xe")
    assert b.lookup_grouped(dataclasses.replace(problem, tokens=1)) == (1, "moe_gemv:w13_s2_w4x1_u8_split2")
    fam = family("moe_gemv")
    assert _profiled(fam, dataclasses.replace(problem, tokens=16), q).schedule == "w13_s1_w4x2_u8_m16_xe"
    assert _profiled(fam, dataclasses.replace(problem, tokens=32), q).schedule == "w13_s1_w4x2_u8_m16_xe"
    # Farther than a factor of two from every measured count (a decode-only sweep asked about a
    # batch or a prompt): the family's heuristic decides, not the nearest decode schedule.
    assert _profiled(fam, dataclasses.replace(problem, tokens=64), q) is None
    assert _profiled(fam, dataclasses.replace(problem, tokens=4), q) is None  # 1 and 16: two doublings off
    assert _profiled(fam, dataclasses.replace(problem, stage="w2", n=4096, k=14336), q) is None
    # a base's grouped entries load underneath, and a grouped entry must name every field
    Profile({"name": "NVIDIA H200"}, base="h100.json").save(tmp_path / "h200.json")
    assert Profile.load(tmp_path / "h200.json").grouped == q.grouped
    bad = dict(q.to_json(), grouped=[{"dtype": "f16"}])
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="grouped entry 0 lacks bits"):
        Profile.load(tmp_path / "bad.json")
