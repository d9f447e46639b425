"""Choosing a kernel configuration for a problem: profiles first (issue #5), heuristics otherwise."""
from .heuristics import HEURISTICS, heuristic_config, m_bucket

__all__ = ["HEURISTICS", "heuristic_config", "m_bucket"]
