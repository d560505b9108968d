"""Per-token cross-entropy without a float32 copy of the whole ``[b, s, vocab]`` logits.

The plain loss (:func:`epochal.parallel.loss.vocab_parallel_cross_entropy` on
unsharded logits) upcasts the bfloat16 logits to float32 and keeps that copy for
the backward: at the 1.34B shape (vocabulary 50,304, micro-batch 4 x 2048) that is
1.6 GB more than the bfloat16 logits themselves. Two ways around it, same losses:

- :func:`chunked_cross_entropy`: the tokens in chunks of ``chunk_tokens``, each chunk's
  upcast and log-softmax recomputed in the backward (``torch.utils.checkpoint``), so
  float32 logits exist for one chunk at a time. Each token's loss is computed
  exactly as in one piece (rows are independent), so losses and gradients are equal.
- :func:`compiled_cross_entropy`: the same function under ``torch.compile``, where
  inductor fuses the upcast into the log-sum-exp kernel (the loss computed inside
  the compiled region).

:func:`token_cross_entropy` picks one from the training options.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

__all__ = [
    "chunked_cross_entropy",
    "compiled_cross_entropy",
    "plain_cross_entropy",
    "token_cross_entropy",
]

#: ``(logits [..., V], labels [...], vocab) -> float32 losses [...]``; ``vocab`` as in
#: :func:`plain_cross_entropy`.
CrossEntropy = Callable[[torch.Tensor, torch.Tensor, int | None], torch.Tensor]


def plain_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, vocab: int | None = None
) -> torch.Tensor:
    """float32 per-token cross-entropy shaped like ``labels`` (logits ``[..., V]``, upcast).

    ``vocab``: only the first ``vocab`` columns join the softmax (the real ids of a padded
    vocabulary, :attr:`~epochal.model.ModelConfig.softmax_vocab_size`); None = all ``V``.
    Labels must be below it (or ``-100``, ignored).
    """
    flat = logits.flatten(0, -2)
    if vocab is not None and vocab < flat.shape[-1]:
        flat = flat[:, :vocab]
    losses = F.cross_entropy(flat.float(), labels.flatten(), reduction="none")
    return losses.view_as(labels)


def chunked_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, chunk_tokens: int, vocab: int | None = None
) -> torch.Tensor:
    """:func:`plain_cross_entropy` over chunks of ``chunk_tokens`` tokens, recomputed in the backward.

    Args:
        logits: ``[..., V]`` in any float dtype.
        labels: int64 ``[...]``.
        chunk_tokens: tokens per chunk (>= 1).
        vocab: the columns that join the softmax (see :func:`plain_cross_entropy`).

    Returns:
        float32 losses shaped like ``labels``, equal to :func:`plain_cross_entropy`'s.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    flat_logits = logits.flatten(0, -2)
    flat_labels = labels.flatten()
    if flat_labels.numel() <= chunk_tokens:
        return plain_cross_entropy(logits, labels, vocab)
    pieces = [
        checkpoint(plain_cross_entropy, x, y, vocab, use_reentrant=False)
        if torch.is_grad_enabled()
        else plain_cross_entropy(x, y, vocab)
        for x, y in zip(
            flat_logits.split(chunk_tokens), flat_labels.split(chunk_tokens), strict=True
        )
    ]
    return torch.cat(pieces).view_as(labels)


@cache
def _compiled() -> CrossEntropy:
    return torch.compile(plain_cross_entropy, dynamic=False)


def compiled_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, vocab: int | None = None
) -> torch.Tensor:
    """:func:`plain_cross_entropy` under ``torch.compile`` (the upcast fused, not stored)."""
    return _compiled()(logits, labels, vocab)


def token_cross_entropy(*, chunk_tokens: int = 0, compiled: bool = False) -> CrossEntropy | None:
    """The per-token loss for ``training.loss_chunk_tokens`` / ``compile_loss``; None = the plain one.

    Chunking wins over compiling when both are asked for (it bounds memory for any
    vocabulary; the compiled chunk function would recompile per shape).
    """
    if chunk_tokens > 0:
        return lambda logits, labels, vocab=None: chunked_cross_entropy(
            logits, labels, chunk_tokens, vocab
        )
    if compiled:
        return compiled_cross_entropy
    return None
