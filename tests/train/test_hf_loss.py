"""A model from a Hugging Face folder trains and reports transformers' loss.

Each family's tiny random model (biases and norms perturbed) has a 600-id vocabulary
over the example chat tokenizer's 512 ids, padded to 640 rows here. A fine-tuning run
from the folder at learning rate 0 reports a step loss and a validation loss; the
expected values are transformers' own: ``AutoModelForCausalLM.from_pretrained`` of the
folder and its loss function (``labels`` with ``-100`` outside the loss mask, summed
over the rows with ``num_items_in_batch`` = the loss tokens of the whole batch).
"""

from __future__ import annotations

import shutil

import pytest
import torch

from epochal.data.sft.examples import TOKENIZER_DIR
from epochal.train.config import build_config
from epochal.train.state.encoder_init import finetune_overrides
from epochal.train.trainer import Trainer
from tests.convert.hf_models import hf_decoder
from tests.parallel import sft_worker as W

pytestmark = pytest.mark.peer
transformers = pytest.importorskip("transformers")

VOCAB = 600  # 512 tokenizer ids + 88 unused rows; padded to 640: 40 padded ids
FAMILIES = ["llama", "qwen2", "qwen3", "mistral"]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_loss_rows")
    return W.write_rows(root, 0, 8, "train.jsonl"), W.write_rows(root, 8, 6, "valid.jsonl")


def _folder(root, family: str):
    base = root / family
    hf_decoder(family, seed=5, vocab=VOCAB, max_position_embeddings=128).save_pretrained(base)
    for file in TOKENIZER_DIR.iterdir():
        shutil.copy(file, base / file.name)
    return base


def _trainer(base, run_dir, rows, *extra: str) -> Trainer:
    train, valid = rows
    init = f"--checkpoint.init_from={base}"
    overrides = [*finetune_overrides(None, [init]), init, f"--run_dir={run_dir}"]
    overrides += [f"--sft.train_file={train}", f"--sft.valid_file={valid}", "--sft.split="]
    overrides += ["--sft.packing=false", "--data.seq_length=80", "--training.device=cpu"]
    overrides += ["--training.micro_batch_size=4", "--training.global_batch_size=8"]
    overrides += ["--training.train_iters=1", "--training.eval_interval=1"]
    overrides += ["--optimizer.lr=0", "--optimizer.min_lr=0", "--checkpoint.save_interval=0"]
    return Trainer(build_config(overrides=[*overrides, *extra]), log=False)


def _transformers_loss(model, samples: list[dict[str, torch.Tensor]]) -> float:
    """transformers' causal-LM loss over ``samples`` with their loss masks (one batch)."""
    n = sum(int(s["loss_mask"].sum()) for s in samples)
    total = 0.0
    with torch.no_grad():
        for s in samples:
            targets = torch.where(s["loss_mask"] > 0, s["labels"], -100)
            labels = torch.cat([torch.tensor([-100]), targets[:-1]])  # transformers shifts
            total += float(model(s["tokens"][None], labels=labels[None], num_items_in_batch=n).loss)
    return total


@pytest.mark.parametrize(
    ("family", "extra"),
    [*((f, ()) for f in FAMILIES), ("qwen2", ("--training.loss_chunk_tokens=16",))],
    ids=[*FAMILIES, "qwen2-chunked-loss"],
)
def test_step_and_validation_losses_are_transformers(tmp_path, rows, family, extra):
    base = _folder(tmp_path, family)
    tr = _trainer(base, tmp_path / "run", rows, *extra)
    assert tr.model_config.padded_vocab_size == 640
    first = [tr.data.train_loader.dataset[g] for g in range(8)]
    valid = tr.data.valid_loader.dataset.dataset
    result = tr.train()
    hf = transformers.AutoModelForCausalLM.from_pretrained(base).eval()
    assert result.losses[0] == pytest.approx(_transformers_loss(hf, first), abs=1e-5)
    want = _transformers_loss(hf, [valid[i] for i in range(len(valid))])
    assert result.eval_loss == pytest.approx(want, abs=1e-5)
    assert not tr.model_config.padded_vocab_in_softmax  # what the folder's model is given
