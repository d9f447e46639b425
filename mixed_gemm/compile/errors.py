"""The one exception type of the build package."""
from __future__ import annotations


class BuildError(RuntimeError):
    """nvcc is missing, failed, or a build could not be cached.

    For compile failures ``source_path``, ``cmd`` and ``stderr`` (nvcc's full, untruncated output)
    are set so callers can show or save more than the message carries.
    """

    def __init__(self, message: str, *, source_path=None, cmd=None, stderr: str | None = None):
        super().__init__(message)
        self.source_path = source_path
        self.cmd = cmd
        self.stderr = stderr
