"""Choosing the kernel of a problem across families: override, profile, heuristics (selection.py)."""
from .selection import SCHEDULE_ENV, SELECTED, Choice, choose, clear_selection, forced, selected
from .heuristics import heuristic_choice, m_bucket, sm_count
from .profiles import PROFILE_ENV, Profile, device_profile, gpu_slug

__all__ = ["PROFILE_ENV", "SCHEDULE_ENV", "SELECTED", "Choice", "Profile", "choose", "clear_selection", "device_profile",
           "forced", "gpu_slug", "heuristic_choice", "m_bucket", "selected", "sm_count"]
