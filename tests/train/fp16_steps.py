"""Overflow injection for the fp16 tests: a train step whose loss is inf on chosen optimizer steps.

The step is read from the data (``IndexedCounting`` items carry their sample index),
so a resumed run and every data-parallel rank inject on the same global steps.
"""

from __future__ import annotations

from functools import partial

import torch

from epochal.train import GPTTrainStep
from tests.train.synthetic import CountingDataset


class IndexedCounting(CountingDataset):
    """:class:`CountingDataset` items with ``"index"`` (int64 scalar): the sample index."""

    def __getitem__(self, i):
        item = super().__getitem__(i)
        item["index"] = torch.tensor(int(i))
        return item


class OverflowAtSteps(GPTTrainStep):
    """GPT's step whose training loss is multiplied by inf on the 1-based optimizer ``steps``.

    A micro-batch belongs to step ``index // global_batch_size + 1`` of its first sample.
    """

    def __init__(self, args=None, *, steps=()):
        super().__init__(args)
        self.steps = set(steps)

    def forward_step(self, data_iterator, model):
        batch = next(data_iterator)
        output, loss_func = super().forward_step(iter([batch]), model)
        step = int(batch["index"].reshape(-1)[0]) // self.args.training.global_batch_size + 1
        if model.training and step in self.steps:
            return output, partial(self._inf_loss, loss_func)
        return output, loss_func

    @staticmethod
    def _inf_loss(loss_func, output):
        loss, logged = loss_func(output)
        return loss * float("inf"), logged
