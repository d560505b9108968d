"""A PyTorch / transformers learning-rate scheduler prepared with the optimizer drives the run.

Peer: plain PyTorch training of the same transformers model with the same
scheduler (``optimizer.step(); lr_scheduler.step()`` each step).
"""

import copy

import pytest
import torch
import transformers
from torch.utils.data import DataLoader
from transformers import default_data_collator

from epochal.accelerate import Accelerator, set_seed
from epochal.accelerate.preparation import PrepareError
from tests.accelerate.conftest import blocks, tiny_gpt2


def _schedule(kind: str, optimizer: torch.optim.Optimizer):
    if kind == "linear":
        return transformers.get_linear_schedule_with_warmup(optimizer, 2, 8)
    if kind == "cosine":
        return transformers.get_scheduler("cosine", optimizer, 1, 6)
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)


def _plain(model, data, kind, make_opt, steps):
    optimizer = make_opt(model)
    scheduler = _schedule(kind, optimizer)
    lrs, losses = [], []
    loader = DataLoader(data, batch_size=4, collate_fn=default_data_collator)
    for _, batch in zip(range(steps), loader):
        lrs.extend(g["lr"] for g in optimizer.param_groups)
        loss = model(**batch).loss
        loss.backward()  # no clipping: the script asks for none (and has no Megatron-LM plugin)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return lrs, losses


def _adamw(model):
    decay = [p for n, p in model.named_parameters() if "bias" not in n]
    no_decay = [p for n, p in model.named_parameters() if "bias" in n]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-2,
    )


def _sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.5)


def _prepared(model, data, kind, make_opt):
    accelerator = Accelerator()
    optimizer = make_opt(model)
    scheduler = _schedule(kind, optimizer)
    loader = DataLoader(data, batch_size=4, collate_fn=default_data_collator)
    return accelerator, *accelerator.prepare(model, optimizer, loader, scheduler)


def _train(model, optimizer, loader, scheduler, steps):
    lrs, losses = [], []
    for _, batch in zip(range(steps), loader):
        lrs.extend(g["lr"] for g in optimizer.param_groups)
        assert scheduler.get_last_lr() == [g["lr"] for g in optimizer.param_groups]
        loss = model(**batch).loss
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return lrs, losses


@pytest.mark.parametrize(
    ("kind", "make_opt"), [("linear", _adamw), ("cosine", _adamw), ("step", _sgd)]
)
def test_scheduler_drives_the_learning_rate_as_plain_pytorch(kind, make_opt):
    set_seed(0)
    model = tiny_gpt2()
    reference = copy.deepcopy(model)
    data = blocks(24)
    accelerator, model, optimizer, loader, scheduler = _prepared(model, data, kind, make_opt)
    ours_lr, ours = _train(model, optimizer, loader, scheduler, 6)
    theirs_lr, theirs = _plain(reference, data, kind, make_opt, 6)
    assert ours_lr == pytest.approx(theirs_lr, abs=1e-12)
    assert len(set(theirs_lr)) > 2  # the schedule does move
    assert ours == pytest.approx(theirs, abs=1e-5)
    state = accelerator.unwrap_model(model).state_dict()
    for name, tensor in reference.state_dict().items():
        assert (state[name] - tensor).abs().max() < 1e-4, (name, (state[name] - tensor).abs().max())


def test_save_and_load_state_continue_the_schedule(tmp_path):
    set_seed(0)
    model = tiny_gpt2()
    fresh = copy.deepcopy(model)
    reference = copy.deepcopy(model)
    data = blocks(24)
    accelerator, model, optimizer, loader, scheduler = _prepared(model, data, "linear", _adamw)
    first_lr, first = _train(model, optimizer, loader, scheduler, 3)
    accelerator.save_state(tmp_path / "state")
    assert (tmp_path / "state" / "scheduler.bin").is_file()

    accelerator, model, optimizer, loader, scheduler = _prepared(fresh, data, "linear", _adamw)
    accelerator.load_state(tmp_path / "state")
    assert scheduler.scheduler.last_epoch == 3
    rest_lr, rest = _train(model, optimizer, loader, scheduler, 3)
    theirs_lr, theirs = _plain(reference, data, "linear", _adamw, 6)
    assert first_lr + rest_lr == pytest.approx(theirs_lr, abs=1e-12)
    assert first + rest == pytest.approx(theirs, abs=1e-5)


def test_scheduler_of_another_optimizer_is_refused():
    model = tiny_gpt2()
    optimizer = torch.optim.AdamW(model.parameters())
    other = torch.optim.AdamW(model.parameters())
    scheduler = transformers.get_constant_schedule(other)
    loader = DataLoader(blocks(8), batch_size=4, collate_fn=default_data_collator)
    with pytest.raises(PrepareError, match="same prepare"):
        Accelerator().prepare(model, optimizer, loader, scheduler)


def test_one_step_advances_once_per_data_parallel_replica_unless_skipped():
    """As Accelerate's AcceleratedScheduler (split_batches=False): num_processes steps per update."""
    from types import SimpleNamespace

    from epochal.accelerate.schedulers import PreparedTorchScheduler

    weight = torch.nn.Parameter(torch.zeros(1))
    user = torch.optim.SGD([weight], lr=1.0)
    plain_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    plain = transformers.get_linear_schedule_with_warmup(plain_opt, 2, 10)
    engine = SimpleNamespace(last_metrics={}, complete_step=lambda: None)
    groups = [{"lr": None}]
    prepared = PreparedTorchScheduler(
        engine,
        SimpleNamespace(param_groups=groups),
        transformers.get_linear_schedule_with_warmup(user, 2, 10),
        steps_per_update=2,
    )
    prepared.step()
    plain_opt.step()
    plain.step()
    plain.step()
    assert (
        groups[0]["lr"] == plain.get_last_lr()[0] == 1.0
    )  # two steps: the end of the warmup (one would give 0.5)
    engine.last_metrics = {"skipped": 1}  # an fp16 overflow skipped the update
    prepared.step()
    assert (
        groups[0]["lr"] == 1.0
    )  # two steps: the end of the warmup (one would give 0.5) and prepared.last_epoch == 2
