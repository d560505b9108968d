"""Whether a decoder's output head is its input embedding: transformers' rule on load.

``transformers`` (5.x, ``PreTrainedModel.tie_weights`` in ``from_pretrained``) ties
``lm_head.weight`` to the input embedding when ``config.json`` says
``tie_word_embeddings: true``, with two exceptions that decide what the model computes:

- the weights hold both tensors and they differ (``torch.equal`` is false): it does
  NOT tie them, uses the stored head and warns ("both are present in the checkpoints
  with different values, so we will NOT tie them");
- the weights hold the head but no embedding: the head is used as the embedding too.

:func:`tie_as_transformers` applies the same rule to the decoders read here (Llama,
Qwen2, Qwen3, Mistral, Mixtral, Qwen2-MoE, Qwen3-MoE, GPT-2), so their logits are
transformers' whatever the folder's flag says; the first case warns as transformers
does. T5 decides its own tying from the weights (:mod:`epochal.formats.hf.t5`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping

import torch

from epochal.model.config import ModelConfig

__all__ = ["HEAD", "TIED_EMBEDDINGS", "separate_head", "tie_as_transformers"]

HEAD = "lm_head.weight"
#: ``model_type`` -> the names its input embedding has in the weights (the first is
#: ``save_pretrained``'s).
TIED_EMBEDDINGS: dict[str, tuple[str, ...]] = {
    "gpt2": ("transformer.wte.weight", "wte.weight"),
    **{
        kind: ("model.embed_tokens.weight",)
        for kind in ("llama", "qwen2", "qwen3", "mistral", "mixtral", "qwen2_moe", "qwen3_moe")
    },
}


def _embedding_name(weights: Mapping[str, torch.Tensor], model_type: str) -> str | None:
    return next((n for n in TIED_EMBEDDINGS.get(model_type, ()) if n in weights), None)


def separate_head(weights: Mapping[str, torch.Tensor], model_type: str) -> bool:
    """The weights hold an ``lm_head.weight`` that differs from the input embedding.

    False for a family without such a head (:data:`TIED_EMBEDDINGS`), for weights without
    one of the two tensors, and for a head equal to the embedding (a ``.bin`` file stores
    a tied pair that way).
    """
    name = _embedding_name(weights, model_type)
    if HEAD not in weights or name is None:
        return False
    head, embedding = weights[HEAD], weights[name]
    return head.shape != embedding.shape or not torch.equal(head, embedding)


def tie_as_transformers(
    config: ModelConfig, weights: dict[str, torch.Tensor], model_type: str, source: str
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """``(config, weights)`` tied as ``transformers`` ties them (module docstring).

    Args:
        config: read from ``config.json`` (``tie_embeddings`` = its ``tie_word_embeddings``).
        weights: the folder's tensors by their Hugging Face names.
        model_type: ``config.json``'s ``model_type``.
        source: the folder, for the warning.

    Returns:
        The config untied when the weights hold a different head (a warning names both
        tensors); the weights with the head renamed to the embedding when they hold no
        embedding; else both unchanged.
    """
    if not config.tie_embeddings or model_type not in TIED_EMBEDDINGS or HEAD not in weights:
        return config, weights
    name = _embedding_name(weights, model_type)
    if name is None:  # transformers ties the embedding to the head that exists
        renamed = {k: v for k, v in weights.items() if k != HEAD}
        renamed[TIED_EMBEDDINGS[model_type][0]] = weights[HEAD]
        return config, renamed
    if not separate_head(weights, model_type):
        return config, weights
    warnings.warn(
        f"{source}: config.json says tie_word_embeddings=true, but the weights hold an "
        f"{HEAD} that differs from {name}: it is used as the output head (untied), as "
        "transformers does; set tie_word_embeddings to false in config.json to silence this",
        stacklevel=3,
    )
    return dataclasses.replace(config, untie_embeddings_and_output_weights=True), weights
