"""Hand-computed packed words: AWQ field order, GPTQ packing along K, GPTQ minus-one zeros."""
from __future__ import annotations

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.formats import AWQ_ORDER, pack, unpack


def i32(word: int) -> int:
    """An unsigned 32-bit pattern as the int32 value torch stores."""
    return word - (1 << 32) if word >= (1 << 31) else word


def col(values, dtype=torch.uint8):
    return torch.tensor(values, dtype=dtype).reshape(-1, 1)


def test_awq_order_constants():
    assert AWQ_ORDER[4] == (0, 2, 4, 6, 1, 3, 5, 7)
    assert AWQ_ORDER[8] == (0, 1, 2, 3)


def test_awq_int4_nibble_order_by_hand():
    # N = 8 output columns, K = 1: q[n, 0] = n + 1, except column 7 = 15 (top nibble, sign bit).
    q = col([1, 2, 3, 4, 5, 6, 7, 15])
    s = torch.ones(8, 1, dtype=torch.float16)
    z = col([0, 1, 2, 3, 12, 13, 14, 15], torch.float16)
    qweight, scales, qzeros = pack(q, s, z, format="awq", bits=4, group_size=-1)
    # nibble i holds column order[i] = 0, 2, 4, 6, 1, 3, 5, 7 -> values 1, 3, 5, 7, 2, 4, 6, 15
    assert qweight.tolist() == [[i32(0xF6427531)]]
    # zeros 0, 2, 12, 14, 1, 3, 13, 15
    assert qzeros.tolist() == [[i32(0xFD31EC20)]]
    assert scales.shape == (1, 8)
    q2, _, z2 = unpack(qweight, scales, qzeros, format="awq", bits=4, group_size=-1)
    assert torch.equal(q2, q) and torch.equal(z2, z)


def test_awq_int8_plain_order_by_hand():
    q = col([0x12, 0x34, 0x56, 0xF8])
    s = torch.ones(4, 1, dtype=torch.float16)
    z = col([0, 1, 128, 255], torch.float16)
    qweight, _, qzeros = pack(q, s, z, format="awq", bits=8, group_size=-1)
    assert qweight.tolist() == [[i32(0xF8563412)]]
    assert qzeros.tolist() == [[i32(0xFF800100)]]


def test_awq_matches_autoawq_packing_loop(gen):
    """AutoAWQ's WQLinear_GEMM.from_linear loop, transcribed over Python ints."""
    n, k = 16, 3
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    qweight, _, _ = pack(q, torch.ones(n, 1, dtype=torch.float16), None, format="awq", group_size=-1)
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    for kk in range(k):
        for j in range(n // 8):
            word = 0
            for i in range(8):
                word |= int(q[8 * j + order[i], kk]) << (4 * i)
            assert int(qweight[kk, j]) == i32(word)


def test_gptq_qweight_packs_along_k_lsb_first():
    # N = 1 (no zeros, so N need not be a multiple of 8), K = 8: q[0, k] = k + 1, k = 7 -> 8 (sign bit).
    q = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]], dtype=torch.uint8)
    s = torch.ones(1, 1, dtype=torch.float16)
    for fmt in ("gptq", "gptq_v2"):
        qweight, scales, qzeros = pack(q, s, None, format=fmt, bits=4, group_size=-1)
        assert qweight.tolist() == [[i32(0x87654321)]] and qzeros is None
    q8 = torch.tensor([[0x01, 0x80, 0x7F, 0xFF], [0, 0, 0, 1]], dtype=torch.uint8)
    qweight, _, _ = pack(q8, torch.ones(2, 1), None, format="gptq", bits=8, group_size=-1)
    assert qweight.tolist() == [[i32(0xFF7F8001), i32(0x01000000)]]


ZEROS4 = [0, 1, 2, 7, 8, 14, 15, 3]


@pytest.mark.parametrize(
    "fmt, bits, zeros, word",
    [
        # stored = (z - 1) mod 16: 15, 0, 1, 6, 7, 13, 14, 2 (nibble 0 first)
        ("gptq", 4, ZEROS4, 0x2ED7610F),
        ("gptq_v2", 4, ZEROS4, 0x3FE87210),
        # stored = (z - 1) mod 256: 255, 0, 127, 254
        ("gptq", 8, [0, 1, 128, 255], 0xFE7F00FF),
        ("gptq_v2", 8, [0, 1, 128, 255], 0xFF800100),
    ],
)
def test_gptq_zeros_minus_one_by_hand(fmt, bits, zeros, word):
    n = len(zeros)
    q = torch.zeros(n, 32 // bits, dtype=torch.uint8)
    s = torch.ones(n, 1, dtype=torch.bfloat16)
    z = col(zeros, torch.bfloat16)
    _, _, qzeros = pack(q, s, z, format=fmt, bits=bits, group_size=-1)
    assert qzeros.tolist() == [[i32(word)]]
    qweight = torch.zeros(1, n, dtype=torch.int32)
    _, _, z2 = unpack(qweight, s.t(), qzeros, format=fmt, bits=bits, group_size=-1)
    assert torch.equal(z2, z)


def test_gptq_z_zero_does_not_bleed_into_neighbours():
    z = torch.zeros(8, 1, dtype=torch.float16)
    z[3] = 5
    _, _, qzeros = pack(torch.zeros(8, 8, dtype=torch.uint8), torch.ones(8, 1, dtype=torch.float16), z,
                        format="gptq", group_size=-1)
    assert qzeros.tolist() == [[i32(0xFFFF4FFF)]]


def test_gptq_symmetric_checkpoint_zeros_read_as_eight():
    qzeros = torch.full((2, 1), i32(0x77777777), dtype=torch.int32)
    qweight = torch.zeros(16, 8, dtype=torch.int32)
    _, _, z = unpack(qweight, torch.ones(2, 8, dtype=torch.float16), qzeros, format="gptq", group_size=64)
    assert torch.equal(z, torch.full((8, 2), 8.0, dtype=torch.float16))


@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_matches_autogptq_dequant(gen, words, bits):
    """AutoGPTQ's torch dequantizer (shift, mask, zeros + 1 then mask), transcribed."""
    k, n, g = 64, 16, 32
    p, mask = 32 // bits, (1 << bits) - 1
    qweight, qzeros = words(k // p, n), words(k // g, n // p)
    scales = torch.rand(k // g, n, generator=gen, dtype=torch.float32) + 0.5
    wf = torch.arange(0, 32, bits, dtype=torch.int32)
    zeros = (qzeros.unsqueeze(2) >> wf).to(torch.int16)
    zeros = ((zeros + 1) & mask).reshape(k // g, n)
    weight = ((qweight.unsqueeze(1) >> wf.unsqueeze(-1)) & mask).reshape(k, n)
    expected = (weight - zeros.repeat_interleave(g, 0)) * scales.repeat_interleave(g, 0)  # (K, N)
    q, s, z = unpack(qweight, scales, qzeros, format="gptq", bits=bits, group_size=g)
    got = mg.reference.dequantize(q, s, z, group_size=g, bits=bits)
    assert torch.equal(got, expected.t())


def test_awq_matches_autoawq_dequant(gen, words):
    """AutoAWQ's dequantize_gemm (unpack_awq + reverse_awq_order), transcribed."""
    k, n, g = 64, 32, 32
    qweight, qzeros = words(k, n // 8), words(k // g, n // 8)
    scales = torch.rand(k // g, n, generator=gen) + 0.5
    shifts = torch.arange(0, 32, 4)
    iw = (qweight[:, :, None] >> shifts).reshape(k, -1)
    iz = (qzeros[:, :, None] >> shifts).reshape(k // g, -1)
    rev = torch.arange(n).view(-1, 8)[:, [0, 4, 1, 5, 2, 6, 3, 7]].reshape(-1)
    iw, iz = iw[:, rev] & 15, iz[:, rev] & 15
    expected = (iw - iz.repeat_interleave(g, 0)) * scales.repeat_interleave(g, 0)
    q, s, z = unpack(qweight, scales, qzeros, format="awq", group_size=g)
    assert torch.equal(mg.reference.dequantize(q, s, z, group_size=g), expected.t())
