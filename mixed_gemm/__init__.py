"""mixed_gemm: CUTLASS mixed-input GEMMs for LLM weight-only quantization.

fp16/bf16 activations times int4/int8 weights with group-wise scales and zero points (AWQ, GPTQ).
"""
from __future__ import annotations

__version__ = "0.1.0"

from . import reference  # noqa: E402  (float32 oracle)
from .formats import pack, quantize, unpack  # noqa: E402
from .codegen import KernelConfig  # noqa: E402
from .ops import PackedWeight, dequantize, matmul, prepack  # noqa: E402

__all__ = [
    "KernelConfig",
    "PackedWeight",
    "__version__",
    "dequantize",
    "matmul",
    "pack",
    "prepack",
    "quantize",
    "reference",
    "unpack",
]
