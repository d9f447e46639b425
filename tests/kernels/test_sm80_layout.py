"""The kernel weight layout: exact round trips, and an emulation of what the GPU does with it.

The emulation is written from the hardware's side: ldmatrix.x4 with lane t pointing at
chunk + 16 t gives lane t, as register i, the word at byte 128 i + 4 t; the converters in
dequant.cuh turn an int4 word into half2 pairs (nibble 0, 4) (1, 5) (2, 6) (3, 7) and an int8 word
into (byte 0, 2) (1, 3); mma.sync.m16n8k16 wants in lane t, for column n = t // 4 of an n8 tile,
rows (k0, k0 + 1) in b0 and (k0 + 8, k0 + 9) in b1 with k0 = 2 (t % 4).
"""
import pytest
import torch

from mixed_gemm.kernels.sm80 import layout as kl


def _rand_q(n, k, bits, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2**bits, (n, k), generator=g, dtype=torch.uint8)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n,k", [(64, 16), (128, 64), (200, 72), (8, 8), (576, 1536)])
def test_b_round_trip(bits, n, k):
    q = _rand_q(n, k, bits, seed=n * 1000 + k + bits)
    b = kl.pack_b(q, bits)
    assert b.dtype == torch.int32
    assert b.shape == ((n + 63) // 64, (k + 15) // 16, 128 * bits // 4)
    assert torch.equal(kl.unpack_b(b, bits, n, k), q)


def _fragments_seen_by_gpu(b: torch.Tensor, bits: int):
    """Yield (na, ka, tile, lane, reg, (lo, hi)) for every half2 of every B fragment, emulating
    ldmatrix + the converters on the raw atom bytes."""
    raw = b.contiguous().view(torch.uint8).view(b.shape[0], b.shape[1], -1)
    words_u32 = raw.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    for na in range(b.shape[0]):
        for ka in range(b.shape[1]):
            atom = words_u32[na, ka]
            for c in range(bits // 4):
                for lane in range(32):
                    for i in range(4):
                        w = int(atom[(c * 512 + 128 * i + 4 * lane) // 4])
                        if bits == 4:
                            nib = [(w >> (4 * p)) & 0xF for p in range(8)]
                            yield na, ka, 2 * i, lane, 0, (nib[0], nib[4])
                            yield na, ka, 2 * i, lane, 1, (nib[1], nib[5])
                            yield na, ka, 2 * i + 1, lane, 0, (nib[2], nib[6])
                            yield na, ka, 2 * i + 1, lane, 1, (nib[3], nib[7])
                        else:
                            byt = [(w >> (8 * p)) & 0xFF for p in range(4)]
                            yield na, ka, 4 * c + i, lane, 0, (byt[0], byt[2])
                            yield na, ka, 4 * c + i, lane, 1, (byt[1], byt[3])


@pytest.mark.parametrize("bits", [4, 8])
def test_gpu_view_matches_mma_fragments(bits):
    n, k = 128, 32
    q = _rand_q(n, k, bits, seed=7 + bits)
    seen = 0
    for na, ka, tile, lane, reg, (lo, hi) in _fragments_seen_by_gpu(kl.pack_b(q, bits), bits):
        col = na * 64 + tile * 8 + lane // 4
        k0 = ka * 16 + 2 * (lane % 4) + 8 * reg
        assert (lo, hi) == (int(q[col, k0]), int(q[col, k0 + 1])), (na, ka, tile, lane, reg)
        seen += 2
    assert seen == n * k  # every element reaches exactly one fragment slot


def test_hand_worked_int4_word():
    # Lane 5 (g = 1, k0 = 2), register 0 of atom (0, 0): tiles 0 and 1, column g = 1 of each.
    q = torch.zeros(64, 16, dtype=torch.uint8)
    expect = {0: (1, 2), 1: (1, 10), 2: (9, 2), 3: (9, 10), 4: (1, 3), 5: (1, 11), 6: (9, 3), 7: (9, 11)}
    for p, (col, kk) in expect.items():
        q[col, kk] = p + 1  # nibble p holds p + 1
    w = int(kl.pack_b(q, 4)[0, 0, 5]) & 0xFFFFFFFF  # word index 128*0/4 + lane = 5
    assert w == 0x87654321


def test_group_params_round_trip_and_transpose():
    n, g = 200, 3
    s = torch.randn(n, g, dtype=torch.float16)
    p = kl.pack_group_params(s)
    assert p.shape == (g, 256)
    # Column 8 j + g of a 64-block sits at 8 g + j.
    assert p[1, 8 * 2 + 5] == s[8 * 5 + 2, 1]
    assert torch.equal(kl.unpack_group_params(p, n), s)
    assert torch.all(kl.unpack_group_params(p, 256)[n:] == 0)  # padded columns are zero


def test_errors():
    with pytest.raises(ValueError, match="bits"):
        kl.pack_b(torch.zeros(64, 16, dtype=torch.uint8), 3)
    with pytest.raises(TypeError, match="q:"):
        kl.pack_b(torch.zeros(64, 16, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="b:"):
        kl.unpack_b(torch.zeros(1, 1, 64, dtype=torch.int32), 4, 64, 32)
