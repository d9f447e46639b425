"""Random quantized weights for the ops tests, in canonical and checkpoint form."""
from __future__ import annotations

import torch

import mixed_gemm as mg

# (name, format, bits, symmetric)
SCHEMES = (
    ("awq_u4_zeros", "awq", 4, False),
    ("gptq_u4_sym", "gptq", 4, True),
    ("gptq_u8_zeros", "gptq_v2", 8, False),
)


def random_weight(n, k, *, fmt, bits, symmetric, group_size, device, seed):
    """Fresh random (q, s, z) and the same weight packed in checkpoint format ``fmt``."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    groups = 1 if group_size == -1 else k // group_size
    q = torch.randint(0, 2**bits, (n, k), generator=gen, dtype=torch.uint8)
    # Scales sized so outputs are O(1): |w| ~ 2**bits * s / 2, summed over K random terms.
    s = ((torch.rand(n, groups, generator=gen) + 0.5) * (2.0 / (2**bits * k**0.5))).half()
    z = None if symmetric else torch.randint(0, 2**bits, (n, groups), generator=gen).half()
    packed = mg.pack(q, s, z, format=fmt, bits=bits, group_size=group_size)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return (to(q), to(s), to(z)), tuple(to(t) for t in packed)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    assert not torch.isnan(y).any(), "output has NaN: an element was never written (or inf/nan math)"
    return ((y.float() - ref).norm() / ref.norm()).item()
