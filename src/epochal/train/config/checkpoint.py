"""The ``[checkpoint]`` section: save interval, keep-last-k, resume, init_from."""

from __future__ import annotations

from dataclasses import dataclass

from epochal._checks import check_fields, checked, require

__all__ = [
    "CheckpointConfig",
]


@dataclass(kw_only=True)
class CheckpointConfig:
    """The ``[checkpoint]`` section.

    Attributes:
        save_interval: save every this many steps (0 = only at the end).
        save_final: save after the last step.
        keep_last: keep this many newest checkpoints (>= 1).
        resume: ``"auto"`` (continue from ``<run_dir>/checkpoints/latest`` if it
            exists), ``"never"`` (start fresh; refuses a run_dir that has
            checkpoints), or a path to a checkpoint folder or a checkpoints folder.
        init_from: when there is nothing to resume, initialize the model weights
            from this checkpoint (a step folder, checkpoints folder or run dir,
            e.g. one written by ``epochal convert --to epochal``) and start the
            optimizer, schedule and data from zero (Megatron's ``--finetune``).
            Empty = random initialization.
    """

    save_interval: int = checked(100, ge=0)
    save_final: bool = True
    keep_last: int = checked(2, ge=1)
    resume: str = "auto"
    init_from: str = ""

    def __post_init__(self) -> None:
        check_fields(self)
        require(bool(self.resume), "resume", "must be 'auto', 'never' or a checkpoint path")
