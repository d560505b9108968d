"""BertModel (BERT pre-/post-LN, ESM-2): shapes, heads, padding, token_dropout, pipeline stages, init."""

from __future__ import annotations

import copy

import pytest
import torch

from epochal.model import BertModel, ModelConfig, build_model
from epochal.model.bert import ESM_MASK_RATIO_TRAIN


def bert_cfg(**kw) -> ModelConfig:
    base = dict(
        type="bert",
        vocab_size=60,
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
        num_tokentypes=2,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        norm_epsilon=1e-12,
    )
    base.update(kw)
    return ModelConfig(**base)


def esm_cfg(**kw) -> ModelConfig:
    base = dict(
        type="esm",
        position_embedding_type="rope",
        num_tokentypes=0,
        token_dropout=True,
        mask_token_id=32,
        vocab_size=33,
    )
    base.update(kw)
    return bert_cfg(**base)


def batch(vocab=60, b=3, s=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (b, s), generator=g)
    types = torch.randint(0, 2, (b, s), generator=g)
    padding = torch.ones(b, s, dtype=torch.long)
    padding[1, 20:] = 0
    return tokens, types, padding


@pytest.mark.parametrize("block", ["pre_ln", "post_ln"])
def test_bert_forward_shapes_and_names(block):
    config = bert_cfg(transformer_block_type=block, bert_binary_head=True)
    model = build_model(config, seed=1).eval()
    names = set(model.state_dict())
    assert {"tokentype_embeddings.weight", "lm_head.dense.weight", "lm_head.norm.weight"} <= names
    assert {"lm_head.bias", "output.weight", "pooler.dense.weight", "binary_head.weight"} <= names
    assert ("norm.weight" in names) == (block == "pre_ln")
    assert ("embedding_norm.weight" in names) == (block == "post_ln")
    assert model.output.weight is model.tok_embeddings.weight
    tokens, types, padding = batch()
    with torch.no_grad():
        mlm, binary = model(tokens, token_types=types, padding_mask=padding)
    assert mlm.shape == (3, 32, config.padded_vocab_size) and binary.shape == (3, 2)
    # token types matter; without a binary head the model returns the logits alone
    no_head = build_model(bert_cfg(transformer_block_type=block), seed=1).eval()
    with torch.no_grad():
        alone = no_head(tokens, token_types=types, padding_mask=padding)
        assert torch.equal(alone, mlm)
        assert not torch.allclose(no_head(tokens, padding_mask=padding), alone)


def test_lm_head_matches_hand_computation():
    model = build_model(bert_cfg(activation="gelu_tanh"), seed=2).eval()
    tokens, types, _ = batch()
    with torch.no_grad():
        h = model.embed(tokens, torch.arange(32)[None], types, None)
        for layer in model.layers.values():
            h = layer(h)
        h = model.norm(h)
        x = torch.nn.functional.gelu(model.lm_head.dense(h), approximate="tanh")
        x = torch.nn.functional.layer_norm(
            x, (64,), model.lm_head.norm.weight, model.lm_head.norm.bias, 1e-12
        )
        want = x @ model.tok_embeddings.weight.T + model.lm_head.bias
        torch.testing.assert_close(model(tokens, token_types=types), want)


@pytest.mark.parametrize("make", [bert_cfg, esm_cfg])
def test_padding_does_not_change_real_tokens(make):
    config = make()
    model = build_model(config, seed=3).eval()
    vocab = 32  # no ESM mask token (Hugging Face counts masks in the padding too)
    tokens, _, padding = batch(vocab=vocab)
    other = tokens.clone()
    other[1, 20:] = (tokens[1, 20:] + 1) % vocab
    with torch.no_grad():
        a = model(tokens, padding_mask=padding)
        b = model(other, padding_mask=padding)
    torch.testing.assert_close(a[1, :20], b[1, :20])
    torch.testing.assert_close(a[0], b[0])
    # and a padded sequence equals the same real tokens alone
    with torch.no_grad():
        alone = model(tokens[1:2, :20])
    torch.testing.assert_close(a[1:2, :20], alone, atol=1e-5, rtol=1e-5)


def test_esm_token_dropout_rescales_embeddings():
    config = esm_cfg()
    model = build_model(config, seed=4).eval()
    tokens, _, padding = batch(vocab=32)  # no mask token yet
    tokens[0, :4] = 32  # 4 masks in 32 real tokens
    tokens[1, :5] = 32  # 5 masks in 20 real tokens
    pos = torch.arange(32)[None]
    with torch.no_grad():
        got = model.embed(tokens, pos, None, padding)
        emb = model.tok_embeddings(tokens)
        observed = torch.tensor([4 / 32, 5 / 20, 0.0])
        scale = (1 - ESM_MASK_RATIO_TRAIN) / (1 - observed)
        want = emb * scale[:, None, None] * (tokens != 32)[..., None] * padding[..., None]
    torch.testing.assert_close(got, want)
    assert model.pos_embeddings is None and model.embedding_norm is None
    # same in training mode (HF applies it at train and eval) and ESM has no embedding dropout
    model.train()
    with torch.no_grad():
        torch.testing.assert_close(model.embed(tokens, pos, None, padding), want)
    with pytest.raises(ValueError, match="no token types"):
        model(tokens, token_types=torch.zeros_like(tokens))


@pytest.mark.parametrize("make", [bert_cfg, esm_cfg])
def test_pipeline_stages_compose_to_the_full_model(make):
    config = make(bert_binary_head=make is bert_cfg)
    full = build_model(config, seed=5).eval()
    first, last = copy.deepcopy(full), copy.deepcopy(full)
    del first.layers["1"]
    for name in BertModel.LAST_STAGE_MODULES:
        setattr(first, name, None)
    del last.layers["0"]
    for name in BertModel.FIRST_STAGE_MODULES:
        setattr(last, name, None)
    # every parameter belongs to exactly one stage (the tied decoder is the last stage's copy)
    first_names = {n for n, _ in first.named_parameters()}
    last_names = {n for n, _ in last.named_parameters()}
    assert not first_names & last_names
    assert first_names | last_names == {n for n, _ in full.named_parameters()} | {"output.weight"}
    tokens, types, padding = batch(vocab=32)
    types = types if config.num_tokentypes else None
    with torch.no_grad():
        want = full(tokens, token_types=types, padding_mask=padding)
        hidden = first(tokens, token_types=types, padding_mask=padding)
        assert hidden.shape == (3, 32, 64)
        got = last(hidden, padding_mask=padding)
    if isinstance(want, tuple):
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    else:
        assert torch.equal(got, want)


def test_init_is_seeded_and_meta_construction_matches():
    config = bert_cfg(bert_binary_head=True)
    a, b = BertModel(config, seed=7), BertModel(config, seed=7)
    with torch.device("meta"):
        c = BertModel(config)
    c.to_empty(device="cpu")
    c.init_weights(seed=7)
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]) and torch.equal(
            tensor, c.state_dict()[name]
        )
    assert not torch.equal(
        a.tokentype_embeddings.weight, BertModel(config, seed=8).tokentype_embeddings.weight
    )
    assert torch.all(a.lm_head.bias == 0) and torch.all(a.lm_head.norm.weight == 1)
    assert c.output.weight is c.tok_embeddings.weight
    excluded = a.num_parameters() - a.num_parameters(exclude_embeddings=True)
    assert excluded == sum(
        m.weight.numel() for m in (a.tok_embeddings, a.pos_embeddings, a.tokentype_embeddings)
    )


def test_training_mode_dropout_and_backward():
    model = build_model(bert_cfg(hidden_dropout=0.1, attention_dropout=0.1), seed=9).train()
    tokens, types, padding = batch()
    logits = model(tokens, token_types=types, padding_mask=padding)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    loss.backward()
    assert model.tokentype_embeddings.weight.grad.abs().sum() > 0
    assert model.lm_head.bias.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.zeros(1, 33, dtype=torch.long))


@pytest.mark.parametrize("make", [bert_cfg, esm_cfg])
def test_flops_count_every_per_token_matmul(make):
    from epochal.model.flops import matmul_parameters

    model = build_model(make(bert_binary_head=False))
    per_token = [
        p.numel()
        for name, p in model.named_parameters()
        if p.dim() == 2 and not name.endswith("embeddings.weight")
    ]
    # the tied decoder is tok_embeddings.weight: counted once, as the head
    assert matmul_parameters(model.config) == sum(per_token) + model.output.weight.numel()
