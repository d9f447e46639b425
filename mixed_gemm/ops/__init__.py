"""The public operations: prepack weights once, multiply many times."""
from .dequantize import dequantize
from .matmul import matmul
from .packed import PackedWeight, prepack

__all__ = ["PackedWeight", "dequantize", "matmul", "prepack"]
