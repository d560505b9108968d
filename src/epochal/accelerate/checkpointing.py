"""``save_state`` / ``load_state`` as epochal checkpoints, and the full weights for ``unwrap_model``.

``save_state(dir)`` writes one epochal checkpoint into ``dir`` (``dir/step_NNNNNNN``
and ``dir/latest``; the previous step folder there is replaced): model and
optimizer as sharded DCP files every layout can load, the learning-rate
schedule, every RNG of every rank, the step and the train loader's
``consumed_samples`` (:meth:`~epochal.train.state.resume.CheckpointSeams.save_checkpoint`),
written to a temporary folder and renamed when complete, with checksums.
``save_state`` writes only a folder of its own: a folder another writer owns (an
``epochal train`` run's directory or ``checkpoints/``, a checkpoint, a converted
model, anything inside one) is refused before anything is written
(:func:`check_state_folder`), since replacing its ``step_*`` and ``latest`` would
delete that run's checkpoints.
``load_state(dir)`` (``dir`` as saved, or its step folder) restores all of it on any
data-parallel size; the train loader then continues at the next sample, so a
script that saves, is killed and loads again computes the uninterrupted run's
losses (bit for bit on the same layout and machine). Objects given to
``register_for_checkpointing`` are saved beside it as ``custom_checkpoint_<i>.pt``
(read back with ``weights_only=True``: tensors, numbers, strings, containers), and a
prepared PyTorch learning-rate scheduler's state as ``scheduler.bin`` (Accelerate's name).

:func:`full_state` gathers the whole model (all pipeline stages, tensor-parallel and
data-parallel shards) on every rank, by epochal's parameter names.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from epochal._atomic import atomic_write
from epochal._ownership import STATE, OwnedPathError, check_writable
from epochal.model.init import canonical_name
from epochal.train.state.checkpoint import Checkpointer, CheckpointError

__all__ = ["SCHEDULER_FILE", "check_state_folder", "full_state", "load_state", "save_state"]

#: the prepared PyTorch scheduler's state beside the checkpoint
SCHEDULER_FILE = "scheduler.bin"


def _all_gather(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _checkpointer(trainer: Any, directory: Path) -> Checkpointer:
    distributed = dist.is_initialized() and dist.get_world_size() > 1
    return Checkpointer(
        directory,
        keep_last=1,
        rank=trainer.rank,
        barrier=dist.barrier if distributed else None,
        world_size=dist.get_world_size() if distributed else 1,
        all_gather=_all_gather if distributed else None,
    )


def check_state_folder(output_dir: str | Path) -> None:
    """Refuse a ``save_state`` folder that another writer owns (:mod:`epochal._ownership`).

    A new folder, one without any writer's marks, or an earlier ``save_state`` folder
    (not a run's ``checkpoints/``) is accepted.

    Raises:
        OwnedPathError: (a ``ValueError``) naming the folder and its owner.
    """
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise OwnedPathError(f"save_state folder {output_dir} is a file; give a folder")
    check_writable(path, writer="save_state", option="save_state folder", own=frozenset({STATE}))


def save_state(
    trainer: Any, output_dir: str | Path, custom: list[Any], scheduler: Any = None
) -> Path:
    """Save the run into ``output_dir`` (see the module docstring); returns the step folder.

    Raises:
        OwnedPathError: ``output_dir`` belongs to another writer (:func:`check_state_folder`).
    """
    check_state_folder(output_dir)
    directory = Path(output_dir)
    previous = trainer.checkpointer
    trainer.checkpointer = _checkpointer(trainer, directory)
    try:
        folder = trainer.save_checkpoint()
    finally:
        trainer.checkpointer = previous
    if trainer.rank == 0:
        for i, obj in enumerate(custom):
            buf = io.BytesIO()
            torch.save(obj.state_dict(), buf)
            atomic_write(directory / f"custom_checkpoint_{i}.pt", buf.getvalue())
        if scheduler is not None:
            buf = io.BytesIO()
            torch.save(scheduler.state_dict(), buf)
            atomic_write(directory / SCHEDULER_FILE, buf.getvalue())
    if dist.is_initialized():
        dist.barrier()
    return folder


def find_state(input_dir: str | Path) -> Path:
    """The checkpoint folder of ``input_dir`` (a ``save_state`` folder or its step folder).

    Raises:
        CheckpointError: no checkpoint there.
    """
    path = Path(input_dir)
    if (path / "trainer_state.json").is_file():
        return path
    found = Checkpointer(path).latest() if path.is_dir() else None
    if found is None:
        raise CheckpointError(f"{path}: no checkpoint written by accelerator.save_state here")
    return found


def load_state(
    trainer: Any, input_dir: str | Path, custom: list[Any], scheduler: Any = None
) -> Path:
    """Restore the run from ``input_dir`` (see the module docstring); returns the step folder.

    Raises:
        CheckpointError: no checkpoint there, a damaged one, one of another model, or
            a missing ``custom_checkpoint_<i>.pt`` for a registered object.
    """
    folder = find_state(input_dir)
    previous = trainer.checkpointer
    trainer.checkpointer = _checkpointer(trainer, folder.parent)
    try:
        trainer.load_checkpoint(folder)
    finally:
        trainer.checkpointer = previous
    base = folder.parent if folder.parent.joinpath("latest").is_file() else Path(input_dir)
    for i, obj in enumerate(custom):
        path = base / f"custom_checkpoint_{i}.pt"
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (registered object {i})")
        obj.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    if scheduler is not None:
        path = base / SCHEDULER_FILE
        if not path.is_file():
            raise CheckpointError(
                f"{path}: missing (the run was saved without the learning-rate scheduler "
                "prepared now)"
            )
        scheduler.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return folder


def full_state(trainer: Any) -> dict[str, torch.Tensor]:
    """The whole model's tensors by epochal name (CPU), on every rank (a collective)."""
    options = StateDictOptions(full_state_dict=True)
    local: dict[str, torch.Tensor] = {}
    for part in trainer.model_parts:
        for name, tensor in get_model_state_dict(part, options=options).items():
            local[canonical_name(name)] = tensor.detach().cpu()
    engine = trainer.engine
    if engine.pp_group is None:
        return local
    first = engine.dp_rank == 0 and engine.tp_rank == 0 and engine.cp_rank == 0
    mine = local if first else {}
    merged: dict[str, torch.Tensor] = {}
    for part in _all_gather(mine):
        merged.update(part)
    return merged
