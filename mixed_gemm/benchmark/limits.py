"""The roofs ``mixed-gemm bench`` reports against, and its default token counts. Pure Python (no
torch): the command's parser reads :data:`DEFAULT_MS`.

The H100 figures the project measures against (docs/notes/measurement.md): 3.0 TB/s of HBM (the
workplace's device-to-device copy, bytes read plus written) and 740 TFLOP/s of dense fp16 (what
cuBLAS reaches on the model shapes). :func:`limit_s` is the time no weight-only kernel beats: the
larger of the weight's bytes at that bandwidth and the product's flops at that rate. cuBLAS's fp16
time over it is the best speedup a shape allows (its *limit*); mg's speedup over that limit is the
share of it mg reaches (*of limit*).
"""
from __future__ import annotations

PEAK_BANDWIDTH = 3.0e12  # bytes/s
DENSE_FLOPS = 740e12     # flop/s
# Decode (1), the serving batches (16-512) and prefill (4096).
DEFAULT_MS = "1,16,32,64,128,256,512,4096"


def floor_s(weight_bytes: int) -> float:
    """Seconds to stream ``weight_bytes`` at :data:`PEAK_BANDWIDTH`."""
    return weight_bytes / PEAK_BANDWIDTH


def limit_s(weight_bytes: int, m: int, n: int, k: int) -> float:
    """The larger of the weight's floor and ``2 m n k`` flops at :data:`DENSE_FLOPS`."""
    return max(floor_s(weight_bytes), 2 * m * n * k / DENSE_FLOPS)
