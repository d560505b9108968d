"""GLM-4.5 (``Glm4MoeForCausalLM``) <-> epochal, against transformers' own model.

A tiny GLM-4.5 (dense first block, 8 experts top-4 of the best 2 of 4 groups, sigmoid
scores with a random balancing bias, the routed scaling factor, one shared expert, biases
on q/k/v, QK-norm, RoPE over half of each head) saved by transformers imports with its
logits, and epochal's export loads back into transformers with the same logits.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from epochal.formats.common import ConversionError
from epochal.formats.hf.io import load_hf_checkpoint, save_hf_checkpoint
from epochal.model import build_model

pytestmark = pytest.mark.peer


def _hf_config(**kw):
    from transformers import Glm4MoeConfig

    values = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        moe_intermediate_size=32,
        n_routed_experts=8,
        num_experts_per_tok=4,
        n_shared_experts=1,
        n_group=4,
        topk_group=2,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        use_qk_norm=True,
        attention_bias=True,
        max_position_embeddings=64,
    )
    values.update(kw)
    return Glm4MoeConfig(**values)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from transformers import Glm4MoeForCausalLM

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = Glm4MoeForCausalLM(_hf_config()).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.2)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(std=0.1)  # a bias that moves the choice
    folder = tmp_path_factory.mktemp("glm4_moe")
    model.save_pretrained(folder)
    tokens = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return folder, tokens, model(tokens).logits


def test_glm4_moe_imports_with_transformers_logits_and_exports_back(saved, tmp_path):
    from transformers import Glm4MoeForCausalLM

    folder, tokens, reference = saved
    ck = load_hf_checkpoint(folder)
    cfg = ck.config
    assert (cfg.rotary_percent, cfg.moe_layer_freq, cfg.moe_router_num_groups) == (
        0.5,
        [0, 1, 1],
        4,
    )
    assert cfg.moe_router_enable_expert_bias and cfg.moe_router_topk_scaling_factor == 2.5
    ours = build_model(cfg).eval()
    ours.load_state_dict(ck.state, strict=True)
    assert ours.layers["1"].mlp.expert_bias.abs().max() > 0  # the gate's bias came over
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens)[..., :128], reference, atol=1e-4, rtol=0)
    save_hf_checkpoint(cfg, ours.state_dict(), tmp_path / "out", architecture="glm4_moe")
    back = Glm4MoeForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(tokens).logits, reference, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("kw", "text"),
    [
        ({"norm_topk_prob": False}, "norm_topk_prob=false"),
        ({"num_experts_per_tok": 6, "topk_group": 2}, "top two experts"),
    ],
)
def test_what_epochal_routes_otherwise_is_refused_by_name(tmp_path, kw, text):
    from transformers import Glm4MoeForCausalLM

    warnings.simplefilter("ignore")
    Glm4MoeForCausalLM(_hf_config(**kw)).save_pretrained(tmp_path)
    with pytest.raises(ConversionError, match=text):
        load_hf_checkpoint(tmp_path)


def test_a_softmax_model_is_refused_as_glm4_moe(saved, tmp_path):
    import dataclasses

    folder, _, _ = saved
    cfg = load_hf_checkpoint(folder).config
    plain = dataclasses.replace(
        cfg, moe_router_score_function="softmax", moe_router_enable_expert_bias=False
    )
    with pytest.raises(ConversionError, match="moe_router_score_function='softmax'"):
        save_hf_checkpoint(
            plain, build_model(plain).state_dict(), tmp_path / "out", architecture="glm4_moe"
        )
    assert not (tmp_path / "out").exists()


def test_init_from_a_glm4_moe_folder_takes_its_configuration_and_weights(tmp_path):
    from transformers import Glm4MoeForCausalLM

    from epochal.train.state.encoder_init import finetune_overrides
    from tests.train.test_init_from_hf import assert_the_logits_of
    from tests.train.test_trainer import VOCAB, trainer

    warnings.simplefilter("ignore")
    torch.manual_seed(2)
    hf = Glm4MoeForCausalLM(_hf_config(vocab_size=VOCAB)).eval()
    with torch.no_grad():
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(std=0.1)
    hf.save_pretrained(tmp_path / "glm")
    init = f"--checkpoint.init_from={tmp_path / 'glm'}"
    tr = trainer(tmp_path / "run", *finetune_overrides(None, [init]), init)
    cfg = tr.model_config
    assert (cfg.rotary_percent, cfg.moe_router_score_function) == (0.5, "sigmoid")
    tr.init_from_checkpoint(tr.find_checkpoint(tmp_path / "glm", "init_from"))
    assert tr.model_parts[0].layers["1"].mlp.expert_bias.abs().max() > 0  # the bias came over
    assert_the_logits_of(hf, tr)
