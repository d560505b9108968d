"""Train steps: what the trainer runs for each micro-batch (see :mod:`.base` for the contract).

:class:`GPTTrainStep` (``model.type = "gpt"``), :class:`BertTrainStep`
(``"bert"``, ``"esm"``) and :class:`T5TrainStep` (``"t5"``) are registered per model type
(:class:`SFTTrainStep`: a GPT fine-tuning on ``sft.train_file``); :func:`train_step_class`
looks one up. :func:`load_train_step` imports a user's class from
``package.module:Class`` (``training.train_step``), :func:`load_eval_callback` an
evaluation callback (``training.eval_callback``).
"""

from epochal.train.steps.base import TrainStep, load_eval_callback, load_train_step
from epochal.train.steps.bert import BertTrainStep
from epochal.train.steps.classifier import ClassifierStep
from epochal.train.steps.finetune import (
    ResidueClassificationStep,
    SequenceClassificationStep,
    SequenceRegressionStep,
)
from epochal.train.steps.gpt import GPTTrainStep, LossFnStep
from epochal.train.steps.reduce import (
    avg_losses_across_data_parallel_group,
    data_parallel_group,
    gather_across_data_parallel_groups,
    set_data_parallel_group,
)
from epochal.train.steps.registry import register_train_step, train_step_class
from epochal.train.steps.sft import SFTTrainStep
from epochal.train.steps.t5 import T5TrainStep

__all__ = [
    "BertTrainStep",
    "ClassifierStep",
    "ResidueClassificationStep",
    "SequenceClassificationStep",
    "SequenceRegressionStep",
    "GPTTrainStep",
    "SFTTrainStep",
    "LossFnStep",
    "T5TrainStep",
    "TrainStep",
    "avg_losses_across_data_parallel_group",
    "data_parallel_group",
    "gather_across_data_parallel_groups",
    "load_eval_callback",
    "load_train_step",
    "register_train_step",
    "set_data_parallel_group",
    "train_step_class",
]
