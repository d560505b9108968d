"""T5's relative attention bias: learned per-head biases indexed by log-spaced distance buckets.

The bias added to the attention score of query position ``i`` and key position
``j`` is ``weight[bucket(j - i), head]`` (Raffel et al., "Exploring the Limits of
Transfer Learning", section 2.1; Hugging Face ``T5Attention`` and Megatron-Core's
``RelativePositionEmbedding`` compute the same buckets):

- bidirectional (the encoder): half of the ``num_buckets`` are for keys after the
  query, half for keys at or before it;
- one-directional (the decoder's causal self-attention): keys after the query
  are bucket 0 (they are masked anyway); all buckets measure the distance back;
- within a direction, distances below ``n // 2`` (``n`` = buckets per
  direction) have a bucket each; larger ones share logarithmically spaced
  buckets up to ``max_distance``, beyond which everything falls in the last one.

Parameter: ``weight`` float ``[num_buckets, num_heads]`` (Hugging Face's
``relative_attention_bias.weight``; Megatron-Core's
``relative_attention_bias.weight``). Only the first block of each stack owns one
in T5; here it lives on the model (``encoder_relative_bias`` /
``decoder_relative_bias``) and the one bias tensor is passed to every block.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["RelativePositionBias", "relative_position_bucket"]


def relative_position_bucket(
    relative_position: torch.Tensor,
    *,
    bidirectional: bool,
    num_buckets: int,
    max_distance: int,
) -> torch.Tensor:
    """Bucket of each relative position ``key - query`` (int64, same shape).

    Args:
        relative_position: int64 ``key_position - query_position``, any shape.
        bidirectional: separate buckets for keys after the query (encoder).
        num_buckets: total number of buckets (even when bidirectional).
        max_distance: distances ``>= max_distance`` share the last bucket.

    Returns:
        int64 buckets in ``[0, num_buckets)``, shaped like ``relative_position``.
    """
    buckets = torch.zeros_like(relative_position)
    n = num_buckets
    if bidirectional:
        n //= 2
        buckets = buckets + (relative_position > 0).long() * n
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    exact = n // 2
    is_small = distance < exact
    # log-spaced beyond `exact`; clamp the log argument so distance 0 does not produce -inf
    scaled = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    large = exact + (scaled * (n - exact)).long()
    large = large.clamp(max=n - 1)
    return buckets + torch.where(is_small, distance, large)


class RelativePositionBias(nn.Module):
    """Learned ``[num_buckets, num_heads]`` table producing the additive attention bias.

    Args:
        num_heads: number of attention heads (all of them; tensor-parallel
            attention selects its slice with ``Attention.bias_heads``).
        num_buckets: number of distance buckets.
        max_distance: see :func:`relative_position_bucket`.
        bidirectional: True for the encoder, False for the decoder.
    """

    def __init__(
        self, num_heads: int, *, num_buckets: int, max_distance: int, bidirectional: bool
    ) -> None:
        super().__init__()
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.weight = nn.Parameter(torch.empty(num_buckets, num_heads))

    def forward(self, query_length: int, key_length: int, offset: int = 0) -> torch.Tensor:
        """The bias for ``query_length`` queries at positions ``offset ..`` and keys ``0 ..``.

        Args:
            query_length: number of queries ``s``.
            key_length: number of keys ``s_k``.
            offset: position of the first query (incremental decoding: the
                number of tokens already cached).

        Returns:
            ``[1, num_heads, s, s_k]`` in the table's dtype.
        """
        device = self.weight.device
        q_pos = torch.arange(offset, offset + query_length, device=device)
        k_pos = torch.arange(key_length, device=device)
        buckets = relative_position_bucket(
            k_pos[None, :] - q_pos[:, None],
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )
        return self.weight[buckets].permute(2, 0, 1).unsqueeze(0)
