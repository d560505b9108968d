"""Hugging Face GPT-2 / Llama <-> epochal: logits agree within 1e-5 in both directions (peer tests)."""

from __future__ import annotations

import json

import pytest
import torch

from epochal.formats.common import ConversionError
from epochal.formats.hf.io import load_hf_checkpoint, save_hf_checkpoint
from epochal.formats.hf.llama import llama_config_from_ours, ours_config_from_llama
from epochal.model import GPTModel
from tests.convert.hf_models import (
    HF_ROPE_SCALING,
    as_read_from_hf,
    gpt2_like,
    hf_gpt2,
    hf_llama,
    llama_like,
    ours,
)

pytestmark = pytest.mark.peer
transformers = pytest.importorskip("transformers")

TOKENS = torch.randint(0, 100, (2, 17), generator=torch.Generator().manual_seed(7))


def logits_of(model, tokens=TOKENS, vocab=100):
    with torch.no_grad():
        out = model(tokens)
    out = out.logits if hasattr(out, "logits") else out
    return out[..., :vocab]


def load_ours(folder) -> GPTModel:
    hf = load_hf_checkpoint(folder)
    model = GPTModel(hf.config).eval()
    model.load_state_dict(hf.state, strict=True)
    return model


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("activation", ["gelu_new", "gelu"])
def test_gpt2_import_logits(tmp_path, tied, activation):
    hf = hf_gpt2(tied=tied, activation_function=activation, seed=1)
    hf.save_pretrained(tmp_path)
    model = load_ours(tmp_path)
    assert model.config.padded_vocab_size == 128 and model.config.vocab_size == 100
    assert model.config.activation == ("gelu_tanh" if activation == "gelu_new" else "gelu")
    ref = logits_of(hf)
    assert ref.abs().max() > 1.0  # the comparison is not trivially satisfied
    torch.testing.assert_close(logits_of(model), ref, rtol=0, atol=1e-5)
    # padded vocabulary rows are zero
    assert torch.count_nonzero(model.state_dict()["tok_embeddings.weight"][100:]) == 0


@pytest.mark.parametrize("tied", [True, False])
def test_gpt2_export_logits(tmp_path, tied):
    model = ours(gpt2_like(untie_embeddings_and_output_weights=not tied), seed=2)
    save_hf_checkpoint(model.config, model.state_dict(), tmp_path / "hf", eos_token_id=1)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.eos_token_id == 1
    torch.testing.assert_close(logits_of(hf), logits_of(model), rtol=0, atol=1e-5)
    # and back: bit-identical parameters
    back = load_ours(tmp_path / "hf")
    for name, tensor in model.state_dict().items():
        expected = tensor.clone()
        expected[100:] = 0 if name in ("tok_embeddings.weight", "output.weight") else expected[100:]
        torch.testing.assert_close(back.state_dict()[name], expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("groups", "tied", "bias"), [(4, False, False), (2, False, True), (1, True, False)]
)
def test_llama_import_logits(tmp_path, groups, tied, bias):
    hf = hf_llama(groups=groups, tied=tied, bias=bias, seed=3)
    hf.save_pretrained(tmp_path)
    model = load_ours(tmp_path)
    cfg = model.config
    assert cfg.num_kv_heads == groups and cfg.tie_embeddings == tied and cfg.add_bias_linear == bias
    assert cfg.rotary_base == 500.0 and cfg.position_embedding_type == "rope"
    ref = logits_of(hf)
    assert ref.abs().max() > 1.0
    torch.testing.assert_close(logits_of(model), ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kv_channels", [None, 12])
def test_llama_export_logits(tmp_path, kv_channels):
    model = ours(llama_like(kv_channels=kv_channels), seed=4)
    save_hf_checkpoint(model.config, model.state_dict(), tmp_path / "hf", dtype=torch.float32)
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    torch.testing.assert_close(logits_of(hf), logits_of(model), rtol=0, atol=1e-5)
    back = load_ours(tmp_path / "hf")
    assert back.config == as_read_from_hf(model.config)


LONG_TOKENS = torch.randint(0, 100, (2, 60), generator=torch.Generator().manual_seed(8))


@pytest.mark.parametrize("kind", ["llama3", "linear"])
def test_llama_rope_scaling_import_export_logits(tmp_path, kind):
    hf = hf_llama(seed=9, rope_scaling=dict(HF_ROPE_SCALING[kind]))
    ref = logits_of(hf, LONG_TOKENS)
    # the scaling matters at this size: the unscaled model gives other logits
    unscaled = logits_of(hf_llama(seed=9), LONG_TOKENS)
    assert (ref - unscaled).abs().max() > 0.1
    hf.save_pretrained(tmp_path / "hf")
    model = load_ours(tmp_path / "hf")
    cfg = model.config
    assert cfg.rope_scaling_type == kind
    assert cfg.rope_scaling_factor == HF_ROPE_SCALING[kind]["factor"]
    if kind == "llama3":
        assert (
            cfg.rope_low_freq_factor,
            cfg.rope_high_freq_factor,
            cfg.rope_original_max_position_embeddings,
        ) == (1.0, 4.0, 32)
    torch.testing.assert_close(logits_of(model, LONG_TOKENS), ref, rtol=0, atol=1e-5)

    # ours -> Hugging Face -> same logits, and the config survives the round trip
    mine = ours(cfg, seed=10)
    save_hf_checkpoint(cfg, mine.state_dict(), tmp_path / "out", dtype=torch.float32)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["rope_scaling"] == HF_ROPE_SCALING[kind]  # what transformers 4.x reads
    assert written["rope_parameters"] == {**HF_ROPE_SCALING[kind], "rope_theta": 500.0}
    back_hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert back_hf.config.rope_parameters["rope_type"] == kind
    torch.testing.assert_close(
        logits_of(back_hf, LONG_TOKENS), logits_of(mine, LONG_TOKENS), rtol=0, atol=1e-5
    )
    assert load_ours(tmp_path / "out").config == cfg


def test_llama_rope_scaling_config_spellings():
    base = hf_llama().config.to_dict()
    base.pop("rope_parameters")
    # transformers 4.x: rope_theta at the top, rope_scaling with "rope_type" or the older "type"
    llama31 = {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    }
    cfg = ours_config_from_llama({**base, "rope_theta": 500000.0, "rope_scaling": llama31})
    assert (cfg.rotary_base, cfg.rope_scaling_type, cfg.rope_scaling_factor) == (
        500000.0,
        "llama3",
        8.0,
    )
    assert cfg.rope_original_max_position_embeddings == 8192
    old = ours_config_from_llama(
        {**base, "rope_theta": 500.0, "rope_scaling": {"type": "linear", "factor": 2}}
    )
    assert (old.rope_scaling_type, old.rope_scaling_factor) == ("linear", 2.0)
    # transformers 5.x: rope_parameters only
    new = ours_config_from_llama(
        {**base, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}}
    )
    assert new == old
    # our export holds both spellings, and they agree
    written = llama_config_from_ours(cfg)
    assert written["rope_scaling"] == llama31 and written["rope_theta"] == 500000.0
    assert written["rope_parameters"] == {**llama31, "rope_theta": 500000.0}
    plain = llama_config_from_ours(llama_like())
    assert "rope_scaling" not in plain
    assert plain["rope_parameters"] == {"rope_type": "default", "rope_theta": 500.0}


@pytest.mark.parametrize(
    ("rope", "match"),
    [
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type='dynamic'"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn'"),
        ({"rope_scaling": {"type": "longrope", "factor": 4.0}}, "rope_type='longrope'"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "needs 'low_freq_factor'"),
        ({"rope_parameters": {"rope_type": "linear"}}, "needs 'factor'"),
        (
            {
                "rope_scaling": {"rope_type": "linear", "factor": 2.0},
                "rope_parameters": {"rope_type": "linear", "factor": 4.0},
            },
            "disagree on 'factor'",
        ),
    ],
)
def test_unsupported_rope_scaling_is_refused(rope, match):
    base = hf_llama().config.to_dict()
    base.pop("rope_parameters")
    with pytest.raises(ConversionError, match=match):
        ours_config_from_llama({**base, **rope})


def test_export_bf16_and_overwrite(tmp_path):
    model = ours(llama_like(), seed=5)
    out = tmp_path / "hf"
    save_hf_checkpoint(model.config, model.state_dict(), out, dtype=torch.bfloat16)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    with pytest.raises(FileExistsError, match="exists"):
        save_hf_checkpoint(model.config, model.state_dict(), out)
    save_hf_checkpoint(model.config, model.state_dict(), out, overwrite=True)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary leftovers


def test_sharded_safetensors_folder(tmp_path):
    hf = hf_llama(seed=6)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    torch.testing.assert_close(logits_of(load_ours(tmp_path)), logits_of(hf), rtol=0, atol=1e-5)


def test_unsupported_configs_are_refused(tmp_path):
    with pytest.raises(ConversionError, match="GPT-2"):
        save_hf_checkpoint(
            gpt2_like(normalization="RMSNorm"), {}, tmp_path / "a", architecture="gpt2"
        )
    with pytest.raises(ConversionError, match="alibi"):
        save_hf_checkpoint(gpt2_like(position_embedding_type="alibi"), {}, tmp_path / "b")
    with pytest.raises(ConversionError, match="Llama"):
        save_hf_checkpoint(llama_like(activation="gelu"), {}, tmp_path / "c", architecture="llama")
    hf = hf_gpt2(scale_attn_by_inverse_layer_idx=True)
    hf.save_pretrained(tmp_path / "d")
    with pytest.raises(ConversionError, match="scale_attn_by_inverse_layer_idx"):
        load_hf_checkpoint(tmp_path / "d")
    hf_llama().save_pretrained(tmp_path / "e")
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    (tmp_path / "e" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="rope_type='dynamic'"):
        load_hf_checkpoint(tmp_path / "e")
    cfg["model_type"] = "mamba"
    (tmp_path / "e" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="model_type='mamba'"):
        load_hf_checkpoint(tmp_path / "e")


def test_missing_or_extra_tensors_name_the_folder(tmp_path):
    from safetensors.torch import load_file, save_file

    hf_llama(seed=0).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights.pop("model.layers.1.mlp.up_proj.weight")
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ConversionError, match=r"missing.*layers\.1\.mlp\.w3\.weight"):
        load_hf_checkpoint(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_hf_checkpoint(tmp_path / "missing")


@pytest.mark.parametrize("make", [hf_gpt2, hf_llama])
def test_untied_folder_without_its_head_names_the_tensor(tmp_path, make):
    from safetensors.torch import load_file, save_file

    make(tied=False, seed=0).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights.pop("lm_head.weight")
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ConversionError, match=r"missing tensor 'lm_head\.weight' \(untied"):
        load_hf_checkpoint(tmp_path)


def test_pytorch_model_bin_is_read_without_unpickling_code(tmp_path):
    import os

    from epochal.formats.safe_load import UnsafeCheckpointError

    hf = hf_gpt2(seed=8)
    hf.config.save_pretrained(tmp_path)
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    torch.testing.assert_close(logits_of(load_ours(tmp_path)), logits_of(hf), rtol=0, atol=1e-5)
    torch.save({**hf.state_dict(), "hook": os.system}, tmp_path / "pytorch_model.bin")
    with pytest.raises(UnsafeCheckpointError, match=r"pytorch_model\.bin: refusing.*system"):
        load_hf_checkpoint(tmp_path)
