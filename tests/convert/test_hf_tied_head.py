"""A folder whose ``config.json`` ties the head but whose weights say otherwise: transformers' logits.

The folders are written as such files are met: a model saved untied, then its
``config.json`` edited to ``tie_word_embeddings: true`` (or its embedding removed).
The expected logits are those of ``AutoModelForCausalLM.from_pretrained`` of the folder.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from epochal.formats.hf.io import load_hf_checkpoint, load_hf_config
from epochal.model import GPTModel
from epochal.train.state.encoder_init import finetune_overrides
from tests.convert.hf_models import hf_decoder, hf_gpt2

pytestmark = pytest.mark.peer
transformers = pytest.importorskip("transformers")

FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gpt2"]
TOKENS = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(3))


def _say_tied(folder) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["tie_word_embeddings"] = True
    path.write_text(json.dumps(config))


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        out = model(TOKENS)
    return (out.logits if hasattr(out, "logits") else out)[..., :100]


def _ours(folder) -> GPTModel:
    hf = load_hf_checkpoint(folder)
    model = GPTModel(hf.config).eval()
    model.load_state_dict(hf.state, strict=True)
    return model


def _untied(family: str):
    if family == "gpt2":
        return hf_gpt2(tied=False, seed=2)
    return hf_decoder(family, seed=2, tie_word_embeddings=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_separate_head_is_used_as_transformers_uses_it(tmp_path, family):
    _untied(family).save_pretrained(tmp_path)
    _say_tied(tmp_path)
    want = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    head, embedding = want.get_output_embeddings().weight, want.get_input_embeddings().weight
    assert head.data_ptr() != embedding.data_ptr()
    warning = r"tie_word_embeddings=true, but the weights hold an lm_head\.weight that differs"
    with pytest.warns(UserWarning, match=warning):
        ours = _ours(tmp_path)
    assert not ours.config.tie_embeddings
    torch.testing.assert_close(_logits(ours), _logits(want), rtol=0, atol=1e-5)
    # the configuration alone (what checkpoint.init_from reads first) says the same
    with pytest.warns(UserWarning, match=warning):
        assert not load_hf_config(tmp_path).tie_embeddings
        shape = finetune_overrides(None, [f"--checkpoint.init_from={tmp_path}"])
    assert "--model.untie_embeddings_and_output_weights=true" in shape


def test_a_head_equal_to_the_embedding_stays_tied(tmp_path):
    hf_decoder("qwen2", seed=2, tie_word_embeddings=False).save_pretrained(tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    _say_tied(tmp_path)
    want = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ours = _ours(tmp_path)
    assert ours.config.tie_embeddings and load_hf_config(tmp_path).tie_embeddings
    torch.testing.assert_close(_logits(ours), _logits(want), rtol=0, atol=1e-5)


def test_a_head_without_an_embedding_is_the_embedding_too(tmp_path):
    hf_decoder("qwen3", seed=2, tie_word_embeddings=False).save_pretrained(tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    del weights["model.embed_tokens.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    _say_tied(tmp_path)
    want = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.equal(want.model.embed_tokens.weight, want.lm_head.weight)
    ours = _ours(tmp_path)
    assert ours.config.tie_embeddings
    torch.testing.assert_close(_logits(ours), _logits(want), rtol=0, atol=1e-5)
