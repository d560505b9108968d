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

RoPE scaling (:class:`RopeScaling`) changes only ``inv_freq``, so every table
built from the same config agrees (training, KV-cache decoding, pipeline stages):

- ``"linear"`` (position interpolation; Hugging Face ``rope_type="linear"``,
  Megatron's ``--rotary-seq-len-interpolation-factor``): ``inv_freq / factor``,
  i.e. position ``p`` is rotated as ``p / factor``.
- ``"llama3"`` (Llama 3.1+; Hugging Face ``rope_type="llama3"``, Megatron-Core's
  ``--use-rope-scaling``): with ``wavelen = 2 pi / inv_freq``,
  ``L = original_max_positions``, ``s = (L / wavelen - low) / (high - low)``
  clamped to ``[0, 1]``, the scaled frequency is
  ``(1 - s) * inv_freq / factor + s * inv_freq``: long wavelengths
  (``wavelen > L / low``) are divided by ``factor``, short ones
  (``wavelen < L / high``) are kept, those in between are interpolated smoothly.
  Same float32 arithmetic as ``transformers``' and Megatron-Core's, so
  ``inv_freq`` is bit-identical to theirs.

ALiBi (Press et al. 2022, as in BLOOM/MPT and Megatron): head ``h`` adds
``-slope[h] * (i - j)`` to the score of query ``i`` and key ``j <= i``; slopes are
the geometric sequence ``2 ** (-8 (h+1) / n)`` for a power-of-two head count
``n``, with the standard interleaved extension otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from epochal.model.config import ROPE_SCALING_TYPES

__all__ = [
    "ROPE_SCALING_TYPES",
    "RopeScaling",
    "rope_inv_freq",
    "rope_cos_sin",
    "rotate_half",
    "apply_rotary",
    "alibi_slopes",
    "alibi_bias",
]


@dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """How RoPE frequencies are stretched for contexts longer than pre-training's.

    Attributes:
        type: ``"linear"`` or ``"llama3"`` (see the module docstring).
        factor: the context extension factor (> 0; Llama 3.1 uses 8).
        low_freq_factor: ``"llama3"`` only: wavelengths above
            ``original_max_positions / low_freq_factor`` tokens are divided by
            ``factor`` (> 0; Llama 3.1 uses 1).
        high_freq_factor: ``"llama3"`` only: wavelengths below
            ``original_max_positions / high_freq_factor`` tokens are kept
            (> ``low_freq_factor``; Llama 3.1 uses 4).
        original_max_positions: ``"llama3"`` only: the pre-training context
            length in tokens (>= 1; Llama 3.1 uses 8192).

    Raises:
        ValueError: a value outside the ranges above.
    """

    type: Literal["linear", "llama3"]
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192

    def __post_init__(self) -> None:
        if self.type not in ROPE_SCALING_TYPES:
            raise ValueError(
                f"RoPE scaling type must be one of {ROPE_SCALING_TYPES}, got {self.type!r}"
            )
        if not self.factor > 0:
            raise ValueError(f"RoPE scaling factor must be > 0, got {self.factor!r}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(
                "RoPE scaling needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor!r} and {self.high_freq_factor!r}"
            )
        if self.original_max_positions < 1:
            raise ValueError(
                f"RoPE original_max_positions must be >= 1, got {self.original_max_positions!r}"
            )


def rope_inv_freq(
    rotary_dim: int,
    base: float = 10000.0,
    scaling: RopeScaling | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """RoPE's per-pair angular frequencies, in radians per position.

    Args:
        rotary_dim: number of rotated channels per head (even, > 0).
        base: the base frequency ``theta``.
        scaling: optional frequency scaling (``None`` = plain RoPE).
        device: where to build the result.

    Returns:
        float32 ``[rotary_dim / 2]``: ``base ** (-2 i / rotary_dim)``, scaled.

    Raises:
        ValueError: if ``rotary_dim`` is odd or not positive.
    """
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim
    inv_freq = 1.0 / (base**exponent)
    if scaling is None:
        return inv_freq
    if scaling.type == "linear":
        return inv_freq / scaling.factor
    # llama3: interpolate between "divided by factor" (long wavelengths) and "kept" (short ones).
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    keep = ((scaling.original_max_positions / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - keep) * inv_freq / scaling.factor + keep * inv_freq


def rope_cos_sin(
    rotary_dim: int,
    max_positions: int,
    base: float = 10000.0,
    device: torch.device | str | None = None,
    *,
    scaling: RopeScaling | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and sine tables of RoPE.

    Args:
        rotary_dim: number of rotated channels per head (even).
        max_positions: number of positions (table rows).
        base: the base frequency ``theta``.
        device: where to build the tables (computed in float32).
        scaling: optional frequency scaling (:func:`rope_inv_freq`).

    Returns:
        ``(cos, sin)``, each float32 ``[max_positions, rotary_dim]``.

    Raises:
        ValueError: if ``rotary_dim`` is odd or not positive.
    """
    inv_freq = rope_inv_freq(rotary_dim, base, scaling, device=device)
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


def alibi_slopes(num_heads: int, device: torch.device | str | None = None) -> torch.Tensor:
    """ALiBi slopes for ``num_heads`` heads, float32 ``[num_heads]`` on ``device`` (None = default)."""

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
    return torch.tensor(slopes, dtype=torch.float32, device=device)


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
