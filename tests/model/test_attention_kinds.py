"""Attention mask kinds (causal, bidirectional with padding, cross), model types and build_model."""

from __future__ import annotations

import math

import pytest
import torch

from epochal.model import Attention, BertModel, ConfigError, GPTModel, ModelConfig, build_model
from epochal.model.layers.attention import padding_attention_mask
from tests.model.test_gpt_model import tiny as cfg


def reference(attn: Attention, x, kv_in, keep) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) masked) v, in float64, one head at a time."""
    b, s, _ = x.shape
    hd = attn.head_dim
    q = attn.wq(x).double().view(b, s, -1, hd)
    k = attn.wk(kv_in).double().view(b, kv_in.shape[1], -1, hd)
    v = attn.wv(kv_in).double().view(b, kv_in.shape[1], -1, hd)
    rep = q.shape[2] // k.shape[2]
    out = torch.empty_like(q)
    for h in range(q.shape[2]):
        scores = q[:, :, h] @ k[:, :, h // rep].transpose(1, 2) / math.sqrt(hd)  # [b, s, s_k]
        scores = scores.masked_fill(~keep, float("-inf"))
        out[:, :, h] = scores.softmax(-1) @ v[:, :, h // rep]
    return attn.wo(out.reshape(b, s, -1).float())


@pytest.mark.parametrize("groups", [None, 2])
def test_bidirectional_with_padding_matches_reference(groups):
    torch.manual_seed(0)
    attn = Attention(cfg(type="bert", num_query_groups=groups))
    assert attn.mask_kind == "bidirectional"
    x = torch.randn(2, 6, 32)
    padding = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        got = attn(x, attention_mask=padding_attention_mask(padding))
        keep = padding.bool()[:, None, :].expand(2, 6, 6)
        want = reference(attn, x, x, keep)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        # the first query sees the last key (not causal) ...
        y = x.clone()
        y[0, -1] += 1.0
        assert not torch.allclose(attn(y)[0, 0], attn(x)[0, 0])
        # ... and padded keys have no effect on the real tokens
        y = x.clone()
        y[1, 4:] = torch.randn(2, 32)
        mask = padding_attention_mask(padding)
        torch.testing.assert_close(
            attn(y, attention_mask=mask)[1, :4], attn(x, attention_mask=mask)[1, :4]
        )


def test_gpt_attention_is_causal_by_default():
    attn = Attention(cfg())
    assert attn.mask_kind == "causal"
    x = torch.randn(1, 5, 32)
    with torch.no_grad():
        want = reference(attn, x, x, torch.ones(5, 5, dtype=torch.bool).tril()[None])
        torch.testing.assert_close(attn(x), want, atol=1e-5, rtol=1e-5)


def test_cross_attention_matches_reference_and_masks_context():
    torch.manual_seed(1)
    attn = Attention(cfg(type="bert"), mask_kind="cross")
    x, ctx = torch.randn(2, 3, 32), torch.randn(2, 7, 32)
    ctx_padding = torch.tensor([[1] * 7, [1, 1, 1, 0, 0, 0, 0]])
    mask = padding_attention_mask(ctx_padding)
    with torch.no_grad():
        got = attn(x, attention_mask=mask, context=ctx)
        assert got.shape == (2, 3, 32)
        keep = ctx_padding.bool()[:, None, :].expand(2, 3, 7)
        torch.testing.assert_close(got, reference(attn, x, ctx, keep), atol=1e-5, rtol=1e-5)
        other = ctx.clone()
        other[1, 3:] = 5.0
        torch.testing.assert_close(attn(x, attention_mask=mask, context=other)[1], got[1])


def test_attention_kind_errors():
    c = cfg(type="bert")
    with pytest.raises(ValueError, match="mask_kind"):
        Attention(c, mask_kind="sideways")
    with pytest.raises(ValueError, match="needs a context"):
        Attention(c, mask_kind="cross")(torch.randn(1, 2, 32))
    with pytest.raises(ValueError, match="takes no context"):
        Attention(c)(torch.randn(1, 2, 32), context=torch.randn(1, 2, 32))
    cos = torch.ones(1, 2, 8)
    with pytest.raises(ValueError, match="rotary"):
        Attention(c, mask_kind="cross")(
            torch.randn(1, 2, 32), rope=(cos, cos), context=torch.randn(1, 3, 32)
        )
    with pytest.raises(ValueError, match="ALiBi"):
        Attention(cfg(position_embedding_type="alibi"), mask_kind="bidirectional")
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        padding_attention_mask(torch.ones(3))


# ------------------------------------------------------------------- config type
def test_model_type_validation_names_the_option():
    with pytest.raises(ConfigError, match="^type:"):
        cfg(type="t9")
    with pytest.raises(ConfigError, match="^num_tokentypes:.*encoder option"):
        cfg(num_tokentypes=2)
    with pytest.raises(ConfigError, match="^transformer_block_type:"):
        cfg(type="bert", transformer_block_type="sandwich")
    with pytest.raises(ConfigError, match="^position_embedding_type:"):
        cfg(type="bert", position_embedding_type="alibi")
    with pytest.raises(ConfigError, match="^activation:"):
        cfg(type="bert", activation="swiglu")
    with pytest.raises(ConfigError, match="^token_dropout:"):
        cfg(type="bert", token_dropout=True, mask_token_id=3)
    with pytest.raises(ConfigError, match="^mask_token_id:"):
        cfg(type="esm", position_embedding_type="rope", token_dropout=True)
    with pytest.raises(ConfigError, match="^mask_token_id:"):
        cfg(type="esm", position_embedding_type="rope", mask_token_id=50)
    with pytest.raises(ConfigError, match="^pad_token_id:"):
        cfg(type="bert", pad_token_id=50)
    with pytest.raises(ConfigError, match="^pad_token_id:.*encoder option"):
        cfg(pad_token_id=0)
    with pytest.raises(ConfigError, match="^num_tokentypes:"):
        cfg(type="esm", position_embedding_type="rope", num_tokentypes=2)
    with pytest.raises(ConfigError, match="^transformer_block_type:"):
        cfg(type="esm", position_embedding_type="rope", transformer_block_type="post_ln")


def test_gpt_serialization_unchanged_and_old_dicts_load_as_gpt():
    gpt = cfg()
    d = gpt.to_dict()
    assert "type" not in d and "num_tokentypes" not in d and "token_dropout" not in d
    again = ModelConfig.from_dict(d)
    assert again == gpt and again.type == "gpt" and not again.is_encoder
    bert = cfg(type="bert", num_tokentypes=2, bert_binary_head=True)
    d = bert.to_dict()
    assert d["type"] == "bert" and d["num_tokentypes"] == 2
    assert ModelConfig.from_dict(d) == bert


def test_build_model_dispatches_on_type():
    assert type(build_model(cfg())) is GPTModel
    assert type(build_model(cfg(type="bert", num_tokentypes=2))) is BertModel
    esm = build_model(cfg(type="esm", position_embedding_type="rope"))
    assert type(esm) is BertModel and esm.tokentype_embeddings is None
    with pytest.raises(ValueError, match="model.type='gpt'"):
        GPTModel(cfg(type="bert"))
    with pytest.raises(ValueError, match="'bert' or 'esm'"):
        BertModel(cfg())
    # same seed -> same weights; GPT through build_model is GPTModel(config, seed)
    a, b = build_model(cfg(), seed=3), GPTModel(cfg(), seed=3)
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert na == nb and torch.equal(pa, pb)


def test_grouped_causal_attention_on_the_cpu_reads_kv_heads_without_repeating_them(monkeypatch):
    """The training path hands SDPA the grouped keys/values (``enable_gqa``), as transformers
    does; outputs equal the repeated-heads computation bit for bit, gradients to rounding."""
    import torch.nn.functional as F

    from epochal.model.layers import attention as attention_module

    config = ModelConfig(
        num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2,
        vocab_size=32, max_position_embeddings=16, attention_dropout=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    attn = Attention(config)
    x = torch.randn(2, 16, 64)
    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.shape[1], k.shape[1], kw.get("enable_gqa", False)))
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", spy)
    out = attn(x)
    assert seen == [(4, 2, True)]
    grads = torch.autograd.grad(out.square().sum(), list(attn.parameters()))
    monkeypatch.setattr(attention_module, "_native_gqa", lambda q, k: False)
    ref = attn(x)
    assert seen[-1] == (4, 4, False)
    ref_grads = torch.autograd.grad(ref.square().sum(), list(attn.parameters()))
    assert torch.equal(out, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
