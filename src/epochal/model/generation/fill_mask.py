"""Masked-language-model predictions: the most likely tokens at each mask position of a text.

What ``epochal fill-mask`` prints, as a function of a model and a tokenizer (Hugging
Face's ``fill-mask`` pipeline for BERT / ESM-2).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["fill_mask"]


@torch.no_grad()
def fill_mask(
    model: Any, tokenizer: Any, text: str, top_k: int = 5
) -> list[list[tuple[str, float]]]:
    """Top ``top_k`` ``(token, probability)`` for each mask token of ``text``, in order.

    Args:
        model: a :class:`~epochal.model.BertModel` (eval mode).
        tokenizer: a tokenizer with ``cls``, ``sep``, ``mask`` ids and ``tokenize``.

    Predictions are restricted to ids below both the tokenizer's and the model's
    (unpadded, ``model.config.vocab_size``) vocabulary sizes.

    Raises:
        ValueError: the text holds no mask token, or a token beyond that vocabulary.
    """
    ids = [tokenizer.cls, *tokenizer.tokenize(text), tokenizer.sep]
    # predictions come from the real vocabulary only: never the model's padded rows, nor
    # ids of a --vocab-file larger than the model's vocabulary
    model_vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    limit = min(tokenizer.vocab_size, model_vocab or tokenizer.vocab_size)
    beyond = sorted({i for i in ids if i >= limit})
    if beyond:
        names = tokenizer.convert_ids_to_tokens(beyond[:5])
        raise ValueError(
            f"--text {text!r}: token(s) {names} (ids {beyond[:5]}) lie beyond the model's "
            f"vocabulary of {limit} (a tokenizer larger than the model's?)"
        )
    tokens = torch.tensor([ids], device=next(model.parameters()).device)
    positions = [i for i, t in enumerate(ids) if t == tokenizer.mask]
    if not positions:
        raise ValueError(
            f"--text {text!r} has no mask token ({tokenizer.convert_ids_to_tokens([tokenizer.mask])[0]})"
        )
    types = torch.zeros_like(tokens) if model.tokentype_embeddings is not None else None
    out = model(tokens, token_types=types)
    logits = out[0] if isinstance(out, tuple) else out
    logits = logits[0, :, :limit].float()
    result = []
    for pos in positions:
        probs = logits[pos].softmax(-1)
        values, indices = probs.topk(min(top_k, probs.numel()))
        names = tokenizer.convert_ids_to_tokens(indices.tolist())
        result.append([(n, float(v)) for n, v in zip(names, values)])
    return result
