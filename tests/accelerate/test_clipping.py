"""Gradient clipping as Accelerate does it: none unless asked, the plugin's default with a plugin.

Peer: Hugging Face Accelerate itself runs the same plain script (one process, CPU) in
this process. A script without a Megatron-LM plugin that never calls
``clip_grad_norm_`` trains unclipped under both; one that calls
``accelerator.clip_grad_norm_(params, 0.3)`` is clipped to 0.3 under both, with the
same returned norms. With a plugin the train step clips at the plugin's default, taken
from Accelerate's own ``MegatronLMPlugin``. The launcher sets
``ACCELERATE_USE_MEGATRON_LM`` only for a Megatron-LM configuration, as
``accelerate launch`` does.
"""

import copy

import pytest
import torch
import transformers
from torch.utils.data import DataLoader
from transformers import default_data_collator

import accelerate
import epochal.accelerate
from epochal.accelerate.utils import MegatronLMPlugin
from epochal.accelerate.yaml_config import read_launch_config
from tests.accelerate.conftest import blocks, tiny_gpt2

STEPS = 5


@pytest.fixture(scope="module")
def start():
    """One tiny GPT-2 (no dropout) whose copies every run starts from, and its data."""
    torch.manual_seed(0)
    return tiny_gpt2(), blocks(4 * STEPS)


def _script(package, start, clip=None, plugin=None):
    """A plain Accelerate training loop; ``(losses, returned norms, trained weights)``."""
    model, data = copy.deepcopy(start[0]), start[1]
    kwargs = {"cpu": True} if plugin is None else {"cpu": True, "megatron_lm_plugin": plugin}
    accelerator = package.Accelerator(**kwargs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, 1, STEPS)
    loader = DataLoader(data, batch_size=4, collate_fn=default_data_collator)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    losses, norms = [], []
    for batch in loader:
        loss = model(**batch).loss
        accelerator.backward(loss)
        if clip is not None:
            norms.append(float(accelerator.clip_grad_norm_(model.parameters(), clip)))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    weights = {
        k: v.detach().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()
    }
    return losses, norms, weights


def _plain(start, clip):
    """The same loop in plain PyTorch, clipping every step to ``clip`` (None: not at all)."""
    model, data = copy.deepcopy(start[0]), start[1]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, 1, STEPS)
    losses, norms = [], []
    for batch in DataLoader(data, batch_size=4, collate_fn=default_data_collator):
        loss = model(**batch).loss
        loss.backward()
        if clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, norms, dict(model.state_dict())


def _same(ours, theirs):
    assert ours[0] == pytest.approx(theirs[0], abs=1e-5)
    assert ours[1] == pytest.approx(theirs[1], rel=1e-4)
    for name, tensor in theirs[2].items():
        assert torch.allclose(ours[2][name], tensor, atol=1e-5), name


@pytest.mark.parametrize("clip", [None, 0.3], ids=["no-clipping", "clip_grad_norm_-0.3"])
def test_a_plain_script_clips_as_under_accelerate(start, clip):
    theirs = _script(accelerate, start, clip)
    ours = _script(epochal.accelerate, start, clip)
    _same(ours, theirs)
    if clip is None:  # the steps' norms exceed 1: clipping at 1.0 would have changed them
        assert max(_plain(start, 1e9)[1]) > 1.0
    else:
        assert all(n > clip for n in theirs[1])  # every step was clipped


def test_with_a_plugin_the_step_clips_at_accelerates_default(start):
    default = accelerate.utils.MegatronLMPlugin().gradient_clipping
    assert MegatronLMPlugin().gradient_clipping == default
    ours = _script(epochal.accelerate, start, clip=default, plugin=MegatronLMPlugin())
    _same(ours, _plain(start, default))


def test_the_launcher_asks_for_megatron_only_with_a_megatron_configuration(tmp_path):
    plain, megatron = tmp_path / "plain.yaml", tmp_path / "megatron.yaml"
    plain.write_text("distributed_type: MULTI_CPU\nnum_processes: 2\nuse_cpu: true\n")
    megatron.write_text("distributed_type: MEGATRON_LM\nnum_processes: 2\nuse_cpu: true\n")
    assert "ACCELERATE_USE_MEGATRON_LM" not in read_launch_config(plain).environment()
    assert read_launch_config(megatron).environment()["ACCELERATE_USE_MEGATRON_LM"] == "true"
