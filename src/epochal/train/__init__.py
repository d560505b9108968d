"""The training layer: configuration, trainer loop, LR/WD schedule, checkpoints, metrics.

Public names: :class:`Trainer`, :class:`TrainConfig`, :func:`build_config`,
:class:`OptimizerParamScheduler`, :class:`Checkpointer`, :func:`make_loaders`,
:func:`build_data`, :func:`plot_run`; train steps :class:`GPTTrainStep` /
:class:`BertTrainStep`, :class:`T5TrainStep`, :func:`avg_losses_across_data_parallel_group` and
:func:`gather_across_data_parallel_groups`. ``epochal train`` / ``epochal plot`` are in
:mod:`epochal.commands.train` / :mod:`epochal.commands.plot`.
"""

from epochal._lazy import lazy_exports

_EXPORTS = {
    "Trainer": "trainer",
    "TrainResult": "result",
    "masked_token_mean_loss": "losses",
    "TrainConfig": "config",
    "build_config": "config",
    "to_toml": "config",
    "OptimizerParamScheduler": "optim.lr_schedule",
    "Checkpointer": "state.checkpoint",
    "CheckpointError": "state.checkpoint",
    "make_loaders": "inputs.loaders",
    "build_data": "inputs.loaders",
    "DataBundle": "inputs.loaders",
    "plot_run": "observe.plot",
    "TrainStep": "steps",
    "GPTTrainStep": "steps",
    "BertTrainStep": "steps",
    "T5TrainStep": "steps",
    "avg_losses_across_data_parallel_group": "steps",
    "gather_across_data_parallel_groups": "steps",
    "register_train_step": "steps",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
