"""Config -> kernel name -> rendered CUDA source."""
from .config import KernelConfig
from .render import render

__all__ = ["KernelConfig", "render"]
