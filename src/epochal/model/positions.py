"""Position encodings: rotary (RoPE) and ALiBi helpers.

Learned absolute positions are a plain ``nn.Embedding`` on the model
(``GPTModel.pos_embeddings``); this module holds the two functional encodings.

RoPE convention ("rotate_half", non-interleaved; Megatron-LM's default and Hugging
Face Llama's): with ``r = rotary_dim`` channels rotated per head,
``inv_freq[i] = base ** (-2 i / r)`` for ``i < r/2``, the angle of position ``p``
is ``theta = p * inv_freq`` repeated twice (``cat([theta, theta])``), and

    x_rot = x[..., :r] * cos + rotate_half(x[..., :r]) * sin,
    rotate_half([x1, x2]) = [-x2, x1]   (x1, x2 the first/second halves of r),

channels ``r:`` pass through unchanged (``rotary_percent < 1``). Channel ``i``
is paired with channel ``i + r/2`` (not ``2i`` with ``2i+1`` as in the GPT-J /
Meta checkpoint "interleaved" layout); Hugging Face Llama weights already use
this layout, Meta's original ones need the usual q/k row permutation.

ALiBi (Press et al. 2022, as in BLOOM/MPT and Megatron): head ``h`` adds
``-slope[h] * (i - j)`` to the score of query ``i`` and key ``j <= i``; slopes are
the geometric sequence ``2 ** (-8 (h+1) / n)`` for a power-of-two head count
``n``, with the standard interleaved extension otherwise.
"""

from __future__ import annotations

import math

import torch

__all__ = ["rope_cos_sin", "rotate_half", "apply_rotary", "alibi_slopes", "alibi_bias"]


def rope_cos_sin(
    rotary_dim: int,
    max_positions: int,
    base: float = 10000.0,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and sine tables of RoPE.

    Args:
        rotary_dim: number of rotated channels per head (even).
        max_positions: number of positions (table rows).
        base: the base frequency ``theta``.
        device: where to build the tables (computed in float32).

    Returns:
        ``(cos, sin)``, each float32 ``[max_positions, rotary_dim]``.

    Raises:
        ValueError: if ``rotary_dim`` is odd or not positive.
    """
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim
    inv_freq = 1.0 / (base**exponent)
    positions = torch.arange(max_positions, dtype=torch.float32, device=device)
    angles = torch.outer(positions, inv_freq)  # [max_positions, rotary_dim / 2]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dimension (split in two halves)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` channels of every head of ``x``.

    Args:
        x: ``[b, s, heads, head_dim]``.
        cos, sin: ``[b or 1, s, rotary_dim]`` (gathered at the tokens' positions).

    Returns:
        A tensor shaped and typed like ``x``.
    """
    r = cos.shape[-1]
    cos = cos.unsqueeze(2).to(x.dtype)
    sin = sin.unsqueeze(2).to(x.dtype)
    if r == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    x_rot, x_pass = x[..., :r], x[..., r:]
    return torch.cat([x_rot * cos + rotate_half(x_rot) * sin, x_pass], dim=-1)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi slopes for ``num_heads`` heads, float32 ``[num_heads]``."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if num_heads <= 0:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    if math.log2(num_heads).is_integer():
        slopes = power_of_two(num_heads)
    else:
        closest = 2 ** math.floor(math.log2(num_heads))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(
    slopes: torch.Tensor,
    seq_len: int,
    dtype: torch.dtype = torch.float32,
    mask: torch.Tensor | None = None,
    key_length: int | None = None,
) -> torch.Tensor:
    """Additive causal ALiBi bias for ``scaled_dot_product_attention``.

    Args:
        slopes: ``[heads]`` (the heads this attention module computes).
        seq_len: sequence length ``s`` (number of queries).
        dtype: dtype of the result (that of the queries).
        mask: optional bool ``[b, 1, s, s_k]``, True = masked out (Megatron's
            convention), combined with the causal mask.
        key_length: number of keys ``s_k >= s`` (default ``s``); the queries are
            the last ``s`` positions (incremental decoding with a KV cache).

    Returns:
        ``[1 or b, heads, s, s_k]``: ``-slope[h] * (i - j)`` for key ``j <= i``
        (``i`` the query's position among the ``s_k``), ``-inf`` for ``j > i``
        and wherever ``mask`` is True.
    """
    device = slopes.device
    s_k = seq_len if key_length is None else key_length
    q_pos = torch.arange(s_k - seq_len, s_k, device=device)
    k_pos = torch.arange(s_k, device=device)
    distance = (q_pos[:, None] - k_pos[None, :]).to(torch.float32)  # i - j
    bias = -slopes.to(torch.float32)[:, None, None] * distance  # [heads, s, s]
    masked_out = (distance < 0)[None, None]
    if mask is not None:
        masked_out = masked_out | mask
    bias = bias[None].masked_fill(masked_out, float("-inf"))
    return bias.to(dtype)
