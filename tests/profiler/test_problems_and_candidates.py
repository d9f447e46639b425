"""Problem presets, argument parsing and candidate schedules (CPU)."""
import dataclasses
import pytest

from mixed_gemm.cli.build import catalog
from mixed_gemm.kernels import Problem, base, family_of, parse_schedule
from mixed_gemm.profiler.candidates import candidate_schedules
from mixed_gemm.profiler.problems import DEFAULT_MS, MODELS, parse_ints, parse_shapes, resolve


def test_presets_cover_the_target_models():
    fused = {"llama3-8b", "llama3-70b", "qwen2.5-7b", "mistral-7b"}
    assert set(MODELS) == fused | {f"{m}-unfused" for m in fused} | {"llama3-70b-tp2"}
    # a TP=2 rank: column-parallel q|k|v, gate|up halve N; row-parallel o, down halve K
    for (_, n, k), (_, n2, k2), halved in zip(MODELS["llama3-70b"], MODELS["llama3-70b-tp2"], "nknk"):
        assert (n2, k2) == ((n // 2, k) if halved == "n" else (n, k // 2))
    for m in fused:  # unfused q + 2 k_v = fused qkv; 2 gate/up = fused gate_up
        (q, nq, kq), (kv, nkv, _), (gu, ngu, _) = MODELS[f"{m}-unfused"]
        assert nq + 2 * nkv == MODELS[m][0][1] and 2 * ngu == MODELS[m][2][1] and kq == MODELS[m][0][2]
    assert [(n, k) for _, n, k in MODELS["llama3-70b"]] == [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)]
    assert DEFAULT_MS == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def test_resolve_dedups_and_parses():
    got = resolve("llama3-8b,mistral-7b", "4096:4096,100:200")
    assert [(n, k) for _, n, k in got] == [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (100, 200)]
    assert got[-1][0] == "100x200"
    with pytest.raises(ValueError, match="unknown preset 'gpt5'"):
        resolve("gpt5")
    for bad in ("4096", "4096:x", "0:5", "4096:4096:1"):
        with pytest.raises(ValueError, match="N:K pairs"):
            parse_shapes(bad)
    assert parse_ints("1, 16,64", "--ms") == [1, 16, 64]
    with pytest.raises(ValueError, match="--ms"):
        parse_ints("1,a", "--ms")
    with pytest.raises(ValueError, match="--ms"):
        parse_ints("0", "--ms")


def _problem(m, n, k):
    return Problem(m=m, n=n, k=k, dtype="f16", bits=4, zero_mode="int", group_size=128, layout="sm80+sm90a")


@pytest.mark.parametrize("m", [1, 16, 64, 256, 4096])
@pytest.mark.parametrize("n,k", [(4096, 4096), (57344, 8192), (8192, 28672)])
def test_candidates_are_valid_catalog_schedules(m, n, k):
    compiled = {c.kernel_name for _, c in catalog()}
    cands = candidate_schedules(_problem(m, n, k), sms=132)
    assert cands and len(cands) == len(set(cands))
    for s in cands:
        c = parse_schedule(s, dtype="f16", bits=4, zero_mode="int")
        assert c.kernel.kernel_name in compiled and s == f"{c.family}:{c.schedule}"
        assert family_of(c).can_implement(c, _problem(m, n, k)) == (True, "")
        if c.family == "sm80":
            assert c.tile[0] <= max(16, 2 * m)
            assert c.split_k == 1 or -(-k // c.tile[2]) // c.split_k >= 2
    assert ("dequant_mm:dequant_mm" in cands) == (m >= 128)


def test_candidates_split_only_small_grids():
    assert not any("_kfused" in s for s in candidate_schedules(_problem(1, 57344, 8192), sms=132)
                   if s.startswith("sm80:t16x64x128"))  # 896 blocks: no split
    assert any("_kfused" in s for s in candidate_schedules(_problem(1, 4096, 4096), sms=132))
    assert candidate_schedules(_problem(1, 4096, 4096), sms=132, only=["dequant_mm", "t16x64x128_w1x1x4_s4"]) \
        == ["dequant_mm:dequant_mm", "sm80:t16x64x128_w1x1x4_s4"]


def test_candidates_skip_families_the_device_lacks(monkeypatch):
    monkeypatch.setattr(base, "compute_capability", lambda i: (7, 5))
    assert candidate_schedules(_problem(256, 4096, 4096), sms=40, device_index=0) == []
    monkeypatch.setattr(base, "compute_capability", lambda i: (9, 0))
    assert candidate_schedules(_problem(256, 4096, 4096), sms=132, device_index=0) \
        == candidate_schedules(_problem(256, 4096, 4096), sms=132)


def test_tile_families_offer_nothing_for_a_layout_the_weight_lacks():
    one_copy = dataclasses.replace(_problem(16, 4096, 4096), layout="sm90a")
    cands = candidate_schedules(one_copy, sms=132)
    assert {s.split(":")[0] for s in cands} == {"gemv", "sm90s", "sm90a", "sm80"}
    assert all(s.endswith("_sm90a") or "_sm90a_" in s for s in cands if s.startswith("sm80:"))  # the one copy's tiles
    sm80 = dataclasses.replace(_problem(64, 4096, 4096), layout="sm80")
    assert not any(s.startswith(("sm90a:", "sm90s:")) for s in candidate_schedules(sm80, sms=132))


def test_candidates_of_named_families_only():
    problem = dataclasses.replace(_problem(32, 4096, 4096), layout="sm90a")
    every = candidate_schedules(problem, sms=132)
    sm90s = candidate_schedules(problem, sms=132, families=["sm90s"])
    assert sm90s and sm90s == [s for s in every if s.startswith("sm90s:")]
    assert candidate_schedules(problem, sms=132, families=["sm90s", "gemv"]) \
        == [s for s in every if s.split(":")[0] in ("sm90s", "gemv")]
