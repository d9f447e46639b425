"""Modules for models: ``QuantLinear``."""
from .quant_linear import QuantLinear

__all__ = ["QuantLinear"]
