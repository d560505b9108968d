"""Hugging Face's classifier heads on epochal's models: pooling, transforms, configuration checks."""

from __future__ import annotations

import pytest
import torch

from epochal.model import build_model
from epochal.model.config import ConfigError, ModelConfig

GPT = dict(
    type="gpt",
    vocab_size=101,
    hidden_size=64,
    num_layers=2,
    num_attention_heads=4,
    max_position_embeddings=32,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)


def test_pooled_classifier_reads_exactly_the_marked_position() -> None:
    model = build_model(
        ModelConfig(
            **GPT, head="pooled_classifier", num_labels=3, head_bias=False, head_dropout=0.0
        ),
        seed=1,
    ).eval()
    assert model.output is None and model.head.dense is None and model.head.out.bias is None
    tokens = torch.randint(0, 101, (2, 10))
    positions = torch.zeros(2, 10, dtype=torch.long)
    positions[0, 6], positions[1, 9] = 1, 1
    token_model = build_model(
        ModelConfig(
            **GPT, head="token_classifier", num_labels=3, head_bias=False, head_dropout=0.0
        ),
        seed=1,
    ).eval()
    hidden = []
    token_model.head.register_forward_hook(lambda _m, args, _out: hidden.append(args[0]))
    rows = (torch.arange(2), torch.tensor([6, 9]))
    with torch.no_grad():
        pooled = model(tokens, residue_mask=positions)
        every = token_model(tokens)
        # the token model's classifier on the marked rows alone: a [2, h] x [h, 3] product,
        # the pooled head's own shape, so the bits must agree
        marked = token_model.head.out(hidden[0][rows])
    assert pooled.shape == (2, 3) and every.shape == (2, 10, 3)
    # same weights (same seed and names): the pooled logits are that position's logits, exactly
    assert torch.equal(pooled, marked)
    # against the [2, 10, h] x [h, 3] product only within float32 rounding: BLAS picks its
    # kernel (and so its summation order) by shape, e.g. on AVX-512 CPUs
    torch.testing.assert_close(pooled, every[rows], rtol=1e-5, atol=1e-6)


def test_pooler_transform_is_berts() -> None:
    config = ModelConfig(
        **{**GPT, "type": "bert"},
        num_tokentypes=2,
        transformer_block_type="post_ln",
        head="pooled_classifier",
        num_labels=2,
        head_transform="pooler",
        head_dropout=0.0,
    )
    model = build_model(config, seed=2).eval()
    tokens = torch.randint(0, 101, (3, 8))
    first = torch.zeros(3, 8, dtype=torch.long)
    first[:, 0] = 1
    with torch.no_grad():
        logits = model(tokens, None, torch.ones_like(tokens), residue_mask=first)
        hidden = model.encode(tokens, None, torch.ones_like(tokens))[:, 0]
        head = model.head
        expected = head.out(torch.tanh(head.dense(hidden)))
    assert torch.allclose(logits, expected, atol=1e-6)


@pytest.mark.parametrize(
    "options,option",
    [
        ({"head": "sequence_regression"}, "head"),  # a GPT model takes only classifier heads
        ({"head": "pooled_classifier", "lora_rank": 4}, "lora_rank"),
        ({"head": "pooled_classifier", "head_transform": "mean"}, "head_transform"),
        ({"head_bias": False}, "head_bias"),  # a classifier option without a classifier head
    ],
)
def test_configuration_errors_name_the_option(options, option) -> None:
    with pytest.raises(ConfigError, match=option):
        ModelConfig(**GPT, **options)


def test_the_trainer_refuses_a_classifier_head_naming_what_to_use(tmp_path) -> None:
    """The classifier heads are for models prepared by epochal.accelerate, not labelled tables."""
    from epochal.train import build_config

    with pytest.raises(ConfigError, match="model.head.*sequence_classification"):
        build_config(
            preset="tiny",
            overrides=[
                f"--run_dir={tmp_path}",
                "--model.head=pooled_classifier",
                "--data.mock=true",
            ],
        )
