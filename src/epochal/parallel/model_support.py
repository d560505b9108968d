"""Which parallel dimensions each model type has plans for (beyond data parallelism).

GPT and BERT have tensor-parallel plans (with sequence parallelism) and a
pipeline split. ESM has no sequence parallelism in the plain plan: its
``token_dropout`` rescaling and padding multiplication read the whole sequence's tokens
inside the embedding (canonical units have it: :data:`CANONICAL_SUPPORTED`). T5 has tensor and sequence parallelism but no pipeline split
(:data:`UNSUPPORTED_REASONS` says why). Unsupported layouts are refused before anything is built.
"""

from __future__ import annotations

import torch

from epochal.model.config import ConfigError, ModelConfig
from epochal.parallel.dims import ParallelDims

__all__ = [
    "CANONICAL_SUPPORTED",
    "MIN_TORCH",
    "SUPPORTED_DIMS",
    "UNSUPPORTED_REASONS",
    "check_model_layout",
]

#: model type -> the parallel dimensions (beyond data parallelism) it supports.
SUPPORTED_DIMS: dict[str, frozenset[str]] = {
    "gpt": frozenset({"tensor_parallel", "sequence_parallel", "pipeline_parallel"}),
    "bert": frozenset({"tensor_parallel", "sequence_parallel", "pipeline_parallel"}),
    "esm": frozenset({"tensor_parallel", "pipeline_parallel"}),
    "t5": frozenset({"tensor_parallel", "sequence_parallel"}),
}

#: ``(model type, option)`` -> why that dimension is refused (in the error message).
UNSUPPORTED_REASONS: dict[tuple[str, str], str] = {
    ("esm", "sequence_parallel"): (
        "ESM's token_dropout rescaling reads the whole sequence inside the embedding"
    ),
    ("t5", "pipeline_parallel"): (
        "an encoder-decoder pipeline split (Megatron's pipeline_model_parallel_split_rank, "
        "the encoder output sent to every decoder stage) is not implemented; use "
        "tensor and data parallelism for T5"
    ),
}

#: ``(model type, option)`` pairs refused above that canonical units support
#: (:mod:`epochal.parallel.canonical_plan`: ESM-2's embedding stage runs whole on every rank
#: there, and keeps this rank's sequence slice after its dropout)
CANONICAL_SUPPORTED: frozenset[tuple[str, str]] = frozenset({("esm", "sequence_parallel")})

#: ``(model type, option)`` -> (the oldest torch release that runs it, why).
MIN_TORCH: dict[tuple[str, str], tuple[str, str]] = {
    ("bert", "sequence_parallel"): (
        "2.13",
        "the masked-LM head's dense layer flattens a sequence-sharded DTensor, which older "
        "DTensor refuses ('Attempted to flatten multiple dimensions')",
    ),
}


def _check_moe_widths(model_config: ModelConfig, tp: int) -> None:
    """Each expert's and the shared expert's inner width split over ``tp`` ranks (column-parallel)."""
    widths = (
        ("moe_ffn_hidden_size", model_config.moe_ffn_size),
        ("moe_shared_expert_intermediate_size", model_config.moe_shared_expert_intermediate_size),
    )
    for option, width in widths:
        if width is not None and width % tp != 0:
            unset = option == "moe_ffn_hidden_size" and model_config.moe_ffn_hidden_size is None
            raise ConfigError(
                f"model.{option}",
                f"= {width}{' (ffn_hidden_size, as it is unset)' if unset else ''} must be "
                f"divisible by parallel.tensor_parallel={tp}: the experts' inner width is split "
                "over the tensor-parallel ranks; choose a multiple of it or a smaller tensor_parallel",
            )


def check_model_layout(
    model_config: ModelConfig,
    dims: ParallelDims,
    *,
    sequence_parallel: bool = False,
    canonical: bool = False,
) -> None:
    """Refuse a layout the model type has no plan for.

    ``canonical``: the model computes in canonical units, which also cover
    :data:`CANONICAL_SUPPORTED`.

    Raises:
        ConfigError: naming ``parallel.tensor_parallel``, ``parallel.sequence_parallel``
            or ``parallel.pipeline_parallel``; under tensor parallelism with MoE layers,
            ``model.moe_ffn_hidden_size`` or ``model.moe_shared_expert_intermediate_size``
            when ``tp`` does not divide it.
    """
    if getattr(model_config, "lora_rank", 0) > 0 and dims.tp > 1:
        raise ConfigError(
            "parallel.tensor_parallel",
            "is not supported with LoRA adapters (model.lora_rank > 0): the adapters of a "
            "column- or row-parallel projection are not sharded; use data and pipeline parallelism",
        )
    if getattr(model_config, "num_experts", None) is not None and dims.tp > 1:
        _check_moe_widths(model_config, dims.tp)
    supported = SUPPORTED_DIMS.get(model_config.type, frozenset())
    used = (
        ("tensor_parallel", dims.tp > 1),
        ("sequence_parallel", sequence_parallel and dims.tp > 1),
        ("pipeline_parallel", dims.pp > 1),
    )
    for option, on in used:
        if canonical and (model_config.type, option) in CANONICAL_SUPPORTED:
            continue
        if on and option not in supported:
            reason = UNSUPPORTED_REASONS.get((model_config.type, option))
            raise ConfigError(
                f"parallel.{option}",
                f"is not supported for model.type={model_config.type!r}"
                + (f": {reason}" if reason else "")
                + f" (supported: {sorted(supported) or 'data parallelism only'})",
            )
        needs = MIN_TORCH.get((model_config.type, option))
        if on and needs and torch.torch_version.TorchVersion(torch.__version__) < needs[0]:
            raise ConfigError(
                f"parallel.{option}",
                f"for model.type={model_config.type!r} needs torch >= {needs[0]} "
                f"(this is {torch.__version__}): {needs[1]}; turn it off or upgrade torch",
            )
