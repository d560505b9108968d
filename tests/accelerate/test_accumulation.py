"""``Accelerator(gradient_accumulation_steps=N)`` with ``accelerator.accumulate(model)``.

Peer: plain PyTorch gradient accumulation as Accelerate performs it (each micro-batch's
loss divided by ``N`` before its backward, one optimizer and scheduler step per ``N``
loader batches).
"""

import copy

import pytest
import torch
import transformers
from torch.utils.data import DataLoader
from transformers import default_data_collator

from epochal.accelerate import Accelerator, AcceleratorError, set_seed
from epochal.accelerate.utils import MegatronLMPlugin
from tests.accelerate.conftest import blocks, tiny_gpt2


def _opt(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    return optimizer, transformers.get_linear_schedule_with_warmup(optimizer, 1, 6)


def test_gradient_accumulation_steps_equal_plain_accumulation():
    set_seed(0)
    model = tiny_gpt2()
    reference = copy.deepcopy(model)
    data = blocks(32)
    accelerator = Accelerator(gradient_accumulation_steps=2)
    assert accelerator.gradient_accumulation_steps == 2
    optimizer, scheduler = _opt(model)
    loader = DataLoader(data, batch_size=4, collate_fn=default_data_collator)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    assert len(loader) == 4  # 32 samples in steps of 2 micro-batches of 4
    ours, synced = [], []
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            synced.append(accelerator.sync_gradients)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        ours.append(loss.item())
    assert synced == [True] * 4

    ref_opt, ref_sched = _opt(reference)
    theirs, pending = [], []
    plain = DataLoader(data, batch_size=4, collate_fn=default_data_collator)
    for i, batch in enumerate(plain):
        loss = reference(**batch).loss / 2
        loss.backward()
        pending.append(loss.item())
        if i % 2 == 1:
            ref_opt.step()  # unclipped: the script asks for no clipping and has no plugin
            ref_sched.step()
            ref_opt.zero_grad()
            theirs.append(sum(pending))
            pending = []
    assert ours == pytest.approx(theirs, abs=1e-5)
    state = accelerator.unwrap_model(model).state_dict()
    for name, tensor in reference.state_dict().items():
        assert (state[name] - tensor).abs().max() < 1e-5, name


def test_gradient_accumulation_disagreeing_with_micro_batches_is_refused():
    with pytest.raises(AcceleratorError, match="num_micro_batches=4"):
        Accelerator(
            gradient_accumulation_steps=2,
            megatron_lm_plugin=MegatronLMPlugin(num_micro_batches=4),
        )
