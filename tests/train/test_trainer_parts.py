"""The parts the trainer holds: its checkpointer, its evaluator and its dropout keys."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from epochal.parallel.dropout_keys import step_seeds
from epochal.train.observe.evaluator import Evaluator
from epochal.train.parallel_trainer import ParallelTrainer
from epochal.train.state.checkpoint import Checkpointer
from epochal.train.state.dropout_seed import DropoutKeys
from epochal.train.state.run_checkpointer import RunCheckpointer
from epochal.train.trainer import Trainer

CPU = torch.device("cpu")


def test_the_trainers_inherit_no_mixin() -> None:
    assert Trainer.__bases__ == (object,)
    assert ParallelTrainer.__bases__ == (Trainer,)


# ------------------------------------------------------------------ dropout keys
def _keys(p: float, invariant: bool = True, **dp: int) -> DropoutKeys:
    parts = [nn.Sequential(nn.Linear(2, 2), nn.Dropout(p))]
    return DropoutKeys(seed=7, device=CPU, model_parts=parts, keyed=invariant, **dp)


def test_dropout_keys_give_each_micro_batch_its_seed_and_keep_the_global_stream() -> None:
    keys = _keys(0.1, dp_rank=1, dp_size=2)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    with keys.step(4, 3) as seeds:
        assert seeds == step_seeds(7, 4, 3, dp_rank=1, dp_size=2)
        torch.manual_seed(99)  # a step reseeds per micro-batch; the stream comes back
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("p, invariant", [(0.0, True), (0.1, False)])
def test_dropout_keys_leave_the_stream_alone_without_keyed_dropout(p, invariant) -> None:
    keys = _keys(p, invariant)
    torch.manual_seed(5)
    with keys.step(0, 2) as seeds:
        assert seeds is None
        drawn = torch.rand(1)
    torch.manual_seed(5)
    assert torch.equal(drawn, torch.rand(1))


# --------------------------------------------------------------------- evaluator
class _Step:
    """A train step's evaluation hooks: the summary adds a value, the loss is doubled."""

    def eval_summary(self, logged: dict[str, float]) -> dict[str, float]:
        return {**logged, "summary": 1.0}

    def evaluation_loss(self, mean: float, logged: dict[str, float]) -> float:
        return 2 * mean


def test_evaluator_turns_the_pass_into_loss_and_logged_values() -> None:
    seen: list[str] = []

    def run_pass(observer):
        observer({"x": torch.zeros(1)}, torch.zeros(1))
        return 1.5, [{"a": 1.0}, {"a": 3.0}]

    ev = Evaluator(run_pass, training=SimpleNamespace(eval_interval=0, eval_iters=1))
    ev.add_callback(lambda batch, logits: seen.append("callback"))
    assert ev.evaluate(_Step(), on_logits=lambda batch, logits: seen.append("extra")) == 3.0
    assert seen == ["callback", "extra"]
    assert ev.last_logged == {"a": 2.0, "summary": 1.0}


def test_evaluator_without_validation_data_keeps_the_last_values() -> None:
    ev = Evaluator(lambda observer: None, training=SimpleNamespace(eval_interval=0, eval_iters=1))
    ev.last_logged = {"a": 1.0}
    assert ev.evaluate(_Step()) is None and ev.last_logged == {"a": 1.0}
    assert ev.observer() is None  # no callbacks: the pass gets no observer


@pytest.mark.parametrize(
    "interval, iters, step, last, due",
    [
        (5, 1, 10, False, True),
        (5, 1, 7, False, False),
        (0, 1, 7, False, False),
        (0, 1, 7, True, True),
        (5, 0, 7, True, False),
    ],
)
def test_evaluator_is_due_on_the_interval_and_at_the_end(interval, iters, step, last, due) -> None:
    training = SimpleNamespace(eval_interval=interval, eval_iters=iters)
    assert Evaluator(lambda o: None, training=training).due(step, last) is due


# ------------------------------------------------------------------ checkpointer
def _checkpointer(tmp_path: Path, save_interval: int, save_final: bool) -> RunCheckpointer:
    section = SimpleNamespace(save_interval=save_interval, save_final=save_final)
    return RunCheckpointer(
        Checkpointer(tmp_path / "checkpoints"),
        config=SimpleNamespace(checkpoint=section),
        model_config=None,
        model_parts=[],
        optimizer_state=None,
        scheduler=None,
        data=None,
    )


@pytest.mark.parametrize(
    "interval, final, step, last, due",
    [(3, False, 6, False, True), (3, False, 7, True, False), (0, True, 7, True, True)],
)
def test_checkpointer_is_due_on_the_interval_and_at_the_end(
    tmp_path, interval, final, step, last, due
) -> None:
    assert _checkpointer(tmp_path, interval, final).due(step, last) is due


def test_checkpointer_using_another_store_puts_its_own_back(tmp_path) -> None:
    ck = _checkpointer(tmp_path, 1, True)
    own, other = ck.store, Checkpointer(tmp_path / "elsewhere")
    with pytest.raises(RuntimeError), ck.using(other):
        assert ck.store is other
        raise RuntimeError
    assert ck.store is own


def test_another_model_is_refused_naming_each_differing_field(tmp_path):
    from epochal.train.state.errors import CheckpointError, refuse_other_model

    ours = {"hidden_size": 128, "num_layers": 2, "ffn_hidden_size": 512}
    refuse_other_model(tmp_path, ours, {"hidden_size": 128, "num_layers": 2})  # a field it lacks
    with pytest.raises(CheckpointError) as err:
        refuse_other_model(tmp_path, ours, {"hidden_size": 64, "num_layers": 4}, prefix="model.")
    assert str(err.value) == (
        f"{tmp_path} holds another model: model.hidden_size: checkpoint 64 vs config 128; "
        "model.num_layers: checkpoint 4 vs config 2"
    )
