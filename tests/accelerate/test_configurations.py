"""``DataLoaderConfiguration`` and ``ProjectConfiguration``: each field honoured as Accelerate does, or refused."""

import dataclasses
import os
import sys

import pytest
import torch
import transformers
from accelerate.utils import DataLoaderConfiguration as AccelerateDataLoaderConfiguration
from accelerate.utils import ProjectConfiguration as AccelerateProjectConfiguration
from torch.utils.data import DataLoader
from transformers import default_data_collator

from epochal.accelerate import Accelerator, AcceleratorError
from epochal.accelerate.utils import DataLoaderConfiguration, ProjectConfiguration
from tests.dist_utils import run_process

#: Accelerate's field -> a value other than its default, and the refusal's words (None: honoured)
NOT_DEFAULT = {
    "split_batches": (True, "batch_size is the micro-batch size per data-parallel rank"),
    "dispatch_batches": (True, "every process reads its own samples"),
    "even_batches": (False, "left out of each epoch"),
    "use_seedable_sampler": (True, None),
    "data_seed": (11, None),
    "non_blocking": (True, None),
    "use_stateful_dataloader": (True, None),
}


def _loader(n=12, shuffle=True):
    return DataLoader(
        list(range(n)), batch_size=2, shuffle=shuffle, collate_fn=lambda xs: {"x": torch.tensor(xs)}
    )


def _order(accelerator):
    return [b["x"].tolist() for b in accelerator.prepare(_loader())]


def test_every_dataloader_configuration_field_is_honoured_or_refused():
    fields = {f.name: f.default for f in dataclasses.fields(AccelerateDataLoaderConfiguration)}
    assert set(fields) == set(NOT_DEFAULT)  # a new field of Accelerate's fails here first
    assert {f.name: f.default for f in dataclasses.fields(DataLoaderConfiguration)} == fields
    with pytest.raises(AcceleratorError) as keyword:
        Accelerator(split_batches=True)
    refusals = {}
    for name, (value, refusal) in NOT_DEFAULT.items():
        for cls in (AccelerateDataLoaderConfiguration, DataLoaderConfiguration):
            config = cls(**{name: value})
            if refusal is None:
                assert (
                    getattr(Accelerator(dataloader_config=config).dataloader_config, name) == value
                )
                continue
            with pytest.raises(AcceleratorError) as err:
                Accelerator(dataloader_config=config)
            assert f"{name}={value!r}" in str(err.value) and refusal in str(err.value)
            refusals[name] = str(err.value)
    # the keyword form and the configuration are refused with the same reason and fix
    assert str(keyword.value).split(": ", 1)[1] == refusals["split_batches"].split(": ", 1)[1]


def test_data_seed_and_non_blocking_reach_the_prepared_loaders():
    seeded = AccelerateDataLoaderConfiguration(data_seed=11, non_blocking=True)
    torch.manual_seed(1)
    first = _order(Accelerator(dataloader_config=seeded))
    torch.manual_seed(2)
    again = Accelerator(dataloader_config=seeded)
    assert _order(again) == first  # the data seed decides the order, not torch's seed
    assert again.prepare(_loader()).non_blocking is True
    other = _order(Accelerator(dataloader_config=AccelerateDataLoaderConfiguration(data_seed=12)))
    assert other != first and sorted(sum(other, [])) == sorted(sum(first, []))


REAL_ACCELERATE = """
import sys, torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration
config = ProjectConfiguration(project_dir=sys.argv[1], automatic_checkpoint_naming=True, total_limit=2)
accelerator = Accelerator(cpu=True, project_config=config)
accelerator.prepare(torch.nn.Linear(2, 2))
print([accelerator.save_state() for _ in range(3)], accelerator.save_iteration)
"""


def _engine(config):
    gpt = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=8)
    data = [{"input_ids": torch.arange(8) % 50, "labels": torch.arange(8) % 50} for _ in range(4)]
    accelerator = Accelerator(project_config=config)
    torch.manual_seed(0)
    model, _ = accelerator.prepare(
        transformers.GPT2LMHeadModel(gpt),
        DataLoader(data, batch_size=2, collate_fn=default_data_collator),
    )
    return accelerator, model


def test_automatic_checkpoint_naming_and_total_limit_as_accelerate(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "MEGATRON_LM_"))}
    proc = run_process(
        [sys.executable, "-c", REAL_ACCELERATE, str(tmp_path / "peer")], env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    peer = sorted(os.listdir(tmp_path / "peer" / "checkpoints"))
    assert peer == ["checkpoint_1", "checkpoint_2"] and proc.stdout.strip().endswith(" 3")

    ours = tmp_path / "ours"
    (ours / "checkpoints" / "notes").mkdir(parents=True)  # not a checkpoint: never deleted
    (ours / "checkpoints" / "notes" / "keep.txt").write_text("mine")
    config = AccelerateProjectConfiguration(
        project_dir=str(ours), automatic_checkpoint_naming=True, total_limit=2
    )
    accelerator, _ = _engine(config)
    written = [accelerator.save_state(str(tmp_path / "ignored")) for _ in range(3)]
    assert written == [str(ours / "checkpoints" / f"checkpoint_{i}") for i in range(3)]
    assert not (tmp_path / "ignored").exists()  # output_dir is ignored, as in Accelerate
    assert sorted(os.listdir(ours / "checkpoints")) == [*peer, "notes"]
    assert config.iteration == accelerator.save_iteration == 3
    assert (ours / "checkpoints" / "notes" / "keep.txt").read_text() == "mine"

    # a restarted script: load_state() takes the newest and the numbering continues
    fresh = ProjectConfiguration(
        project_dir=str(ours), automatic_checkpoint_naming=True, total_limit=2
    )
    restarted, model = _engine(fresh)
    restarted.load_state()
    assert fresh.iteration == 3
    assert restarted.save_state() == str(ours / "checkpoints" / "checkpoint_3")
    assert sorted(os.listdir(ours / "checkpoints")) == ["checkpoint_2", "checkpoint_3", "notes"]
    fresh.iteration = 2
    with pytest.raises(AcceleratorError, match="checkpoint_2 already exists"):
        restarted.save_state()
    with pytest.raises(AcceleratorError, match="total_limit"):
        Accelerator(project_config=ProjectConfiguration(total_limit=0))
