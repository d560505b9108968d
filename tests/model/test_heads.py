"""Fine-tuning heads: shapes, BioNeMo's structure, pooling, losses and metrics against direct computations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from epochal.model import build_model
from epochal.model.config import ConfigError, ModelConfig
from epochal.model.heads import mean_over_residues
from epochal.train.steps.finetune import (
    ResidueClassificationStep,
    SequenceClassificationStep,
    SequenceRegressionStep,
)
from epochal.train.steps.head_metrics import rank_average, spearman

BASE = dict(
    type="esm",
    vocab_size=33,
    hidden_size=64,
    num_layers=2,
    num_attention_heads=4,
    max_position_embeddings=32,
    position_embedding_type="rope",
    hidden_dropout=0.0,
    attention_dropout=0.0,
    head_dropout=0.0,
)


def _model(**kw):
    return build_model(ModelConfig(**{**BASE, **kw}), seed=3)


def test_sequence_head_is_mlp_on_residue_mean() -> None:
    model = _model(head="sequence_regression", num_labels=2).eval()
    tokens = torch.randint(4, 24, (3, 12))
    padding = torch.ones(3, 12, dtype=torch.long)
    padding[1, 9:] = 0
    residue = padding.clone()
    residue[:, 0] = 0
    residue[0, 11] = 0
    residue[1, 8] = 0
    out = model(tokens, None, padding, residue_mask=residue)
    h = model.encode(tokens, None, padding)
    pooled = torch.stack([h[i][residue[i].bool()].mean(0) for i in range(3)])
    assert torch.allclose(mean_over_residues(h, residue), pooled, atol=1e-6)
    head = model.head
    assert head.fc1.out_features == 256  # BioNeMo's MegatronMLPHead
    expected = head.fc2(torch.relu(head.fc1(pooled)))
    assert out.shape == (3, 2)
    assert torch.allclose(out, expected, atol=1e-5)


def test_residue_conv_head_is_bionemo_convnet() -> None:
    model = _model(head="residue_classification", num_labels=3).eval()
    assert model.head.conv1.kernel_size == (7, 1) and model.head.conv1.out_channels == 32
    assert model.lm_head is None and model.output is None
    tokens = torch.randint(4, 24, (2, 10))
    out = model(tokens)
    h = model.encode(tokens)
    x = F.conv2d(
        h.permute(0, 2, 1).unsqueeze(-1),
        model.head.conv1.weight,
        model.head.conv1.bias,
        padding=(3, 0),
    )
    x = F.conv2d(torch.relu(x), model.head.conv2.weight, model.head.conv2.bias, padding=(3, 0))
    assert out.shape == (2, 10, 3)
    assert torch.allclose(out, x.squeeze(-1).permute(0, 2, 1), atol=1e-5)
    linear = _model(head="residue_classification", num_labels=3, residue_head="linear")
    assert linear(tokens).shape == (2, 10, 3)


def test_bert_gets_heads_too() -> None:
    bert = build_model(
        ModelConfig(
            type="bert",
            vocab_size=50,
            hidden_size=32,
            num_layers=2,
            num_attention_heads=4,
            max_position_embeddings=16,
            num_tokentypes=2,
            head="sequence_classification",
            num_labels=4,
        )
    )
    assert bert(torch.randint(0, 50, (2, 8))).shape == (2, 4)


def test_head_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="num_labels"):
        ModelConfig(**{**BASE, "head": "sequence_classification", "num_labels": 1})
    with pytest.raises(ConfigError, match="lora_target_modules"):
        ModelConfig(
            **{**BASE, "head": "sequence_regression", "lora_rank": 2, "lora_target_modules": "wz"}
        )
    with pytest.raises(ConfigError, match="freeze_encoder"):
        ModelConfig(**{**BASE, "freeze_encoder": True})


def test_regression_loss_and_metrics_equal_direct_computation() -> None:
    step = SequenceRegressionStep(None)
    torch.manual_seed(0)
    preds = [torch.randn(4, 1), torch.randn(4, 1)]
    targets = [torch.randn(4, 1), torch.randn(4, 1)]
    logged = []
    for p, t in zip(preds, targets):
        loss, lg = step.loss_func(t, True, p)
        assert torch.allclose(loss, ((p - t) ** 2).mean())
        logged.append({k: float(v) for k, v in lg.items()})
    averaged = {k: sum(d[k] for d in logged) / 2 for k in logged[0]}
    out = step.eval_summary(averaged)
    x, y = torch.cat(preds).reshape(-1).double(), torch.cat(targets).reshape(-1).double()
    r = torch.corrcoef(torch.stack([x, y]))[0, 1].item()
    assert out["pearson"] == pytest.approx(r, abs=1e-9)
    rx = x.argsort().argsort().double()
    ry = y.argsort().argsort().double()
    assert out["spearman"] == pytest.approx(
        torch.corrcoef(torch.stack([rx, ry]))[0, 1].item(), abs=1e-9
    )
    assert out["mse"] == pytest.approx(float(((x - y) ** 2).mean()), rel=1e-6)
    assert not any(k.startswith("reg ") for k in out)


def test_rank_average_gives_ties_their_mean_rank() -> None:
    assert rank_average(torch.tensor([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]
    assert spearman(
        torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0, 20.0, 15.0])
    ) == pytest.approx(0.5)


def test_classification_losses_and_accuracy_equal_direct_computation() -> None:
    torch.manual_seed(1)
    logits = torch.randn(5, 6, 3)
    labels = torch.randint(0, 3, (5, 6))
    labels[0, 0] = -100
    labels[1, :2] = -100
    labels[2, 3] = -2  # a class training never saw
    step = ResidueClassificationStep(type("A", (), {"model": type("M", (), {"num_labels": 3})()})())
    loss, lg = step.loss_func(labels, True, logits)
    valid = labels >= 0
    expected = F.cross_entropy(logits[valid], labels[valid])
    assert torch.allclose(loss, expected, atol=1e-6)
    out = step.eval_summary({k: float(v) for k, v in lg.items()})
    pred = logits.argmax(-1)
    assert out["accuracy"] == pytest.approx(float((pred[valid] == labels[valid]).float().mean()))
    for k in range(3):
        sel = labels == k
        assert out[f"accuracy class {k}"] == pytest.approx(float((pred[sel] == k).float().mean()))
    assert out["unseen labels"] == pytest.approx(1 / (valid.sum().item() + 1))
    seq = SequenceClassificationStep(None)
    seq_logits, seq_labels = torch.randn(4, 3), torch.tensor([0, 2, 1, 2])
    loss, _ = seq.loss_func(seq_labels, False, seq_logits)
    assert torch.allclose(loss, F.cross_entropy(seq_logits, seq_labels), atol=1e-6)
