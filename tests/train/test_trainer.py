"""Trainer: Megatron batch math and loss, custom loss hook, evaluation, bf16, resume options, errors."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from epochal.model import ConfigError
from epochal.train.config import build_config
from epochal.train.inputs.loaders import make_loaders
from epochal.train.observe.metrics import read_metrics
from epochal.train.state.checkpoint import CheckpointError
from epochal.train.trainer import Trainer, masked_token_mean_loss
from tests.train.synthetic import CountingDataset

VOCAB = 64


def config(run_dir, *extra):
    return build_config(
        preset="tiny",
        overrides=[
            f"--run_dir={run_dir}",
            "--training.device=cpu",  # CPU references: the same with or without a GPU
            "--data.corpus=",
            "--data.mock=true",
            "--data.seq_length=8",
            "--model.hidden_size=32",
            "--model.num_layers=2",
            "--model.ffn_hidden_size=64",
            "--training.micro_batch_size=2",
            "--training.global_batch_size=6",
            "--training.train_iters=4",
            "--training.eval_interval=2",
            "--training.eval_iters=2",
            "--scheduler.lr_warmup_iters=1",
            "--checkpoint.save_interval=2",
            "--logging.progress=false",
            "--logging.tensorboard=false",
            *extra,
        ],
    )


class MaskedCounting(CountingDataset):
    """Counting samples whose loss mask keeps a sample-dependent number of tokens."""

    def __getitem__(self, i):
        item = super().__getitem__(i)
        keep = 1 + (int(i) * 5) % self.seq
        item["loss_mask"] = (torch.arange(self.seq) < keep).float()
        return item


def trainer(tmp_path, *extra, train=None, valid=None, **kw):
    cfg = config(tmp_path, *extra)
    train = train if train is not None else MaskedCounting(1000, 8, VOCAB)
    valid = valid if valid is not None else CountingDataset(40, 8, VOCAB, offset=10**6)
    return Trainer(cfg, data=make_loaders(cfg, train, valid, vocab_size=VOCAB), log=False, **kw)


def test_megatron_loss_and_gradient_accumulation(tmp_path):
    tr = trainer(tmp_path)
    assert tr.num_microbatches() == 3  # gbs 6 / (mbs 2 * dp 1)
    model = tr.model_parts[0]
    reference = copy.deepcopy(model)
    ds = MaskedCounting(1000, 8, VOCAB)
    out = tr.train_step(tr.data.train_loader.stream())
    assert tr.data.train_loader.consumed_samples == 6
    # By hand: mean over micro-batches of each micro-batch's masked token mean.
    per_mb = []
    for mb in range(3):
        items = [ds[2 * mb + j] for j in range(2)]
        tokens = torch.stack([x["tokens"] for x in items])
        labels = torch.stack([x["labels"] for x in items])
        mask = torch.stack([x["loss_mask"] for x in items])
        ce = F.cross_entropy(reference(tokens).flatten(0, 1), labels.flatten(), reduction="none")
        per_mb.append((ce * mask.flatten()).sum() / mask.sum())
    expected = torch.stack(per_mb).mean()
    assert out["loss"] == pytest.approx(expected.item(), rel=1e-6)
    expected.backward()
    norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in reference.parameters()))
    assert out["grad_norm"] == pytest.approx(norm.item(), rel=1e-5)
    assert out["lr"] == 0.0 and out["skipped"] == 0  # Megatron: the first warmup step uses init_lr


def test_micro_batch_split_does_not_change_the_step(tmp_path):
    """Equal token counts per micro-batch: 3 x 2 samples == 1 x 6 samples (same gradients)."""
    ds = CountingDataset(1000, 8, VOCAB)
    a = trainer(tmp_path / "a", train=ds)
    b = trainer(tmp_path / "b", "--training.micro_batch_size=6", train=ds)
    assert a.num_microbatches() == 3 and b.num_microbatches() == 1
    la = [a.train_step(s)["loss"] for s in [a.data.train_loader.stream()] * 3]
    lb = [b.train_step(s)["loss"] for s in [b.data.train_loader.stream()] * 3]
    assert la == pytest.approx(lb, rel=1e-5)
    for pa, pb in zip(a.model_parts[0].parameters(), b.model_parts[0].parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def test_custom_loss_hook(tmp_path):
    calls = []

    def loss_fn(labels, logits, loss_mask):
        calls.append((labels.shape, logits.shape, loss_mask.shape))
        return 2.0 * masked_token_mean_loss(labels, logits, loss_mask)

    hooked = trainer(tmp_path / "h", loss_fn=loss_fn)
    plain = trainer(tmp_path / "p")
    out_h = hooked.train_step(hooked.data.train_loader.stream())
    out_p = plain.train_step(plain.data.train_loader.stream())
    assert out_h["loss"] == pytest.approx(2 * out_p["loss"], rel=1e-6)
    assert calls[0] == (torch.Size([2, 8]), torch.Size([2, 8, 128]), torch.Size([2, 8]))


def test_train_evaluates_logs_and_checkpoints(tmp_path):
    tr = trainer(tmp_path)
    result = tr.train()
    assert result.final_step == 4 and len(result.losses) == 4
    first = tr.evaluate()
    assert first == tr.evaluate()  # every evaluation reads the same validation samples
    assert result.eval_loss == pytest.approx(first)
    recs = read_metrics(tmp_path / "metrics.jsonl")
    evals = [r for r in recs if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4]
    assert evals[-1]["ppl"] == pytest.approx(torch.tensor(evals[-1]["loss"]).exp().item(), rel=1e-6)
    trains = [r for r in recs if r["kind"] == "train"]
    assert [r["consumed_samples"] for r in trains] == [6, 12, 18, 24]
    assert [r["tokens"] for r in trains] == [48, 96, 144, 192]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "latest",
        "step_0000002",
        "step_0000004",
    ]
    assert (tmp_path / "config.toml").is_file() and (
        tmp_path / "checkpoints/step_0000004/config.toml"
    ).is_file()
    # Training again to the same step resumes and has nothing left to do.
    again = trainer(tmp_path).train()
    assert again.start_step == 4 and again.final_step == 4 and again.losses == []


def test_resume_options(tmp_path):
    trainer(tmp_path).train()
    with pytest.raises(ConfigError, match="checkpoint.resume"):
        trainer(tmp_path, "--checkpoint.resume=never").train()
    with pytest.raises(ConfigError, match="checkpoint.resume"):
        trainer(tmp_path / "x", f"--checkpoint.resume={tmp_path / 'nothing'}").train()
    # A checkpoint of another model shape is refused with a clear error.
    other = trainer(
        tmp_path / "y", "--model.hidden_size=64", f"--checkpoint.resume={tmp_path / 'checkpoints'}"
    )
    with pytest.raises(CheckpointError, match="step_0000004"):
        other.train()


def test_bf16_autocast(tmp_path):
    tr = trainer(tmp_path, "--training.bf16=true")
    seen = []
    tr.loss_fn = lambda labels, logits, mask: (
        seen.append(logits.dtype),
        masked_token_mean_loss(labels, logits, mask),
    )[1]
    out = tr.train_step(tr.data.train_loader.stream())
    assert seen[0] == torch.bfloat16 and torch.isfinite(torch.tensor(out["loss"]))
    assert all(p.dtype == torch.float32 for p in tr.model_parts[0].parameters())


def test_compile_option_compiles_every_block(tmp_path, monkeypatch):
    from epochal.model.layers.block import TransformerBlock

    compiled = []
    monkeypatch.setattr(
        TransformerBlock, "compile", lambda self, *a, **k: compiled.append(self.layer_id)
    )
    trainer(tmp_path, "--training.compile=true")
    assert compiled == [0, 1]


def test_vocab_smaller_than_tokenizer_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="model.vocab_size"):
        trainer(tmp_path, "--model.vocab_size=10")


def test_training_does_not_need_the_global_rng_untouched(tmp_path):
    """Same seed, same losses, whatever the global RNG state was before."""
    torch.manual_seed(123)
    a = trainer(tmp_path / "a", "--model.hidden_dropout=0.2").train().losses
    torch.manual_seed(456)
    b = trainer(tmp_path / "b", "--model.hidden_dropout=0.2").train().losses
    assert a == b


def test_batch_size_rampup(tmp_path):
    """Megatron's ramp-up [2, 2, 8]: gbs = 2 + 2 * (consumed // 4), capped at 6."""
    tr = trainer(
        tmp_path,
        "--training.rampup_batch_size=[2, 2, 8]",
        "--training.train_iters=5",
        "--training.eval_interval=0",
        "--checkpoint.save_interval=0",
    )
    result = tr.train()
    recs = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["consumed_samples"] for r in recs] == [2, 4, 8, 14, 20]  # gbs 2, 2, 4, 6, 6
    assert result.final_step == 5
    with pytest.raises(ConfigError, match="rampup_batch_size"):
        trainer(tmp_path / "x", "--training.rampup_batch_size=[3, 2, 8]")
