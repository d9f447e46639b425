"""gemv's one-shot mode (``_os``, templates/gemv/gemv_oneshot.cuh): a CTA's whole share of the weight
in shared memory. The slab's sizes mirror ``OneShotSlab`` (checked by the rendered source's
``static_assert`` on ``smem_bytes``), and the fit is judged on the device's SMs and opt-in limit."""
from __future__ import annotations

import functools
from typing import Tuple

ONESHOT_SMS = 132            # the SMs a share is sized for without a GPU (H100 SXM, H200)
ONESHOT_MAX_SMEM = 232448    # the shared memory a block may opt in to there
ONESHOT_ATOM_BYTES = 128     # an int4 16 x 16 atom (x 2 for int8): OneShotSlab::kAtomBytes (gemv_oneshot.cuh)
ONESHOT_GROUP_BYTES = 64     # a strip's 16 scales and 16 zeros of one group: OneShotSlab::kGroupBytes


def oneshot_slab_bytes(bits: int, katoms: int, groups: int) -> int:
    """A 16-row strip's slab in shared memory (``OneShotSlab::bytes``): its atoms over all of K, then its
    groups' parameters."""
    return katoms * ONESHOT_ATOM_BYTES * (bits // 4) + groups * ONESHOT_GROUP_BYTES


def oneshot_smem_limit(device_index: int) -> int:
    """The dynamic shared memory a one-shot kernel opts in to on ``device_index``: the device's per-block
    limit, at most :data:`ONESHOT_MAX_SMEM`."""
    import torch

    return min(ONESHOT_MAX_SMEM, torch.cuda.get_device_properties(device_index).shared_memory_per_block_optin)


def check_oneshot_copies(name: str, **tensors) -> None:
    """ValueError naming ``name`` unless every tensor is present and 16-byte aligned (a one-shot kernel
    copies them 16 bytes at a time)."""
    for field, t in tensors.items():
        if t is None or t.data_ptr() % 16:
            raise ValueError(f"{name}: one-shot mode copies the {field} tensor 16 bytes at a time; it must be "
                             f"present and 16-byte aligned")


@functools.lru_cache(maxsize=1)
def oneshot_device() -> Tuple[int, int]:
    """``(SMs, shared memory a block may opt in to)`` the one-shot mode's fit is judged on: the current CUDA
    device's (fewer SMs give each CTA a larger share), else the H100 / H200's."""
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            return props.multi_processor_count, min(ONESHOT_MAX_SMEM, props.shared_memory_per_block_optin)
    except Exception:  # noqa: BLE001 - a CPU-only torch: the default device
        pass
    return ONESHOT_SMS, ONESHOT_MAX_SMEM
