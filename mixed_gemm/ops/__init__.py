"""The public operations: prepack weights once, multiply many times."""
from .matmul import matmul
from .packed import PackedWeight, prepack

__all__ = ["PackedWeight", "matmul", "prepack"]
