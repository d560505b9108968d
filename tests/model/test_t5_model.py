"""T5Model: logits equal Hugging Face T5 (v1.0 and v1.1) for the same weights; cache, masks, config."""

from __future__ import annotations

import pytest
import torch

from epochal.model import ModelConfig, T5Model, build_model
from epochal.model.config import ConfigError
from epochal.model.generation.kv_cache import KVCache
from epochal.model.layers.relative_bias import relative_position_bucket

transformers = pytest.importorskip("transformers")

VOCAB = 96


def hf_t5(version: str):
    """A tiny random Hugging Face T5 (v1.0: relu, tied; v1.1: gated-gelu, untied), eval mode."""
    v10 = version == "1.0"
    cfg = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=64,
        d_kv=16,
        d_ff=96,
        num_layers=2,
        num_decoder_layers=3,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
        dropout_rate=0.0,
        feed_forward_proj="relu" if v10 else "gated-gelu",
        tie_word_embeddings=v10,
        layer_norm_epsilon=1e-6,
        decoder_start_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # make the norms non-trivial
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def hf_scales_output(hf_model) -> bool:
    """Whether HF rescales the decoder output (transformers >= 5 names it separately)."""
    c = hf_model.config
    return bool(getattr(c, "scale_decoder_outputs", c.tie_word_embeddings))


def hf_tied(hf_model) -> bool:
    """Whether the HF head IS the shared embedding (transformers >= 5 always ties T5)."""
    return hf_model.lm_head.weight.data_ptr() == hf_model.shared.weight.data_ptr()


def our_config(hf_model) -> ModelConfig:
    c = hf_model.config
    return ModelConfig(
        type="t5",
        vocab_size=c.vocab_size,
        make_vocab_size_divisible_by=1,
        hidden_size=c.d_model,
        kv_channels=c.d_kv,
        ffn_hidden_size=c.d_ff,
        num_layers=c.num_layers,
        decoder_num_layers=c.num_decoder_layers,
        num_attention_heads=c.num_heads,
        max_position_embeddings=512,
        position_embedding_type="relative",
        relative_attention_num_buckets=c.relative_attention_num_buckets,
        relative_attention_max_distance=c.relative_attention_max_distance,
        normalization="RMSNorm",
        norm_epsilon=c.layer_norm_epsilon,
        activation="gated_gelu" if c.is_gated_act else "relu",
        add_bias_linear=False,
        softmax_scale=1.0,
        untie_embeddings_and_output_weights=not hf_tied(hf_model),
        scale_decoder_output=hf_scales_output(hf_model),
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def copy_hf_weights(hf_model, model: T5Model) -> None:
    """Test-local name mapping (the converter in epochal.convert is tested on its own)."""
    sd = hf_model.state_dict()
    c = hf_model.config
    n_enc = c.num_layers
    ours: dict[str, torch.Tensor] = {"tok_embeddings.weight": sd["shared.weight"]}
    ours["encoder_relative_bias.weight"] = sd[
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    ]
    ours["decoder_relative_bias.weight"] = sd[
        "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    ]
    ours["encoder_norm.weight"] = sd["encoder.final_layer_norm.weight"]
    ours["decoder_norm.weight"] = sd["decoder.final_layer_norm.weight"]
    if not hf_tied(hf_model):
        ours["output.weight"] = sd["lm_head.weight"]

    def mlp(src: str, dst: str) -> None:
        if c.is_gated_act:
            ours[f"{dst}.mlp.w1.weight"] = sd[f"{src}.DenseReluDense.wi_0.weight"]
            ours[f"{dst}.mlp.w3.weight"] = sd[f"{src}.DenseReluDense.wi_1.weight"]
            ours[f"{dst}.mlp.w2.weight"] = sd[f"{src}.DenseReluDense.wo.weight"]
        else:
            ours[f"{dst}.mlp.fc1.weight"] = sd[f"{src}.DenseReluDense.wi.weight"]
            ours[f"{dst}.mlp.fc2.weight"] = sd[f"{src}.DenseReluDense.wo.weight"]
        ours[f"{dst}.ffn_norm.weight"] = sd[f"{src}.layer_norm.weight"]

    for i in range(n_enc):
        src, dst = f"encoder.block.{i}.layer", f"layers.{i}"
        for x in "qkvo":
            ours[f"{dst}.attention.w{x}.weight"] = sd[f"{src}.0.SelfAttention.{x}.weight"]
        ours[f"{dst}.attention_norm.weight"] = sd[f"{src}.0.layer_norm.weight"]
        mlp(f"{src}.1", dst)
    for j in range(c.num_decoder_layers):
        src, dst = f"decoder.block.{j}.layer", f"layers.{n_enc + j}"
        for x in "qkvo":
            ours[f"{dst}.attention.w{x}.weight"] = sd[f"{src}.0.SelfAttention.{x}.weight"]
            ours[f"{dst}.cross_attention.w{x}.weight"] = sd[f"{src}.1.EncDecAttention.{x}.weight"]
        ours[f"{dst}.attention_norm.weight"] = sd[f"{src}.0.layer_norm.weight"]
        ours[f"{dst}.cross_attention_norm.weight"] = sd[f"{src}.1.layer_norm.weight"]
        mlp(f"{src}.2", dst)
    missing, unexpected = model.load_state_dict(ours, strict=False)
    assert not unexpected
    assert set(missing) <= {"output.weight"}  # tied


def _inputs():
    g = torch.Generator().manual_seed(1)
    enc = torch.randint(2, VOCAB, (3, 11), generator=g)
    dec = torch.randint(2, VOCAB, (3, 7), generator=g)
    enc_mask = torch.ones(3, 11, dtype=torch.long)
    enc_mask[1, 8:] = 0
    enc_mask[2, 4:] = 0
    dec_mask = torch.ones(3, 7, dtype=torch.long)
    dec_mask[2, 5:] = 0
    return enc, dec, enc_mask, dec_mask


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_logits_equal_hugging_face_t5(version: str) -> None:
    hf = hf_t5(version)
    model = build_model(our_config(hf)).eval()
    copy_hf_weights(hf, model)
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
