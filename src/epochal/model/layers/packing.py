"""Packed sequences (THD): several sequences concatenated in one row, attention within each.

A packed batch holds ``n`` sequences of lengths ``l_0 .. l_{n-1}`` back to back in
one row of ``T = sum(l_i)`` tokens (``[1, T]``; no padding between them), with
``cu_seqlens = [0, l_0, l_0 + l_1, ..., T]`` (int32 ``[n + 1]``, the cumulative
sequence lengths of flash-attention's varlen kernels and Megatron-Core's
``PackedSeqParams``; "THD" = tokens, heads, head dim). The model then treats
every sequence as if it were alone in a padded batch:

- attention is confined to each sequence (query and key of the same sequence);
- positions restart at 0 for every sequence (:meth:`PackedSequences.position_ids`),
  for rotary and learned absolute positions alike;
- per-sequence quantities (ESM's token-dropout ratio, BERT's pooled first token)
  are taken per sequence (:meth:`PackedSequences.document_ids`,
  :meth:`PackedSequences.starts`).

A padded tail (to make ``T`` a multiple of the tensor-parallel size, say) is just
one more sequence of padding tokens: it attends to itself only, so the real
sequences are unchanged, and its tokens are loss-masked by whoever packs the batch.

Attention kernels (:func:`packed_attention`): on CUDA in float16/bfloat16 without
attention dropout, PyTorch's flash-attention varlen kernel
(``torch.nn.attention.varlen.varlen_attn``); everywhere else scaled-dot-product
attention run per sequence (the attention work is ``sum(l_i ** 2)``, as the
varlen kernel's, instead of ``n * max_len ** 2`` for the padded batch or ``T ** 2``
for one dense document-masked matrix). ``flex_attention`` with a document mask
is exact too but, without ``torch.compile``, materializes the whole ``T x T``
score matrix on CPU, so it is not used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from epochal._eager import eager

__all__ = ["PackedSequences", "packed_attention"]


@dataclass(frozen=True, eq=False)
class PackedSequences:
    """Where each sequence of a packed ``[1, T]`` row starts and ends.

    Build it with :meth:`from_cu_seqlens` (which validates); the model does so from
    the ``cu_seqlens`` tensor a packed batch carries.

    Attributes:
        cu_seqlens: int32 ``[n + 1]``: ``0``, then the running sum of the lengths
            (on the model's device).
        lengths: the ``n`` sequence lengths (host integers, each >= 1).
    """

    cu_seqlens: torch.Tensor
    lengths: tuple[int, ...]

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: torch.Tensor, total: int | None = None) -> PackedSequences:
        """Validate ``cu_seqlens`` and read its lengths.

        Args:
            cu_seqlens: integer ``[n + 1]``, ``n >= 1``: starts at 0, strictly
                increasing (no empty sequence).
            total: the packed row's token count ``T`` the last entry must equal
                (``None`` = not checked).

        Raises:
            ValueError: a ``cu_seqlens`` of the wrong shape or dtype, not starting
                at 0, not strictly increasing, or not ending at ``total``.
        """
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise ValueError(
                f"cu_seqlens must be 1-D [num_sequences + 1] with at least one sequence, "
                f"got shape {tuple(cu_seqlens.shape)}"
            )
        if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype == torch.bool:
            raise ValueError(f"cu_seqlens must be an integer tensor, got {cu_seqlens.dtype}")
        bounds = [int(x) for x in cu_seqlens.tolist()]
        lengths = tuple(b - a for a, b in zip(bounds, bounds[1:], strict=False))
        if bounds[0] != 0 or min(lengths) < 1:
            raise ValueError(
                f"cu_seqlens must start at 0 and increase strictly (no empty sequence), "
                f"got {bounds[:8]}{' ...' if len(bounds) > 8 else ''}"
            )
        if total is not None and bounds[-1] != total:
            raise ValueError(
                f"cu_seqlens ends at {bounds[-1]} but the packed row has {total} tokens"
            )
        return cls(cu_seqlens=cu_seqlens.to(torch.int32), lengths=lengths)

    @property
    def num_sequences(self) -> int:
        """``n``, the number of sequences in the row."""
        return len(self.lengths)

    @property
    def total(self) -> int:
        """``T``, the number of tokens in the row."""
        return sum(self.lengths)

    @property
    def max_seqlen(self) -> int:
        """The longest sequence's length."""
        return max(self.lengths)

    def starts(self) -> torch.Tensor:
        """int64 ``[n]``: the index of each sequence's first token in the row."""
        return self.cu_seqlens[:-1].long()

    def document_ids(self) -> torch.Tensor:
        """int64 ``[T]``: the sequence (0-based) each token belongs to."""
        n = self.num_sequences
        counts = torch.tensor(self.lengths, device=self.cu_seqlens.device)
        return torch.arange(n, device=self.cu_seqlens.device).repeat_interleave(
            counts, output_size=self.total
        )

    def position_ids(self) -> torch.Tensor:
        """int64 ``[1, T]``: each token's position within its own sequence (restarting at 0)."""
        device = self.cu_seqlens.device
        offsets = self.starts()[self.document_ids()]
        return (torch.arange(self.total, device=device) - offsets).unsqueeze(0)

    def segment_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Per-sequence sums of a per-token tensor: ``[T, ...] -> [n, ...]`` (float32 or wider)."""
        out = values.new_zeros((self.num_sequences, *values.shape[1:]))
        return out.index_add_(0, self.document_ids(), values)


def _use_varlen_kernel(q: torch.Tensor, dropout_p: float) -> bool:
    """Whether the flash-attention varlen kernel applies (CUDA, half precision, no dropout)."""
    return (
        q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16)
        and dropout_p == 0.0
        and q.shape[-1] % 8 == 0
        and q.shape[-1] <= 256
    )


@eager
def packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    packed: PackedSequences,
    *,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """Bidirectional attention confined to each packed sequence.

    Args:
        q, k, v: ``[1, heads, T, head_dim]`` (keys/values already repeated to the
            query heads), ``T = packed.total``.
        packed: the sequence boundaries.
        dropout_p: attention dropout probability (0 in evaluation).
        scale: the query-key scale (``None`` = ``1 / sqrt(head_dim)``).

    Returns:
        ``[1, heads, T, head_dim]``: for every sequence, what
        ``scaled_dot_product_attention`` gives for it alone.

    Raises:
        ValueError: a batch dimension other than 1, or ``T`` not ``packed.total``.
    """
    if q.shape[0] != 1 or q.shape[2] != packed.total:
        raise ValueError(
            f"packed attention needs q/k/v of shape [1, heads, {packed.total}, head_dim], "
            f"got {tuple(q.shape)}"
        )
    if _use_varlen_kernel(q, dropout_p):
        from torch.nn.attention.varlen import varlen_attn

        cu = packed.cu_seqlens.to(device=q.device, dtype=torch.int32)
        out = varlen_attn(
            q[0].transpose(0, 1),
            k[0].transpose(0, 1),
            v[0].transpose(0, 1),
            cu,
            cu,
            packed.max_seqlen,
            packed.max_seqlen,
            scale=scale,
        )
        return out.transpose(0, 1).unsqueeze(0)
    lengths = list(packed.lengths)
    outs = [
        F.scaled_dot_product_attention(qi, ki, vi, dropout_p=dropout_p, scale=scale)
        for qi, ki, vi in zip(
            q.split(lengths, dim=2), k.split(lengths, dim=2), v.split(lengths, dim=2), strict=True
        )
    ]
    return torch.cat(outs, dim=2)
