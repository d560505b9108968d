"""The names Accelerate's example scripts import or touch beyond the Megatron-LM pattern.

Peers: Accelerate 1.15's ``find_executable_batch_size`` (its batch sizes on
out-of-memory), its ``state.deepspeed_plugin`` without DeepSpeed.
"""

import pytest
import torch
from accelerate.utils import find_executable_batch_size as accelerate_find
from torch.utils.data import DataLoader
from transformers import default_data_collator

from epochal.accelerate import Accelerator, AcceleratorError
from epochal.accelerate.local_sgd import LocalSGD
from epochal.accelerate.preparation import PrepareError
from epochal.accelerate.utils import DummyOptim, DummyScheduler, find_executable_batch_size
from tests.accelerate.conftest import blocks, tiny_gpt2


def _tries(decorator):
    seen = []

    @decorator(starting_batch_size=64)
    def train(batch_size, scale):
        seen.append(batch_size * scale)
        if batch_size > 20:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch_size

    return train(1), seen


@pytest.mark.slow  # ~20 s of full collections between retries, as Accelerate's own decorator does
def test_find_executable_batch_size_retries_as_accelerate():
    assert _tries(find_executable_batch_size) == _tries(accelerate_find)
    assert _tries(find_executable_batch_size)[1] == [64, 57, 51, 45, 40, 36, 32, 28, 25, 22, 19]
    calls = []

    @find_executable_batch_size(starting_batch_size=8)
    def once(batch_size):
        calls.append(batch_size)
        raise ValueError("not memory")

    with pytest.raises(ValueError, match="not memory"):
        once()
    assert calls == [8]  # any other error propagates at once


def _prepared(tmp_path=None):
    accelerator = Accelerator()
    model = tiny_gpt2()
    loader = DataLoader(blocks(24), batch_size=4, collate_fn=default_data_collator)
    model, loader = accelerator.prepare(model, loader)
    return accelerator, model, loader


def test_skip_first_batches_after_load_state_is_a_checked_no_op(tmp_path):
    accelerator, model, loader = _prepared()
    assert accelerator.skip_first_batches(loader, 0) is loader
    losses = []
    for step, batch in enumerate(loader):
        losses.append(model(**batch).loss.item())
        if step == 1:
            accelerator.save_state(tmp_path / "state")
    accelerator, model, loader = _prepared()
    accelerator.load_state(tmp_path / "state")
    with pytest.raises(AcceleratorError, match="starts at step 2 of its epoch"):
        accelerator.skip_first_batches(loader, 3)
    active = accelerator.skip_first_batches(loader, 2)
    assert active is loader
    assert [model(**b).loss.item() for b in active] == pytest.approx(losses[2:], abs=1e-6)


def test_deepspeed_placeholders_are_refused_at_prepare():
    accelerator = Accelerator()
    assert accelerator.state.deepspeed_plugin is None
    model = tiny_gpt2()
    loader = DataLoader(blocks(8), batch_size=4, collate_fn=default_data_collator)
    optimizer = DummyOptim(model.parameters(), lr=1e-3)
    with pytest.raises(PrepareError, match="DeepSpeed is not supported.*torch.optim"):
        accelerator.prepare(model, optimizer, loader)
    real = torch.optim.AdamW(model.parameters())
    with pytest.raises(PrepareError, match="DummyScheduler: DeepSpeed is not supported"):
        accelerator.prepare(model, real, loader, DummyScheduler(real, total_num_steps=4))


def test_local_sgd_on_one_replica_changes_nothing():
    accelerator, model, loader = _prepared()
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=2) as local_sgd:
        for batch in loader:
            model(**batch)
            local_sgd.step()
    assert local_sgd.num_steps == len(loader)


def test_local_sgd_on_several_replicas_is_refused():
    from types import SimpleNamespace

    from epochal.accelerate.local_sgd import LocalSGDError

    plugin = SimpleNamespace(tp_degree=2, cp_degree=1, pp_degree=1)
    four = SimpleNamespace(num_processes=4, state=SimpleNamespace(megatron_lm_plugin=plugin))
    with pytest.raises(LocalSGDError, match="2 data-parallel replicas.*enabled=False"):
        LocalSGD(accelerator=four, model=None, local_sgd_steps=8)
    assert LocalSGD(accelerator=four, model=None, local_sgd_steps=8, enabled=False).enabled is False
