"""MegatronDataModule with a real Lightning Trainer on CPU: stop, resume, compare bit for bit."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from epochal.data import MegatronDataModule, MegatronDataSampler, WrappedDataLoader  # noqa: E402
from epochal.data.loading.data_sampler import DataSamplerConfigError  # noqa: E402
from epochal.data.loading.datamodule import DataModuleStateError  # noqa: E402
from tests.data.lightning_toy import (  # noqa: E402
    SCENARIOS,
    ToyDataModule,
    make_module,
    make_trainer,
    quiet,
)
from tests.data.resumable_helpers import ToyGPTDataset  # noqa: E402
from tests.dist_utils import run_process  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _quiet_lightning():
    quiet()


def _fit(scenario, ckpt_dir=None, ckpt_path=None, **trainer_overrides):
    module, data = make_module(scenario), ToyDataModule(scenario)
    trainer = make_trainer(scenario, ckpt_dir, **trainer_overrides)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return trainer, module, data


def _steps_to_micro_batches(scenario, steps):
    """Number of micro-batches the first ``steps`` steps take (ramp-up aware)."""
    spec = SCENARIOS[scenario]
    ds = MegatronDataSampler(6, 2, data_parallel_rank=0, data_parallel_size=1, **spec["sampler"])
    consumed, count = 0, 0
    for _ in range(steps):
        count += ds.num_microbatches_at(consumed)
        consumed += ds.global_batch_size_at(consumed)
    return count, consumed


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The uninterrupted run of every scenario, saving checkpoints along the way."""
    quiet()
    runs = {}
    for scenario in SCENARIOS:
        ckpt_dir = str(tmp_path_factory.mktemp(scenario))
        trainer, module, data = _fit(scenario, ckpt_dir)
        runs[scenario] = (trainer, module, data, ckpt_dir)
    return runs


@pytest.mark.peer
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_stop_and_go_matches_uninterrupted_run(uninterrupted, scenario, tmp_path):
    trainer, ref, ref_data, ref_dir = uninterrupted[scenario]
    spec = SCENARIOS[scenario]
    max_steps, every = spec["max_steps"], spec["ckpt_every"]
    assert trainer.global_step == max_steps  # no StopIteration before max_steps (NeMo issue 11481)
    assert len(ref.losses) == (max_steps * 2 if scenario != "dataloader_iter_rampup" else max_steps)
    # validation saw the same samples every time it ran
    assert len(ref.val_runs) >= 2 and all(run == ref.val_runs[0] for run in ref.val_runs)
    # 6 validation samples: one whole global batch of 4 (validation runs whole global batches, like
    # Megatron); 'cyclic' validates on a fixed shuffled subset
    assert len(set(ref.val_runs[0])) == 4 and set(ref.val_runs[0]) <= set(range(6))
    if scenario != "cyclic_reload":
        assert ref.val_runs[0] == [0, 1, 2, 3]

    if scenario == "accumulate":
        # a real crash: another process trains, checkpoints at step 3 and is SIGKILLed after step 5
        crash_dir = str(tmp_path / "crashed")
        cmd = [
            sys.executable,
            "-c",
            f"from tests.data.lightning_toy import crash_main; crash_main({crash_dir!r}, {scenario!r}, 5)",
        ]
        proc = run_process(cmd, cwd=REPO, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == -9, proc.stdout + proc.stderr
        ckpt_dir = crash_dir
    else:
        ckpt_dir = (
            ref_dir  # the checkpoint of the uninterrupted run (a run stopped right after saving it)
        )
    ckpt = os.path.join(ckpt_dir, f"step={every}.ckpt")
    assert os.path.isfile(ckpt), os.listdir(ckpt_dir)

    # both resume records in the checkpoint say the same thing
    state = torch.load(ckpt, weights_only=False)
    micro, consumed = _steps_to_micro_batches(scenario, every)
    assert state["ToyDataModule"] == {"consumed_samples": consumed}
    assert state["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [
        {"consumed_samples": consumed, "mode": "train"}
    ]

    trainer2, resumed, data2 = _fit(scenario, ckpt_path=ckpt)
    assert trainer2.global_step == max_steps
    assert resumed.seen == ref.seen[micro:]  # the same sample ids after the resume
    done_losses = every if scenario == "dataloader_iter_rampup" else micro
    assert len(resumed.losses) == len(ref.losses) - done_losses
    for a, b in zip(resumed.losses, ref.losses[done_losses:], strict=True):
        assert torch.equal(a, b)  # bit for bit on CPU
    for p_res, p_ref in zip(resumed.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p_res, p_ref)
    assert resumed.val_runs and all(run == ref.val_runs[0] for run in resumed.val_runs)
    assert data2.consumed_samples == ref_data.consumed_samples
    assert data2.state_dict() == ref_data.state_dict()


def test_uninterrupted_cyclic_run_reshuffles_every_epoch(uninterrupted):
    _, ref, data, _ = uninterrupted["cyclic_reload"]
    ids = [i for mb in ref.seen for i in mb]
    epochs = [ids[k : k + 12] for k in range(0, len(ids), 12)]
    assert len(epochs) == 3 and epochs[0] != epochs[1]
    assert all(len(set(e)) == len(e) for e in epochs)
    assert (
        data.train_loaders_built == 3
    )  # reloaded every epoch; the position carried over each time
    assert data.state_dict() == {"consumed_samples": 32}


def test_mismatched_accumulation_is_loud(tmp_path):
    # global_batch_size 4 = 2 micro-batches of 2, but Lightning steps after every micro-batch
    with pytest.raises(DataModuleStateError, match="accumulate_grad_batches"):
        _fit("accumulate", str(tmp_path), accumulate_grad_batches=1, max_steps=3)


def test_hooks_are_wrapped_and_modes_checked():
    class WrongMode(MegatronDataModule):
        def __init__(self):
            super().__init__(
                MegatronDataSampler(6, 2, 4, data_parallel_rank=0, data_parallel_size=1)
            )

        def train_dataloader(self):
            return WrappedDataLoader(ToyGPTDataset(8), mode="train")

        def val_dataloader(self):
            return WrappedDataLoader(
                ToyGPTDataset(8), mode="train"
            )  # NeMo's silent default, refused

        def test_dataloader(self):
            return torch.utils.data.DataLoader(ToyGPTDataset(8))

    dm = WrongMode()
    loader = dm.train_dataloader()  # no trainer attached: anchored at step 0
    assert loader.megatron_sampler is not None and loader.consumed_samples == 0
    with pytest.raises(ValueError, match="mode='train'; it must be 'validation'"):
        dm.val_dataloader()
    with pytest.raises(TypeError, match="WrappedDataLoader"):
        dm.test_dataloader()
    with pytest.raises(DataModuleStateError, match="consumed_samples"):
        dm.load_state_dict({"consumed": 3})
    with pytest.raises(DataModuleStateError, match="integer >= 0"):
        dm.load_state_dict({"consumed_samples": -3})
    dm.load_state_dict({"consumed_samples": 4})
    assert dm.state_dict() == {"consumed_samples": 4}  # nothing trained since the load
    assert dm.train_dataloader().consumed_samples == 4
    dm.update_init_global_step()  # idempotent
    assert dm.state_dict() == {"consumed_samples": 4} and dm.num_microbatches == 2
    with pytest.raises(DataModuleStateError, match="must be a MegatronDataSampler"):
        MegatronDataModule().update_init_global_step()


def test_state_inside_a_step_is_tolerated_but_drift_is_not():
    class Data(MegatronDataModule):
        def __init__(self):
            super().__init__(
                MegatronDataSampler(6, 2, 8, data_parallel_rank=0, data_parallel_size=1)
            )

        def train_dataloader(self):
            return WrappedDataLoader(ToyGPTDataset(64), mode="train")

    dm = Data()
    dm.trainer = SimpleNamespace(global_step=0)  # what the module reads from a Trainer
    it = iter(dm.train_dataloader())
    next(it)  # one of the step's 4 micro-batches: a checkpoint here (e.g. after validation) is fine
    assert dm.state_dict() == {"consumed_samples": 0}
    for _ in range(3):
        next(it)
    dm.trainer.global_step = 1
    assert dm.state_dict() == {"consumed_samples": 8} and dm.num_microbatches == 4
    for _ in range(4):  # a whole step's micro-batches without an optimizer step: drift
        next(it)
    with pytest.raises(DataModuleStateError, match="delivered samples up to position 16"):
        dm.state_dict()


def test_padded_train_loader_counts_its_last_step_whole():
    class Data(MegatronDataModule):
        def __init__(self):
            super().__init__(
                MegatronDataSampler(
                    6,
                    2,
                    4,
                    data_parallel_rank=0,
                    data_parallel_size=1,
                    pad_samples_to_global_batch_size=True,
                )
            )

        def train_dataloader(self):
            return WrappedDataLoader(ToyGPTDataset(10), mode="train", drop_last=False)

    dm = Data()
    dm.trainer = SimpleNamespace(global_step=0)
    batches = list(dm.train_dataloader())  # 3 steps of 2 micro-batches; the last one is padding
    assert len(batches) == 6 and not batches[-1]["loss_mask"].any()
    dm.trainer.global_step = 3
    assert dm.state_dict() == {"consumed_samples": 12}


@pytest.mark.parametrize(
    ("rampup", "train_samples", "drop_last", "fits"),
    [
        (
            [2, 2, 4],
            12,
            True,
            True,
        ),  # steps of 2, 2, 4 (to 8), then 4: epoch ends (12) are step ends
        ([2, 2, 5], 12, True, False),  # ramp-up ends at 10: the step [10, 14) runs across 12
        ([2, 2, 10], 12, True, False),  # the last ramp-up step [10, 14) crosses 12
        (None, 13, False, False),  # drop_last=False: epochs of 13, steps of 4
        (None, 13, True, True),
    ],
)
def test_cyclic_steps_must_not_run_across_an_epoch_end(rampup, train_samples, drop_last, fits):
    # Lightning ends its epoch when a pass of the train loader ends and discards a step left
    # half-way: its samples would be lost and the run would resume at another sample.
    class Data(MegatronDataModule):
        def __init__(self):
            super().__init__(
                MegatronDataSampler(
                    6,
                    2,
                    4,
                    rampup_batch_size=rampup,
                    dataloader_type="cyclic",
                    global_shuffle=True,
                    data_parallel_rank=0,
                    data_parallel_size=1,
                )
            )

        def train_dataloader(self):
            return WrappedDataLoader(
                ToyGPTDataset(train_samples), mode="train", drop_last=drop_last
            )

    if fits:
        assert Data().train_dataloader().megatron_sampler is not None
    else:
        with pytest.raises(DataSamplerConfigError, match="epoch"):
            Data().train_dataloader()
