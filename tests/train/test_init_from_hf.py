"""``checkpoint.init_from`` naming a Hugging Face decoder folder: configuration and weights from it."""

from __future__ import annotations

import pytest
import torch

from epochal.train.state.checkpoint import CheckpointError
from epochal.train.state.encoder_init import finetune_overrides
from tests.convert.hf_models import hf_decoder
from tests.train.test_trainer import VOCAB, trainer

pytestmark = pytest.mark.peer
pytest.importorskip("transformers")


def test_init_from_a_qwen3_folder_takes_its_configuration_and_weights(tmp_path):
    hf = hf_decoder("qwen3", seed=4, vocab=VOCAB, head_dim=24, tie_word_embeddings=True)
    hf.save_pretrained(tmp_path / "qwen3")
    init = f"--checkpoint.init_from={tmp_path / 'qwen3'}"
    shape = finetune_overrides(None, [init])
    assert "--model.qk_layernorm=true" in shape and "--model.kv_channels=24" in shape

    tr = trainer(tmp_path / "run", *shape, init)
    cfg = tr.model_config
    assert (cfg.hidden_size, cfg.num_kv_heads, cfg.head_dim, cfg.qk_layernorm) == (64, 2, 24, True)
    assert cfg.tie_embeddings and cfg.vocab_size == VOCAB
    # what Trainer.train() does when there is nothing to resume
    tr.init_from_checkpoint(tr.find_checkpoint(tmp_path / "qwen3", "init_from"))
    assert_the_logits_of(hf, tr)


def assert_the_logits_of(hf, tr) -> None:
    """The trainer's model (initialised from ``hf``'s folder) gives ``hf``'s logits (1e-4)."""
    tokens = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = hf(tokens).logits
        got = tr.model_parts[0].eval()(tokens)[..., :VOCAB]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_options_that_contradict_the_folder_are_refused_by_name(tmp_path):
    hf_decoder("mistral", vocab=VOCAB, sliding_window=4).save_pretrained(tmp_path / "m")
    init = f"--checkpoint.init_from={tmp_path / 'm'}"
    with pytest.raises(CheckpointError, match=r"model\.hidden_size=32 \(the folder's is 64\)"):
        finetune_overrides(None, [init, "--model.hidden_size=32"])
    # the same values, and the dropouts, may be given
    same = finetune_overrides(None, [init, "--model.hidden_size=64", "--model.hidden_dropout=0.1"])
    assert "--model.sliding_window=4" in same
    assert not any(o.startswith(("--model.hidden_size", "--model.hidden_dropout")) for o in same)
