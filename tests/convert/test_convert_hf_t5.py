"""Hugging Face T5 / mT5 <-> epochal T5Model through files: logits within 1e-4 both ways (peer tests)."""

from __future__ import annotations

import json

import pytest
import torch

from epochal.cli import main
from epochal.formats.common import ConversionError
from epochal.formats.hf.io import load_hf_checkpoint, save_hf_checkpoint
from epochal.model import ModelConfig, build_model
from tests.convert.hf_models import gpt2_like, hf_t5, t5_inputs

pytestmark = pytest.mark.peer
transformers = pytest.importorskip("transformers")

VOCAB = 96


def _logits(model, enc, dec, enc_mask, dec_mask, hf: bool):
    with torch.no_grad():
        if hf:
            return model(
                input_ids=enc,
                attention_mask=enc_mask,
                decoder_input_ids=dec,
                decoder_attention_mask=dec_mask,
            ).logits
        return model(enc, dec, enc_mask, dec_mask)[..., :VOCAB]


def _assert_same_logits(ours, ref) -> None:
    enc, dec, enc_mask, dec_mask = t5_inputs(VOCAB)
    a = _logits(ours, enc, dec, enc_mask, dec_mask, hf=False)
    b = _logits(ref, enc, dec, enc_mask, dec_mask, hf=True)
    real = dec_mask.bool()
    assert b.abs().max() > 0.1  # non-trivial logits
    torch.testing.assert_close(a[real], b[real], atol=1e-4, rtol=1e-4)


def load_ours(folder):
    hf = load_hf_checkpoint(folder)
    model = build_model(hf.config).eval()
    model.load_state_dict(hf.state, strict=True)
    return model, hf


@pytest.mark.parametrize("version", ["1.0", "1.1", "mt5"])
def test_import_then_export_keeps_logits(tmp_path, version: str) -> None:
    ref = hf_t5(version, vocab=VOCAB)
    ref.save_pretrained(tmp_path / "hf")
    ours, loaded = load_ours(tmp_path / "hf")
    assert loaded.config.type == "t5"
    assert loaded.architecture == ("mt5" if version == "mt5" else "t5")
    assert loaded.config.activation == ("relu" if version == "1.0" else "gated_gelu")
    assert loaded.config.scale_decoder_output == (version == "1.0")
    _assert_same_logits(ours, ref)
    # and back: transformers reads our export with the same logits
    arch = "mt5" if version == "mt5" else "t5"
    save_hf_checkpoint(loaded.config, ours.state_dict(), tmp_path / "out", architecture=arch)
    cls = (
        transformers.MT5ForConditionalGeneration
        if version == "mt5"
        else transformers.T5ForConditionalGeneration
    )
    back = cls.from_pretrained(tmp_path / "out").eval()
    _assert_same_logits(ours, back)
    again, _ = load_ours(tmp_path / "out")
    for name, tensor in ours.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name


def test_an_untied_head_round_trips(tmp_path) -> None:
    """A head that differs from the embeddings (original T5 v1.1 files) stays separate."""
    ref = hf_t5("1.1", vocab=VOCAB)
    ref.save_pretrained(tmp_path / "hf")
    ours, loaded = load_ours(tmp_path / "hf")
    untied = build_model(
        ModelConfig(**{**loaded.config.to_dict(), "untie_embeddings_and_output_weights": True})
    ).eval()
    state = dict(ours.state_dict())
    state["output.weight"] = state["output.weight"] + 0.5 * torch.randn_like(state["output.weight"])
    untied.load_state_dict(state, strict=True)
    save_hf_checkpoint(untied.config, untied.state_dict(), tmp_path / "untied")
    back = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "untied").eval()
    _assert_same_logits(untied, back)
    reread, hf = load_ours(tmp_path / "untied")
    assert hf.config.untie_embeddings_and_output_weights
    _assert_same_logits(reread, back)


def test_cli_converts_hf_t5_to_epochal_and_back(tmp_path, capsys) -> None:
    ref = hf_t5("1.0", vocab=VOCAB)
    ref.save_pretrained(tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "run"), "--to", "epochal"]) == 0
    assert main(["convert", str(tmp_path / "run"), str(tmp_path / "hf2"), "--to", "hf"]) == 0
    config = json.loads((tmp_path / "hf2" / "config.json").read_text())
    assert config["model_type"] == "t5" and config["feed_forward_proj"] == "relu"
    back = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "hf2").eval()
    ours, _ = load_ours(tmp_path / "hf2")
    _assert_same_logits(ours, back)
    _assert_same_logits(ours, ref)


def test_errors_name_what_was_found(tmp_path) -> None:
    ref = hf_t5("1.1", vocab=VOCAB)
    ref.save_pretrained(tmp_path / "hf")
    with pytest.raises(ConversionError, match="holds a 't5' model.*expected model.type='gpt'"):
        load_hf_checkpoint(tmp_path / "hf", model_type="gpt")
    gpt = build_model(gpt2_like())
    with pytest.raises(ConversionError, match="architecture='t5' does not fit model.type='gpt'"):
        save_hf_checkpoint(gpt.config, gpt.state_dict(), tmp_path / "x", architecture="t5")
    megatron_style = ModelConfig(
        type="t5",
        vocab_size=VOCAB,
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
        output_bias=True,
    )
    model = build_model(megatron_style)
    with pytest.raises(ConversionError, match="position_embedding_type='learned_absolute'"):
        save_hf_checkpoint(megatron_style, model.state_dict(), tmp_path / "y")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["feed_forward_proj"] = "gated-silu"
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match="feed_forward_proj='gated-silu'"):
        load_hf_checkpoint(tmp_path / "hf")


def test_megatron_legacy_t5_is_refused_clearly(tmp_path) -> None:
    """Megatron legacy T5 files are not supported: both directions say so, naming T5."""
    from epochal.convert.megatron.legacy import load_megatron_checkpoint, save_megatron_checkpoint

    config = ModelConfig(
        type="t5", vocab_size=VOCAB, hidden_size=64, num_layers=2, num_attention_heads=4,
        max_position_embeddings=32, output_bias=True,
    )  # fmt: skip
    model = build_model(config)
    with pytest.raises(ConversionError, match="model.type=.t5.: Megatron legacy T5.*--to hf"):
        save_megatron_checkpoint(config, model.state_dict(), tmp_path / "m")
    rank = tmp_path / "iter_0000001" / "mp_rank_00"
    rank.mkdir(parents=True)
    shard = {"decoder.layers.0.cross_attention.linear_q.weight": torch.zeros(4, 4)}
    torch.save(
        {"args": None, "checkpoint_version": 3.0, "model": shard}, rank / "model_optim_rng.pt"
    )
    with pytest.raises(ConversionError, match="encoder-decoder \\(T5\\)"):
        load_megatron_checkpoint(tmp_path / "iter_0000001")
