"""Rendering: template + values -> CUDA source (family-agnostic; families own their configs)."""
from .generated import write_generated
from .render import render_template

__all__ = ["render_template", "write_generated"]
