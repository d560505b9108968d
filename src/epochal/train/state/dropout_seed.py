"""Keyed dropout in the trainers: each micro-batch's random stream from its step and global index.

Under the exact gradient synchronisation and with a model that draws random numbers, the
trainer hands every micro-batch the seed
:func:`~epochal.parallel.dropout_keys.micro_batch_seed` of ``(training.seed, the
optimizer step, its global micro-batch index)`` (the blocks derive theirs from
it, see :mod:`epochal.parallel.dropout_keys`). The masks then depend neither on
the data-parallel rank nor on how many micro-batches ran before, so any layout
and any resume draw the same ones; the global random streams are left as they
were around each step. Without dropout nothing is reseeded.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from epochal.parallel.dropout_keys import has_dropout, preserved_rng, step_seeds

__all__ = ["DropoutKeys"]


class DropoutKeys:
    """The dropout seeds of a step's micro-batches, held by the trainer (``trainer.dropout_keys``).

    Args:
        seed: ``training.seed``.
        device: the device the model runs on (its CUDA generator is reseeded too).
        model_parts: this rank's model parts (keyed only if one draws random numbers).
        keyed: key dropout by the micro-batch (the exact synchronisation; False:
            nothing is ever reseeded).
        dp_rank: this rank's data-parallel coordinate.
        dp_size: the data-parallel size.
    """

    def __init__(
        self,
        *,
        seed: int,
        device: torch.device,
        model_parts: Sequence[nn.Module],
        keyed: bool,
        dp_rank: int = 0,
        dp_size: int = 1,
    ) -> None:
        self.seed = seed
        self.device = device
        self.model_parts = list(model_parts)
        self.keyed_dropout = keyed
        self.dp_rank = dp_rank
        self.dp_size = dp_size

    @functools.cached_property
    def keyed(self) -> bool:
        """Keyed dropout asked for and a model part that draws random numbers in training."""
        return self.keyed_dropout and any(has_dropout(part) for part in self.model_parts)

    def micro_batch_seeds(self, step: int, num_microbatches: int) -> list[int] | None:
        """The seeds of this rank's micro-batches of the step after ``step`` optimizer steps
        (None: the running random stream)."""
        if not self.keyed:
            return None
        return step_seeds(self.seed, step, num_microbatches, self.dp_rank, self.dp_size)

    @contextlib.contextmanager
    def step(self, step: int, num_microbatches: int) -> Iterator[list[int] | None]:
        """Around one step's forward/backward: its micro-batches' seeds (for the step plan),
        the global random streams kept as they were.

        Args:
            step: the optimizer steps done before this one.
            num_microbatches: this rank's micro-batches in the step.

        Yields:
            :meth:`micro_batch_seeds` (None: nothing is reseeded).
        """
        seeds = self.micro_batch_seeds(step, num_microbatches)
        with preserved_rng(self.device) if seeds else contextlib.nullcontext():
            yield seeds
