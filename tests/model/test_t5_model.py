"""T5Model: logits equal Hugging Face T5 (v1.0 and v1.1) for the same weights; cache, masks, config.

The weights go through :mod:`epochal.formats.hf.t5`'s in-memory functions; the
file round trips are in ``tests/convert/test_convert_hf_t5.py``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from epochal.formats.hf.t5 import ours_config_from_t5, ours_state_from_t5
from epochal.model import ModelConfig, T5Model, build_model
from epochal.model.config import ConfigError
from epochal.model.generation.kv_cache import KVCache
from epochal.model.layers.relative_bias import relative_position_bucket
from tests.convert.hf_models import hf_t5, t5_inputs

transformers = pytest.importorskip("transformers")

VOCAB = 96


def from_hf(hf_model) -> T5Model:
    """Our model with ``hf_model``'s weights (through the converter's in-memory functions)."""
    weights = hf_model.state_dict()
    config = ours_config_from_t5(hf_model.config.to_dict(), weights, make_vocab_size_divisible_by=1)
    model = build_model(dataclasses.replace(config, hidden_dropout=0.0, attention_dropout=0.0))
    model.load_state_dict(ours_state_from_t5(weights, config), strict=True)
    return model.eval()


def _inputs():
    return t5_inputs(VOCAB)


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_logits_equal_hugging_face_t5(version: str) -> None:
    hf = hf_t5(version, vocab=VOCAB)
    model = from_hf(hf)
    enc, dec, enc_mask, dec_mask = _inputs()
    with torch.no_grad():
        ref = hf(
            input_ids=enc,
            attention_mask=enc_mask,
            decoder_input_ids=dec,
            decoder_attention_mask=dec_mask,
        ).logits
        ours = model(enc, dec, enc_mask, dec_mask)
    assert ours.shape == (3, 7, VOCAB)
    real = dec_mask.bool()  # HF's padded decoder queries still attend; compare real ones
    torch.testing.assert_close(ours[real], ref[real], atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        enc_out = model.encode(enc, enc_mask)
        ref_enc = hf.encoder(input_ids=enc, attention_mask=enc_mask).last_hidden_state
    keep = enc_mask.bool()
    torch.testing.assert_close(enc_out[keep], ref_enc[keep], atol=1e-4, rtol=1e-4)


def test_relative_buckets_equal_hugging_face() -> None:
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(-300, 300)[None, :] - torch.arange(0, 40)[:, None]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 20), (4, 7)):
            ref = T5Attention._relative_position_bucket(
                rel, bidirectional=bidirectional, num_buckets=buckets, max_distance=distance
            )
            ours = relative_position_bucket(
                rel, bidirectional=bidirectional, num_buckets=buckets, max_distance=distance
            )
            assert torch.equal(ours, ref)


def _megatron_style_config(**overrides) -> ModelConfig:
    values = dict(
        type="t5",
        vocab_size=100,
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
        output_bias=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    values.update(overrides)
    return ModelConfig(**values)


@pytest.mark.parametrize("positions", ["learned_absolute", "relative"])
def test_kv_cache_decoding_equals_full_decode(positions: str) -> None:
    model = build_model(_megatron_style_config(position_embedding_type=positions)).eval()
    enc, dec, enc_mask, _ = _inputs()
    with torch.no_grad():
        memory = model.encode(enc, enc_mask)
        full = model.decode(dec, memory, enc_mask)
        cache = KVCache(dec.shape[1])
        steps = [model.decode(dec[:, :3], memory, enc_mask, kv_cache=cache)]
        for t in range(3, dec.shape[1]):
            steps.append(model.decode(dec[:, t : t + 1], memory, enc_mask, kv_cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_padding_and_causality_hide_what_they_should() -> None:
    model = build_model(_megatron_style_config(position_embedding_type="relative")).eval()
    enc, dec, enc_mask, _ = _inputs()
    with torch.no_grad():
        base = model(enc, dec, enc_mask)
        enc2 = enc.clone()
        enc2[enc_mask == 0] = 5  # change padded encoder tokens only
        dec2 = dec.clone()
        dec2[:, 5:] = 7  # change future decoder tokens only
        other = model(enc2, dec2, enc_mask)
    torch.testing.assert_close(other[:, :5], base[:, :5])
    assert not torch.allclose(other[:, 5:], base[:, 5:])


def test_megatron_style_model_trains_and_ties() -> None:
    model = build_model(_megatron_style_config(), seed=3)
    assert isinstance(model, T5Model)
    assert model.output.weight is model.tok_embeddings.weight
    assert model.output.bias is not None and model.output.bias.shape == (128,)
    assert len(model.encoder_blocks()) == 2 and len(model.decoder_blocks()) == 2
    enc, dec, enc_mask, dec_mask = _inputs()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(5):
        logits = model(enc, dec, enc_mask, dec_mask)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), dec.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    again = build_model(_megatron_style_config(), seed=3)
    fresh = build_model(_megatron_style_config(), seed=3)
    torch.testing.assert_close(again.state_dict(), fresh.state_dict())


def test_encoder_and_decoder_depths_and_sequence_limit() -> None:
    config = _megatron_style_config(encoder_num_layers=3, decoder_num_layers=1)
    model = build_model(config)
    assert len(model.encoder_blocks()) == 3 and len(model.decoder_blocks()) == 1
    assert [b.layer_id for b in model.decoder_blocks()] == [3]
    with pytest.raises(ValueError, match="max_position_embeddings=32"):
        model(torch.zeros(1, 33, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long))


@pytest.mark.parametrize(
    ("values", "option"),
    [
        (dict(type="gpt", position_embedding_type="relative"), "position_embedding_type"),
        (dict(type="gpt", output_bias=True), "output_bias"),
        (dict(type="bert", decoder_num_layers=2), "decoder_num_layers"),
        (dict(type="gpt", activation="gated_gelu"), "activation"),
        (dict(type="t5", relative_attention_num_buckets=7), "relative_attention_num_buckets"),
        (dict(type="t5", position_embedding_type="rope"), "position_embedding_type"),
        (dict(type="t5", softmax_scale=0.0), "softmax_scale"),
        (dict(type="t5", encoder_num_layers=0), "encoder_num_layers"),
        (dict(type="t5", num_tokentypes=2), "num_tokentypes"),
    ],
)
def test_invalid_t5_options_name_the_option(values: dict, option: str) -> None:
    base = dict(vocab_size=100, hidden_size=64, num_layers=2, num_attention_heads=4)
    base["max_position_embeddings"] = 32
    with pytest.raises(ConfigError) as err:
        ModelConfig(**base, **values)
    assert err.value.option == option


def test_other_types_serialize_without_t5_fields() -> None:
    gpt = ModelConfig(
        vocab_size=100,
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
    )
    assert "output_bias" not in gpt.to_dict() and "type" not in gpt.to_dict()
    t5 = _megatron_style_config(decoder_num_layers=3)
    assert ModelConfig.from_dict(t5.to_dict()) == t5
    with pytest.raises(ValueError, match="model.type='t5'"):
        T5Model(gpt)


def test_a_gpt_checkpoint_is_refused_for_a_t5_config(tmp_path) -> None:
    """The trainer's checkpoint check names the model type found and the one configured."""
    from epochal.train.state.checkpoint import CheckpointError
    from epochal.train.state.run_checkpointer import check_model_config

    gpt = ModelConfig(
        vocab_size=100,
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
    )
    t5 = _megatron_style_config()
    with pytest.raises(CheckpointError, match="holds a 'gpt' model.*model.type='t5'"):
        check_model_config(t5, tmp_path, {"model_config": gpt.to_dict()})
    with pytest.raises(CheckpointError, match="holds a 't5' model.*model.type='gpt'"):
        check_model_config(gpt, tmp_path, {"model_config": t5.to_dict()})
    check_model_config(t5, tmp_path, {"model_config": t5.to_dict()})  # same: fine
