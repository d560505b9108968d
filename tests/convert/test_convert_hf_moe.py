"""Mixtral, Qwen2-MoE and Qwen3-MoE <-> epochal through ``epochal convert`` (peer tests).

Each family's tiny random model (2 layers, hidden 64, GQA, 4 experts, top-2) goes
Hugging Face -> ``epochal convert --to epochal`` -> ``epochal convert --to hf``: the
logits equal ``transformers``' within 1e-4 in float32 both ways, and the written
folder loads as the family's class. Qwen2-MoE has its gated shared expert, a dense
first layer (``mlp_only_layers``) and no top-k renormalisation; Qwen3-MoE renormalises.
"""

from __future__ import annotations

import json

import pytest
import torch

from epochal.cli import main
from epochal.formats.common import ConversionError
from epochal.formats.hf.io import load_hf_checkpoint, load_hf_config, save_hf_checkpoint
from epochal.model import GPTModel
from epochal.train.state.epochal_ckpt import load_epochal_checkpoint
from tests.convert.hf_models import randomize

pytestmark = pytest.mark.peer
transformers = pytest.importorskip("transformers")

TOKENS = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(11))
COMMON = dict(
    vocab_size=100,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    num_experts_per_tok=2,
    bos_token_id=0,
    eos_token_id=1,
)
FAMILIES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4)),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            num_experts=4,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            mlp_only_layers=[0],
            norm_topk_prob=False,
        ),
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(num_experts=4, moe_intermediate_size=32, norm_topk_prob=True, head_dim=24),
    ),
}


def hf_moe(family: str, seed: int = 5):
    config_name, model_name, extra = FAMILIES[family]
    cfg = getattr(transformers, config_name)(**{**COMMON, **extra})
    with torch.random.fork_rng():
        model = getattr(transformers, model_name)(cfg)
    return randomize(model, seed).eval()


def logits_of(model):
    with torch.no_grad():
        out = model(TOKENS)
    return (out.logits if hasattr(out, "logits") else out)[..., :100]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_moe_family_in_and_out_through_epochal_convert(tmp_path, family):
    hf = hf_moe(family)
    hf.save_pretrained(tmp_path / "hf")
    ref = logits_of(hf)
    assert ref.abs().max() > 1.0

    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "ep"), "--to", "epochal"]) == 0
    ck = load_epochal_checkpoint(tmp_path / "ep")
    cfg = ck.config
    assert (cfg.num_experts, cfg.moe_router_topk) == (4, 2)
    assert cfg.moe_router_pre_softmax == (family == "qwen2_moe")
    assert cfg.moe_layer_freq == ([0, 1] if family == "qwen2_moe" else 1)
    assert (cfg.moe_shared_expert_intermediate_size is not None) == (family == "qwen2_moe")
    assert load_hf_config(tmp_path / "hf") == cfg
    mine = GPTModel(cfg).eval()
    mine.load_state_dict(ck.state, strict=True)
    torch.testing.assert_close(logits_of(mine), ref, rtol=0, atol=1e-4)

    assert main(["convert", str(tmp_path / "ep"), str(tmp_path / "out"), "--to", "hf"]) == 0
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == family
    back = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", dtype=torch.float32
    ).eval()
    assert type(back).__name__ == FAMILIES[family][1]
    torch.testing.assert_close(logits_of(back), logits_of(mine), rtol=0, atol=1e-4)
    assert load_hf_checkpoint(tmp_path / "out").config == cfg


def test_a_moe_model_is_not_exported_as_a_dense_family(tmp_path):
    hf_moe("mixtral").save_pretrained(tmp_path / "hf")
    ck = load_hf_checkpoint(tmp_path / "hf")
    with pytest.raises(ConversionError, match="num_experts=4 .*mixtral"):
        save_hf_checkpoint(ck.config, ck.state, tmp_path / "out", architecture="llama")
    with pytest.raises(ConversionError, match="Qwen2-MoE has a shared expert.*fits 'mixtral'"):
        save_hf_checkpoint(ck.config, ck.state, tmp_path / "out2", architecture="qwen2_moe")


def test_accelerate_prepare_refuses_an_in_memory_moe_model_by_name():
    from epochal.accelerate.prepare_model import ModelPrepareError, convert_hf_model

    with pytest.raises(ModelPrepareError, match="MixtralForCausalLM: mixture-of-experts"):
        convert_hf_model(hf_moe("mixtral"))


def _moe_config(**kw):
    from epochal.model import ModelConfig

    values = dict(
        vocab_size=100,
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        num_query_groups=2,
        max_position_embeddings=64,
        position_embedding_type="rope",
        normalization="RMSNorm",
        activation="swiglu",
        add_bias_linear=False,
        untie_embeddings_and_output_weights=True,
        num_experts=4,
        moe_ffn_hidden_size=32,
        moe_shared_expert_intermediate_size=48,
    )
    return ModelConfig(**{**values, **kw})


@pytest.mark.parametrize("architecture", ["qwen2_moe", "qwen3_moe", "mixtral"])
def test_an_ungated_shared_expert_is_refused_as_what_no_family_holds(tmp_path, architecture):
    config = _moe_config(moe_shared_expert_gate=False)
    state = GPTModel(config).state_dict()
    with pytest.raises(ConversionError) as info:
        save_hf_checkpoint(config, state, tmp_path / "out", architecture=architecture)
    text = str(info.value)
    assert "no Hugging Face architecture epochal exports holds this model" in text
    assert "moe_shared_expert_gate=False (Qwen2-MoE gates" in text  # the option to change
    assert "moe_shared_expert_intermediate_size=48 (a shared expert;" in text
    assert "export as" not in text and "fits" not in text
    assert not (tmp_path / "out").exists()


def test_a_refused_moe_export_names_the_family_that_holds_it(tmp_path):
    config = _moe_config(moe_shared_expert_gate=True)  # Qwen2-MoE's shape
    state = GPTModel(config).state_dict()
    for refused in ("qwen3_moe", "mixtral"):
        with pytest.raises(ConversionError, match=r"fits 'qwen2_moe' \(epochal convert "):
            save_hf_checkpoint(config, state, tmp_path / refused, architecture=refused)
    save_hf_checkpoint(config, state, tmp_path / "ok", architecture="qwen2_moe")  # and it does
    # with QK-norm too, neither Qwen family holds it (Qwen2-MoE has no QK-norm)
    qk = _moe_config(moe_shared_expert_gate=True, qk_layernorm=True)
    with pytest.raises(ConversionError, match="no Hugging Face architecture") as info:
        save_hf_checkpoint(qk, GPTModel(qk).state_dict(), tmp_path / "qk", architecture="qwen3_moe")
    assert "qk_layernorm=True (Qwen2-MoE has no QK-norm)" in str(info.value)


@pytest.mark.parametrize("architecture", ["qwen2_moe", "qwen3_moe", "mixtral"])
def test_deepseek_routing_is_refused_by_the_softmax_families(tmp_path, architecture):
    config = _moe_config(
        moe_shared_expert_gate=True,
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,
        moe_router_topk_scaling_factor=2.5,
    )
    with pytest.raises(ConversionError) as info:
        save_hf_checkpoint(
            config, GPTModel(config).state_dict(), tmp_path / "out", architecture=architecture
        )
    text = str(info.value)
    assert "moe_router_score_function='sigmoid'" in text
    assert "moe_router_enable_expert_bias=True" in text
    assert "moe_router_topk_scaling_factor=2.5" in text
    assert not (tmp_path / "out").exists()
