"""Which parallel dimensions each model type has plans for (beyond data parallelism).

GPT and BERT have tensor-parallel plans (with sequence parallelism) and a
pipeline split. ESM has no sequence parallelism: its ``token_dropout`` rescaling
and padding multiplication read the whole sequence's tokens inside the
embedding. Unsupported layouts are refused before anything is built.
"""

from __future__ import annotations

from epochal.model.config import ConfigError, ModelConfig
from epochal.parallel.dims import ParallelDims

__all__ = ["SUPPORTED_DIMS", "check_model_layout"]

#: model type -> the parallel dimensions (beyond data parallelism) it supports.
SUPPORTED_DIMS: dict[str, frozenset[str]] = {
    "gpt": frozenset({"tensor_parallel", "sequence_parallel", "pipeline_parallel"}),
    "bert": frozenset({"tensor_parallel", "sequence_parallel", "pipeline_parallel"}),
    "esm": frozenset({"tensor_parallel", "pipeline_parallel"}),
}


def check_model_layout(
    model_config: ModelConfig, dims: ParallelDims, *, sequence_parallel: bool = False
) -> None:
    """Refuse a layout the model type has no plan for.

    Raises:
        ConfigError: naming ``parallel.tensor_parallel``, ``parallel.sequence_parallel``
            or ``parallel.pipeline_parallel``.
    """
    supported = SUPPORTED_DIMS.get(model_config.type, frozenset())
    used = (
        ("tensor_parallel", dims.tp > 1),
        ("sequence_parallel", sequence_parallel and dims.tp > 1),
        ("pipeline_parallel", dims.pp > 1),
    )
    for option, on in used:
        if on and option not in supported:
            raise ConfigError(
                f"parallel.{option}",
                f"is not supported for model.type={model_config.type!r} "
                f"(supported: {sorted(supported) or 'data parallelism only'})",
            )
