"""``DataLoaderConfiguration`` and ``ProjectConfiguration``: Accelerate's option objects, honoured or refused.

Both are Accelerate's dataclasses (``accelerate.utils``) with the same fields and
defaults; the ``Accelerator`` also takes Accelerate's own objects. Every field either
does what it does in Accelerate or is refused with an :class:`ConfigurationError`
naming it and what to use; none is accepted and ignored.

``DataLoaderConfiguration`` (what the prepared loaders do with each field):

======================  ==============================================================
``split_batches``       ``False`` only (as the keyword form): a loader's ``batch_size``
                        is the micro-batch size per data-parallel rank, as in
                        Accelerate's Megatron-LM mode
``dispatch_batches``    ``None`` / ``False`` only: every process reads its own samples
                        through Megatron's sampler (process 0 does not read and send)
``even_batches``        ``True`` only: every process gets the same number of batches;
                        the samples that fill no whole global batch are left out of each
                        epoch (``prepare`` prints how many) instead of repeating samples
                        from the start to fill it
``use_seedable_sampler`` accepted (either value): the shuffle is always seeded, a
                        permutation per epoch (as Accelerate's seedable sampler)
``data_seed``           the seed of the prepared loaders' shuffle and ``collate_fn``
                        randomness (default: the seed ``set_seed`` gave)
``non_blocking``        batches are moved to the device with ``non_blocking``
``use_stateful_dataloader``  accepted (either value): the prepared train loader always
                        saves its position with ``save_state`` and resumes there
======================  ==============================================================

``ProjectConfiguration``: ``project_dir`` (``save_state()`` / ``load_state()`` without
a folder use ``project_dir/checkpoints``), ``logging_dir`` (trackers; default
``project_dir``), ``automatic_checkpoint_naming`` (each ``save_state()`` writes
``project_dir/checkpoints/checkpoint_<iteration>``, the folder given to it is ignored,
as in Accelerate), ``total_limit`` (after a save, the oldest such folders beyond the
limit are deleted), ``iteration`` (the next folder's number; ``save_state`` adds 1, as
Accelerate), ``save_on_each_node`` (one machine only: epochal's checkpoints are
sharded over all processes, so every machine must see one shared folder).

``ParallelismConfig`` (``Accelerator(parallelism_config=...)``): accepted when it asks
for nothing (every size 1). Its sizes are Accelerate's FSDP2 / DeepSpeed layouts, not
the Megatron-LM engine's, so each one above 1 is refused by name with the Megatron-LM
field to use (:func:`check_parallelism_config`). ``cp_size`` in particular is torch's
experimental context parallelism in Accelerate: Accelerate refuses it without an FSDP2
``fsdp_plugin`` (and switches the run to ``DistributedType.FSDP``), the script cuts
the batch's buffers in place under ``accelerator.maybe_context_parallel(...)`` and each
rank's loss is its own chunk's mean over pre-shifted ``shift_labels``. The same
computation in Megatron-LM's engine is ``MegatronLMPlugin(context_parallel_size=N)``
(the same load-balanced chunks: rank ``r`` holds chunks ``r`` and ``2N-1-r``), whose
loss is the whole batch's.

Differences from Accelerate, both on the safe side: ``total_limit`` deletes only
``checkpoint_<n>`` folders that hold a ``save_state`` checkpoint (Accelerate deletes
whatever lies in ``checkpoints/``), and only after the new checkpoint is complete
(Accelerate deletes first); ``load_state`` with automatic naming sets ``iteration`` past
the newest ``checkpoint_<n>`` there (Accelerate leaves it, so its next ``save_state``
after a restart stops with "already exists" unless the script sets it).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epochal.accelerate.state import AcceleratorError

__all__ = [
    "ConfigurationError",
    "DataLoaderConfiguration",
    "ProjectConfiguration",
    "automatic_folder",
    "checkpoint_folders",
    "check_dataloader_config",
    "check_project_config",
    "check_parallelism_config",
    "continue_numbering",
    "newest_folder",
    "prune_checkpoints",
]

_NUMBERED = re.compile(r"^checkpoint_(\d+)$")


class ConfigurationError(AcceleratorError, ValueError):
    """A ``DataLoaderConfiguration`` / ``ProjectConfiguration`` value epochal cannot honour."""


@dataclass
class DataLoaderConfiguration:
    """Accelerate's ``DataLoaderConfiguration`` (see the module docstring for each field)."""

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


@dataclass
class ProjectConfiguration:
    """Accelerate's ``ProjectConfiguration`` (see the module docstring for each field)."""

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def set_directories(self, project_dir: str | None = None) -> None:
        """Set ``project_dir``, and ``logging_dir`` to it when unset (Accelerate's method)."""
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir

    def __post_init__(self) -> None:
        self.set_directories(self.project_dir)


#: the refused values: field -> (test of the value, why, what to use)
_REFUSED = {
    "split_batches": (
        lambda v: bool(v),
        "a loader's batch_size is the micro-batch size per data-parallel rank (as in "
        "Accelerate's Megatron-LM mode)",
        "give each DataLoader batch_size = your batch size / data-parallel size",
    ),
    "dispatch_batches": (
        lambda v: bool(v),
        "every process reads its own samples through Megatron's sampler (process 0 does "
        "not read and send the batches)",
        "leave dispatch_batches unset",
    ),
    "even_batches": (
        lambda v: not v,
        "every process gets the same number of batches: the samples that fill no whole "
        "global batch are left out of each epoch (prepare prints how many)",
        "leave even_batches=True",
    ),
}


def refuse_split_batches(where: str = "split_batches=True") -> ConfigurationError:
    """The refusal of ``split_batches=True`` (keyword and ``DataLoaderConfiguration`` alike)."""
    why, fix = _REFUSED["split_batches"][1:]
    return ConfigurationError(f"{where}: {why}; {fix}")


def check_dataloader_config(config: Any) -> DataLoaderConfiguration:
    """epochal's :class:`DataLoaderConfiguration` from Accelerate's (or ours, or None).

    Raises:
        ConfigurationError: a refused value (see the module docstring), or a field this
            version of epochal does not know set to other than its default.
    """
    if config is None:
        return DataLoaderConfiguration()
    known = {f.name for f in dataclasses.fields(DataLoaderConfiguration)}
    if dataclasses.is_dataclass(config):
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            if f.name not in known and f.default is not dataclasses.MISSING and value != f.default:
                raise ConfigurationError(
                    f"DataLoaderConfiguration({f.name}={value!r}) has no epochal equivalent; "
                    "leave it at its default"
                )
    defaults = DataLoaderConfiguration()
    values = {name: getattr(config, name, getattr(defaults, name)) for name in known}
    for name, (refused, why, fix) in _REFUSED.items():
        if refused(values[name]):
            raise ConfigurationError(
                f"DataLoaderConfiguration({name}={values[name]!r}): {why}; {fix}"
            )
    seed = values["data_seed"]
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigurationError(f"DataLoaderConfiguration(data_seed={seed!r}) must be an integer")
    return DataLoaderConfiguration(**values)


#: ``ParallelismConfig`` field -> what to use in the Megatron-LM engine instead
_PARALLELISM_FIELDS = {
    "cp_size": (
        "torch's FSDP2 context parallelism (Accelerate needs an fsdp_plugin for it and returns "
        "each rank's chunk loss); epochal runs Megatron-LM's: "
        "MegatronLMPlugin(context_parallel_size={n}) (or other_megatron_args="
        "{{'context_parallel_size': {n}}}) cuts each sequence into the same 2 x {n} chunks "
        "and returns the whole batch's loss"
    ),
    "tp_size": "use MegatronLMPlugin(tp_degree={n})",
    "sp_size": (
        "DeepSpeed's Ulysses sequence parallelism has no epochal equivalent; split long "
        "sequences with MegatronLMPlugin(context_parallel_size={n})"
    ),
    "dp_shard_size": (
        "FSDP2 sharding: the data-parallel size is the processes left over by "
        "tp_degree x context_parallel_size x pp_degree; shard the optimizer with "
        "MegatronLMPlugin(use_distributed_optimizer=True)"
    ),
    "dp_replicate_size": (
        "the data-parallel size is the processes left over by "
        "tp_degree x context_parallel_size x pp_degree"
    ),
}


def check_parallelism_config(config: Any) -> None:
    """Accept a ``ParallelismConfig`` (ours or Accelerate's) that asks for nothing; refuse its sizes.

    Raises:
        ConfigurationError: a size above 1, naming the field and the Megatron-LM option
            that does it (see the module docstring).
    """
    if config is None:
        return
    for name, instead in _PARALLELISM_FIELDS.items():
        value = getattr(config, name, None)
        n = 1 if value is None else value
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigurationError(
                f"ParallelismConfig.{name} must be an integer >= 1, got {value!r}"
            )
        if n > 1:
            raise ConfigurationError(
                f"Accelerator(parallelism_config=ParallelismConfig({name}={n})) is not supported "
                f"by the Megatron-LM engine: {instead.format(n=n)}"
            )


def check_project_config(
    config: Any, project_dir: str | os.PathLike | None, local_world_size: int, world_size: int
) -> Any:
    """The project configuration to use (the user's object, as Accelerate keeps it).

    ``project_dir`` fills in an unset ``project_dir`` (Accelerate's rule).

    Raises:
        ConfigurationError: ``total_limit`` < 1, a negative ``iteration``, or
            ``save_on_each_node`` over several machines.
    """
    if config is None:
        config = ProjectConfiguration(project_dir=None if project_dir is None else str(project_dir))
    elif project_dir is not None and getattr(config, "project_dir", None) is None:
        config.set_directories(str(project_dir))
    limit = getattr(config, "total_limit", None)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigurationError(
            f"ProjectConfiguration(total_limit={limit!r}) must be an integer >= 1 (or None: keep all)"
        )
    iteration = getattr(config, "iteration", 0)
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise ConfigurationError(
            f"ProjectConfiguration(iteration={iteration!r}) must be an integer >= 0"
        )
    if getattr(config, "save_on_each_node", False) and local_world_size < world_size:
        raise ConfigurationError(
            "ProjectConfiguration(save_on_each_node=True): epochal's checkpoints are sharded "
            "over all processes of all machines, so they need one folder every machine sees; "
            "put project_dir on a shared file system and leave save_on_each_node=False"
        )
    return config


def checkpoint_folders(base: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(n, folder)`` of each ``checkpoint_<n>`` holding a ``save_state`` checkpoint, oldest first."""
    from epochal.accelerate.checkpointing import find_state
    from epochal.train.state.checkpoint import CheckpointError

    base = Path(base)
    found = []
    for entry in base.iterdir() if base.is_dir() else ():
        match = _NUMBERED.match(entry.name)
        if not match or entry.is_symlink() or not entry.is_dir():
            continue
        try:
            find_state(entry)
        except CheckpointError:
            continue  # not a complete checkpoint written by save_state: not ours to delete
        found.append((int(match.group(1)), entry))
    return sorted(found)


def automatic_folder(config: Any) -> Path:
    """``project_dir/checkpoints/checkpoint_<iteration>``, the next automatic folder.

    Raises:
        ConfigurationError: no ``project_dir``, or the folder exists (Accelerate refuses too).
    """
    if getattr(config, "project_dir", None) is None:
        raise ConfigurationError(
            "ProjectConfiguration(automatic_checkpoint_naming=True) needs project_dir"
        )
    folder = Path(config.project_dir) / "checkpoints" / f"checkpoint_{config.iteration}"
    if folder.exists():
        raise ConfigurationError(
            f"{folder} already exists: set accelerator.project_configuration.iteration to the "
            "number the next checkpoint should have"
        )
    return folder


def prune_checkpoints(base: str | os.PathLike, total_limit: int | None, keep: Path) -> list[Path]:
    """Delete the oldest ``checkpoint_<n>`` folders of ``base`` beyond ``total_limit``.

    Only folders :func:`checkpoint_folders` lists are candidates (a ``save_state``
    checkpoint named ``checkpoint_<n>``), never ``keep`` (the one just written);
    anything else in ``base`` stays. Call on one process.

    Returns:
        The folders deleted.
    """
    if total_limit is None:
        return []
    folders = [f for _, f in checkpoint_folders(base) if f.resolve() != keep.resolve()]
    extra = len(folders) + 1 - total_limit
    removed = folders[: max(extra, 0)]
    for folder in removed:
        shutil.rmtree(folder)
    return removed


def newest_folder(base: str | os.PathLike) -> Path:
    """The ``checkpoint_<n>`` folder of ``base`` with the highest ``n`` (``load_state()``).

    Raises:
        ConfigurationError: none there.
    """
    found = checkpoint_folders(base)
    if not found:
        raise ConfigurationError(
            f"load_state: no checkpoint_<n> folder holding a checkpoint in {base}"
        )
    return found[-1][1]


def continue_numbering(config: Any) -> None:
    """After ``load_state`` with automatic naming: ``iteration`` past the newest ``checkpoint_<n>``."""
    if not getattr(config, "automatic_checkpoint_naming", False) or config.project_dir is None:
        return
    found = checkpoint_folders(Path(config.project_dir) / "checkpoints")
    if found:
        config.iteration = max(config.iteration, found[-1][0] + 1)
