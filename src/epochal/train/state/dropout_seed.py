"""Keyed dropout in the trainers: each micro-batch's random stream from its step and global index.

With ``training.layout_invariant`` and a model that draws random numbers, the
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
from collections.abc import Iterator
from typing import Any

from epochal.parallel.dropout_keys import has_dropout, preserved_rng, seed_micro_batch, step_seeds

__all__ = ["KeyedDropoutSeams"]


class KeyedDropoutSeams:
    """Mixin of :class:`~epochal.train.trainer.Trainer`: the dropout seeds of a step's micro-batches.

    Uses the trainer's ``config``, ``device``, ``model_parts``, ``step`` and
    ``data_parallel_info()``.
    """

    config: Any
    device: Any
    model_parts: Any
    step: int
    _step_seeds: list[int] | None = None
    _seed_iter: Iterator[int] | None = None

    @functools.cached_property
    def keyed_dropout(self) -> bool:
        """``training.layout_invariant`` and a model part that draws random numbers in training."""
        invariant = self.config.training.layout_invariant
        return invariant and any(has_dropout(part) for part in self.model_parts)

    def micro_batch_seeds(self, num_microbatches: int) -> list[int] | None:
        """The seeds of this rank's micro-batches of the next step (None: the running stream)."""
        if not self.keyed_dropout:
            return None
        info = self.data_parallel_info()  # type: ignore[attr-defined]
        return step_seeds(self.config.training.seed, self.step, num_microbatches, **info)

    @contextlib.contextmanager
    def keyed_step(self, num_microbatches: int) -> Iterator[list[int] | None]:
        """Around one step's forward/backward: fix its seeds, keep the global streams as they were."""
        self._step_seeds = self.micro_batch_seeds(num_microbatches)
        self._seed_iter = iter(self._step_seeds) if self._step_seeds is not None else None
        try:
            with preserved_rng(self.device) if self._step_seeds else contextlib.nullcontext():
                yield self._step_seeds
        finally:
            self._seed_iter = None

    def seed_next_micro_batch(self) -> None:
        """Before a micro-batch's forward: reseed with its seed (nothing without keyed dropout)."""
        if self._seed_iter is not None:
            seed_micro_batch(next(self._seed_iter), self.device)
