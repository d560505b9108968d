"""QK-norm (``qk_layernorm``) and sliding-window attention (``sliding_window``) in the GPT model.

The logits against transformers' Qwen3 / Mistral / Qwen2 are in
``tests/convert/test_convert_hf_decoders.py``; here: the window's definition, the
short-sequence case, the KV cache, ALiBi with a window, and the options' checks.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from epochal.model import ConfigError, GPTModel, KVCache, ModelConfig

TOKENS = torch.randint(0, 50, (2, 13), generator=torch.Generator().manual_seed(2))


def tiny(**kw) -> ModelConfig:
    base = dict(
        vocab_size=50,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        num_query_groups=2,
        max_position_embeddings=24,
        position_embedding_type="rope",
        normalization="RMSNorm",
        activation="swiglu",
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    base.update(kw)
    return ModelConfig(**base)


def _same_weights(config: ModelConfig, model: GPTModel) -> GPTModel:
    other = GPTModel(config).eval()
    other.load_state_dict(model.state_dict())
    return other


def test_window_attention_equals_a_direct_computation():
    """One layer's output against softmax over keys i - w < j <= i, written out by hand."""
    cfg = tiny(sliding_window=4, num_layers=1)
    model = GPTModel(cfg, seed=1).eval()
    attn = model.layers["0"].attention
    x = torch.randn(1, 9, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = attn(x)
        q, k, v = attn._self_qkv(x, None)
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(cfg.head_dim)
        i = torch.arange(9)[:, None]
        j = torch.arange(9)[None, :]
        keep = (j <= i) & (j > i - 4)
        probs = scores.masked_fill(~keep, float("-inf")).softmax(-1)
        want = attn.wo((probs @ v).transpose(1, 2).reshape(1, 9, -1))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_sequence_within_the_window_attends_as_without_one():
    model = GPTModel(tiny(sliding_window=13), seed=4).eval()
    full = _same_weights(dataclasses.replace(model.config, sliding_window=None), model)
    with torch.no_grad():
        assert torch.equal(model(TOKENS), full(TOKENS))  # 13 tokens, window 13
        # one token more than the window: the first key drops out of the last query's view
        longer = torch.cat([TOKENS, TOKENS[:, :1]], dim=1)
        diff = (model(longer) - full(longer)).abs()
    assert diff[:, :13].max() < 1e-6 and diff[:, 13].max() > 1e-4


@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_window_with_kv_cache_equals_the_full_forward(pos):
    cfg = tiny(sliding_window=5, qk_layernorm=True, add_qkv_bias=True, position_embedding_type=pos)
    model = GPTModel(cfg, seed=3).eval()
    with torch.no_grad():
        full = model(TOKENS)
        cache = KVCache(max_length=16)
        pieces = [model(TOKENS[:, :7], kv_cache=cache), model(TOKENS[:, 7:10], kv_cache=cache)]
        pieces += [model(TOKENS[:, t : t + 1], kv_cache=cache) for t in range(10, 13)]
        nowindow = _same_weights(dataclasses.replace(cfg, sliding_window=None), model)(TOKENS)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)
    assert (nowindow - full).abs().max() > 1e-3


def test_qk_layernorm_parameters_names_and_init():
    model = GPTModel(tiny(qk_layernorm=True, kv_channels=12), seed=0)
    names = {n: p.shape for n, p in model.named_parameters() if "layernorm" in n}
    assert names == {
        f"layers.{i}.attention.{w}_layernorm.weight": torch.Size([12])
        for i in range(2)
        for w in ("q", "k")
    }
    assert all(torch.equal(p, torch.ones(12)) for n, p in model.named_parameters() if n in names)
    plain = GPTModel(tiny(kv_channels=12), seed=0)
    assert not any("layernorm" in n for n, _ in plain.named_parameters())
    # the norm acts: scaling a head's query weights changes nothing after it (RMSNorm is
    # scale-invariant), where the model without QK-norm changes
    for m, changes in ((model, False), (plain, True)):
        m.eval()
        with torch.no_grad():
            before = m(TOKENS)
            m.layers["0"].attention.wq.weight.mul_(3.0)
            after = m(TOKENS)
        assert ((after - before).abs().max() > 1e-3) == changes


@pytest.mark.parametrize(
    ("kw", "option"),
    [
        (dict(sliding_window=0), "sliding_window"),
        (dict(sliding_window=True), "sliding_window"),
        (dict(sliding_window=2.5), "sliding_window"),
        (dict(qk_layernorm="yes"), "qk_layernorm"),
        (
            dict(
                type="bert",
                qk_layernorm=True,
                position_embedding_type="learned_absolute",
                activation="gelu",
                normalization="LayerNorm",
            ),
            "qk_layernorm",
        ),
        (
            dict(
                type="bert",
                sliding_window=4,
                position_embedding_type="learned_absolute",
                activation="gelu",
                normalization="LayerNorm",
            ),
            "sliding_window",
        ),
    ],
)
def test_invalid_values_name_the_option(kw, option):
    with pytest.raises(ConfigError, match=f"^{option}:"):
        tiny(**kw)
