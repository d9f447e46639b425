"""The lowbit layout (1-3-bit planes, 1:2-sparse 7-bit bytes): exact inverses, the docstring's bit
positions, and a Python mirror of the converters in templates/atoms/lowbit.cuh (the shifts and masks
the kernel applies to a lane's words, per dtype's mantissa window) giving every lane's A-fragment
values q' = q - 2**(bits-1); for 1:2-sparse, a mirror of the compressed fragments and metadata words
the kernel hands mma.sp.m16n8k32, decompressed by the PTX ISA's rules (section 9.7.14.6)."""
import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import LAYOUTS
from mixed_gemm.kernels.gemv import lowbit_layout as L

SHAPES = ((16, 64), (37, 200), (96, 256))


def _field3(w, p: int, half: int, mantissa: int) -> int:
    """Field3Atoms::convert for pair p, register half ``half``: the code as the lop3 leaves it under
    the magic's exponent (bits e .. e+2 of the half, read after the word's window shift), over 2**e."""
    spare = 6 if mantissa == 10 else 3

    def last_shift(c):
        return L.FIELD3_SPARE_BIT - spare - c

    def field(word, shift, e, width):
        assert 0 <= e and e + width <= mantissa  # inside the mantissa: the half is exactly magic + q 2**e
        return ((word >> shift) >> (e + 16 * half)) & ((1 << width) - 1)

    if p < 3 * L.FIELD3_PER_WORD:
        c, j = divmod(p, L.FIELD3_PER_WORD)
        shift = (0 if j <= 2 else last_shift(c)) if mantissa == 10 else (0 if j <= 1 else 6 if j <= 3 else last_shift(c))
        return field(w[c], shift, 3 * j - shift, 3)
    return sum(field(w[c], last_shift(c), spare + c, 1) << c for c in range(3))


def _fragments(b: torch.Tensor, bits: int, n_pad: int, kp: int, mantissa: int = 10) -> torch.Tensor:
    """What PlaneAtoms / Field3Atoms::convert leave in each lane's registers, placed back at (n, k): q'."""
    out = torch.zeros(n_pad, kp, dtype=torch.int64)
    words = b.to(torch.int64) & 0xFFFFFFFF
    for blk in range(b.shape[0]):
        for nb in range(b.shape[1]):
            for lane in range(32):
                g, t = lane // 4, lane % 4
                w = words[blk, nb, :, lane].tolist()
                for u in range(4):
                    for r in range(4):
                        p = 4 * u + r
                        for e in range(2):  # the register's halves: k0 = 0 (low), 1 (high)
                            if bits == 3:
                                v = _field3(w, p, e, mantissa) - 4
                            else:
                                field = (w[p // 8] >> (2 * (p % 8) + 16 * e)) & 3 if bits == 2 else (w[0] >> (p + 16 * e)) & 1
                                v = field - (1 << (bits - 1))
                            n = 16 * nb + g + 8 * (r & 1)
                            k = 16 * (blk * 4 + u) + 8 * (r >> 1) + 2 * t + e
                            out[n, k] = v
    return out


def _sparse_mma(b: torch.Tensor, n_pad: int, kp: int) -> torch.Tensor:
    """The dense A that WeightAtoms<7>'s fragments and metadata word stand for, placed at (n, k): per
    block and half h, lanes t with t >> 1 == h supply the metadata (rows g: bits 0-15, g + 8: 16-31,
    k 16 (t & 1) .. + 15; nibble = index of the first kept element | the second's << 2), and the
    compressed A register n1 + 2 i of lane 4 g + t holds chunk t + 4 i of row g + 8 n1."""
    out = torch.zeros(n_pad, kp, dtype=torch.int64)
    words = b.to(torch.int64) & 0xFFFFFFFF
    for blk in range(b.shape[0]):
        for nb in range(b.shape[1]):
            w = words[blk, nb]  # (4, 32)
            meta = [0x88888888 | (w[0, l] >> 7) & 0x01010101 | (w[1, l] >> 5) & 0x04040404
                    | (w[2, l] >> 3) & 0x10101010 | (w[3, l] >> 1) & 0x40404040 for l in range(32)]
            for h in range(2):
                for g in range(8):
                    for n1 in range(2):
                        for chunk in range(8):
                            supplier = 4 * g + 2 * h + chunk // 4
                            nibble = (int(meta[supplier]) >> (16 * n1 + 4 * (chunk % 4))) & 0xF
                            assert nibble in (0x4, 0x8, 0x9, 0xC, 0xD, 0xE)  # mma.sp::ordered_metadata's
                            t, i = chunk % 4, chunk // 4
                            word = int(w[2 * h + i, 4 * g + t])
                            for j in range(2):
                                code = (word >> (8 * (2 * n1 + j))) & 0x7F  # the & 0x7f7f7f7f, then the prmt
                                k = 64 * blk + 32 * h + 4 * chunk + ((nibble >> (2 * j)) & 3)
                                out[16 * nb + 8 * n1 + g, k] = code - 64
    return out


@pytest.mark.parametrize("bits", (1, 2, 3))
@pytest.mark.parametrize("n,k", SHAPES)
def test_planes_round_trip_and_the_converter_reads_every_code(bits, n, k):
    gen = torch.Generator().manual_seed(bits * 1000 + n + k)
    q = torch.randint(0, 2**bits, (n, k), generator=gen, dtype=torch.uint8)
    b = L.pack_b(q, bits)
    assert tuple(b.shape) == L.shapes(n, k, bits, 1)[0] and torch.equal(L.unpack_b(b, bits, n, k), q)
    for mantissa in (10, 7):  # fp16, bf16 (3 bits: their windows differ)
        got = _fragments(b, bits, b.shape[1] * 16, b.shape[0] * 64, mantissa)
        assert torch.equal(got[:n, :k], q.to(torch.int64) - (1 << (bits - 1)))  # padding: code 0 under scale 0


@pytest.mark.parametrize("n,k", SHAPES)
def test_sparse_bytes_and_the_mma_sp_operands_give_the_weight(n, k):
    k = k // 32 * 32
    q, s, z = mg.sparsify_quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(n)), group_size=32)
    b, scales, zeros = L.pack(q, s, z, 7, torch.float16, "int")
    assert tuple(b.shape) == L.shapes(n, k, 7, 1)[0] and L.dims(b) == (b.shape[1] * 16, b.shape[0] * 4)
    got = _sparse_mma(b, b.shape[1] * 16, b.shape[0] * 64)[:n, :k]
    qi, zc = q.to(torch.int64), z.to(torch.int64).repeat_interleave(32, dim=1)
    # the kept element: the non-zero-code one, the first when both are zero codes (its q' s + z' is 0)
    first = (qi[:, 0::2] != zc[:, 0::2]) | (qi[:, 1::2] == zc[:, 1::2])
    kept = torch.stack((first, ~first), dim=-1).reshape(n, k)
    assert torch.equal(got, torch.where(kept, qi - 64, torch.zeros_like(got)))
    q2, _, z2 = L.unpack(b, scales, zeros, 7, n, k, "int")
    assert torch.equal(q2, q) and torch.equal(z2.float(), z.half().float())


def test_registry_prepack_and_errors():
    assert LAYOUTS["lowbit"] is L
    q, s, z = mg.quantize(torch.randn(64, 128), bits=3, group_size=32)
    w = mg.prepack(q, s, z, format="plain", bits=3, group_size=32)
    assert (w.layout, w.k16, w.n_pad) == ("lowbit", 8, 64) and w.nbytes == 64 * 128 * 3 // 8 + 2 * 2 * 64 * 4
    with pytest.raises(ValueError, match="layout: .* are packed into 'lowbit'"):
        mg.prepack(q, s, z, format="plain", bits=3, group_size=32, layout="sm80")
    q4, s4, z4 = mg.quantize(torch.randn(64, 128), bits=4, group_size=32)
    with pytest.raises(ValueError, match="layout: .* are packed into 'lowbit'"):
        mg.prepack(q4, s4, z4, format="plain", bits=4, group_size=32, layout="lowbit")
    with pytest.raises(ValueError, match="zero_mode: 1:2-sparse 7-bit weights have integer zero codes"):
        L.pack(q, s, z.float() + 0.5, 7, torch.float16, "float")
    with pytest.raises(ValueError, match="bits: the lowbit layout holds"):
        L.pack_b(q, 4)


@pytest.mark.parametrize("p,k0", ((0, 0), (7, 1), (14, 0), (15, 0), (15, 1)))
def test_three_bit_fields_sit_where_the_docstring_says(p, k0):
    # one element of lane 0 (n = 8 n1, k = 16 u + 8 k2 + k0) holds code 5 (0b101), every other 0
    u, r = divmod(p, 4)
    n, k = 8 * (r & 1), 16 * u + 8 * (r >> 1) + k0
    q = torch.zeros(16, 64, dtype=torch.uint8)
    q[n, k] = 5
    words = (L.pack_b(q, 3)[0, 0, :, 0].to(torch.int64) & 0xFFFFFFFF).tolist()
    if p < 15:  # word p // 5, bits 3 (p % 5) (+ 16 for k0 = 1)
        expect = [0, 0, 0]
        expect[p // 5] = 5 << (3 * (p % 5) + 16 * k0)
    else:  # code bit c in bit 15 (k0 = 0) / 31 (k0 = 1) of word c
        expect = [(5 >> c & 1) << (15 + 16 * k0) for c in range(3)]
    assert words == expect
