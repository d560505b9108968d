"""What a run directory already holds, checked before training starts in it.

- **Resuming** continues a run, so the checkpoint's ``config.toml`` and the
  current configuration must agree on every option in :data:`RUN_DEFINING`:
  the data (sources, tokenizer, split, sequence length, document masking),
  ``training.seed`` / ``micro_batch_size`` / ``global_batch_size`` /
  ``rampup_batch_size`` and a fine-tuning run's tables (``finetune.train_file``,
  ``valid_file``, ``split``, ``sequence_column``, ``label_column``: a new split
  could move training rows into validation) and every option of a chat fine-tuning
  run's ``[sft]`` section (its rows, split, loss tokens, packing, over-long rows and
  tokenizer). These decide which samples are drawn in which order;
  changing one would silently make another run under the old name. The tokenizer
  is compared as the run uses it (:func:`~epochal.train.inputs.recorded_tokenizer.with_resolved_tokenizer`:
  the record of the data, an ``[sft]`` run's folder, ``sft.tokenizer = ""`` being
  ``checkpoint.init_from``'s), so a saved ``config.toml``, which names the resolved
  tokenizer, and the command that started the run are the same run. The model
  must agree too; the trainer compares the *resolved* model (vocabulary size
  included) with the checkpoint's
  (:func:`~epochal.train.state.run_checkpointer.check_model_config`), so a
  ``[model]`` spelling that resolves to the same model is accepted.
  Everything else may change on resume: ``training.train_iters``,
  evaluation, device, ``bf16``, ``compile``, ``optimizer``, ``scheduler``,
  ``checkpoint``, ``logging``, the ``parallel`` layout (checkpoints reshard),
  ``data.num_workers``, ``data.cache_dir`` and ``data.blend_schedule`` (whose past
  the train dataset checks against the checkpoint's); the changes are reported.
- **Starting fresh** in a directory that has ``metrics.jsonl`` but nothing to
  resume (an earlier run that stopped before its first checkpoint): the run
  directory is identified by its recorded ``config.toml`` too, so a configuration
  that differs from it in what cannot change on resume (the options above and the
  model) is refused, naming the options; the same configuration starts over and the
  earlier ``metrics.jsonl``, ``config.toml`` and ``tensorboard/`` are renamed to
  ``<name>.<UTC time>`` (nothing is deleted) and the new run's history starts at
  segment 0, so ``epochal plot`` does not call it "resumed".
- **Where** a run directory may be (:func:`check_run_dir_place`): not a file, not
  inside another run's directory, a checkpoint, an ``accelerator.save_state`` folder
  or a converted model, and not around another run's directory
  (:mod:`epochal._ownership`).
"""

from __future__ import annotations

import dataclasses
import os
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from epochal._ownership import (
    CONVERTED_RUN,
    RUN,
    OwnedPathError,
    check_writable,
    file_writer,
    owned_inside,
    owner_above,
)
from epochal.model.config import ConfigError
from epochal.train.config import DataConfig, TrainConfig, config_from_saved, position_length
from epochal.train.config.run_name import flat_options
from epochal.train.inputs.recorded_tokenizer import (
    effective_tokenizer_type,
    with_resolved_tokenizer,
)
from epochal.train.state.checkpoint import Checkpointer
from epochal.train.state.errors import CheckpointError

__all__ = [
    "RUN_DEFINING",
    "archive_previous_history",
    "check_resume_config",
    "check_run_dir_holds",
    "check_run_dir_place",
    "config_changes",
]

# section -> the options of that section that define a run (None: all of them); the
# model is compared resolved, by run_checkpointer.check_model_config
RUN_DEFINING: dict[str, frozenset[str] | None] = {
    "data": frozenset(
        f.name
        for f in dataclasses.fields(DataConfig)
        # a blend schedule may change its future on resume; the dataset refuses a changed past
        if f.name
        not in ("num_workers", "cache_dir", "blend_schedule", "blend_schedule_interpolation")
    ),
    "training": frozenset({"seed", "micro_batch_size", "global_batch_size", "rampup_batch_size"}),
    # which rows train and which validate (``head_lr`` may change)
    "finetune": frozenset({"train_file", "valid_file", "split", "sequence_column", "label_column"}),
    # chat fine-tuning: every option decides which tokens are drawn and which carry the loss
    "sft": None,
}


def _defines_run(option: str) -> bool:
    section, _, key = option.partition(".")
    if section not in RUN_DEFINING:
        return False
    keys = RUN_DEFINING[section]
    return keys is None or key in keys


def _as_run(config: TrainConfig) -> TrainConfig:
    """``config`` with its tokenizer resolved as the trainer resolves it (what its ``config.toml`` names).

    An ``[sft]`` run's ``sft.tokenizer = ""`` becomes the folder it stands for
    (``checkpoint.init_from``).

    Raises:
        ConfigError: the data's tokenizer records disagree (naming ``data.data_path``).
    """
    config = with_resolved_tokenizer(config)
    sft = config.sft
    if sft.enabled and not sft.tokenizer and config.checkpoint.init_from:
        sft = dataclasses.replace(sft, tokenizer=config.checkpoint.init_from)
        config = dataclasses.replace(config, sft=sft)
    return config


def config_changes(saved: TrainConfig, current: TrainConfig) -> tuple[list[str], list[str]]:
    """The options whose values differ, as ``"option: saved -> current"`` lines.

    Both configurations are compared with their tokenizers resolved (:func:`_as_run`):
    an option left unset that resolves to the saved value is no change.

    Returns:
        ``(run-defining changes, other changes)``; ``run_dir`` is not compared.

    Raises:
        ConfigError: the data's tokenizer records disagree (naming ``data.data_path``).
    """
    a, b = flat_options(_as_run(saved)), flat_options(_as_run(current))
    defining, other = [], []
    for option in a:
        if option == "run_dir" or a[option] == b.get(option):
            continue
        if option == "data.tokenizer_type" and effective_tokenizer_type(
            saved
        ) == effective_tokenizer_type(current):
            continue  # "" (unset) and the tokenizer it resolves to are the same run
        line = f"{option}: {a[option]!r} -> {b.get(option)!r}"
        (defining if _defines_run(option) else other).append(line)
    return defining, other


def check_resume_config(
    folder: str | os.PathLike, current: TrainConfig, checkpointer: Checkpointer | None = None
) -> list[str]:
    """Refuse to resume ``folder`` with a configuration that defines another run.

    Args:
        folder: the checkpoint about to be resumed (its ``config.toml`` is compared;
            a model-only checkpoint, e.g. a converted model, or one without a
            ``config.toml`` is not checked: it starts a new run).
        current: the configuration of this process.
        checkpointer: reads (and verifies) the folder's ``trainer_state.json``; default
            a :class:`Checkpointer` of the folder's parent.

    Returns:
        The allowed changes (``"option: saved -> current"``), to report.

    Raises:
        ConfigError: (``checkpoint.resume``) listing every run-defining option
            that differs, or naming the checkpoint's unreadable ``config.toml``.
    """
    path = Path(folder) / "config.toml"
    checkpointer = checkpointer or Checkpointer(Path(folder).parent)
    if not path.is_file() or checkpointer.read_trainer_state(folder).get("model_only"):
        return []
    defining, other = config_changes(_saved_config(path), current)
    if defining:
        raise ConfigError(
            "checkpoint.resume",
            f"{folder} belongs to a run with another configuration; these options cannot change "
            f"on resume ({'; '.join(defining)}). Use another run_dir (and "
            f"checkpoint.init_from={str(folder)!r} to start from its weights), or set them back",
        )
    return other


def _saved_config(path: Path) -> TrainConfig:
    try:
        return config_from_saved(tomllib.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ConfigError) as exc:
        raise ConfigError(
            "checkpoint.resume", f"cannot read the configuration of {path} ({exc})"
        ) from None


def _model_changes(recorded: Any, config: TrainConfig) -> list[str]:
    """``model.<field>: recorded -> configured`` for each field the configuration sets otherwise.

    As :func:`~epochal.train.state.run_checkpointer.check_model_config` compares the
    resolved model: an unset ``model.vocab_size`` (the tokenizer's) is not compared, an unset
    ``model.max_position_embeddings`` is the sequence length.
    """
    if not isinstance(recorded, dict):
        return []
    ours = dataclasses.asdict(config.model)
    if ours["max_position_embeddings"] is None:
        ours["max_position_embeddings"] = position_length(config)
    if ours["vocab_size"] is None:
        del ours["vocab_size"]
    recorded = {"type": "gpt", **recorded}  # a GPT's model_config is written without "type"
    return [
        f"model.{k}: {recorded[k]!r} -> {v!r}"
        for k, v in ours.items()
        if k in recorded and recorded[k] != v
    ]


def check_run_dir_holds(config: TrainConfig) -> None:
    """Refuse, before any data is prepared or process launched, a run directory of another run.

    Reads the newest checkpoint of ``<run_dir>/checkpoints`` (its ``config.toml`` and
    ``trainer_state.json``, without verifying checksums: the trainer does that when it
    loads) and compares what cannot change on resume: the options of
    :data:`RUN_DEFINING` and the resolved model. A directory without checkpoints, a
    checkpoint that cannot be read (the trainer reports it), ``checkpoint.resume`` set
    to a path, or a model-only checkpoint pass.

    Raises:
        ConfigError: (``run_dir``) naming each option that differs, with both values and
            how to go on; (``checkpoint.resume``) ``"never"`` with checkpoints present.
    """
    check_run_dir_place(config.run_dir)
    checkpointer = Checkpointer(Path(config.run_dir) / "checkpoints", checksums=False)
    try:
        folder = checkpointer.latest()
        if folder is None:
            _check_recorded_config(config)
            return
        if config.checkpoint.resume == "never":
            raise ConfigError(
                "checkpoint.resume",
                f"is 'never' but {checkpointer.directory} already has checkpoints; "
                "use another run_dir or resume='auto'",
            )
        if config.checkpoint.resume != "auto":
            return
        state = checkpointer.read_trainer_state(folder)
    except CheckpointError:
        return
    if state.get("model_only"):
        return
    changes = _model_changes(state.get("model_config"), config)
    if (folder / "config.toml").is_file():
        changes += config_changes(_saved_config(folder / "config.toml"), config)[0]
    if changes:
        raise ConfigError(
            "run_dir",
            f"{config.run_dir} holds another run (its checkpoint {folder.name} -> this "
            f"configuration: {'; '.join(changes)}). To train this configuration, pass "
            "--run_dir=NEW_DIR (or leave run_dir unset: each configuration then gets a "
            "directory of its own, see epochal train --help); to continue that run, set "
            "these options back",
        )


def check_run_dir_place(run_dir: str | os.PathLike, *, strict: bool = True) -> None:
    """Refuse a run directory that is a file, or lies in or around what another writer owns.

    Refused (:mod:`epochal._ownership`): ``run_dir`` naming a file; ``run_dir`` inside
    another run's directory, a checkpoint (``runs/a/checkpoints/step_0000003``), a
    checkpoints folder (a run's or ``accelerator.save_state``'s) or a converted Hugging
    Face / Megatron model; ``run_dir`` containing another run's directory or checkpoints
    (up to three levels down, its own ``checkpoints``, ``tensorboard`` and ``profile``
    not counted); ``run_dir/config.toml`` that is not a run's record (a file ``epochal
    config`` wrote, or one that is not an epochal configuration), which training would
    replace. A run directory of its own (an earlier run to resume) or a model-only run
    directory ``epochal convert`` wrote is accepted. ``strict=False`` (the trainer's
    own check when it starts, for library use; ``epochal train`` checks strictly before
    anything is prepared) refuses only what loses data: a file, a path in a checkpoint,
    a checkpoints folder or a converted model; a run inside another run's directory
    (which that run's saves never touch) and folders below ``run_dir`` pass.

    Raises:
        ConfigError: (``run_dir``) naming the path, what owns it and how to go on.
    """
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError(
            "run_dir",
            f"{run_dir} is a file, not a directory; pass --run_dir=DIR naming a directory "
            "(new or an earlier run's), or leave run_dir unset",
        )
    above = owner_above(path)
    try:
        if strict or (above is not None and above.kind not in (RUN, CONVERTED_RUN)):
            ours = frozenset({RUN, CONVERTED_RUN})
            check_writable(path, writer="train", option="run_dir", own=ours)
    except OwnedPathError as exc:
        raise ConfigError("run_dir", f"{str(exc).removeprefix('run_dir ')}") from None
    skip = frozenset({"checkpoints", "tensorboard", "profile"})
    inner = owned_inside(path, skip=skip) if strict else None
    if inner is not None:
        raise ConfigError(
            "run_dir",
            f"{run_dir} contains {inner.describe()}; a run directory may not hold another "
            "run's files: choose a directory outside it",
        )
    record = path / "config.toml"
    if record.is_file() and file_writer(record) == "config":
        raise ConfigError(
            "run_dir",
            f"{run_dir} holds {record}, a configuration epochal config wrote, which training "
            "would replace with the run's record; train with --config "
            f"{record} --run_dir=ANOTHER_DIR, or move the file",
        )


def _check_recorded_config(config: TrainConfig) -> None:
    """A run directory without a checkpoint but with a recorded ``config.toml``: the same run only.

    Raises:
        ConfigError: (``run_dir``) naming each option that cannot change on resume and
            differs from the recorded configuration, or the unreadable record.
    """
    record = Path(config.run_dir) / "config.toml"
    if not record.is_file():
        return
    try:
        saved = config_from_saved(tomllib.loads(record.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ConfigError) as exc:
        raise ConfigError(
            "run_dir",
            f"{config.run_dir} holds {record}, which is not a run's readable record ({exc}); "
            "training would replace it: use another --run_dir, or move the file",
        ) from None
    defining, other = config_changes(saved, config)
    changes = defining + [line for line in other if line.startswith("model.")]
    if changes:
        raise ConfigError(
            "run_dir",
            f"{config.run_dir} holds another run (its record {record} has no checkpoint yet "
            f"-> this configuration: {'; '.join(changes)}). To train this configuration, pass "
            "--run_dir=NEW_DIR (or leave run_dir unset); to start that run again, set these "
            "options back",
        )


def archive_previous_history(
    run_dir: str | os.PathLike, log: Callable[[str], None] | None = None
) -> list[Path]:
    """Before a fresh start: rename an earlier run's history out of the way.

    If ``run_dir/metrics.jsonl`` exists, it, ``config.toml`` and ``tensorboard/``
    are renamed to ``metrics.<UTC time>.jsonl``, ``config.<UTC time>.toml`` and
    ``tensorboard.<UTC time>`` (a counter is added if that name is taken).
    Nothing is deleted.

    Returns:
        The new paths (empty if there was no earlier history).
    """
    run = Path(run_dir)
    if not (run / "metrics.jsonl").is_file():
        return []
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    moved = []
    for name in ("metrics.jsonl", "config.toml", "tensorboard"):
        src = run / name
        if not src.exists():
            continue
        stem, dot, ext = name.partition(".")
        for n in range(1000):
            tag = stamp if n == 0 else f"{stamp}-{n}"
            dst = run / f"{stem}.{tag}{dot}{ext}"
            if not dst.exists():
                break
        os.rename(src, dst)
        moved.append(dst)
    if log is not None:
        log(
            f"{run} has metrics from an earlier run but no checkpoint to resume: starting a new "
            f"history (the earlier files are now {', '.join(p.name for p in moved)})"
        )
    return moved
