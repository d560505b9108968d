"""``epochal generate`` / ``fill-mask`` bounds (issue 26): no padded-id predictions, no bad_alloc."""

from __future__ import annotations

import argparse
import subprocess
import sys
import types

import pytest
import torch

from epochal.model import ModelConfig
from epochal.model.generation.decoding import GenerationConfig
from epochal.model.generation.fill_mask import fill_mask
from epochal.model.generation.limits import check_generation_sizes
from tests.convert.test_convert_cli import trainer_checkpoint


class _Vocab:
    """A WordPiece-like tokenizer of ``n`` tokens (``t0`` ...), [CLS]=0, [SEP]=1, [MASK]=2."""

    cls, sep, mask = 0, 1, 2

    def __init__(self, n: int) -> None:
        self.vocab_size = n

    def tokenize(self, text: str) -> list[int]:
        return [self.mask if w == "[MASK]" else int(w[1:]) for w in text.split()]

    def convert_ids_to_tokens(self, ids):
        return [f"t{i}" for i in ids]


class _Model:
    """A masked LM of 10 real ids padded to 64 whose padded rows would win every argmax."""

    tokentype_embeddings = None
    config = types.SimpleNamespace(vocab_size=10, padded_vocab_size=64)

    def parameters(self):
        return iter([torch.zeros(1)])

    def __call__(self, tokens, token_types=None):
        logits = torch.zeros(1, tokens.shape[1], 64)
        logits[..., 10:] = 50.0  # padded rows (and ids of a larger --vocab-file)
        logits[..., 7] = 5.0  # the best real token
        return logits


def test_fill_mask_never_predicts_padded_or_foreign_ids():
    (preds,) = fill_mask(_Model(), _Vocab(40), "t5 [MASK] t6", top_k=10)
    ids = [int(name[1:]) for name, _ in preds]
    assert ids[0] == 7 and max(ids) < 10 and len(ids) == 10
    assert sum(p for _, p in preds) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match=r"beyond the model's vocabulary of 10"):
        fill_mask(_Model(), _Vocab(40), "t25 [MASK]")


def _check_sizes(args, config, gen, prompts, dtype):
    from epochal.train.config.limits import device_memory_bytes

    check_generation_sizes(
        config, gen, prompts, dtype, memory=device_memory_bytes("cpu"), source=args.checkpoint
    )


def _args():
    return argparse.Namespace(checkpoint="ckpt")


def _rope(positions: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=259,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=positions,
        position_embedding_type="rope",
    )


def test_absurd_positions_and_beams_are_refused_before_allocation():
    gen = GenerationConfig(max_new_tokens=5)
    _check_sizes(_args(), _rope(64), gen, [[1, 2, 3]], torch.float32)  # an ordinary model passes
    with pytest.raises(
        ValueError, match=r"ckpt: the model declares max_position_embeddings=1,000,000,000,000"
    ):
        _check_sizes(_args(), _rope(10**12), gen, [[1, 2, 3]], torch.float32)
    beams = GenerationConfig(max_new_tokens=5, num_beams=300, num_return_sequences=1)
    with pytest.raises(ValueError, match=r"--num-beams 300 exceeds the model's vocabulary of 259"):
        _check_sizes(_args(), _rope(64), beams, [[1]], torch.float32)
    big = _rope(2**20)
    many = GenerationConfig(max_new_tokens=2**20 - 10, num_beams=250, num_return_sequences=1)
    with pytest.raises(ValueError, match=r"--num-beams: 1 prompt\(s\) x 250 beam\(s\).*GiB"):
        _check_sizes(_args(), big, many, [[1]], torch.float32)


def test_generate_cli_refuses_a_million_beams_quickly_and_small(tmp_path):
    trainer_checkpoint(tmp_path / "run")
    code = (
        "import resource, sys\n"
        "from epochal.cli import main\n"
        f"rc = main(['generate', '--checkpoint', {str(tmp_path / 'run')!r}, '--prompt', 'x',"
        " '--num-beams', '1000000', '--device', 'cpu'])\n"
        "print(rc, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    rc, peak_kib = out.stdout.split()[-2:]
    assert rc == "2" and "--num-beams 1,000,000 exceeds the model's vocabulary" in out.stderr, (
        out.stderr
    )
    assert int(peak_kib) < 2 * 2**20
