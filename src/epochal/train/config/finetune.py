"""The ``[finetune]`` section: the labelled data of a fine-tuning run (``model.head`` != ``"mlm"``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from epochal._checks import check_fields, checked, require

__all__ = ["FinetuneConfig"]


@dataclass(kw_only=True)
class FinetuneConfig:
    """The ``[finetune]`` section (used when ``model.head`` names a fine-tuning head).

    Attributes:
        train_file / valid_file: CSV / TSV / parquet tables with a sequence and a label
            column (:mod:`epochal.data.datasets.labelled`). A held-out test table is scored
            after training with ``epochal embed --predictions`` (no test pass in the run).
        split: without ``valid_file``: train/valid weights dividing ``train_file``'s rows
            (a fixed permutation of ``training.seed``), e.g. ``"90,10"``; ``""`` = no
            validation.
        sequence_column / label_column: the columns' names.
        head_lr: the learning rate of the head (``head.*``) at the schedule's peak;
            ``0`` = ``optimizer.lr``. The schedule's warmup and decay apply to it alike.
    """

    train_file: str = ""
    valid_file: str = ""
    split: str = ""
    sequence_column: str = "sequence"
    label_column: str = "label"
    head_lr: float = checked(0.0, ge=0, note="0 = optimizer.lr")

    def __post_init__(self) -> None:
        check_fields(self)
        require(bool(self.sequence_column), "sequence_column", "must name a column")
        require(bool(self.label_column), "label_column", "must name a column")
        if self.split:
            try:
                weights = [float(w) for w in self.split.split(",")]
            except ValueError:
                weights = []
            require(
                len(weights) == 2
                and all(math.isfinite(w) and w >= 0 for w in weights)
                and 0 < sum(weights) < math.inf,
                "split",
                "must be two finite weights >= 0 'train,valid' with a positive, finite sum, "
                f"like '90,10', got {self.split!r}",
            )
            require(
                not self.valid_file,
                "split",
                "and finetune.valid_file are exclusive (a split of train_file, or a valid file)",
            )

    def split_fractions(self) -> tuple[float, float] | None:
        """``(train, valid)`` fractions of :attr:`split`, or None."""
        if not self.split:
            return None
        a, b = (float(w) for w in self.split.split(","))
        return a / (a + b), b / (a + b)
