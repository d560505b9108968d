"""Qwen2 / Qwen2.5, Qwen3 and Mistral <-> epochal through ``epochal convert`` (peer tests).

Each family's tiny random model (2 layers, hidden 64, GQA 4 heads / 2 groups) goes
Hugging Face -> ``epochal convert --to epochal`` -> ``epochal convert --to hf``: the
logits equal ``transformers``' within 1e-4 in float32 both ways, and the written
folder loads as the family's class. The token sequences (40) are longer than the
sliding windows (7), so the window is exercised.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from epochal.cli import main
from epochal.convert.megatron.args import megatron_args_from_config
from epochal.formats.common import ConversionError
from epochal.formats.hf.io import load_hf_checkpoint, load_hf_config, save_hf_checkpoint
from epochal.formats.hf.llama import llama_config_from_ours
from epochal.model import GPTModel
from epochal.train.state.epochal_ckpt import load_epochal_checkpoint
from tests.convert.hf_models import DECODER_FAMILIES, hf_decoder, llama_like, ours

pytestmark = pytest.mark.peer
transformers = pytest.importorskip("transformers")

TOKENS = torch.randint(0, 100, (2, 40), generator=torch.Generator().manual_seed(11))

CASES = {
    "qwen2_untied": ("qwen2", dict()),
    "qwen2_tied": ("qwen2", dict(tie_word_embeddings=True)),
    "qwen2_window": ("qwen2", dict(use_sliding_window=True, sliding_window=7, max_window_layers=0)),
    "qwen3": ("qwen3", dict(head_dim=24)),  # head_dim != hidden / heads (16)
    "mistral_window": ("mistral", dict(sliding_window=7)),
}


def logits_of(model, tokens=TOKENS):
    with torch.no_grad():
        out = model(tokens)
    return (out.logits if hasattr(out, "logits") else out)[..., :100]


def _ours_from(config, state) -> GPTModel:
    model = GPTModel(config).eval()
    model.load_state_dict(state, strict=True)
    return model


@pytest.mark.parametrize("case", sorted(CASES))
def test_family_in_and_out_through_epochal_convert(tmp_path, case, capsys):
    family, options = CASES[case]
    hf = hf_decoder(family, seed=5, **options)
    hf.save_pretrained(tmp_path / "hf")
    ref = logits_of(hf)
    assert ref.abs().max() > 1.0  # the comparison is not trivially satisfied

    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "ep"), "--to", "epochal"]) == 0
    ck = load_epochal_checkpoint(tmp_path / "ep")
    cfg = ck.config
    assert (cfg.num_attention_heads, cfg.num_kv_heads, cfg.hidden_size) == (4, 2, 64)
    assert cfg.qkv_bias == (family == "qwen2") and not cfg.add_bias_linear
    assert cfg.qk_layernorm == (family == "qwen3")
    assert cfg.head_dim == options.get("head_dim", 16)
    assert cfg.tie_embeddings == options.get("tie_word_embeddings", False)
    assert cfg.sliding_window == (7 if "window" in case else None)
    assert load_hf_config(tmp_path / "hf") == cfg  # the same, without reading the weights
    mine = _ours_from(cfg, ck.state)
    torch.testing.assert_close(logits_of(mine), ref, rtol=0, atol=1e-4)
    if cfg.sliding_window is not None:  # the window changes these logits: it is really applied
        full = _ours_from(dataclasses.replace(cfg, sliding_window=None), ck.state)
        assert (logits_of(full) - ref).abs().max() > 0.1

    assert main(["convert", str(tmp_path / "ep"), str(tmp_path / "out"), "--to", "hf"]) == 0
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == family
    back = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", dtype=torch.float32
    ).eval()
    assert type(back).__name__ == DECODER_FAMILIES[family][1]
    assert back.config.sliding_window == cfg.sliding_window
    torch.testing.assert_close(logits_of(back), logits_of(mine), rtol=0, atol=1e-4)
    assert load_hf_checkpoint(tmp_path / "out").config == cfg


@pytest.mark.parametrize(
    ("family", "options", "match"),
    [
        # a window in the second layer only (max_window_layers=1 of 2)
        (
            "qwen2",
            dict(use_sliding_window=True, sliding_window=7, max_window_layers=1),
            "use_sliding_window=True with layer_types",
        ),
        ("qwen3", dict(attention_bias=True), "attention_bias=True"),
        (
            "qwen2",
            dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 500.0}),
            "rope_type='yarn'",
        ),
        ("mistral", dict(hidden_act="gelu"), "hidden_act='gelu'"),
    ],
)
def test_what_epochal_cannot_represent_is_refused_by_name(tmp_path, family, options, match):
    hf_decoder(family, **options).save_pretrained(tmp_path / "hf")
    with pytest.raises(ConversionError, match=match):
        load_hf_checkpoint(tmp_path / "hf")


def test_window_on_no_layer_imports_as_full_attention(tmp_path):
    # use_sliding_window with max_window_layers >= layers: transformers windows no layer
    hf = hf_decoder("qwen2", use_sliding_window=True, sliding_window=7, max_window_layers=2)
    hf.save_pretrained(tmp_path / "hf")
    ck = load_hf_checkpoint(tmp_path / "hf")
    assert ck.config.sliding_window is None
    torch.testing.assert_close(
        logits_of(_ours_from(ck.config, ck.state)), logits_of(hf), rtol=0, atol=1e-4
    )


@pytest.mark.parametrize(
    ("kw", "architecture", "match"),
    [
        (dict(qk_layernorm=True), "llama", "qk_layernorm=True"),
        (dict(sliding_window=8), "llama", "sliding_window=8"),
        (dict(add_qkv_bias=True), "llama", "add_qkv_bias=True"),
        (dict(add_qkv_bias=True, qk_layernorm=True), "qwen2", "qk_layernorm=True"),
        (dict(), "qwen3", "qk_layernorm=False"),
        (dict(add_qkv_bias=True), "mistral", "no biases"),
    ],
)
def test_export_refuses_a_class_that_cannot_hold_the_model(tmp_path, kw, architecture, match):
    model = ours(llama_like(**kw), seed=1)
    with pytest.raises(ConversionError, match=match):
        save_hf_checkpoint(
            model.config, model.state_dict(), tmp_path / "x", architecture=architecture
        )
    assert not (tmp_path / "x").exists()


def test_default_export_class_follows_the_options():
    from epochal.formats.hf.io import hf_architecture_for

    assert hf_architecture_for(llama_like()) == "llama"
    assert hf_architecture_for(llama_like(add_qkv_bias=True)) == "qwen2"
    assert hf_architecture_for(llama_like(qk_layernorm=True)) == "qwen3"
    assert hf_architecture_for(llama_like(sliding_window=4)) == "mistral"
    with pytest.raises(ConversionError, match="qk_layernorm"):
        llama_config_from_ours(llama_like(qk_layernorm=True))
    for kw in (dict(qk_layernorm=True), dict(sliding_window=4)):
        with pytest.raises(ConversionError, match=next(iter(kw))):
            megatron_args_from_config(
                llama_like(**kw),
                tensor_parallel=1,
                pipeline_parallel=1,
                iteration=1,
                dtype=torch.float32,
                transformer_impl="local",
            )
