"""A tiny Lightning setup for the stop-and-go tests: a linear model, a MegatronDataModule, a crash helper.

``python -c "from tests.data.lightning_toy import crash_main; crash_main(dir, style, kill_at)"``
trains with checkpoints and kills its own process with SIGKILL after step ``kill_at``.
"""

from __future__ import annotations

import os
import signal
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from epochal.data import MegatronDataModule, MegatronDataSampler, WrappedDataLoader
from tests.data.resumable_helpers import ToyGPTDataset

# scenario -> (data sampler options, trainer options, train samples)
SCENARIOS: dict[str, dict[str, Any]] = {
    # one Lightning batch = one micro-batch; Lightning accumulates 2 micro-batches per step.
    # max_epochs=1 and exactly max_steps * gbs samples: NeMo issue 11481's setup.
    "accumulate": {
        "sampler": {"global_batch_size": 4},
        "trainer": {"accumulate_grad_batches": 2, "max_epochs": 1, "val_check_interval": 4},
        "train_samples": 32,
        "max_steps": 8,
        "ckpt_every": 3,
    },
    # NeMo style: training_step(dataloader_iter) takes num_microbatches micro-batches; ramp-up
    # from 2 to 4 samples per step after 8 samples: steps take 2,2,2,2,4,4,4,4 samples.
    "dataloader_iter_rampup": {
        "sampler": {"global_batch_size": 4, "rampup_batch_size": [2, 2, 8]},
        "trainer": {"max_epochs": 1, "val_check_interval": 2},
        "train_samples": 24,
        "max_steps": 8,
        "ckpt_every": 3,
    },
    # reshuffled epochs of 12 samples (3 steps) with the loader rebuilt every epoch
    "cyclic_reload": {
        "sampler": {
            "global_batch_size": 4,
            "dataloader_type": "cyclic",
            "global_shuffle": True,
            "seed": 5,
        },
        "trainer": {
            "accumulate_grad_batches": 2,
            "max_epochs": -1,
            "reload_dataloaders_every_n_epochs": 1,
            "val_check_interval": 6,
            "check_val_every_n_epoch": None,
        },
        "train_samples": 13,
        "max_steps": 8,
        "ckpt_every": 4,  # mid-epoch: epochs are 3 steps
    },
}


def _init_linear(module: torch.nn.Linear, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        module.weight.copy_(torch.randn(module.weight.shape, generator=g) * 0.3)
        module.bias.zero_()


def _loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    target = batch["x"].sum(-1, keepdim=True) * 0.5 + batch["tokens"][:, :1].float() * 0.01
    mask = batch["loss_mask"][:, :1]
    return ((model(batch["x"]) - target) ** 2 * mask).sum() / mask.sum().clamp(min=1)


class _Recorder(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        _init_linear(self.lin, 0)
        self.seen: list[list[int]] = []  # sample ids of every training micro-batch, in order
        self.losses: list[torch.Tensor] = []  # loss of every training step / micro-batch
        self.val_runs: list[list[int]] = []

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.val_runs[-1].extend(batch["id"].tolist())

    def on_validation_epoch_start(self) -> None:
        self.val_runs.append([])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class AccumulateModule(_Recorder):
    """Each Lightning batch is one micro-batch (Trainer(accumulate_grad_batches=k))."""

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch["id"].tolist())
        loss = _loss(self.lin, batch)
        self.losses.append(loss.detach().clone())
        return loss


class IterModule(_Recorder):
    """NeMo style: one training_step per optimizer step, pulling num_microbatches micro-batches."""

    def training_step(self, dataloader_iter) -> torch.Tensor:
        n = self.trainer.datamodule.num_microbatches
        total = torch.zeros(())
        for _ in range(n):
            batch, _, _ = next(dataloader_iter)
            self.seen.append(batch["id"].tolist())
            total = total + _loss(self.lin, batch)
        loss = total / n
        self.losses.append(loss.detach().clone())
        return loss


class ToyDataModule(MegatronDataModule):
    """Train and validation loaders of ToyGPTDataset; validation has 6 samples."""

    def __init__(self, scenario: str) -> None:
        spec = SCENARIOS[scenario]
        super().__init__(
            MegatronDataSampler(
                seq_len=6,
                micro_batch_size=2,
                data_parallel_rank=0,
                data_parallel_size=1,
                **spec["sampler"],
            )
        )
        self.train_ds = ToyGPTDataset(spec["train_samples"])
        self.valid_ds = ToyGPTDataset(6, seed=1)
        self.train_loaders_built = 0

    def train_dataloader(self) -> WrappedDataLoader:
        self.train_loaders_built += 1
        return WrappedDataLoader(self.train_ds, mode="train")

    def val_dataloader(self) -> WrappedDataLoader:
        return WrappedDataLoader(self.valid_ds, mode="validation")


class _Crash(Callback):
    def __init__(self, at_step: int, how: str) -> None:
        self.at_step, self.how = at_step, how

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.at_step:
            if self.how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("simulated crash")


def make_module(scenario: str) -> _Recorder:
    return IterModule() if scenario.startswith("dataloader_iter") else AccumulateModule()


def make_trainer(
    scenario: str,
    ckpt_dir: str | None,
    crash_at: int | None = None,
    crash_how: str = "raise",
    **overrides: Any,
) -> pl.Trainer:
    spec = SCENARIOS[scenario]
    callbacks: list[Callback] = []
    if ckpt_dir is not None:
        callbacks.append(
            ModelCheckpoint(
                dirpath=ckpt_dir,
                filename="{step}",
                every_n_train_steps=spec["ckpt_every"],
                save_top_k=-1,
                save_on_train_epoch_end=False,
            )
        )
    if crash_at is not None:
        callbacks.append(_Crash(crash_at, crash_how))
    options = {"max_steps": spec["max_steps"], **spec["trainer"], **overrides}
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        enable_checkpointing=ckpt_dir is not None,
        **options,
    )


def quiet() -> None:
    """Silence Lightning's advice about workers, logging intervals and experimental hooks."""
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*dataloader_iter.*")


def crash_main(ckpt_dir: str, scenario: str, kill_at: int) -> None:
    """Train ``scenario`` with checkpoints and SIGKILL this process after step ``kill_at``."""
    quiet()
    trainer = make_trainer(scenario, ckpt_dir, crash_at=kill_at, crash_how="sigkill")
    trainer.fit(make_module(scenario), datamodule=ToyDataModule(scenario))
    raise SystemExit("the crash callback did not fire")
