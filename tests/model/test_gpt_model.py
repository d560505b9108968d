"""GPTModel: shapes, causality for every position x attention variant, pipeline split, init."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from epochal.model import GPTModel, ModelConfig
from epochal.model.init import initial_value

POSITIONS = ["learned_absolute", "rope", "alibi", "none"]
GROUPS = {"mha": None, "mqa": 1, "gqa": 2}


def tiny(**kw) -> ModelConfig:
    base = dict(
        vocab_size=50,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=16,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    base.update(kw)
    return ModelConfig(**base)


@pytest.mark.parametrize(("pos", "attn"), list(itertools.product(POSITIONS, GROUPS)))
def test_shapes_and_causality(pos, attn):
    act = "swiglu" if attn == "gqa" else "gelu"
    norm = "RMSNorm" if attn == "mqa" else "LayerNorm"
    cfg = tiny(
        position_embedding_type=pos,
        num_query_groups=GROUPS[attn],
        activation=act,
        normalization=norm,
    )
    model = GPTModel(cfg, seed=1).eval()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (2, 12), generator=gen)
    with torch.no_grad():
        ref = model(tokens)
        assert ref.shape == (2, 12, cfg.padded_vocab_size) == (2, 12, 128)
        assert ref.dtype == torch.float32
        for t in (0, 5, 11):
            changed = tokens.clone()
            changed[:, t] = (changed[:, t] + 7) % cfg.vocab_size
            out = model(changed)
            torch.testing.assert_close(out[:, :t], ref[:, :t], rtol=0, atol=1e-6)
            assert not torch.allclose(out[:, t], ref[:, t])
        # An explicit Megatron-style mask equal to the causal mask changes nothing.
        mask = torch.ones(12, 12, dtype=torch.bool).triu(1)[None, None]
        torch.testing.assert_close(model(tokens, attention_mask=mask), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pos", POSITIONS)
def test_attention_mask_isolates_documents(pos):
    """Megatron's reset_attention_mask: tokens of doc 2 never see doc 1."""
    cfg = tiny(position_embedding_type=pos)
    model = GPTModel(cfg, seed=2).eval()
    tokens = torch.randint(0, cfg.vocab_size, (1, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(1, 1, 10, 10, dtype=torch.bool)
    mask[..., 4:, :4] = True  # documents [0, 4) and [4, 10)
    pos_ids = torch.cat([torch.arange(4), torch.arange(6)])[None]
    with torch.no_grad():
        out = model(tokens, position_ids=pos_ids, attention_mask=mask)
        alone = model(tokens[:, 4:])
    torch.testing.assert_close(out[:, 4:], alone, rtol=1e-5, atol=1e-5)


def test_sequence_too_long_is_an_error():
    model = GPTModel(tiny())
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("pos", ["learned_absolute", "rope", "alibi"])
@pytest.mark.parametrize("tied", [True, False])
def test_pipeline_split_composes_to_the_full_model(pos, tied):
    cfg = tiny(
        num_layers=4, position_embedding_type=pos, untie_embeddings_and_output_weights=not tied
    )
    full = GPTModel(cfg, seed=3).eval()
    first, last = copy.deepcopy(full), copy.deepcopy(full)
    first.norm = None
    first.output = None
    for k in ("2", "3"):
        del first.layers[k]
    last.tok_embeddings = None
    last.pos_embeddings = None
    for k in ("0", "1"):
        del last.layers[k]
    tokens = torch.randint(0, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        hidden = first(tokens)
        assert hidden.shape == (2, 8, cfg.hidden_size)
        torch.testing.assert_close(last(hidden), full(tokens), rtol=0, atol=0)
    # Stages built on their own from the same seed hold the same weights as the full model.
    stage = GPTModel(cfg, seed=3)
    stage.tok_embeddings = None
    del stage.layers["0"]
    stage.init_weights(seed=3)
    full_params = dict(full.named_parameters(remove_duplicate=False))
    for name, p in stage.named_parameters():
        assert torch.equal(p, full_params[name]), name


def test_tied_embeddings():
    model = GPTModel(tiny())
    assert model.output.weight is model.tok_embeddings.weight
    assert {"tok_embeddings.weight", "output.weight"} <= set(model.state_dict())
    names = [n for n, _ in model.named_parameters()]
    assert "output.weight" not in names
    untied = GPTModel(tiny(untie_embeddings_and_output_weights=True))
    assert untied.output.weight is not untied.tok_embeddings.weight


def test_init_megatron_statistics():
    cfg = tiny(hidden_size=64, num_layers=8, vocab_size=1000, init_method_std=0.02)
    model = GPTModel(cfg, seed=0)
    block = model.layers["3"]
    assert abs(block.attention.wq.weight.std().item() - 0.02) < 2e-3
    scaled = 0.02 / (2 * 8) ** 0.5
    assert abs(block.attention.wo.weight.std().item() - scaled) < 1e-3
    assert abs(block.mlp.fc2.weight.std().item() - scaled) < 1e-3
    assert abs(model.tok_embeddings.weight.std().item() - 0.02) < 1e-3
    assert torch.all(block.attention.wq.bias == 0) and torch.all(block.mlp.fc1.bias == 0)
    assert torch.all(block.attention_norm.weight == 1) and torch.all(model.norm.bias == 0)


def test_init_reproducible_and_device_independent():
    cfg = tiny(position_embedding_type="rope")
    a, b, c = GPTModel(cfg, seed=5), GPTModel(cfg, seed=5), GPTModel(cfg, seed=6)
    for (n, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), n
        if pa.dim() == 2:
            assert not torch.equal(pa, pc), n
    # Meta-device construction, then to_empty + init_weights, gives the same model.
    with torch.device("meta"):
        meta = GPTModel(cfg, seed=5)
    meta.to_empty(device="cpu")
    meta.init_weights(seed=5)
    assert meta.output.weight is meta.tok_embeddings.weight
    sd_a, sd_m = a.state_dict(), meta.state_dict()
    for k in sd_a:
        assert torch.equal(sd_a[k], sd_m[k]), k
    torch.testing.assert_close(meta.rope_cos, a.rope_cos)
    # The full value of a parameter is available for plans that shard it later.
    w = initial_value(
        cfg, "layers.1.attention.wk.weight", (cfg.num_kv_heads * cfg.head_dim, 32), seed=5
    )
    assert torch.equal(w, a.layers["1"].attention.wk.weight)
    # Wrapper components do not change the stream.
    w2 = initial_value(cfg, "layers.1._orig_mod.attention.wk.weight", w.shape, seed=5)
    assert torch.equal(w, w2)


def test_init_does_not_touch_global_rng():
    state = torch.get_rng_state()
    GPTModel(tiny(), seed=0)
    assert torch.equal(state, torch.get_rng_state())


def test_dropout_is_active_only_in_training():
    cfg = tiny(hidden_dropout=0.5, attention_dropout=0.5)
    model = GPTModel(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model.train()
    assert not torch.allclose(model(tokens), model(tokens))
    model.eval()
    torch.testing.assert_close(model(tokens), model(tokens), rtol=0, atol=0)


@pytest.mark.parametrize(
    "kw",
    [
        dict(position_embedding_type="learned_absolute", activation="gelu_tanh"),
        dict(
            position_embedding_type="rope",
            activation="swiglu",
            normalization="RMSNorm",
            num_query_groups=2,
        ),
    ],
)
def test_tiny_model_overfits_a_fixed_batch(kw):
    torch.manual_seed(0)
    cfg = tiny(**kw)
    model = GPTModel(cfg, seed=0)
    tokens = torch.randint(0, cfg.vocab_size, (4, 17), generator=torch.Generator().manual_seed(3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    first = None
    for _ in range(80):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert first > 3.0
    assert loss.item() < 0.1, loss.item()
