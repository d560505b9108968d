"""RoPE and ALiBi against straightforward reference implementations (and Megatron-Core's RoPE)."""

from __future__ import annotations

import math

import pytest
import torch

from epochal.model import Attention, ModelConfig
from epochal.model.layers.positions import (
    RopeScaling,
    alibi_bias,
    alibi_slopes,
    apply_rotary,
    rope_cos_sin,
    rope_inv_freq,
)


def ref_rope(
    x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, base: float
) -> torch.Tensor:
    """Rotate channel pairs (i, i + r/2) of x [b, s, heads, d] by angle p * base^(-2i/r), one at a time."""
    out = x.clone().double()
    half = rotary_dim // 2
    for bi in range(x.shape[0]):
        for si in range(x.shape[1]):
            p = float(positions[bi, si])
            for i in range(half):
                theta = p * base ** (-2.0 * i / rotary_dim)
                c, s = math.cos(theta), math.sin(theta)
                a, b = x[bi, si, :, i].double(), x[bi, si, :, i + half].double()
                out[bi, si, :, i] = a * c - b * s
                out[bi, si, :, i + half] = b * c + a * s
    return out.to(x.dtype)


def ref_alibi_slopes(n: int) -> list[float]:
    """Press et al.'s reference get_slopes."""

    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return pow2(n)
    c = 2 ** math.floor(math.log2(n))
    return pow2(c) + ref_alibi_slopes(2 * c)[0::2][: n - c]


@pytest.mark.parametrize(("head_dim", "percent"), [(8, 1.0), (16, 0.5)])
def test_rope_matches_reference(head_dim, percent):
    r = int(head_dim * percent)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 3, head_dim, generator=gen)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 3, 9, 0, 11, 2]])
    cos, sin = rope_cos_sin(r, 12, base=500.0)
    ours = apply_rotary(x, cos[positions], sin[positions])
    torch.testing.assert_close(ours, ref_rope(x, positions, r, 500.0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[..., r:], x[..., r:], rtol=0, atol=0)


@pytest.mark.peer
def test_rope_matches_megatron_core():
    pytest.importorskip("megatron.core")
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    rope = RotaryEmbedding(
        kv_channels=16, rotary_percent=0.5, rotary_base=10000, use_cpu_initialization=True
    )
    freqs = rope.get_freqs_non_repeated(10)
    emb = torch.cat([freqs, freqs], dim=-1)[:, None, None, :]  # Megatron's non-interleaved layout
    x = torch.randn(10, 2, 3, 16, generator=torch.Generator().manual_seed(1))  # [s, b, heads, d]
    theirs = _apply_rotary_pos_emb_bshd(x, emb)
    cos, sin = rope_cos_sin(8, 10)
    ours = apply_rotary(x.transpose(0, 1), cos[None], sin[None]).transpose(0, 1)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


def ref_llama3_inv_freq(
    rotary_dim: int, base: float, factor: float, low: float, high: float, original: int
) -> list[float]:
    """Llama 3.1's frequency rule, one frequency at a time in float64 (Meta's apply_scaling)."""
    out = []
    for i in range(rotary_dim // 2):
        freq = base ** (-2.0 * i / rotary_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            out.append(freq)
        elif wavelen > original / low:
            out.append(freq / factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return out


# base 500, r = 16: wavelengths 6.3 .. 2e3 tokens; with original 64 and low/high 1/4 the
# thresholds are 16 and 64 tokens, so some frequencies are kept, some divided, some interpolated.
LLAMA3 = RopeScaling(
    type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=64
)


def test_rope_llama3_scaling_matches_reference():
    plain = rope_inv_freq(16, 500.0)
    ours = rope_inv_freq(16, 500.0, LLAMA3)
    ref = torch.tensor(ref_llama3_inv_freq(16, 500.0, 8.0, 1.0, 4.0, 64), dtype=torch.float64)
    torch.testing.assert_close(ours.double(), ref, rtol=1e-6, atol=0)
    ratio = plain / ours
    kept, divided = ratio == 1, (ratio - 8).abs() < 1e-5
    assert kept.any() and divided.any() and (~kept & ~divided).any()  # all three regimes
    # the tables rotate by the scaled frequencies
    cos, sin = rope_cos_sin(16, 40, 500.0, scaling=LLAMA3)
    angles = torch.outer(torch.arange(40, dtype=torch.float64), ref)
    torch.testing.assert_close(
        cos.double(), torch.cat([angles, angles], -1).cos(), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        sin.double(), torch.cat([angles, angles], -1).sin(), atol=1e-5, rtol=0
    )


def test_rope_linear_scaling_divides_positions():
    cos, sin = rope_cos_sin(8, 24, 500.0, scaling=RopeScaling(type="linear", factor=4.0))
    quarter = torch.arange(24, dtype=torch.float64) / 4  # position p is rotated as p / 4
    angles = torch.outer(quarter, rope_inv_freq(8, 500.0).double())
    emb = torch.cat([angles, angles], dim=-1)
    torch.testing.assert_close(cos.double(), emb.cos(), atol=1e-6, rtol=0)
    torch.testing.assert_close(sin.double(), emb.sin(), atol=1e-6, rtol=0)
    plain_cos, _ = rope_cos_sin(8, 24, 500.0)
    torch.testing.assert_close(cos[::4], plain_cos[:6], atol=1e-6, rtol=0)  # p = 4k acts as k


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(type="yarn", factor=2.0), "type"),
        (dict(type="linear", factor=0.0), "factor"),
        (dict(type="llama3", factor=8.0, low_freq_factor=4.0, high_freq_factor=4.0), "low_freq"),
        (dict(type="llama3", factor=8.0, original_max_positions=0), "original_max_positions"),
    ],
)
def test_rope_scaling_rejects_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        RopeScaling(**kw)


@pytest.mark.peer
@pytest.mark.parametrize(
    "params",
    [
        dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
        dict(
            rope_type="llama3",
            factor=32.0,
            low_freq_factor=2.0,
            high_freq_factor=8.0,
            original_max_position_embeddings=128,
        ),
        dict(rope_type="linear", factor=3.0),
    ],
)
def test_rope_scaling_equals_transformers_bit_for_bit(params):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        max_position_embeddings=256,
        rope_parameters={**params, "rope_theta": 500.0},
    )
    theirs, attention_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf, "cpu")
    assert attention_factor == 1.0
    scaling = RopeScaling(
        type=params["rope_type"],
        factor=params["factor"],
        low_freq_factor=params.get("low_freq_factor", 1.0),
        high_freq_factor=params.get("high_freq_factor", 4.0),
        original_max_positions=params.get("original_max_position_embeddings", 8192),
    )
    ours = rope_inv_freq(16, 500.0, scaling)
    assert not torch.equal(ours, rope_inv_freq(16, 500.0))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.peer
def test_rope_scaling_equals_megatron_core():
    pytest.importorskip("megatron.core")
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    # Megatron-Core's llama3 scaling: low 1, high 4, original 8192 (hard-coded); base 1e6 and
    # head_dim 16 put wavelengths on both sides of its 2048 / 8192 token thresholds.
    rope = RotaryEmbedding(
        kv_channels=16,
        rotary_percent=1.0,
        rotary_base=1000000,
        rope_scaling=True,
        rope_scaling_factor=8.0,
        use_cpu_initialization=True,
    )
    ours = rope_inv_freq(16, 1e6, RopeScaling(type="llama3", factor=8.0))
    assert not torch.equal(ours, rope_inv_freq(16, 1e6))
    torch.testing.assert_close(ours, rope.inv_freq, rtol=0, atol=0)
    # --rotary-seq-len-interpolation-factor multiplies positions by 1 / factor: our "linear"
    rope = RotaryEmbedding(
        kv_channels=16,
        rotary_percent=1.0,
        rotary_base=500,
        seq_len_interpolation_factor=4,
        use_cpu_initialization=True,
    )
    cos, _ = rope_cos_sin(16, 50, 500.0, scaling=RopeScaling(type="linear", factor=4.0))
    freqs = rope.get_freqs_non_repeated(50)
    torch.testing.assert_close(cos, torch.cat([freqs, freqs], -1).cos(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("n", [1, 2, 4, 6, 8, 12, 16])
def test_alibi_slopes(n):
    torch.testing.assert_close(
        alibi_slopes(n), torch.tensor(ref_alibi_slopes(n), dtype=torch.float32)
    )
    if n == 8:
        torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0**-k for k in range(1, 9)]))


def test_alibi_bias_values():
    slopes = torch.tensor([0.5, 0.25])
    bias = alibi_bias(slopes, 4)
    assert bias.shape == (1, 2, 4, 4)
    for h in range(2):
        for i in range(4):
            for j in range(4):
                expected = -float(slopes[h]) * (i - j) if j <= i else float("-inf")
                assert bias[0, h, i, j].item() == expected


def reference_attention(attn: Attention, cfg: ModelConfig, x: torch.Tensor) -> torch.Tensor:
    """Explicit scores + softmax + weighted sum, head by head, float64."""
    b, s, _ = x.shape
    hd, nh, ng = cfg.head_dim, cfg.num_attention_heads, cfg.num_kv_heads
    xd = x.double()

    def proj(lin):
        y = xd @ lin.weight.double().T
        return y + lin.bias.double() if lin.bias is not None else y

    q = proj(attn.wq).view(b, s, nh, hd)
    k = proj(attn.wk).view(b, s, ng, hd)
    v = proj(attn.wv).view(b, s, ng, hd)
    if cfg.position_embedding_type == "rope":
        pos = torch.arange(s).expand(b, s)
        q = ref_rope(q, pos, cfg.rotary_dim, cfg.rotary_base)
        k = ref_rope(k, pos, cfg.rotary_dim, cfg.rotary_base)
    slopes = ref_alibi_slopes(nh)
    out = torch.zeros(b, s, nh, hd, dtype=torch.float64)
    for h in range(nh):
        g = h // (nh // ng)
        scores = torch.einsum("bid,bjd->bij", q[:, :, h], k[:, :, g]) / math.sqrt(hd)
        for i in range(s):
            for j in range(s):
                if j > i:
                    scores[:, i, j] = float("-inf")
                elif cfg.position_embedding_type == "alibi":
                    scores[:, i, j] += slopes[h] * (j - i)
        out[:, :, h] = torch.softmax(scores, dim=-1) @ v[:, :, g]
    y = out.reshape(b, s, nh * hd) @ attn.wo.weight.double().T
    if attn.wo.bias is not None:
        y = y + attn.wo.bias.double()
    return y.float()


@pytest.mark.parametrize("pos", ["rope", "alibi", "none"])
@pytest.mark.parametrize("groups", [None, 1, 2])
def test_attention_matches_reference(pos, groups):
    cfg = ModelConfig(
        vocab_size=10,
        hidden_size=24,
        num_layers=1,
        num_attention_heads=4,
        num_query_groups=groups,
        kv_channels=6,
        max_position_embeddings=8,
        position_embedding_type=pos,
        attention_dropout=0.0,
        rotary_base=100.0,
    )
    torch.manual_seed(0)
    attn = Attention(cfg).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    x = torch.randn(2, 7, 24, generator=torch.Generator().manual_seed(4))
    rope = None
    if pos == "rope":
        cos, sin = rope_cos_sin(cfg.rotary_dim, 8, cfg.rotary_base)
        rope = (cos[None, :7], sin[None, :7])
    with torch.no_grad():
        ours = attn(x, rope)
    torch.testing.assert_close(ours, reference_attention(attn, cfg, x), rtol=1e-4, atol=1e-5)


def test_alibi_heads_slice_for_tensor_parallel_ranks():
    cfg = ModelConfig(
        vocab_size=10,
        hidden_size=32,
        num_layers=1,
        num_attention_heads=8,
        max_position_embeddings=8,
        position_embedding_type="alibi",
    )
    attn = Attention(cfg)
    attn.alibi_heads = slice(4, 8)
    attn.init_buffers()
    torch.testing.assert_close(attn.alibi_slopes, alibi_slopes(8)[4:])
