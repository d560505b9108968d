"""Validation of a checkpoint's ``trainer_state.json`` counters."""

from __future__ import annotations

from typing import Any

from epochal.train.state.errors import CheckpointError

__all__ = ["COUNTERS", "check_trainer_state"]

#: counters that must be integers >= 0 when present.
COUNTERS = ("step", "consumed_train_samples", "tokens_seen", "global_batch_size", "seq_length")


def check_trainer_state(state: dict[str, Any], source: str) -> dict[str, Any]:
    """Return ``state`` after checking its counters (``step`` -5 would resume at step -4).

    Raises:
        CheckpointError: a counter that is not an integer >= 0, naming ``source`` and it.
    """
    for name in COUNTERS:
        value = state.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CheckpointError(f"{source}: {name} must be an integer >= 0, got {value!r}")
    return state
