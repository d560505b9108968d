"""The model's KV-cache hook: incremental decoding equals the full forward."""

from __future__ import annotations

import itertools

import pytest
import torch

from epochal.model import GPTModel, KVCache, ModelConfig

POSITIONS = ["learned_absolute", "rope", "alibi", "none"]
GROUPS = {"mha": None, "mqa": 1, "gqa": 2}


def tiny(**kw) -> ModelConfig:
    base = dict(
        vocab_size=50,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=24,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    base.update(kw)
    return ModelConfig(**base)


@pytest.mark.parametrize(("pos", "attn"), list(itertools.product(POSITIONS, GROUPS)))
def test_incremental_decoding_matches_full_forward(pos, attn):
    cfg = tiny(position_embedding_type=pos, num_query_groups=GROUPS[attn])
    model = GPTModel(cfg, seed=3).eval()
    tokens = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache(max_length=16)
        pieces = [model(tokens[:, :5], kv_cache=cache)]  # prefill
        assert cache.length == 5
        pieces.append(model(tokens[:, 5:8], kv_cache=cache))  # a chunk of 3
        for t in range(8, 11):  # then one token at a time
            pieces.append(model(tokens[:, t : t + 1], kv_cache=cache))
        assert cache.length == 11
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_cache_with_left_padding_mask_and_positions(pos):
    """A left-padded row with explicit positions and a key mask equals the unpadded row."""
    cfg = tiny(position_embedding_type=pos, num_query_groups=2)
    model = GPTModel(cfg, seed=4).eval()
    row = torch.randint(0, cfg.vocab_size, (1, 7), generator=torch.Generator().manual_seed(2))
    pad = 3
    padded = torch.cat([torch.zeros(1, pad, dtype=torch.long), row], dim=1)
    valid = torch.arange(pad + 7) >= pad
    positions = (torch.arange(pad + 7) - pad).clamp(min=0)[None]
    with torch.no_grad():
        ref = model(row)
        cache = KVCache(max_length=pad + 7)
        s0 = pad + 4
        mask = (~valid[None, None, None, :s0]).expand(1, 1, s0, s0).clone()
        mask[..., torch.arange(s0), torch.arange(s0)] = False  # pad queries see themselves
        first = model(padded[:, :s0], positions[:, :s0], mask, kv_cache=cache)
        outs = [first[:, pad:]]
        for t in range(s0, pad + 7):
            step_mask = ~valid[None, None, None, : t + 1]
            outs.append(
                model(padded[:, t : t + 1], positions[:, t : t + 1], step_mask, kv_cache=cache)
            )
    torch.testing.assert_close(torch.cat(outs, dim=1), ref, rtol=1e-5, atol=1e-5)


def test_logits_to_keep_and_overflow():
    cfg = tiny(position_embedding_type="rope")
    model = GPTModel(cfg, seed=0).eval()
    tokens = torch.randint(0, cfg.vocab_size, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(tokens)
        last = model(tokens, logits_to_keep=1)
        assert last.shape == (1, 1, cfg.padded_vocab_size)
        torch.testing.assert_close(last, full[:, -1:], rtol=1e-6, atol=1e-6)
        cache = KVCache(max_length=6)
        model(tokens, kv_cache=cache)
        with pytest.raises(ValueError, match="KV cache overflow"):
            model(tokens[:, :1], kv_cache=cache)
        big = KVCache(max_length=40)
        model(torch.zeros(1, 20, dtype=torch.long), kv_cache=big)
        with pytest.raises(ValueError, match="max_position_embeddings"):
            model(torch.zeros(1, 5, dtype=torch.long), kv_cache=big)


def test_cache_reorder_selects_rows():
    cfg = tiny(position_embedding_type="rope")
    model = GPTModel(cfg, seed=0).eval()
    tokens = torch.randint(0, cfg.vocab_size, (3, 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = model(tokens[[2, 2, 0]])
        cache = KVCache(max_length=6)
        model(tokens[:, :4], kv_cache=cache)
        cache.reorder(torch.tensor([2, 2, 0]))
        out = model(tokens[[2, 2, 0], 4:], kv_cache=cache)
    torch.testing.assert_close(out, ref[:, 4:], rtol=1e-5, atol=1e-5)
