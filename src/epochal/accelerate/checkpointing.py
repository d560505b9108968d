"""``save_state`` / ``load_state`` as epochal checkpoints, and the full weights for ``unwrap_model``.

``save_state(dir)`` writes one epochal checkpoint into ``dir`` (``dir/step_NNNNNNN``
and ``dir/latest``): model and optimizer as sharded DCP files every layout can load,
the learning-rate schedule, every RNG of every rank, the step and the train loader's
``consumed_samples`` (:meth:`~epochal.train.state.run_checkpointer.RunCheckpointer.save`),
written to a temporary folder and renamed when complete, with checksums. As
Accelerate's ``save_state`` writes its files into a folder that holds others and
leaves those alone, so does this one: it writes only ``latest``, this step's
``step_NNNNNNN``, ``scheduler.bin`` and ``custom_checkpoint_<i>.pt``, and deletes only
the checkpoint its own earlier save there made (the step folder its ``latest``
named), once the new one is complete. A name it must write that the user's file or
folder already has (a ``latest`` that is not its pointer, a ``step_NNNNNNN`` that is
not its checkpoint, or ``scheduler.bin`` / ``custom_checkpoint_<i>.pt`` in a folder it
has not saved to) is refused before anything is written, naming the path
(:class:`StateFolderError`). A folder another writer owns (an ``epochal train`` run's
directory or ``checkpoints/``, a checkpoint, a converted model, anything inside one)
is refused the same way (:func:`check_state_folder`).
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
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from epochal._atomic import atomic_write
from epochal._ownership import STATE, OwnedPathError, check_writable
from epochal.model.init import canonical_name
from epochal.train.state.checkpoint import (
    LATEST,
    TRAINER_STATE,
    Checkpointer,
    CheckpointError,
    step_folder_name,
)

__all__ = [
    "SCHEDULER_FILE",
    "StateFolderError",
    "check_state_folder",
    "full_state",
    "load_state",
    "save_state",
]

#: the prepared PyTorch scheduler's state beside the checkpoint
SCHEDULER_FILE = "scheduler.bin"
_STEP_NAME = re.compile(r"step_\d{7,}")


def _all_gather(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


class StateFolderError(OwnedPathError):
    """A ``save_state`` folder holding a file or folder of the user's under a name it writes."""


#: no count-based pruning: ``save_state`` deletes only its own previous checkpoint
_KEEP_ALL = 2**31


def _checkpointer(trainer: Any, directory: Path) -> Checkpointer:
    distributed = dist.is_initialized() and dist.get_world_size() > 1
    return Checkpointer(
        directory,
        keep_last=_KEEP_ALL,
        rank=trainer.rank,
        barrier=dist.barrier if distributed else None,
        world_size=dist.get_world_size() if distributed else 1,
        all_gather=_all_gather if distributed else None,
    )


def _own_latest(folder: Path) -> Path | None:
    """The checkpoint ``folder/latest`` names if it is a pointer ``save_state`` wrote, else None."""
    pointer = folder / LATEST
    try:
        name = pointer.read_text(encoding="utf-8").strip() if pointer.is_file() else ""
    except (OSError, UnicodeDecodeError):
        return None
    named = folder / name
    if _STEP_NAME.fullmatch(name) and (named / TRAINER_STATE).is_file():
        return named
    return None


def check_state_folder(
    output_dir: str | Path, step: int | None = None, written: tuple[str, ...] = ()
) -> Path | None:
    """Refuse a ``save_state`` folder before anything is written there.

    Refused: a folder another writer owns (:mod:`epochal._ownership`), and a name this
    save writes that the user already has (see the module docstring): ``latest`` that
    is not ``save_state``'s pointer, ``step_NNNNNNN`` of ``step`` that is not its
    checkpoint, a name of ``written`` (``scheduler.bin``, ``custom_checkpoint_<i>.pt``)
    in a folder ``save_state`` has not saved to. Other files are no concern.

    Returns:
        The checkpoint of the earlier save into this folder (what its ``latest``
        names), or None.

    Raises:
        OwnedPathError: (a ``ValueError``) naming the folder and its owner.
        StateFolderError: naming the path of the user's and what to do.
    """
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise StateFolderError(f"save_state folder {output_dir} is a file; give a folder")
    check_writable(path, writer="save_state", option="save_state folder", own=frozenset({STATE}))
    if not path.is_dir():
        return None
    previous = _own_latest(path)
    clash = []
    if (path / LATEST).exists() and previous is None:
        clash.append(path / LATEST)
    if step is not None:
        folder = path / step_folder_name(step)
        if folder.exists() and not (folder / TRAINER_STATE).is_file():
            clash.append(folder)
    if previous is None:
        clash += [path / name for name in written if (path / name).exists()]
    if clash:
        raise StateFolderError(
            f"save_state folder {output_dir}: {clash[0]} is not accelerator.save_state's "
            f"(it writes {LATEST}, step_NNNNNNN/, {SCHEDULER_FILE} and "
            "custom_checkpoint_<i>.pt there and leaves everything else alone); choose "
            "another folder, or move that file away"
        )
    return previous


def save_state(
    trainer: Any, output_dir: str | Path, custom: list[Any], scheduler: Any = None
) -> Path:
    """Save the run into ``output_dir`` (see the module docstring); returns the step folder.

    Raises:
        OwnedPathError: ``output_dir`` belongs to another writer, or holds a file of the
            user's under a name this save writes (:class:`StateFolderError`,
            :func:`check_state_folder`).
    """
    check_state_folder(output_dir)  # first: nothing of the trainer is touched when refused
    written = tuple(f"custom_checkpoint_{i}.pt" for i in range(len(custom)))
    written += (SCHEDULER_FILE,) if scheduler is not None else ()
    earlier = check_state_folder(output_dir, trainer.step, written)
    directory = Path(output_dir)
    with trainer.checkpointer.using(_checkpointer(trainer, directory)):
        folder = trainer.save_checkpoint()
    if trainer.rank == 0 and earlier is not None and earlier.resolve() != folder.resolve():
        shutil.rmtree(earlier)  # the earlier save's checkpoint, replaced by this complete one
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
    with trainer.checkpointer.using(_checkpointer(trainer, folder.parent)):
        trainer.load_checkpoint(folder)
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
