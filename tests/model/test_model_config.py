"""ModelConfig: derived sizes and validation errors that name the option."""

from __future__ import annotations

import pytest

from epochal.model import ConfigError, ModelConfig

BASE = dict(
    vocab_size=50257,
    hidden_size=768,
    num_layers=12,
    num_attention_heads=12,
    max_position_embeddings=1024,
)


def test_derived_sizes():
    cfg = ModelConfig(**BASE)
    assert cfg.padded_vocab_size == 50304
    assert cfg.head_dim == 64 and cfg.num_kv_heads == 12 and cfg.ffn_size == 3072
    assert ModelConfig(**BASE, make_vocab_size_divisible_by=1).padded_vocab_size == 50257
    swiglu = ModelConfig(**BASE, activation="swiglu")
    assert swiglu.ffn_size == int(4 * 768 * 2 / 3 / 64) * 64 == 2048
    assert ModelConfig(**BASE, num_query_groups=4).num_kv_heads == 4
    assert ModelConfig(**BASE, kv_channels=32).head_dim == 32
    assert ModelConfig(**BASE, position_embedding_type="rope", rotary_percent=0.5).rotary_dim == 32
    assert ModelConfig(**BASE, add_bias_linear=False).qkv_bias is False
    assert ModelConfig(**BASE, add_bias_linear=False, add_qkv_bias=True).qkv_bias is True
    assert ModelConfig.from_dict(ModelConfig(**BASE).to_dict()) == ModelConfig(**BASE)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("vocab_size", 0),
        ("hidden_size", -1),
        ("num_layers", 1.5),
        ("num_attention_heads", 7),  # does not divide 768
        ("num_query_groups", 5),
        ("num_query_groups", 0),
        ("kv_channels", 0),
        ("ffn_hidden_size", 0),
        ("position_embedding_type", "sinusoidal"),
        ("normalization", "BatchNorm"),
        ("activation", "relu6"),
        ("rotary_base", 0.0),
        ("rotary_percent", 1.5),
        ("norm_epsilon", 0.0),
        ("hidden_dropout", 1.0),
        ("attention_dropout", -0.1),
        ("init_method_std", 0.0),
        ("add_bias_linear", "yes"),
        ("make_vocab_size_divisible_by", 0),
    ],
)
def test_invalid_values_name_the_option(option, value):
    with pytest.raises(ConfigError) as info:
        ModelConfig(**{**BASE, option: value})
    assert info.value.option == option
    assert str(info.value).startswith(option)
    assert isinstance(info.value, ValueError)


ROPE = dict(BASE, position_embedding_type="rope")


@pytest.mark.parametrize(
    ("option", "values"),
    [
        ("rope_scaling_type", dict(rope_scaling_type="yarn")),
        ("rope_scaling_type", dict(rope_scaling_type="dynamic", rope_scaling_factor=2.0)),
        ("rope_scaling_factor", dict(rope_scaling_type="llama3", rope_scaling_factor=0.0)),
        ("rope_scaling_factor", dict(rope_scaling_type="linear", rope_scaling_factor=-2.0)),
        ("rope_scaling_factor", dict(rope_scaling_factor=float("nan"))),
        ("rope_low_freq_factor", dict(rope_scaling_type="llama3", rope_low_freq_factor=0.0)),
        ("rope_high_freq_factor", dict(rope_scaling_type="llama3", rope_high_freq_factor=1.0)),
        (
            "rope_high_freq_factor",
            dict(rope_scaling_type="llama3", rope_low_freq_factor=5.0),  # > high (4)
        ),
        (
            "rope_original_max_position_embeddings",
            dict(rope_scaling_type="llama3", rope_original_max_position_embeddings=0),
        ),
        (
            "rope_original_max_position_embeddings",
            dict(rope_scaling_type="llama3", rope_original_max_position_embeddings=8192.0),
        ),
    ],
)
def test_invalid_rope_scaling_names_the_option(option, values):
    with pytest.raises(ConfigError) as info:
        ModelConfig(**ROPE, **values)
    assert info.value.option == option, str(info.value)


def test_rope_scaling_needs_rope_positions():
    ModelConfig(**ROPE, rope_scaling_type="llama3", rope_scaling_factor=8.0)
    ModelConfig(**ROPE, rope_scaling_type="linear", rope_scaling_factor=2.0)
    with pytest.raises(
        ConfigError, match="rope_scaling_type: needs position_embedding_type='rope'"
    ):
        ModelConfig(**BASE, rope_scaling_type="linear", rope_scaling_factor=2.0)


def test_odd_rotary_dim_is_rejected():
    with pytest.raises(ConfigError, match="rotary_percent"):
        ModelConfig(**BASE, kv_channels=6, position_embedding_type="rope", rotary_percent=0.5)


def test_unknown_key():
    with pytest.raises(ConfigError, match="hiden_size"):
        ModelConfig.from_dict({**BASE, "hiden_size": 3})
    err = ConfigError("hidden_size", "bad").with_prefix("model")
    assert err.option == "model.hidden_size" and str(err) == "model.hidden_size: bad"
