"""torch's tinygemm int4 layout (``torch._weight_int4pack_mm``; what torchao's int4 weight-only
packs): the packed codes and the ``(K / G, N, 2)`` bf16 scales-and-zeros it reads.

tinygemm dequantizes ``w = (q - 8) * scale + zero``; canonical ``(q, s, z)`` is ``w = (q - z) * s``,
so its ``zero`` is ``(8 - z) * s`` (``[..., 0]`` scale, ``[..., 1]`` zero). Codes pack with
tinygemm's CUDA packer on a GPU and its CPU packer elsewhere (the layouts differ; each kernel
reads its own).
"""
from __future__ import annotations

import torch

INNER_K_TILES = 8  # torchao's default for int4 weight-only: K must be a multiple of 8 * 16


def check_shape(n: int, k: int, group_size: int) -> None:
    """``ValueError`` naming the rule tinygemm's packing sets on ``(N, K)`` and the group."""
    if group_size not in (32, 64, 128, 256):
        raise ValueError(f"group_size: tinygemm takes 32, 64, 128 or 256, got {group_size}")
    if k % (INNER_K_TILES * 16) or k % group_size:
        raise ValueError(f"K={k}: tinygemm needs a multiple of {INNER_K_TILES * 16} and of the group size {group_size}")
    if n % 8:
        raise ValueError(f"N={n}: tinygemm needs a multiple of 8")


def pack_codes(q: torch.Tensor) -> torch.Tensor:
    """4-bit codes ``q`` ``(N, K)`` in ``[0, 16)`` in tinygemm's packed layout, on ``q``'s device."""
    qi = q.to(torch.int32)
    if qi.is_cuda:
        return torch._convert_weight_to_int4pack((qi[:, ::2] << 4 | qi[:, 1::2]).to(torch.uint8), INNER_K_TILES)
    return torch._convert_weight_to_int4pack_for_cpu(qi, INNER_K_TILES)


def scales_and_zeros(s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Canonical ``s``, ``z`` ``(N, K / G)`` as tinygemm's bf16 ``(K / G, N, 2)``."""
    s32 = s.float()
    return torch.stack([s32.t(), ((8 - z.float()) * s32).t()], dim=-1).to(torch.bfloat16).contiguous()


def padded_k(k: int) -> int:
    """K rounded up to what the packer takes (a multiple of ``INNER_K_TILES * 16``)."""
    step = INNER_K_TILES * 16
    return -(-k // step) * step


def pad_k(q: torch.Tensor, s: torch.Tensor, z: torch.Tensor, group_size: int):
    """``(q, s, z)`` with K zero-padded to :func:`padded_k` (as torchao pads in_features): the
    padded codes, and the whole groups added past the last one (scale 1, zero 0), meet zero
    activations (the layer pads x), so they add nothing. A ragged last group (K % group != 0) keeps
    its scale, which the padded columns share."""
    n, k = q.shape
    kp = padded_k(k)
    check_shape(n, kp, group_size)
    if kp == k:
        return q, s, z
    extra = kp // group_size - s.shape[1]
    q = torch.cat([q, q.new_zeros(n, kp - k)], 1)
    if extra > 0:
        s = torch.cat([s, s.new_ones(n, extra)], 1)
        z = torch.cat([z, z.new_zeros(n, extra)], 1)
    return q, s, z


def pack(q: torch.Tensor, s: torch.Tensor, z: torch.Tensor, group_size: int):
    """Canonical 4-bit ``(q, s, z)`` as tinygemm's ``(packed codes, scales_and_zeros)``."""
    check_shape(q.shape[0], q.shape[1], group_size)
    return pack_codes(q), scales_and_zeros(s, z)
