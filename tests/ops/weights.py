"""Random quantized weights for the ops tests, in canonical and checkpoint form."""
from __future__ import annotations

import zlib

import torch

import mixed_gemm as mg
from tolerance import assert_elementwise

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


def seed_of(*parts) -> int:
    """A seed fixed by the case: crc32 of its parts' text (``hash()`` of a str is salted per process)."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def rel_err(y: torch.Tensor, ref: torch.Tensor, k: int | None = None) -> float:
    """Norm-wise relative error of ``y`` against the float32 ``ref``; with ``k`` (the reduction
    length) also asserts every element is close (:func:`tolerance.assert_elementwise`): one wrong
    element cannot hide in the norm."""
    assert not torch.isnan(y).any(), "output has NaN: an element was never written (or inf/nan math)"
    ref = ref.float()
    if k is not None:
        assert_elementwise(y, ref, k)
    return ((y.float() - ref).norm() / ref.norm()).item()


def deterministic_and_replayable(x, w, config, replays: int = 3) -> torch.Tensor:
    """``mg.matmul(x, w, config=config)`` twice (bit-identical: split-K sums in a fixed order), then
    captured in a CUDA graph and replayed into a NaN-poisoned output (identical again: the split-K
    counters and semaphores were left at zero). Returns the first result."""
    first = mg.matmul(x, w, config=config)
    assert torch.equal(mg.matmul(x, w, config=config), first)
    out = torch.empty_like(first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mg.matmul(x, w, config=config, out=out)
    for _ in range(replays):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, first)
    return first
