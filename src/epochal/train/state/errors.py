"""The errors of checkpoint reading (shared by :mod:`.checkpoint` and :mod:`.dcp_checks`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["CheckpointCorruptError", "CheckpointError", "refuse_other_model"]


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, malformed or unsafe; the message names the file."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint file is missing, truncated or changed since it was saved (names the file)."""


def refuse_other_model(
    folder: str | Path, ours: Mapping[str, Any], theirs: Mapping[str, Any], prefix: str = ""
) -> None:
    """Refuse a checkpoint whose model fields differ from the config's.

    Args:
        folder: the checkpoint, named in the message.
        ours: the config's model fields.
        theirs: the checkpoint's; a field it lacks is not compared.
        prefix: put before each field's name in the message (``"model."`` for run configs).

    Raises:
        CheckpointError: ``<folder> holds another model: <prefix>k: checkpoint x vs config y; ...``.
    """
    diff = [
        f"{prefix}{k}: checkpoint {theirs[k]!r} vs config {v!r}"
        for k, v in ours.items()
        if k in theirs and theirs[k] != v
    ]
    if diff:
        raise CheckpointError(f"{folder} holds another model: " + "; ".join(diff))
