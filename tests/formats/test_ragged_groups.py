"""K not a multiple of the group size (SmolLM2's K = 576 at G = 128): the last group is shorter."""
import pytest
import torch

import mixed_gemm as mg


@pytest.mark.parametrize("fmt", ["awq", "gptq", "plain"])
@pytest.mark.parametrize("symmetric", [False, True])
def test_ragged_round_trip_and_reference(fmt, symmetric):
    torch.manual_seed(0)
    n, k, g = 64, 576, 128
    w = torch.randn(n, k) * 0.05
    w[:, 512:] *= 10  # the short last group has its own range
    q, s, z = mg.quantize(w.half(), bits=4, group_size=g, symmetric=symmetric)
    assert q.shape == (n, k) and s.shape == (n, 5)
    packed = mg.pack(q, s, z, format=fmt, bits=4, group_size=g)
    q2, s2, z2 = mg.unpack(*packed, format=fmt, bits=4, group_size=g)
    assert torch.equal(q2, q) and torch.equal(s2, s) and (z is None or torch.equal(z2, z))
    dq = mg.reference.dequantize(q, s, z, group_size=g, bits=4)
    # Each group is quantized with its own range: the error stays within half a step.
    step = s.float().repeat_interleave(g, dim=1)[:, :k]
    assert bool(((dq - w.half().float()).abs() <= step * 0.5 + 1e-3).all())


def test_ragged_needs_the_ceil_groups():
    q = torch.zeros(8, 576, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"ceil\(K / group_size\)"):
        mg.reference.dequantize(q, torch.ones(8, 4), None, group_size=128, bits=4)
