"""The errors of checkpoint reading (shared by :mod:`.checkpoint` and :mod:`.dcp_checks`)."""

from __future__ import annotations

__all__ = ["CheckpointCorruptError", "CheckpointError"]


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, malformed or unsafe; the message names the file."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint file is missing, truncated or changed since it was saved (names the file)."""
