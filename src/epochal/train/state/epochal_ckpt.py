"""Read and write epochal's own checkpoints (the trainer's DCP folders) as ``(ModelConfig, state)``.

Reading accepts a run directory (``<run_dir>/checkpoints/latest``), a
checkpoints directory, one ``step_*`` folder, or a consolidated ``.safetensors``
file (:func:`epochal.train.parallel_trainer.export_consolidated`) stored inside
its ``step_*`` folder (for the config), saved under any parallel
layout: the model tensors are read with DCP into full (unsharded) CPU tensors,
so a TP2 x PP2 checkpoint loads in one process (DCP reshards). Only the
``model.*`` entries are read; optimizer state is ignored. Loading uses
:class:`epochal.train.state.checkpoint.SafeFileSystemReader` (no arbitrary unpickling).

The model configuration comes from, in order: ``trainer_state.json``'s
``model_config`` (written by :func:`save_epochal_checkpoint`), the
``[model]`` table of the folder's ``config.toml`` with ``vocab_size`` from the
file, the ``vocab_size`` argument, or the tokenizer named in ``[data]``
(``max_position_embeddings`` defaults to ``data.seq_length`` as in the trainer).

A consolidated file written by :func:`save_consolidated` (``epochal convert
--to safetensors``) carries the model config, the step and the run's
``config.toml`` (as JSON) in its safetensors metadata, so it is read on its own,
anywhere; one written by ``export_consolidated`` has none and must stay in its
``step_*`` folder.

Writing (:func:`save_epochal_checkpoint`) produces a run directory holding one
model-only checkpoint ``checkpoints/step_0000000`` in the trainer's layout
(DCP tensors under ``model.``, ``trainer_state.json`` with ``"model_only":
true`` and the model config, ``config.toml`` with the resolved ``[model]``
table; the source's BOS / EOS / PAD ids as ``token_ids``, so that an export
of it writes those and not a tokenizer rebuilt from defaults), written to a temporary
name and renamed. It has no optimizer state, so
the trainer cannot *resume* from it; ``epochal generate`` and ``epochal convert``
read it, and its ``config.toml`` is a starting point for fine-tuning.
:func:`save_consolidated` writes the single-file export for inference.
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

from epochal._dcp import single_process_dcp
from epochal.formats.checked_config import check_positions
from epochal.formats.common import ConversionError, check_shapes, complete_tied
from epochal.model.config import ConfigError, ModelConfig

__all__ = [
    "EpochalCheckpoint",
    "find_step_folder",
    "load_epochal_checkpoint",
    "model_toml",
    "run_tokenizer",
    "save_consolidated",
    "save_epochal_checkpoint",
    "tokenizer_for_run",
]

#: safetensors metadata keys of :func:`save_consolidated` (JSON text, decimal step).
META_MODEL_CONFIG = "epochal_model_config"
META_STEP = "epochal_step"
META_RUN_CONFIG = "epochal_run_config"
META_TOKEN_IDS = "epochal_token_ids"


@dataclass
class EpochalCheckpoint:
    """A model read from an epochal checkpoint.

    Attributes:
        config: the model config.
        state: full CPU tensors with :class:`~epochal.model.GPTModel`'s names.
        folder: the ``step_*`` folder that was read (for a self-contained
            consolidated file: the folder holding it).
        step: the training step of that checkpoint.
        run_config: the parsed ``config.toml`` (a dict), or None.
        token_ids: a model-only checkpoint's ``{"bos", "eos", "pad"}`` ids recorded by
            :func:`save_epochal_checkpoint` (each None, an id, or for EOS a list), else None.
    """

    config: ModelConfig
    state: dict[str, torch.Tensor]
    folder: Path
    step: int
    run_config: dict[str, Any] | None
    token_ids: dict[str, Any] | None = None


def find_step_folder(path: str | os.PathLike) -> Path:
    """Resolve a run dir, checkpoints dir or step folder to one complete ``step_*`` folder.

    Raises:
        FileNotFoundError: nothing that looks like an epochal checkpoint.
    """
    from epochal.train.state.checkpoint import Checkpointer

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
    from epochal.train.config import config_from_saved, model_config_from_section, position_length

    try:
        train_config = config_from_saved(run_config)
    except (ConfigError, TypeError) as exc:
        raise ConversionError(f"{folder / 'config.toml'}: {exc}") from exc
    vocab = vocab_size or train_config.model.vocab_size
    if vocab is None:
        vocab = _tokenizer_vocab_size(train_config, folder)
    return model_config_from_section(
        train_config.model, vocab_size=vocab, seq_length=position_length(train_config)
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
    """The tokenizer a training run used, rebuilt from its ``[data]`` section (None for mock GPT data).

    A ``data.corpus`` run gets its tokenizer from the trainer's corpus cache
    (:func:`epochal.train.inputs.corpus.prepare_corpus`; the corpus-trained BPE is
    re-created deterministically if the cache is gone), otherwise
    ``data.tokenizer_type`` is built from its files.

    Raises:
        ConversionError: the tokenizer cannot be built (names ``source``).
    """
    from epochal.train.inputs.corpus import prepare_corpus, tokenizer_from_config
    from epochal.train.inputs.recorded_tokenizer import with_resolved_tokenizer

    data = train_config.data
    if data.mock and not data.corpus and train_config.model.type != "esm":
        return None  # Megatron's mock GPT data has no tokenizer; ESM's mock proteins have ESM-2's
    if not data.corpus:  # the tokenizer the trainer resolves an unset type to (ESM-2's for ESM)
        data = with_resolved_tokenizer(train_config).data

    try:
        if data.corpus:
            return prepare_corpus(data).tokenizer
        return tokenizer_from_config(data)
    except (ConfigError, OSError, ValueError) as exc:
        raise ConversionError(f"{source}: cannot rebuild the run's tokenizer ({exc})") from exc


def run_tokenizer(ck: EpochalCheckpoint) -> Any:
    """The tokenizer of the run that wrote ``ck``, or None when its config names none to rebuild.

    None for a checkpoint without a ``[data]`` section, with mock data, or whose
    ``[data]`` cannot be rebuilt here (a model-only checkpoint from ``epochal
    convert``, files that moved): the tokenizer is optional for conversion and
    generation, which then ask for ``--tokenizer-type``/``--prompt-ids``.
    """
    if not ck.run_config or "data" not in ck.run_config or ck.token_ids is not None:
        return None  # a converted model records its source's ids, not a tokenizer
    from epochal.train.config import config_from_saved

    try:
        return tokenizer_for_run(config_from_saved(ck.run_config), str(ck.folder / "config.toml"))
    except (ValueError, TypeError, OSError):  # ConversionError and ConfigError are ValueErrors
        return None


def load_epochal_checkpoint(
    path: str | os.PathLike, *, vocab_size: int | None = None
) -> EpochalCheckpoint:
    """Read the model of an epochal checkpoint (any parallel layout) into full CPU tensors.

    Args:
        path: a run dir, a checkpoints dir, a ``step_*`` folder, or a consolidated
            ``.safetensors`` file (see the module docstring).
        vocab_size: the unpadded vocabulary when the checkpoint does not record it.

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        ConversionError: the config cannot be resolved or tensors do not match it.
        CheckpointError: a malformed or unsafe DCP folder
            (``CheckpointCorruptError``: a file fails its checksum).
        UnsafeCheckpointError: a ``.safetensors`` file that is not valid.
        epochal._checksum.ChecksumError: a ``.safetensors`` file fails its checksum.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from epochal.train.state.checkpoint import (
        CheckpointError,
        SafeFileSystemReader,
        SafeLoadPlanner,
        verify_checkpoint,
    )
    from epochal.train.state.dcp_checks import dcp_failure

    if Path(path).suffix == ".safetensors":
        return _load_consolidated(Path(path), vocab_size)
    folder = find_step_folder(path)
    verify_checkpoint(folder)
    config, step, run_config, token_ids = _read_step_folder(folder, vocab_size)
    metadata = SafeFileSystemReader(folder).read_metadata()
    template: dict[str, torch.Tensor] = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata):
            template[key[len("model.") :]] = torch.empty(
                tuple(meta.size), dtype=meta.properties.dtype
            )
    if not template:
        raise ConversionError(f"{folder}: the DCP checkpoint holds no model.* tensors")
    with single_process_dcp():
        try:
            dcp.load(
                {"model": template},
                storage_reader=SafeFileSystemReader(folder),
                planner=SafeLoadPlanner(),
                no_dist=True,  # every process reads the whole model itself, with or without a process group
            )
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - DCP wraps reader errors
            cause = dcp_failure(exc)
            if isinstance(cause, CheckpointError):  # a damaged or truncated file, named
                raise cause from exc
            raise ConversionError(
                f"{folder}: cannot read the model tensors ({type(cause).__name__}: {cause})"
            ) from exc
    state = _complete(config, template, str(folder))
    return EpochalCheckpoint(
        config=config,
        state=state,
        folder=folder,
        step=step,
        run_config=run_config,
        token_ids=token_ids,
    )


#: the ids a model-only checkpoint records (``trainer_state.json``'s ``token_ids``)
TOKEN_ID_KEYS = ("bos", "eos", "pad")


def _token_ids(trainer_state: dict[str, Any], source: Path) -> dict[str, Any] | None:
    """``trainer_state.json``'s ``token_ids`` checked (None when it records none).

    Raises:
        ConversionError: not an object of ``bos`` / ``eos`` / ``pad``, each null, an id
            >= 0 or (``eos``) a list of ids.
    """
    ids = trainer_state.get("token_ids")
    if ids is None:
        return None

    def is_id(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    good = isinstance(ids, dict) and set(ids) <= set(TOKEN_ID_KEYS)
    good = good and all(
        v is None or is_id(v) or (k == "eos" and isinstance(v, list) and all(map(is_id, v)))
        for k, v in ids.items()
    )
    if not good:
        raise ConversionError(
            f"{source}: token_ids must map bos / eos / pad to null, an id >= 0 or (eos) a "
            f"list of ids, got {ids!r}"
        )
    return {k: ids.get(k) for k in TOKEN_ID_KEYS}


def _read_step_folder(
    folder: Path, vocab_size: int | None
) -> tuple[ModelConfig, int, dict[str, Any] | None, dict[str, Any] | None]:
    """``(config, step, parsed config.toml or None, token ids or None)`` of a ``step_*`` folder."""
    from epochal.train.state.trainer_state import check_trainer_state

    trainer_state = _read_json(folder / "trainer_state.json")
    check_trainer_state(trainer_state, str(folder / "trainer_state.json"))
    token_ids = _token_ids(trainer_state, folder / "trainer_state.json")
    run_config = None
    if (folder / "config.toml").is_file():
        try:
            run_config = tomllib.loads((folder / "config.toml").read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConversionError(f"{folder / 'config.toml'}: not valid TOML ({exc})") from exc
    config = _model_config(folder, trainer_state, run_config, vocab_size)
    check_positions(config.max_position_embeddings, str(folder), "max_position_embeddings")
    return config, int(trainer_state.get("step", 0)), run_config, token_ids


def _load_consolidated(file: Path, vocab_size: int | None) -> EpochalCheckpoint:
    """A consolidated ``.safetensors`` file: self-contained, or inside its ``step_*`` folder."""
    from epochal._checksum import verify_safetensors
    from epochal.formats.safe_load import load_safetensors, safetensors_metadata

    meta = safetensors_metadata(file)  # a file that is no safetensors file is refused here
    if not verify_safetensors(file):
        warnings.warn(
            f"{file} records no checksum (exported before exports carried one); "
            "reading it unverified",
            stacklevel=3,
        )
    if META_MODEL_CONFIG in meta:
        try:
            config = ModelConfig.from_dict(json.loads(meta[META_MODEL_CONFIG]))
            step = int(meta.get(META_STEP, "0"))
            run_config = json.loads(meta[META_RUN_CONFIG]) if META_RUN_CONFIG in meta else None
            ids = json.loads(meta[META_TOKEN_IDS]) if META_TOKEN_IDS in meta else None
        except (ValueError, TypeError) as exc:  # JSONDecodeError and ConfigError are ValueErrors
            raise ConversionError(f"{file}: bad epochal metadata ({exc})") from exc
        token_ids = _token_ids({"token_ids": ids}, file)
        folder = file.parent
    else:  # export_consolidated's file: the config is in its step folder
        folder = find_step_folder(file.parent)
        config, step, run_config, token_ids = _read_step_folder(folder, vocab_size)
    check_positions(config.max_position_embeddings, str(file), "max_position_embeddings")
    state = _complete(config, load_safetensors(file, verify=False), str(file))
    return EpochalCheckpoint(
        config=config,
        state=state,
        folder=folder,
        step=step,
        run_config=run_config,
        token_ids=token_ids,
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
    extra_files: dict[str, str] | None = None,
    token_ids: dict[str, Any] | None = None,
) -> Path:
    """Write a model-only epochal checkpoint (see the module docstring).

    Args:
        config: the model config.
        state: full tensors with our names.
        run_dir: the run directory to create (``checkpoints/step_0000000`` inside).
        source: recorded in ``trainer_state.json`` (where the weights came from).
        token_ids: the source's ``{"bos", "eos", "pad"}`` ids (missing keys: None),
            recorded in ``trainer_state.json``; None records none.
        overwrite: replace an existing run directory.
        extra_files: file name -> text written into the run directory (a fine-tuned
            run's ``label_vocab.json``), with the rest, before the folder appears.

    Returns:
        The step folder.

    Raises:
        FileExistsError: ``run_dir`` exists and ``overwrite`` is false.
        ConversionError: ``state`` does not match ``config``.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    from epochal._atomic import atomic_directory
    from epochal._checksum import MANIFEST, build_manifest

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
    if token_ids is not None:
        trainer_state["token_ids"] = {k: token_ids.get(k) for k in TOKEN_ID_KEYS}
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    with atomic_directory(run_dir, overwrite=overwrite) as tmp:
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        folder = tmp / "checkpoints" / "step_0000000"
        folder.mkdir(parents=True)
        with single_process_dcp():
            dcp.save({"model": tensors}, storage_writer=FileSystemWriter(folder, thread_count=1))
        torch.save({}, folder / "rng_rank0.pt")
        (folder / "trainer_state.json").write_text(json.dumps(trainer_state, indent=1))
        (folder / "config.toml").write_text(toml_text)
        (folder / MANIFEST).write_bytes(build_manifest(folder))  # last: checksums of the rest
        (tmp / "config.toml").write_text(toml_text)
        (tmp / "checkpoints" / "latest").write_text("step_0000000\n")
    return run_dir / "checkpoints" / "step_0000000"


def save_consolidated(
    config: ModelConfig,
    state: dict[str, torch.Tensor],
    path: str | os.PathLike,
    *,
    step: int = 0,
    run_config: dict[str, Any] | None = None,
    source: str = "",
    dtype: torch.dtype | None = None,
    overwrite: bool = False,
    token_ids: dict[str, Any] | None = None,
) -> Path:
    """Write the model as one ``.safetensors`` file for inference, written then renamed.

    The tensors are those of ``export_consolidated`` (every ``GPTModel.state_dict()``
    name, the tied ``output.weight`` included, full CPU tensors), so
    :func:`epochal.parallel.checkpoint.load_consolidated` loads the file into a
    model. Its metadata adds the model config, ``step`` and ``run_config`` (the
    run's parsed ``config.toml``, for its tokenizer) as JSON, so that
    :func:`load_epochal_checkpoint` and ``epochal generate`` read the file alone.

    Args:
        config: the model config.
        state: full tensors with our names.
        path: the file to write; its name must end in ``.safetensors``.
        step: the training step recorded.
        run_config: the run's configuration dict, or None.
        source: recorded in the metadata (where the weights came from).
        dtype: cast floating tensors to this dtype (default: keep).
        overwrite: replace an existing file.
        token_ids: a model without a tokenizer of its own: its source's ``{"bos", "eos",
            "pad"}`` ids (as :func:`save_epochal_checkpoint` records them), or None.

    Returns:
        ``path``.

    Raises:
        ConversionError: ``path`` is not a ``.safetensors`` name, or ``state``
            does not match ``config``.
        FileExistsError: the file exists and ``overwrite`` is false.
    """
    from safetensors.torch import save_file

    from epochal._atomic import atomic_path
    from epochal._checksum import placeholder_metadata, seal_safetensors

    path = Path(path)
    if path.suffix != ".safetensors":
        raise ConversionError(f"{path}: the consolidated export must be a *.safetensors file")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path}: output exists (pass overwrite / --overwrite to replace it)")
    state = complete_tied(config, state)
    check_shapes(state, config, "model state")
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        t = tensor.detach().to("cpu")
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        tensors[name] = t.contiguous()
    if config.tie_embeddings:  # safetensors refuses two names for the same memory
        tensors["output.weight"] = tensors["tok_embeddings.weight"].clone()
    metadata = {
        "format": "pt",
        "source": source,
        META_MODEL_CONFIG: json.dumps(config.to_dict()),
        META_STEP: str(int(step)),
        **placeholder_metadata(),
    }
    if run_config is not None:
        metadata[META_RUN_CONFIG] = json.dumps(run_config, default=str)
    if token_ids is not None:
        metadata[META_TOKEN_IDS] = json.dumps({k: token_ids.get(k) for k in TOKEN_ID_KEYS})
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
        seal_safetensors(tmp)
    return path


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
