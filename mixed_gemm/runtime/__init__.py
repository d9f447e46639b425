"""Loading fatbins into torch's CUDA context and launching kernels on torch's current stream."""
from .driver import CudaDriverError
from .kernel import Function, Module, current_stream, get_module
from .library import get_library
from .workspace import scratch, semaphores, workspace

__all__ = ["CudaDriverError", "Function", "Module", "current_stream", "get_library", "get_module", "scratch", "semaphores", "workspace"]
