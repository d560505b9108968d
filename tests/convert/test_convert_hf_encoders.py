"""Hugging Face BERT / MegatronBERT / ESM-2 <-> epochal: logits within 1e-4 both ways (peer tests)."""

from __future__ import annotations

import json

import pytest
import torch

from epochal.formats.common import ConversionError
from epochal.formats.hf.io import load_hf_checkpoint, save_hf_checkpoint
from epochal.model import build_model
from tests.convert.hf_models import (
    as_read_from_hf,
    encoder_like,
    gpt2_like,
    hf_bert,
    hf_esm,
    randomize,
)

pytestmark = pytest.mark.peer
transformers = pytest.importorskip("transformers")

GEN = torch.Generator().manual_seed(11)
TOKENS = torch.randint(0, 100, (3, 19), generator=GEN)
TYPES = torch.randint(0, 2, (3, 19), generator=GEN)
PADDING = torch.ones(3, 19, dtype=torch.long)
PADDING[1, 12:] = 0
PADDING[2, 5:] = 0
# protein-like ids: cls 0, residues 4..23, mask 32 (a few per row), eos 2, pad 1
PROTEIN = torch.randint(4, 24, (3, 19), generator=GEN)
PROTEIN[:, 0] = 0
PROTEIN[0, [3, 7]] = 32
PROTEIN[1, 2] = 32
PROTEIN[1, 11] = 2
PROTEIN[1, 12:] = 1
PROTEIN[2, 4] = 2
PROTEIN[2, 5:] = 1


def ours_outputs(model, tokens, padding, types=None):
    with torch.no_grad():
        out = model(tokens, token_types=types, padding_mask=padding)
    return out if isinstance(out, tuple) else (out,)


def hf_outputs(model, tokens, padding, types=None):
    kwargs = {"attention_mask": padding}
    if types is not None:
        kwargs["token_type_ids"] = types
    with torch.no_grad():
        out = model(tokens, **kwargs)
    logits = out.prediction_logits if hasattr(out, "prediction_logits") else out.logits
    binary = getattr(out, "seq_relationship_logits", None)
    return (logits,) if binary is None else (logits, binary)


def load_ours(folder, **kw):
    hf = load_hf_checkpoint(folder, **kw)
    model = build_model(hf.config).eval()
    model.load_state_dict(hf.state, strict=True)
    return model


def assert_outputs_close(ours, ref, vocab):
    assert len(ours) == len(ref)
    assert ref[0].abs().max() > 1.0  # not trivially close
    torch.testing.assert_close(ours[0][..., :vocab], ref[0], rtol=0, atol=1e-4)
    if len(ref) == 2:
        assert ref[1].abs().max() > 0.1
        torch.testing.assert_close(ours[1], ref[1], rtol=0, atol=1e-4)


BERT_CLASSES = [
    ("BertForMaskedLM", "post_ln", False),
    ("BertForPreTraining", "post_ln", True),
    ("MegatronBertForPreTraining", "pre_ln", True),
    ("MegatronBertForMaskedLM", "pre_ln", False),
]


@pytest.mark.parametrize(("cls_name", "block", "binary"), BERT_CLASSES)
def test_bert_import_logits(tmp_path, cls_name, block, binary):
    hf = hf_bert(cls_name, seed=1, hidden_act="gelu")
    hf.save_pretrained(tmp_path)
    model = load_ours(tmp_path, model_type="bert")
    c = model.config
    assert (c.type, c.transformer_block_type, c.bert_binary_head) == ("bert", block, binary)
    assert c.num_tokentypes == 2 and c.padded_vocab_size == 128
    ref = hf_outputs(hf, TOKENS, PADDING, TYPES)
    assert_outputs_close(ours_outputs(model, TOKENS, PADDING, TYPES), ref, 100)
    assert torch.count_nonzero(model.lm_head.bias[100:]) == 0


@pytest.mark.parametrize(("cls_name", "block", "binary"), BERT_CLASSES)
@pytest.mark.parametrize("tied", [True, False])
def test_bert_export_logits_and_round_trip(tmp_path, cls_name, block, binary, tied):
    config = encoder_like(
        transformer_block_type=block,
        bert_binary_head=binary,
        activation="gelu_tanh",
        untie_embeddings_and_output_weights=not tied,
    )
    model = randomize(build_model(config, seed=2), 2).eval()
    save_hf_checkpoint(config, model.state_dict(), tmp_path / "hf")
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written["architectures"] == [cls_name] and written["hidden_act"] == "gelu_new"
    hf = getattr(transformers, cls_name).from_pretrained(tmp_path / "hf").eval()
    ref = hf_outputs(hf, TOKENS, PADDING, TYPES)
    assert_outputs_close(ours_outputs(model, TOKENS, PADDING, TYPES), ref, 100)
    back = load_hf_checkpoint(tmp_path / "hf")
    assert back.config == as_read_from_hf(config)
    for name, tensor in model.state_dict().items():
        want = tensor.clone()
        if name in ("tok_embeddings.weight", "output.weight", "lm_head.bias"):
            want[100:] = 0  # padded rows are not exported
        assert torch.equal(back.state[name], want), name


def test_esm_import_logits_with_token_dropout_and_padding(tmp_path):
    hf = hf_esm(seed=3)
    hf.save_pretrained(tmp_path)
    model = load_ours(tmp_path, model_type="esm")
    c = model.config
    assert (c.type, c.position_embedding_type, c.token_dropout, c.mask_token_id) == (
        "esm",
        "rope",
        True,
        32,
    )
    ref = hf_outputs(hf, PROTEIN, PADDING)
    assert_outputs_close(ours_outputs(model, PROTEIN, PADDING), ref, 33)
    # and without a padding mask (every token real)
    ref = hf.eval()(PROTEIN).logits.detach()
    with torch.no_grad():
        torch.testing.assert_close(model(PROTEIN)[..., :33], ref, rtol=0, atol=1e-4)


@pytest.mark.parametrize("token_dropout", [True, False])
def test_esm_export_logits_and_round_trip(tmp_path, token_dropout):
    config = encoder_like("esm", token_dropout=token_dropout, rotary_base=500.0)
    model = randomize(build_model(config, seed=4), 4).eval()
    save_hf_checkpoint(config, model.state_dict(), tmp_path / "hf")
    hf = transformers.EsmForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.token_dropout is token_dropout and hf.config.rope_theta == 500.0
    ref = hf_outputs(hf, PROTEIN, PADDING)
    assert_outputs_close(ours_outputs(model, PROTEIN, PADDING), ref, 33)
    back = load_hf_checkpoint(tmp_path / "hf")
    assert back.config == as_read_from_hf(config)
    for name, tensor in model.state_dict().items():
        want = tensor.clone()
        if name in ("tok_embeddings.weight", "output.weight", "lm_head.bias"):
            want[33:] = 0
        assert torch.equal(back.state[name], want), name


def test_another_model_type_is_refused(tmp_path):
    hf_bert("BertForMaskedLM").save_pretrained(tmp_path / "bert")
    with pytest.raises(ConversionError, match=r"holds a 'bert' model.*expected model.type='gpt'"):
        load_hf_checkpoint(tmp_path / "bert", model_type="gpt")
    bert = encoder_like()
    state = build_model(bert).state_dict()
    with pytest.raises(ConversionError, match="does not fit model.type='bert'.*'megatron-bert'"):
        save_hf_checkpoint(bert, state, tmp_path / "x", architecture="gpt2")
    with pytest.raises(ConversionError, match="does not fit.*'pre_ln'.*use 'megatron-bert'"):
        save_hf_checkpoint(bert, state, tmp_path / "x", architecture="bert")
    gpt = gpt2_like()
    with pytest.raises(ConversionError, match="does not fit model.type='gpt'"):
        save_hf_checkpoint(gpt, build_model(gpt).state_dict(), tmp_path / "x", architecture="esm")
    assert not (tmp_path / "x").exists()


def test_unsupported_encoder_options_are_refused(tmp_path):
    hf_esm(position_embedding_type="absolute").save_pretrained(tmp_path / "esm1b")
    with pytest.raises(ConversionError, match="position_embedding_type='absolute'"):
        load_hf_checkpoint(tmp_path / "esm1b")
    hf_bert(position_embedding_type="relative_key").save_pretrained(tmp_path / "rel")
    with pytest.raises(ConversionError, match="relative_key"):
        load_hf_checkpoint(tmp_path / "rel")
    with pytest.raises(ConversionError, match="num_tokentypes=0"):
        config = encoder_like(num_tokentypes=0)
        save_hf_checkpoint(config, build_model(config).state_dict(), tmp_path / "y")


@pytest.mark.parametrize("make", ["bert", "esm"])
def test_cli_hf_to_epochal_to_safetensors_to_hf(tmp_path, capsys, make):
    from epochal.cli import main
    from epochal.train.state.epochal_ckpt import load_epochal_checkpoint

    hf = hf_bert("BertForPreTraining", seed=5) if make == "bert" else hf_esm(seed=5)
    hf.save_pretrained(tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "run"), "--to", "epochal"]) == 0
    ck = load_epochal_checkpoint(tmp_path / "run")
    assert ck.config.type == make
    single = str(tmp_path / "m.safetensors")
    assert main(["convert", str(tmp_path / "run"), single, "--to", "safetensors"]) == 0
    assert main(["convert", single, str(tmp_path / "back"), "--to", "hf"]) == 0
    again = type(hf).from_pretrained(tmp_path / "back").eval()
    tokens = TOKENS if make == "bert" else PROTEIN
    types = TYPES if make == "bert" else None
    want, got = hf_outputs(hf, tokens, PADDING, types), hf_outputs(again, tokens, PADDING, types)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    # post-LN BERT and ESM have no Megatron-LM counterpart: a clear error, exit status 2
    code = main(["convert", str(tmp_path / "run"), str(tmp_path / "meg"), "--to", "megatron"])
    assert code == 2
    assert f"model.type='{make}'" in capsys.readouterr().err
    assert not (tmp_path / "meg").exists()
