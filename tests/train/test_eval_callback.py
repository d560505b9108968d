"""Evaluation callbacks (``training.eval_callback``) and evaluation logits in one process.

The layouts (TP2, PP2, DP2) are in ``tests/parallel/test_custom_train_step.py``.
"""

from __future__ import annotations

import pytest

from epochal.model.config import ConfigError
from epochal.train.observe.metrics import read_metrics
from epochal.train.trainer import Trainer
from tests.parallel import custom_step_worker as W
from tests.train.eval_metrics import token_accuracy

CALLBACK = "tests.train.eval_metrics:token_accuracy"


def _trainer(tmp_path, *extra: str) -> Trainer:
    cfg = W.config(str(tmp_path), list(extra))
    return Trainer(cfg, data=W.data(cfg), log=False)


def test_callback_metric_is_logged_with_the_evaluation(tmp_path):
    tr = _trainer(tmp_path, f"--training.eval_callback={CALLBACK}")
    tr.train()
    evals = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["kind"] == "eval"]
    assert evals and "accuracy" in evals[-1]
    # The logged value is the mean over micro-batches of the callback's value.
    logits = tr.evaluate_logits()
    batches = [mb for mb, _ in zip(tr.data.valid_loader, logits)]
    per_mb = [float(token_accuracy(mb, x)["accuracy"]) for mb, x in zip(batches, logits)]
    assert evals[-1]["accuracy"] == pytest.approx(sum(per_mb) / len(per_mb), abs=1e-6)
    assert tr.last_eval_logged["accuracy"] == pytest.approx(evals[-1]["accuracy"], abs=1e-6)


def test_add_eval_callback_and_several_callbacks(tmp_path):
    tr = _trainer(tmp_path, f"--training.eval_callback={CALLBACK}")
    seen = []
    tr.add_eval_callback(lambda batch, logits: seen.append(logits.shape) or {"n": 1.0})
    tr.evaluate()
    assert len(seen) == 4 and all(s[:2] == (2, 16) for s in seen)
    assert tr.last_eval_logged["n"] == 1.0 and "accuracy" in tr.last_eval_logged


@pytest.mark.parametrize(
    "spec, message",
    [
        ("tests.train.no_such_module:f", "cannot import module"),
        ("tests.train.eval_metrics:missing", "has no 'missing'"),
        ("tests.train.eval_metrics:NOT_CALLABLE", "is not a function"),
    ],
)
def test_bad_eval_callback_is_a_config_error(tmp_path, spec, message):
    with pytest.raises(ConfigError, match=message) as info:
        _trainer(tmp_path, f"--training.eval_callback={spec}")
    assert "training.eval_callback" in str(info.value)


def test_malformed_spec_is_refused_by_the_config(tmp_path):
    with pytest.raises(ConfigError, match="training.eval_callback"):
        W.config(str(tmp_path), ["--training.eval_callback=no_colon"])


def test_callback_returning_no_dict_is_a_clear_error(tmp_path):
    tr = _trainer(tmp_path, "--training.eval_callback=tests.train.eval_metrics:returns_a_list")
    with pytest.raises(TypeError, match="must return None or a dict"):
        tr.evaluate()
