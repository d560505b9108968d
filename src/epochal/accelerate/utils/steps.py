"""The train-step names of ``accelerate.utils`` (epochal's own steps; see :mod:`epochal.train.steps`)."""

from epochal.train.steps import (
    BertTrainStep,
    GPTTrainStep,
    T5TrainStep,
    avg_losses_across_data_parallel_group,
    gather_across_data_parallel_groups,
)
from epochal.train.steps import TrainStep as AbstractTrainStep

__all__ = [
    "AbstractTrainStep",
    "BertTrainStep",
    "GPTTrainStep",
    "T5TrainStep",
    "avg_losses_across_data_parallel_group",
    "gather_across_data_parallel_groups",
]
