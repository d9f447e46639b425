"""Modules for models: ``QuantLinear``, ``QuantExperts`` and ``TopKRouter`` for mixture-of-experts layers, and
``OneKernelRMSNorm`` (a transformers RMSNorm as one launch)."""
from .moe import QuantExperts, is_experts
from .norm import OneKernelRMSNorm
from .quant_linear import QuantLinear
from .router import TopKRouter

__all__ = ["OneKernelRMSNorm", "QuantExperts", "QuantLinear", "TopKRouter", "is_experts"]
