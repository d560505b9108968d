"""``epochal.accelerate.utils``: the names an Accelerate + Megatron-LM script imports from ``accelerate.utils``.

``MegatronLMPlugin``, ``MegatronLMDummyScheduler`` (:mod:`epochal.accelerate.plugin`);
``MegatronLMDummyDataLoader`` (Megatron's indexed GPT datasets, :mod:`epochal.accelerate.dummy_data`);
the train steps ``GPTTrainStep``, ``BertTrainStep``, ``T5TrainStep`` and their base
``AbstractTrainStep`` (epochal's :class:`~epochal.train.steps.TrainStep`, whose
``get_batch_func`` / ``get_forward_step_func`` / ``get_loss_func`` factories a
subclass may override, as in Accelerate's guide); ``avg_losses_across_data_parallel_group``
and ``gather_across_data_parallel_groups`` (over the data-parallel group of the
prepared run); ``set_seed``; ``DistributedType``; ``DataLoaderConfiguration`` and
``ProjectConfiguration`` (:mod:`epochal.accelerate.configuration`);
``find_executable_batch_size`` / ``release_memory`` (:mod:`epochal.accelerate.utils.memory`);
``DummyOptim`` / ``DummyScheduler`` (refused at ``prepare``: :mod:`epochal.accelerate.deepspeed`).

The train steps are epochal's own (:mod:`epochal.train.steps`): they read epochal's
micro-batch keys (``tokens``, ``labels``, ``loss_mask``, ...), which the prepared
model makes from the transformers batch (:mod:`epochal.accelerate.batches`).
"""

from epochal.accelerate.configuration import DataLoaderConfiguration, ProjectConfiguration
from epochal.accelerate.deepspeed import DummyOptim, DummyScheduler
from epochal.accelerate.dummy_data import MegatronLMDummyDataLoader
from epochal.accelerate.plugin import MegatronLMDummyScheduler, MegatronLMPlugin, PluginError
from epochal.accelerate.seeding import set_seed
from epochal.accelerate.state import DistributedType
from epochal.accelerate.utils.memory import find_executable_batch_size, release_memory
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
    "DataLoaderConfiguration",
    "DistributedType",
    "DummyOptim",
    "DummyScheduler",
    "GPTTrainStep",
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "MegatronLMPlugin",
    "PluginError",
    "ProjectConfiguration",
    "T5TrainStep",
    "avg_losses_across_data_parallel_group",
    "find_executable_batch_size",
    "gather_across_data_parallel_groups",
    "release_memory",
    "set_seed",
]
