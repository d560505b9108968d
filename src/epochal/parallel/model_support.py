"""Which parallel dimensions each model type has plans for (tensor / pipeline / data).

GPT has a tensor-parallel plan and a pipeline split; BERT / ESM encoders so far
train under data parallelism (every sharding), activation recompute and
``torch.compile``, but their encoder-only modules (token-type embeddings, the
masked-LM head's dense / norm / bias, the binary head) have no tensor-parallel
plan and the pipeline split does not yet route their padding mask to every
stage: such layouts are refused before anything is built.
"""

from __future__ import annotations

from epochal.model.config import ConfigError, ModelConfig
from epochal.parallel.dims import ParallelDims

__all__ = ["SUPPORTED_DIMS", "check_model_layout"]

#: model type -> the parallel dimensions (beyond data parallelism) it supports.
SUPPORTED_DIMS: dict[str, frozenset[str]] = {
    "gpt": frozenset({"tensor_parallel", "pipeline_parallel"}),
    "bert": frozenset(),
    "esm": frozenset(),
}


def check_model_layout(model_config: ModelConfig, dims: ParallelDims) -> None:
    """Refuse a layout the model type has no plan for.

    Raises:
        ConfigError: naming ``parallel.tensor_parallel`` or ``parallel.pipeline_parallel``.
    """
    supported = SUPPORTED_DIMS.get(model_config.type, frozenset())
    for option, size in (("tensor_parallel", dims.tp), ("pipeline_parallel", dims.pp)):
        if size > 1 and option not in supported:
            raise ConfigError(
                f"parallel.{option}",
                f"is {size}, but model.type={model_config.type!r} trains only with "
                f"data parallelism so far (tensor and pipeline parallelism: GPT)",
            )
