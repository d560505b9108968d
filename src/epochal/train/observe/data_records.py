"""What the train records of ``metrics.jsonl`` say about the data each step read.

On the logging rank, for each optimizer step that consumed the global samples
``[before, after)``:

- ``"sample_digest"``: the digest of the step's sample identities
  (:mod:`epochal.train.inputs.sample_identity`), when the train dataset names its
  samples (every dataset epochal builds does); two runs read the same samples at a
  step exactly when their digests there are equal, whatever their data-parallel
  size, micro-batch size or accumulation;
- ``"sources"``: the ledger of a blend: how many of the step's samples each source
  served (in the order of the blend's prefixes), whether its weights are fixed or follow
  ``data.blend_schedule``;
- ``"epoch"`` and the ``{"kind": "epoch"}`` records of multi-epoch data
  (:mod:`epochal.train.inputs.epoch_evidence`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from epochal.data.datasets.scheduled_blend import find_blend
from epochal.train.inputs.epoch_evidence import epoch_recorder
from epochal.train.inputs.sample_identity import has_identities, identity_digest, sample_identities

__all__ = ["DataRecords"]


class DataRecords:
    """Adds the data's evidence to each train record (see the module docstring).

    Args:
        dataset: the (global, not data-parallel-sliced) train dataset.
        micro_batch_size: samples per micro-batch (the epoch records cover one).
    """

    def __init__(self, dataset: Any, micro_batch_size: int) -> None:
        self.dataset = dataset
        self.digests = has_identities(dataset)
        self.epochs = epoch_recorder(dataset, micro_batch_size)
        self.blend = find_blend(dataset)

    def annotate(
        self,
        record: dict[str, Any],
        before: int,
        after: int,
        step: int,
        log_record: Callable[[dict[str, Any]], None],
    ) -> None:
        """Add the fields of step ``step`` (global samples ``[before, after)``) to ``record``.

        Epoch-start records are passed to ``log_record`` (written before the step's record).
        """
        if self.digests:
            record["sample_digest"] = identity_digest(
                sample_identities(self.dataset, before, after)
            )
        if self.blend is not None:
            record["sources"] = self.blend.source_counts(after, before)
        if self.epochs is not None:
            record["epoch"] = self.epochs.epochs(after)
            for k in self.epochs.starts_between(before, after):
                log_record(self.epochs.record(k, step))
