"""Loading fatbins into torch's CUDA context and launching kernels on torch's current stream."""
from .driver import CudaDriverError
from .kernel import Kernel, get_kernel

__all__ = ["CudaDriverError", "Kernel", "get_kernel"]
