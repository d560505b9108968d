"""Megatron-style parallelism on PyTorch's own engine, applied from outside to a plain GPTModel.

Composition (torchtitan's order), all in :class:`ParallelEngine`: pipeline split
(:mod:`~epochal.parallel.pipeline`) -> tensor/sequence parallel
(:mod:`~epochal.parallel.tensor_parallel`) -> activation recompute
(:mod:`~epochal.parallel.recompute`) -> ``torch.compile`` -> data parallel /
sharded optimizer (:mod:`~epochal.parallel.data_parallel`) -> pipeline schedule.
The trainer uses it through :class:`epochal.train.parallel_trainer.ParallelTrainer`.

Layering: this package imports :mod:`epochal.model` and never :mod:`epochal.train`.
"""

from epochal._lazy import lazy_exports

_EXPORTS = {
    "ParallelConfig": "config",
    "ParallelDims": "dims",
    "ParallelEngine": "engine",
    "apply_tensor_parallel": "tensor_parallel",
    "apply_data_parallel": "data_parallel",
    "apply_recompute": "recompute",
    "clip_grad_norm_parallel": "grad_clip",
    "vocab_parallel_cross_entropy": "loss",
    "TiedOptimizerState": "checkpoint",
    "consolidate_checkpoint": "checkpoint",
    "init_distributed": "launch",
    "relaunch": "launch",
    "stage_layer_counts": "pipeline",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
