"""Sequence packing (THD): a padded masked-LM micro-batch as one row of sequences back to back.

:func:`pack_padded_batch` takes a collated micro-batch of ``b`` padded samples
(``[b, s]`` tensors: ``text``/``tokens``, ``labels``, ``loss_mask``,
``padding_mask``, ``types``, ... as the BERT and ESM datasets give them) and
returns the *same samples in the same order* with the padding cut out: every
``[b, s]`` tensor becomes ``[1, T]`` (``T`` = the number of real tokens), and
``cu_seqlens`` (int32 ``[n + 1]``: ``0, l_0, l_0 + l_1, ..., T``) says where each
sample starts and ends. An encoder given ``cu_seqlens`` (e.g.
``BertModel.forward(..., cu_seqlens=...)``) confines attention to each sample and
restarts positions per sample, so a packed micro-batch gives the loss the padded
one gives, without computing the padding.

Which tokens are real: ``padding_mask != 0`` (the model's reading of Megatron's
``padding_mask``); the real tokens of a sample must come first (right padding).
Without a ``padding_mask`` every token is real. A sample without real tokens (the
fully loss-masked filler of :class:`~epochal.data.loading.padding.PaddedDataset`)
is left out, from the per-sample tensors too: it contributes nothing to a loss.

``pad_to_multiple_of`` (e.g. the tensor-parallel size under sequence
parallelism) appends a tail of zeros (``loss_mask`` and ``padding_mask`` 0) as one
more sequence in ``cu_seqlens``, so that ``T`` divides; per-sample tensors then get
one more entry, ``-1`` (the ignore index of the BERT step's sentence-order loss and
of the classification heads) or, for floating ones, ``NaN`` (a regression target
that is not scored).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch

__all__ = ["PACKED_KEY", "pack_padded_batch", "sample_lengths"]

#: the key :func:`pack_padded_batch` adds: int32 ``[n + 1]`` cumulative sequence lengths.
PACKED_KEY = "cu_seqlens"

_TOKEN_KEYS = ("text", "tokens")


def sample_lengths(padding_mask: torch.Tensor) -> torch.Tensor:
    """Each sample's number of real tokens, checking that padding only follows them.

    Args:
        padding_mask: ``[b, s]``, nonzero = real token.

    Returns:
        int64 ``[b]``.

    Raises:
        ValueError: ``padding_mask`` is not 2-D, or a row has a real token after padding
            (the message names the row).
    """
    if padding_mask.dim() != 2:
        raise ValueError(
            f"padding_mask must be [batch, seq], got shape {tuple(padding_mask.shape)}"
        )
    real = padding_mask != 0
    gaps = real[:, 1:] & ~real[:, :-1]
    if gaps.any():
        row = int(gaps.any(dim=1).nonzero()[0])
        raise ValueError(
            f"padding_mask row {row} has a real token after padding; packing needs "
            "right-padded samples"
        )
    return real.sum(dim=1)


def pack_padded_batch(
    batch: Mapping[str, Any],
    *,
    pad_to_multiple_of: int = 1,
    per_sample_keys: Collection[str] = (),
) -> dict[str, Any]:
    """Pack a padded micro-batch into one row without padding (see the module docstring).

    Args:
        batch: a collated micro-batch: a token tensor ``text`` or ``tokens``
            ``[b, s]``; every other tensor either ``[b, s, ...]`` (per token, packed)
            or ``[b]`` (per sample, kept); other values pass through unchanged.
        pad_to_multiple_of: make ``T`` a multiple of this (>= 1) with a loss-masked
            tail sequence.
        per_sample_keys: keys whose ``[b, ...]`` tensors are per sample whatever their
            shape (e.g. regression targets ``[b, num_labels]``, which could be
            mistaken for per-token ``[b, s]`` ones); a tail adds ``NaN`` (floating) or
            ``-1`` rows to them.

    Returns:
        A dict with the same keys: per-token tensors ``[1, T, ...]``, per-sample
        tensors ``[n]`` (``n`` the samples with real tokens, plus one for a tail),
        and :data:`PACKED_KEY` (``cu_seqlens``), int32 ``[n + 1]``.

    Raises:
        ValueError: no token tensor, a tensor of another shape (named), a batch
            already packed, a ``padding_mask`` with real tokens after padding, or
            ``pad_to_multiple_of < 1``.
    """
    if pad_to_multiple_of < 1:
        raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
    if PACKED_KEY in batch:
        raise ValueError(f"the batch is already packed (it has {PACKED_KEY!r})")
    token_key = next((k for k in _TOKEN_KEYS if k in batch), None)
    if token_key is None or not isinstance(batch[token_key], torch.Tensor):
        raise ValueError(f"a masked-LM batch needs a token tensor {' or '.join(_TOKEN_KEYS)}")
    tokens = batch[token_key]
    if tokens.dim() != 2:
        raise ValueError(f"batch[{token_key!r}] must be [batch, seq], got {tuple(tokens.shape)}")
    b, s = tokens.shape
    padding = batch.get("padding_mask")
    if padding is not None:
        lengths = sample_lengths(padding)
    else:
        lengths = torch.full((b,), s, dtype=torch.long)
    kept = lengths > 0
    kept_lengths = lengths[kept].tolist()
    real = torch.arange(s)[None, :] < lengths[:, None]  # [b, s], real tokens of kept rows
    total = sum(kept_lengths)
    tail = -total % pad_to_multiple_of
    if total == 0 and tail == 0:
        tail = pad_to_multiple_of  # nothing real: one loss-masked tail keeps the row non-empty
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            out[key] = value
        elif key in per_sample_keys and value.dim() >= 1 and value.shape[0] == b:
            out[key] = _per_sample(value, kept, tail)
        elif value.dim() >= 2 and tuple(value.shape[:2]) == (b, s):
            packed = value[real.to(value.device)]  # [T, ...], samples in order
            if tail:
                packed = torch.cat([packed, packed.new_zeros((tail, *packed.shape[1:]))])
            out[key] = packed.unsqueeze(0)
        elif value.dim() == 1 and value.shape[0] == b:
            out[key] = _per_sample(value, kept, tail)
        else:
            raise ValueError(
                f"batch[{key!r}] has shape {tuple(value.shape)}; packing takes per-token "
                f"[{b}, {s}, ...] or per-sample [{b}] tensors"
            )
    seq_lengths = kept_lengths + ([tail] if tail else [])
    cu = torch.zeros(len(seq_lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(seq_lengths, dtype=torch.int32).cumsum(0)
    out[PACKED_KEY] = cu
    return out


def _per_sample(value: torch.Tensor, kept: torch.Tensor, tail: int) -> torch.Tensor:
    """The kept samples' rows of ``value`` ``[b, ...]``, plus a tail row (NaN / -1) if any."""
    rows = value[kept.to(value.device)]
    if not tail:
        return rows
    fill = float("nan") if rows.is_floating_point() else -1
    return torch.cat([rows, rows.new_full((1, *rows.shape[1:]), fill)])
