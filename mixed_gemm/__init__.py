"""mixed_gemm: CUTLASS mixed-input GEMMs for LLM weight-only quantization.

fp16/bf16 activations times int4/int8 weights with group-wise scales and zero points (AWQ, GPTQ,
HQQ, GGUF), served by kernel families (:mod:`mixed_gemm.kernels`) chosen per problem.
"""
from __future__ import annotations

from . import reference  # float32 oracle
from .compile import blocking, jit_mode
from .compile.background import pending as pending_builds
from .compile.background import wait as wait_for_builds
from .formats import pack, quantize, sparsify_quantize, unpack
from .kernels.dequant_mm import DequantMMConfig
from .kernels.sm80 import Sm80Config
from .ops import (PackedExperts, PackedWeight, dequantize, explain, matmul, moe, prebuild, prepack, prepack_experts,
                  silu_mul_matmul, topk_router)
from .version import __version__

KernelConfig = Sm80Config  # the sm80 family's config under its historical name

__all__ = [
    "DequantMMConfig",
    "KernelConfig",
    "PackedExperts",
    "PackedWeight",
    "Sm80Config",
    "__version__",
    "blocking",
    "jit_mode",
    "pending_builds",
    "wait_for_builds",
    "dequantize",
    "explain",
    "matmul",
    "moe",
    "pack",
    "prebuild",
    "prepack",
    "prepack_experts",
    "quantize",
    "sparsify_quantize",
    "reference",
    "silu_mul_matmul",
    "topk_router",
    "unpack",
]
