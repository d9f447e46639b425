"""Choosing a kernel configuration for a problem: override, profile, heuristics (see choose.py)."""
from .choose import SCHEDULE_ENV, choose_config
from .heuristics import HEURISTICS, heuristic_config, m_bucket
from .profiles import PROFILE_ENV, Profile, device_profile, gpu_slug

__all__ = ["HEURISTICS", "PROFILE_ENV", "Profile", "SCHEDULE_ENV", "choose_config", "device_profile",
           "gpu_slug", "heuristic_config", "m_bucket"]
