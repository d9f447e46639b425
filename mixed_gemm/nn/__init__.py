"""Modules for models: ``QuantLinear``, and ``QuantExperts`` and ``TopKRouter`` for mixture-of-experts layers."""
from .moe import QuantExperts, is_experts
from .quant_linear import QuantLinear
from .router import TopKRouter

__all__ = ["QuantExperts", "QuantLinear", "TopKRouter", "is_experts"]
