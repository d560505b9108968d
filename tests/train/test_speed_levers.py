"""The trainer's GPU speed levers give the losses of the plain path (issue 25), checked on CPU.

``training.loss_chunk_tokens`` (chunked cross-entropy), ``compile_loss``,
``fused_adamw`` and ``attention_backend``. Their speed is measured by
``benchmarks/bench_gpu.py`` on a GPU; here only that they compute the same thing.
"""

from __future__ import annotations

import pytest
import torch

from epochal.parallel.token_loss import (
    chunked_cross_entropy,
    compiled_cross_entropy,
    plain_cross_entropy,
)
from tests.train.test_trainer import trainer


def _logits_and_labels(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 7, 50, generator=g) * 3).to(dtype).requires_grad_(True)
    labels = torch.randint(0, 50, (3, 7), generator=g)
    return logits, labels


@pytest.mark.parametrize("chunk", [1, 4, 5, 21, 100])
def test_chunked_cross_entropy_equals_the_plain_one(chunk):
    logits, labels = _logits_and_labels()
    ref = plain_cross_entropy(logits, labels)
    (ref * torch.arange(21.0).view(3, 7)).sum().backward()
    ref_grad, logits.grad = logits.grad, None
    got = chunked_cross_entropy(logits, labels, chunk)
    (got * torch.arange(21.0).view(3, 7)).sum().backward()
    assert got.dtype == torch.float32 and got.shape == labels.shape
    assert torch.equal(got, ref)
    assert torch.equal(logits.grad, ref_grad)
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_cross_entropy(logits, labels, 0)


def test_chunked_cross_entropy_keeps_no_float32_logits_for_the_backward():
    logits, labels = _logits_and_labels()
    saved = []

    def pack(t):
        saved.append((t.dtype, tuple(t.shape)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunked_cross_entropy(logits, labels, 4)
    assert not [s for s in saved if s[0] == torch.float32 and s[1][-1:] == (50,)]
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        plain_cross_entropy(logits, labels)
    assert [s for s in saved if s[0] == torch.float32 and s[1][-1:] == (50,)]  # the plain one does


def test_compiled_cross_entropy_equals_the_plain_one():
    """Also with 40 of the 50 columns in the softmax (a padded vocabulary's real ids)."""
    logits, labels = _logits_and_labels(torch.float32)
    labels = labels % 40
    want = torch.nn.functional.cross_entropy(
        logits[..., :40].flatten(0, 1), labels.flatten(), reduction="none"
    ).view(3, 7)
    got = compiled_cross_entropy(logits, labels, 40)
    torch.testing.assert_close(got, plain_cross_entropy(logits, labels, 40))
    torch.testing.assert_close(got, want)


def test_trainer_levers_keep_the_losses(tmp_path):
    ref = trainer(tmp_path / "ref").train().losses
    chunked = trainer(tmp_path / "chunk", "--training.loss_chunk_tokens=5").train().losses
    assert chunked == ref  # bit for bit
    math = trainer(tmp_path / "math", "--training.attention_backend=math").train().losses
    torch.testing.assert_close(torch.tensor(math), torch.tensor(ref), rtol=1e-5, atol=1e-5)
    fused = trainer(tmp_path / "fused", "--training.fused_adamw=true")
    assert all(o.defaults["fused"] for o in fused.optimizers.optimizers)
    torch.testing.assert_close(
        torch.tensor(fused.train().losses), torch.tensor(ref), rtol=1e-5, atol=1e-5
    )
