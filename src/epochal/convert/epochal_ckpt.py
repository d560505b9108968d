"""Read and write epochal's own checkpoints (the trainer's DCP folders) as ``(ModelConfig, state)``.

Reading accepts a run directory (``<run_dir>/checkpoints/latest``), a
checkpoints directory, one ``step_*`` folder, or a consolidated ``.safetensors``
file (:func:`epochal.train.parallel_trainer.export_consolidated`) stored inside
its ``step_*`` folder (for the config), saved under any parallel
layout: the model tensors are read with DCP into full (unsharded) CPU tensors,
so a TP2 x PP2 checkpoint loads in one process (DCP reshards). Only the
``model.*`` entries are read; optimizer state is ignored. Loading uses
:class:`epochal.train.checkpoint.SafeFileSystemReader` (no arbitrary unpickling).

The model configuration comes from, in order: ``trainer_state.json``'s
``model_config`` (written by :func:`save_epochal_checkpoint`), the
``[model]`` table of the folder's ``config.toml`` with ``vocab_size`` from the
file, the ``vocab_size`` argument, or the tokenizer named in ``[data]``
(``max_position_embeddings`` defaults to ``data.seq_length`` as in the trainer).

Writing (:func:`save_epochal_checkpoint`) produces a run directory holding one
model-only checkpoint ``checkpoints/step_0000000`` in the trainer's layout
(DCP tensors under ``model.``, ``trainer_state.json`` with ``"model_only":
true`` and the model config, ``config.toml`` with the resolved ``[model]``
table), written to a temporary name and renamed. It has no optimizer state, so
the trainer cannot *resume* from it; ``epochal generate`` and ``epochal convert``
read it, and its ``config.toml`` is a starting point for fine-tuning.
"""

from __future__ import annotations

import json
import os
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from epochal.convert.common import ConversionError, check_shapes, complete_tied
from epochal.model.config import ConfigError, ModelConfig

__all__ = [
    "EpochalCheckpoint",
    "find_step_folder",
    "load_epochal_checkpoint",
    "model_toml",
    "tokenizer_for_run",
    "save_epochal_checkpoint",
]


@dataclass
class EpochalCheckpoint:
    """A model read from an epochal checkpoint.

    Attributes:
        config: the model config.
        state: full CPU tensors with :class:`~epochal.model.GPTModel`'s names.
        folder: the ``step_*`` folder that was read.
        step: the training step of that checkpoint.
        run_config: the parsed ``config.toml`` (a dict), or None.
    """

    config: ModelConfig
    state: dict[str, torch.Tensor]
    folder: Path
    step: int
    run_config: dict[str, Any] | None


def find_step_folder(path: str | os.PathLike) -> Path:
    """Resolve a run dir, checkpoints dir or step folder to one complete ``step_*`` folder.

    Raises:
        FileNotFoundError: nothing that looks like an epochal checkpoint.
    """
    from epochal.train.checkpoint import Checkpointer

    path = Path(path)
    if (path / "trainer_state.json").is_file():
        return path
    for candidate in (path, path / "checkpoints"):
        if candidate.is_dir():
            latest = Checkpointer(candidate).latest()
            if latest is not None:
                return latest
    raise FileNotFoundError(
        f"{path}: no epochal checkpoint (step_* folder with trainer_state.json) found"
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConversionError(f"{path}: unreadable ({exc})") from exc
    if not isinstance(data, dict):
        raise ConversionError(f"{path}: expected a JSON object")
    return data


def _model_config(
    folder: Path,
    trainer_state: dict[str, Any],
    run_config: dict[str, Any] | None,
    vocab_size: int | None,
) -> ModelConfig:
    source = folder / "trainer_state.json"
    if isinstance(trainer_state.get("model_config"), dict):
        try:
            config = ModelConfig.from_dict(trainer_state["model_config"])
        except ConfigError as exc:
            raise ConversionError(f"{source}: bad model_config ({exc})") from exc
        return config
    if run_config is None:
        raise ConversionError(f"{folder}: no config.toml and no model_config in trainer_state.json")
    from epochal.train.config import config_from_dict, model_config_from_section

    try:
        train_config = config_from_dict(run_config)
    except (ConfigError, TypeError) as exc:
        raise ConversionError(f"{folder / 'config.toml'}: {exc}") from exc
    vocab = vocab_size or train_config.model.vocab_size
    if vocab is None:
        vocab = _tokenizer_vocab_size(train_config, folder)
    return model_config_from_section(
        train_config.model, vocab_size=vocab, seq_length=train_config.data.seq_length
    )


def _tokenizer_vocab_size(train_config: Any, folder: Path) -> int:
    tokenizer = tokenizer_for_run(train_config, str(folder / "config.toml"))
    if tokenizer is None:
        raise ConversionError(
            f"{folder / 'config.toml'}: model.vocab_size is not recorded and the run used mock data "
            "(no tokenizer); pass vocab_size / --vocab-size"
        )
    return tokenizer.vocab_size


def tokenizer_for_run(train_config: Any, source: str = "config.toml") -> Any:
    """The tokenizer a training run used, rebuilt from its ``[data]`` section (None for mock data).

    A ``data.corpus`` run gets its tokenizer from the trainer's corpus cache
    (:func:`epochal.train.corpus.prepare_corpus`; the corpus-trained BPE is
    re-created deterministically if the cache is gone), otherwise
    ``data.tokenizer_type`` is built from its files.

    Raises:
        ConversionError: the tokenizer cannot be built (names ``source``).
    """
    data = train_config.data
    if data.mock and not data.corpus:
        return None
    from epochal.train.corpus import prepare_corpus, tokenizer_from_config

    try:
        if data.corpus:
            return prepare_corpus(data).tokenizer
        return tokenizer_from_config(data)
    except (ConfigError, OSError, ValueError) as exc:
        raise ConversionError(f"{source}: cannot rebuild the run's tokenizer ({exc})") from exc


def load_epochal_checkpoint(
    path: str | os.PathLike, *, vocab_size: int | None = None
) -> EpochalCheckpoint:
    """Read the model of an epochal checkpoint (any parallel layout) into full CPU tensors.

    Args:
        path: a run dir, a checkpoints dir, or a ``step_*`` folder.
        vocab_size: the unpadded vocabulary when the checkpoint does not record it.

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        ConversionError: the config cannot be resolved or tensors do not match it.
        CheckpointError: a malformed or unsafe DCP folder.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from epochal.train.checkpoint import SafeFileSystemReader, SafeLoadPlanner

    consolidated = None
    if Path(path).suffix == ".safetensors":
        consolidated = Path(path)
        if not consolidated.is_file():
            raise FileNotFoundError(f"{consolidated}: no such file")
        path = consolidated.parent
    folder = find_step_folder(path)
    trainer_state = _read_json(folder / "trainer_state.json")
    run_config = None
    if (folder / "config.toml").is_file():
        try:
            run_config = tomllib.loads((folder / "config.toml").read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConversionError(f"{folder / 'config.toml'}: not valid TOML ({exc})") from exc
    config = _model_config(folder, trainer_state, run_config, vocab_size)
    step = int(trainer_state.get("step", 0))
    if consolidated is not None:
        from epochal.convert.safe_load import load_safetensors

        state = _complete(config, load_safetensors(consolidated), str(consolidated))
        return EpochalCheckpoint(
            config=config, state=state, folder=folder, step=step, run_config=run_config
        )
    metadata = SafeFileSystemReader(folder).read_metadata()
    template: dict[str, torch.Tensor] = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata):
            template[key[len("model.") :]] = torch.empty(
                tuple(meta.size), dtype=meta.properties.dtype
            )
    if not template:
        raise ConversionError(f"{folder}: the DCP checkpoint holds no model.* tensors")
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*assuming the intent is to load in a single process.*"
        )
        dcp.load(
            {"model": template},
            storage_reader=SafeFileSystemReader(folder),
            planner=SafeLoadPlanner(),
            no_dist=True,  # every process reads the whole model itself, with or without a process group
        )
    state = _complete(config, template, str(folder))
    return EpochalCheckpoint(
        config=config, state=state, folder=folder, step=step, run_config=run_config
    )


def _complete(
    config: ModelConfig, tensors: dict[str, torch.Tensor], source: str
) -> dict[str, torch.Tensor]:
    state = complete_tied(config, tensors)
    if config.tie_embeddings and "tok_embeddings.weight" not in state and "output.weight" in state:
        state["tok_embeddings.weight"] = state["output.weight"]
    check_shapes(state, config, source)
    return state


def save_epochal_checkpoint(
    config: ModelConfig,
    state: dict[str, torch.Tensor],
    run_dir: str | os.PathLike,
    *,
    source: str = "",
    overwrite: bool = False,
) -> Path:
    """Write a model-only epochal checkpoint (see the module docstring).

    Args:
        config: the model config.
        state: full tensors with our names.
        run_dir: the run directory to create (``checkpoints/step_0000000`` inside).
        source: recorded in ``trainer_state.json`` (where the weights came from).
        overwrite: replace an existing run directory.

    Returns:
        The step folder.

    Raises:
        FileExistsError: ``run_dir`` exists and ``overwrite`` is false.
        ConversionError: ``state`` does not match ``config``.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    from epochal._atomic import atomic_directory

    state = complete_tied(config, state)
    check_shapes(state, config, "model state")
    run_dir = Path(run_dir)
    toml_text = model_toml(config, source)
    trainer_state = {
        "format": 1,
        "step": 0,
        "model_only": True,
        "source": source,
        "model_config": config.to_dict(),
    }
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    with atomic_directory(run_dir, overwrite=overwrite) as tmp:
        folder = tmp / "checkpoints" / "step_0000000"
        folder.mkdir(parents=True)
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=".*assuming the intent is to save in a single process.*"
            )
            dcp.save({"model": tensors}, storage_writer=FileSystemWriter(folder, thread_count=1))
        torch.save({}, folder / "rng_rank0.pt")
        (folder / "trainer_state.json").write_text(json.dumps(trainer_state, indent=1))
        (folder / "config.toml").write_text(toml_text)
        (tmp / "config.toml").write_text(toml_text)
        (tmp / "checkpoints" / "latest").write_text("step_0000000\n")
    return run_dir / "checkpoints" / "step_0000000"


def model_toml(config: ModelConfig, source: str = "") -> str:
    """The ``[model]`` table of ``config`` (and ``[data] seq_length``) as TOML text.

    A starting point for ``epochal train --config``: add a ``[data]`` source
    (``data_path``, ``corpus`` or ``mock``) to fine-tune.
    """
    origin = " ".join(source.split())
    lines = [
        f"# model converted by epochal convert{' from ' + origin if origin else ''}",
        "[model]",
    ]
    for key, value in config.to_dict().items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = json.dumps(value)
        else:
            text = repr(value)
        lines.append(f"{key} = {text}")
    lines += ["", "[data]", f"seq_length = {config.max_position_embeddings}", ""]
    return "\n".join(lines)
