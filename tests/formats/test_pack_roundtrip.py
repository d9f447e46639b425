"""pack(unpack(x)) == x and unpack(pack(x)) == x, bit-exact, for every format, width and group size."""
from __future__ import annotations

import pytest
import torch

from mixed_gemm.formats import FORMATS as ALL_FORMATS, pack, unpack

# The dense formats that hold their own shape (hqq: test_hqq.py; sparse12: test_sparse12.py).
FORMATS = tuple(f for f in ALL_FORMATS if f not in ("hqq", "sparse12"))

N, K = 48, 384  # N a multiple of 8 but not of 32; K // 128 = 3 groups
GROUPS = [32, 64, 128, -1]


def _equal(a, b):
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _packed_shapes(fmt, bits, group_size):
    p, ng = 32 // bits, (1 if group_size == -1 else K // group_size)
    qweight = {"awq": (K, N // p), "gptq": (K // p, N), "gptq_v2": (K // p, N), "plain": (N, K)}[fmt]
    scales = (N, ng) if fmt == "plain" else (ng, N)
    zeros = (N, ng) if fmt == "plain" else (ng, N // p)
    return qweight, scales, zeros


@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("group_size", GROUPS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("fmt", FORMATS)
def test_unpack_of_pack_is_identity(canonical, fmt, bits, group_size, symmetric):
    q, s, z = canonical(N, K, bits=bits, group_size=group_size, symmetric=symmetric)
    packed = pack(q, s, z, format=fmt, bits=bits, group_size=group_size)
    qw, sc, zw = packed
    exp_q, exp_s, exp_z = _packed_shapes(fmt, bits, group_size)
    assert tuple(qw.shape) == exp_q and tuple(sc.shape) == exp_s
    assert qw.dtype == (torch.uint8 if fmt == "plain" else torch.int32)
    assert sc.dtype == s.dtype
    if symmetric:
        assert zw is None
    else:
        assert tuple(zw.shape) == exp_z
        assert zw.dtype == (s.dtype if fmt == "plain" else torch.int32)
    assert all(t is None or t.is_contiguous() for t in packed)
    q2, s2, z2 = unpack(*packed, format=fmt, bits=bits, group_size=group_size)
    assert _equal(q2, q) and _equal(s2, s) and _equal(z2, z)


@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("group_size", GROUPS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("fmt", FORMATS)
def test_pack_of_unpack_is_identity(gen, words, canonical, fmt, bits, group_size, symmetric):
    if fmt == "plain":
        packed = canonical(N, K, bits=bits, group_size=group_size, symmetric=symmetric)
    else:
        qshape, sshape, zshape = _packed_shapes(fmt, bits, group_size)
        scales = torch.rand(sshape, generator=gen).to(torch.float16) + 0.5
        packed = (words(*qshape), scales, None if symmetric else words(*zshape))
    q, s, z = unpack(*packed, format=fmt, bits=bits, group_size=group_size)
    assert q.dtype == torch.uint8 and tuple(q.shape) == (N, K)
    assert int(q.max()) < 2**bits and int(q.max()) == 2**bits - 1  # the all-ones word is in there
    ng = 1 if group_size == -1 else K // group_size
    assert tuple(s.shape) == (N, ng) and s.dtype == torch.float16
    if symmetric:
        assert z is None
    else:
        assert z.shape == s.shape and z.dtype == s.dtype
        assert torch.equal(z, z.round()) and 0 <= float(z.min()) and float(z.max()) < 2**bits
    assert all(t is None or t.is_contiguous() for t in (q, s, z))
    repacked = pack(q, s, z, format=fmt, bits=bits, group_size=group_size)
    assert all(_equal(a, b) for a, b in zip(repacked, packed))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("fmt", FORMATS)
def test_scale_dtypes_round_trip(canonical, fmt, bits, dtype):
    q, s, z = canonical(16, 128, bits=bits, group_size=32, dtype=dtype)
    out = unpack(*pack(q, s, z, format=fmt, bits=bits, group_size=32), format=fmt, bits=bits, group_size=32)
    assert _equal(out[0], q) and _equal(out[1], s) and _equal(out[2], z)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_on_device(canonical, words, fmt, bits, device):
    q, s, z = canonical(N, K, bits=bits, group_size=64, device=device)
    packed = pack(q, s, z, format=fmt, bits=bits, group_size=64)
    assert all(t.device.type == device for t in packed)
    out = unpack(*packed, format=fmt, bits=bits, group_size=64)
    assert all(o.device.type == device for o in out)
    assert _equal(out[0], q) and _equal(out[1], s) and _equal(out[2], z)
    if fmt != "plain":  # device results equal the CPU ones bit for bit
        cpu = pack(q.cpu(), s.cpu(), z.cpu(), format=fmt, bits=bits, group_size=64)
        assert all(_equal(a.cpu(), b) for a, b in zip(packed, cpu))


def test_plain_passes_tensors_through(canonical):
    q, s, z = canonical(8, 64, group_size=32)
    assert all(a is b for a, b in zip(pack(q, s, z, format="plain", group_size=32), (q, s, z)))
    assert all(a is b for a, b in zip(unpack(q, s, z, format="plain", group_size=32), (q, s, z)))


def test_unpack_does_not_modify_inputs(words):
    qweight, zeros = words(64, 4), words(2, 4)
    scales = torch.ones(2, 32, dtype=torch.float16)
    before = [t.clone() for t in (qweight, scales, zeros)]
    unpack(qweight, scales, zeros, format="awq", group_size=32)
    unpack(qweight[:8, :].repeat(1, 8), scales, zeros, format="gptq", group_size=32)
    assert all(torch.equal(a, b) for a, b in zip((qweight, scales, zeros), before))
