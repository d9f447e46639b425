"""The public operations: prepack weights once, multiply many times."""
from .dequantize import dequantize
from .experts import PackedExperts, prepack_experts
from .gated import silu_mul_matmul
from .matmul import explain, matmul, problem
from .moe import moe
from .packed import PackedWeight, prepack
from .prebuild import prebuild
from .router import topk_router
from .library import matmul_packed_op, moe_packed_op, packed_view  # registers torch.ops.mixed_gemm.matmul, .moe

__all__ = ["PackedExperts", "PackedWeight", "dequantize", "explain", "matmul", "matmul_packed_op", "moe",
           "moe_packed_op", "packed_view", "prebuild", "prepack", "prepack_experts", "problem", "silu_mul_matmul", "topk_router"]
