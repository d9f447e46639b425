"""The public operations: prepack weights once, multiply many times."""
from .dequantize import dequantize
from .matmul import matmul
from .packed import PackedWeight, prepack
from .library import matmul_packed_op, packed_view  # registers torch.ops.mixed_gemm.matmul

__all__ = ["PackedWeight", "dequantize", "matmul", "matmul_packed_op", "packed_view", "prepack"]
