"""Modules for models: ``QuantLinear``, and ``QuantExperts`` for mixture-of-experts layers."""
from .moe import QuantExperts, is_experts
from .quant_linear import QuantLinear

__all__ = ["QuantExperts", "QuantLinear", "is_experts"]
