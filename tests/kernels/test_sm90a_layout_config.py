"""The sm90a family on the CPU: its config and schedule strings, the weight layout (pack/unpack,
the drawing's offset formula, the additive zeros), and its heuristic and candidates."""
import pytest
import torch

from mixed_gemm.kernels import Problem
from mixed_gemm.kernels.sm90a import FAMILY, Sm90aConfig, layout
from mixed_gemm.kernels.sm90a.candidates import candidate_schedules
from mixed_gemm.kernels.sm90a.catalog import default_catalog


@pytest.mark.parametrize("schedule", ["t128x64x128_coop_c1x1_s0_dp", "t128x64x128_coop_c1x1_s0_split4",
                                      "t64x128x64_pp_c1x1_s0", "t128x128x64_coop_c2x1_s6_sk"])
def test_schedule_round_trip_and_compiled_identity(schedule):
    c = Sm90aConfig.from_schedule(schedule, dtype="bf16", bits=8, zero_mode="offset")
    assert c.schedule == schedule and c.name.endswith(schedule)
    assert c.kernel.zero_mode == "int" and c.kernel.splits == 1  # one binary for every zero mode and split
    assert c.kernel_name == c.kernel.kernel_name and "_z" not in c.kernel_name
    assert c.kernel_name.endswith("_sk") == (c.kind == "coop")


@pytest.mark.parametrize("bad,rule", [
    (dict(tile=(64, 64, 128), kind="coop"), "M >= 128"),
    (dict(tile=(128, 64, 32)), "tile K must be 64 or 128"),
    (dict(tile=(96, 64, 64), kind="pp"), "tile M"),
    (dict(tile=(128, 12, 64)), "multiple of 8"),
    (dict(kind="pp", tile=(64, 64, 64), decomposition="sk"), "cooperative"),
    (dict(decomposition="split", splits=1), "splits > 1"),
    (dict(cluster=(2, 2)), "cluster"),
])
def test_config_rules(bad, rule):
    with pytest.raises(ValueError, match=rule):
        Sm90aConfig(**bad)
    with pytest.raises(ValueError, match="not an sm90a schedule"):
        Sm90aConfig.from_schedule("t16x64x128_w1x1x4_s4")


@pytest.mark.parametrize("bits", [4, 8])
def test_layout_pack_unpack_and_offsets(bits):
    gen = torch.Generator().manual_seed(bits)
    n, k = 40, 56  # both ragged vs the 16 x 16 atom
    q = torch.randint(0, 2**bits, (n, k), generator=gen, dtype=torch.uint8)
    b = layout.pack_b(q, bits)
    assert tuple(b.shape) == layout.shapes(n, k, bits, 1)[0] == (4, 3, 8 * bits)
    assert torch.equal(layout.unpack_b(b, bits, n, k), q)
    flat = b.view(torch.uint8).reshape(-1)
    if bits == 4:
        flat = torch.stack((flat & 15, flat >> 4), 1).reshape(-1)  # low nibble first
    nn, kk = torch.arange(n).repeat_interleave(k), torch.arange(k).repeat(n)
    stored = flat[layout.element_offset(nn, kk, 48, bits)]
    assert torch.equal(stored, (q ^ (1 << (bits - 1))).reshape(-1))  # signed codes at the drawing's offsets
    # lane 4 n0 + k1 of a warp owns 8 values (one 32-bit word for int4) of one atom
    off = layout.element_offset(torch.tensor([0, 0, 1, 8]), torch.tensor([0, 2, 0, 1]), 48, bits)
    assert off.tolist() == [0, 8, 32, 5 if bits == 4 else 3]


def test_additive_zeros_fold_every_mode():
    s = torch.tensor([[0.5], [2.0]])
    z = torch.tensor([[3.0], [8.0]])
    assert torch.equal(layout.additive_zeros(s, z, 4, "int"), torch.tensor([[2.5], [0.0]]))
    assert torch.equal(layout.additive_zeros(s, None, 4, "sym"), torch.zeros(2, 1))
    assert torch.equal(layout.additive_zeros(s, z, 8, "offset"), torch.tensor([[67.0], [264.0]]))
    # w = q' s + z' with q' = q - 8 equals (q - z) s
    q = torch.arange(16.0)
    assert torch.allclose((q - 8) * 0.5 + 2.5, (q - 3) * 0.5)


def _problem(m, g=128, n=4096, k=4096):
    return Problem(m=m, n=n, k=k, dtype="f16", bits=4, zero_mode="int", group_size=g, layout="sm80+sm90a")


def test_heuristic_and_candidates():
    assert FAMILY.heuristic(_problem(8), 132) is None  # decode up to 8 tokens: gemv
    thin = FAMILY.heuristic(_problem(16), 132)  # 32 tiles of 128 rows: split 4 ways over K
    assert thin.tile == (128, 32, 128) and thin.decomposition == "split" and thin.splits == 4
    c = FAMILY.heuristic(_problem(64), 132)
    assert c.tile == (128, 64, 128) and c.decomposition == "split" and FAMILY.can_implement(c, _problem(64))[0]
    assert FAMILY.heuristic(_problem(64, g=64), 132).tile[2] == 64
    assert FAMILY.heuristic(_problem(128, g=32), 132) is None
    big = FAMILY.heuristic(_problem(4096), 132)
    assert big.tile == (128, 256, 64) and big.decomposition == "dp" and big.cluster == (2, 1)
    int8 = FAMILY.heuristic(Problem(**dict(_problem(4096).__dict__, bits=8)), 132)
    assert int8.cluster == (1, 1) and int8.bits == 8  # clusters are compiled for int4 only
    from mixed_gemm.kernels.sm90a.catalog import default_catalog as cat
    compiled = {c.kernel_name for c in cat()}
    for m in (9, 16, 32, 33, 64, 100, 128, 200, 256, 1000, 5000):
        for bits in (4, 8):
            for g in (64, 128, 4096):
                p = Problem(**dict(_problem(m, g=g).__dict__, bits=bits))
                c = FAMILY.heuristic(p, 132)
                assert c.kernel.kernel_name in compiled and FAMILY.can_implement(c, p)[0], (m, bits, g)
    compiled = {c.kernel_name for c in default_catalog()}
    for m in (64, 256, 4096):
        for bits in (4, 8):
            cands = candidate_schedules(m, 4096, 4096, 128, 132, bits)
            configs = [Sm90aConfig.from_schedule(s, bits=bits) for s in cands]
            assert configs and all(c.kernel.kernel_name in compiled for c in configs)  # catalog kernels only
            assert all(c.cluster == (1, 1) for c in configs) or bits == 4
    assert all("x128_" not in s.split("_")[0][-4:] for s in candidate_schedules(64, 4096, 4096, 64, 132))
    assert candidate_schedules(8, 4096, 4096, 128, 132) == []  # gemv only below 16 tokens
    at16 = candidate_schedules(16, 4096, 4096, 128, 132)  # only the 32-token tiles (128 and 64 weight rows)
    assert at16 and all(s.split("_")[0].split("x")[1] == "32" for s in at16)
    assert any(s.startswith("t64x32x128_pp") for s in at16) and any(s.startswith("t128x32x128_") for s in at16)
