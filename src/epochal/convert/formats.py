"""One entry point over the checkpoint formats: detect, read any, write any.

Formats: ``"epochal"`` (a run / checkpoint folder of any parallel layout, or a
consolidated ``.safetensors`` file), ``"hf"`` (a Hugging Face model folder),
``"megatron"`` (Megatron-LM legacy ``mp_rank_*`` files, ``torch_dist``, or NeMo 2).
:func:`detect_format` tells them apart; :func:`load_checkpoint` reads any of them into
our ``(ModelConfig, state_dict)`` with the token ids the source records;
:func:`save_checkpoint` writes any target; :func:`load_model_checkpoint` reads a
checkpoint and its tokenizer for inference (``epochal generate`` / ``fill-mask``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from epochal.model.config import ModelConfig

__all__ = [
    "FORMATS",
    "TARGETS",
    "LoadedCheckpoint",
    "ModelCheckpoint",
    "detect_format",
    "export_tokenizer",
    "load_checkpoint",
    "load_model_checkpoint",
    "merge_adapters",
    "run_chat_tokenizer",
    "save_checkpoint",
]

FORMATS = ("epochal", "hf", "megatron")
TARGETS = (*FORMATS, "safetensors")


def detect_format(path: str | os.PathLike) -> str:
    """``"hf"``, ``"megatron"`` or ``"epochal"`` for a checkpoint folder.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    from epochal.convert.megatron.legacy_save import TRACKER_FILE
    from epochal.convert.megatron.nemo2 import is_nemo2
    from epochal.convert.megatron.torch_dist import is_torch_dist

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    if (path / "config.json").is_file():
        return "hf"
    if (path / TRACKER_FILE).is_file() or is_torch_dist(path) or is_nemo2(path):
        return "megatron"
    if path.is_dir():
        children = [p.name for p in path.iterdir()]
        if any(n.startswith("mp_rank_") for n in children) or any(
            n.startswith("iter_") for n in children
        ):
            return "megatron"
    return "epochal"


@dataclass
class LoadedCheckpoint:
    """A checkpoint of any format in our names (:func:`load_checkpoint`).

    Attributes:
        config, state: our model config and full CPU tensors.
        format: the format read (``"epochal"``, ``"hf"``, ``"megatron"``).
        step: the training step / iteration recorded (0 when none).
        extra: what a writer may carry over: ``bos`` / ``eos`` / ``pad`` token ids,
            ``tokenizer_json`` (an epochal run's ``tokenizer.json``), ``tokenizer_files``
            (other tokenizer files by name, e.g. ESM-2's ``vocab.txt``; a fine-tuning
            run's chat tokenizer folder and ``generation_config.json``), ``run_config``,
            ``token_ids`` (a converted model's recorded ids: it has no tokenizer of its own).
    """

    config: ModelConfig
    state: dict[str, torch.Tensor]
    format: str
    step: int
    extra: dict[str, Any] = field(default_factory=dict)


def load_checkpoint(
    path: str | os.PathLike,
    fmt: str = "auto",
    *,
    iteration: int | None = None,
    vocab_size: int | None = None,
    make_vocab_size_divisible_by: int | None = None,
    model_config: str | os.PathLike | None = None,
) -> LoadedCheckpoint:
    """Read a checkpoint of any format (``fmt="auto"``: :func:`detect_format`).

    Args:
        path: the checkpoint.
        fmt: ``"auto"`` or one of :data:`FORMATS`.
        iteration: Megatron: the iteration to read (default: the tracker's).
        vocab_size: the unpadded vocabulary when the checkpoint lacks it.
        make_vocab_size_divisible_by: our padding multiple (default: the input's, else 128).
        model_config: NeMo 2 only: Megatron-Core config fields completing its context.

    Raises:
        ValueError: ``model_config`` for a non-Megatron input; every reader's
            :class:`~epochal.formats.common.ConversionError`.
        OSError: missing files, unsafe pickles.
    """
    fmt = detect_format(path) if fmt == "auto" else fmt
    if model_config is not None and fmt != "megatron":
        raise ValueError(f"--model-config applies to NeMo 2 checkpoints; {path} is {fmt}")
    if fmt == "hf":
        from epochal.formats.hf.io import load_hf_checkpoint

        hf = load_hf_checkpoint(
            path, make_vocab_size_divisible_by=make_vocab_size_divisible_by or 128
        )
        eos = hf.eos_token_ids
        eos = eos[0] if len(eos) == 1 else (list(eos) or None)
        return LoadedCheckpoint(hf.config, hf.state, fmt, 0, {"bos": hf.bos_token_id, "eos": eos})
    if fmt == "megatron":
        from epochal.convert.megatron.legacy import load_megatron_checkpoint

        ck = load_megatron_checkpoint(
            path,
            iteration=iteration,
            vocab_size=vocab_size,
            make_vocab_size_divisible_by=make_vocab_size_divisible_by,
            model_config=model_config,
        )
        return LoadedCheckpoint(ck.config, ck.state, fmt, ck.iteration or 0)
    from epochal.train.state.epochal_ckpt import load_epochal_checkpoint

    ck = load_epochal_checkpoint(path, vocab_size=vocab_size)
    named = run_chat_tokenizer(ck.run_config)
    if ck.token_ids is not None:  # a converted model: its source's ids, no tokenizer to rebuild
        tokenizer: dict[str, Any] = {**ck.token_ids, "token_ids": ck.token_ids}
    elif named is not None and not Path(named[0]).is_dir():
        tokenizer = {"missing_tokenizer": named}  # a Hugging Face export refuses it
    else:
        tokenizer = _chat_tokenizer_info(named[0]) if named else _run_tokenizer_info(ck)
    extra = {**tokenizer, "run_config": ck.run_config}
    if ck.config.head != "mlm":  # a classifier's class names go wherever its weights go
        from epochal.train.inputs.finetune import label_vocab_file

        run_dir = (ck.run_config or {}).get("run_dir")
        found = label_vocab_file(path, ck.folder, run_dir if isinstance(run_dir, str) else None)
        if found is not None:
            extra["label_vocab"] = found.read_text()
    return LoadedCheckpoint(ck.config, ck.state, fmt, ck.step, extra)


def _run_tokenizer_info(ck: Any) -> dict[str, Any]:
    """BOS/EOS/PAD ids and a ``tokenizer.json`` of the run's tokenizer, when it can be rebuilt."""
    from epochal.train.state.epochal_ckpt import run_tokenizer

    tokenizer = run_tokenizer(ck)
    if tokenizer is None:
        return {}
    info = {
        "bos": getattr(tokenizer, "bos", None),
        "eos": getattr(tokenizer, "eod", None),
        "pad": getattr(tokenizer, "pad", None),
    }
    source = getattr(tokenizer, "source", None)
    if isinstance(source, str) and source.endswith(".json") and Path(source).is_file():
        info["tokenizer_json"] = source
    if hasattr(tokenizer, "hf_tokenizer_files"):  # ESM-2: vocab.txt for EsmTokenizer
        info["tokenizer_files"] = tokenizer.hf_tokenizer_files()
    return info


def _chat_tokenizer_info(folder: str, origin: str = "the run's chat tokenizer") -> dict[str, Any]:
    """What an export of a fine-tuning run carries of its chat tokenizer folder.

    The folder's tokenizer files unchanged (``tokenizer_files``: the chat template and
    special tokens with them, so ``AutoTokenizer`` of the export renders the ids the run
    trained on), its BOS / EOS / PAD ids for ``config.json``, and a
    ``generation_config.json`` whose ``eos_token_id`` lists the end-of-turn tokens
    (:func:`epochal.data.sft.end_of_turn_ids`: EOS, the folder's own
    ``generation_config.json`` ids, the template's end of turn), where ``transformers``'
    ``generate()`` and chat pipeline stop.

    Raises:
        ConversionError: the folder's tokenizer cannot be loaded (names it and ``origin``).
    """
    import json

    from epochal.data.sft import (
        SFTDataError,
        chat_tokenizer_files,
        end_of_turn_ids,
        load_chat_tokenizer,
    )
    from epochal.formats.common import ConversionError

    try:
        tokenizer = load_chat_tokenizer(folder)
        files = chat_tokenizer_files(folder)
    except SFTDataError as exc:
        raise ConversionError(f"{origin}: {exc}") from None
    stops = end_of_turn_ids(tokenizer, extra=generation_eos_ids(folder))
    bos, pad = tokenizer.bos_token_id, tokenizer.pad_token_id
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else (stops or [None])[0]
    pad = eos if pad is None else pad
    generation = {"bos_token_id": bos, "eos_token_id": stops or eos, "pad_token_id": pad}
    generation = {k: v for k, v in generation.items() if v is not None}
    files["generation_config.json"] = (json.dumps(generation, indent=2) + "\n").encode()
    return {"bos": bos, "eos": eos, "pad": pad, "tokenizer_files": files}


def merge_adapters(
    config: ModelConfig, state: dict[str, torch.Tensor]
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """``(config, state)`` with LoRA adapters folded into the weights (unchanged without adapters).

    ``W + (alpha / r) B A`` (:func:`epochal.model.lora.merge_lora_state`); the config
    loses ``lora_rank`` and ``freeze_encoder``: a plain model.
    """
    if not config.lora_rank:
        return config, state
    import dataclasses

    from epochal.model.lora import merge_lora_state

    merged = merge_lora_state(state, config)
    return dataclasses.replace(config, lora_rank=0, freeze_encoder=False), merged


def save_checkpoint(
    ck: LoadedCheckpoint,
    output: str | os.PathLike,
    target: str,
    *,
    source: str,
    dtype: torch.dtype | None = None,
    overwrite: bool = False,
    hf_architecture: str | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    expert_parallel: int = 1,
    megatron_iteration: int | None = None,
    megatron_spec: str = "transformer_engine",
    ckpt_format: str = "torch",
    tokenizer: str | None = None,
    no_tokenizer: bool = False,
) -> Path:
    """Write ``ck`` as ``target`` (one of :data:`TARGETS`); returns the output path.

    A LoRA model is written merged (:func:`merge_adapters`); a fine-tuned model (``head``
    != ``"mlm"``) goes to Hugging Face as its bare encoder with the head next to it
    (:func:`epochal.formats.hf.encoder.save_hf_encoder`).

    Args:
        ck: what :func:`load_checkpoint` read.
        output: the folder (or ``.safetensors`` file for ``"safetensors"``).
        target: ``"epochal"``, ``"hf"``, ``"megatron"`` or ``"safetensors"``.
        source: recorded in the output as where it came from.
        dtype: cast the floating-point weights (None: keep).
        overwrite: replace an existing output.
        hf_architecture: Hugging Face output class (default: from the config).
        bos_token_id / eos_token_id / pad_token_id: Hugging Face ``config.json``
            ids, and those a model-only epochal checkpoint records (default: those
            ``ck.extra`` carries; for Hugging Face the padding id falls back to EOS when
            the run's ``tokenizer.json`` is copied).
        tensor_parallel / pipeline_parallel / expert_parallel / megatron_iteration / megatron_spec /
            ckpt_format: Megatron output layout (iteration default: ``ck.step``).
        tokenizer / no_tokenizer: Hugging Face output: ship this tokenizer folder, or none
            (:func:`export_tokenizer`; needed when a fine-tuning run's folder is gone).

    Raises:
        ValueError: a bad option or a model the target cannot hold.
        OSError: an existing output without ``overwrite``, a write failure.
    """
    if (tokenizer is not None or no_tokenizer) and target != "hf":
        raise ValueError("--tokenizer / --no-tokenizer apply to --to hf")
    if tokenizer is not None and no_tokenizer:
        raise ValueError("--tokenizer and --no-tokenizer exclude each other")
    config, state = merge_adapters(ck.config, ck.state)
    extra = ck.extra
    from epochal.train.inputs.finetune import LABEL_VOCAB_FILE

    labels = {LABEL_VOCAB_FILE: extra["label_vocab"]} if extra.get("label_vocab") else {}
    if target == "hf" and config.head != "mlm":
        from epochal.formats.hf.encoder import save_hf_encoder

        return save_hf_encoder(
            config, state, output, dtype=dtype, overwrite=overwrite, extra_files=labels or None
        )
    if target == "hf":
        from epochal.formats.hf.io import save_hf_checkpoint

        extra = export_tokenizer(extra, tokenizer, without=no_tokenizer)
        eos = extra.get("eos") if eos_token_id is None else eos_token_id
        pad = extra.get("pad") if pad_token_id is None else pad_token_id
        if pad is None and extra.get("tokenizer_json"):  # a padding token for AutoTokenizer
            pad = eos[0] if isinstance(eos, list) and eos else eos
        return save_hf_checkpoint(
            config,
            state,
            output,
            architecture=hf_architecture,
            dtype=dtype,
            bos_token_id=extra.get("bos") if bos_token_id is None else bos_token_id,
            eos_token_id=eos,
            pad_token_id=pad,
            # the run's tokenizer next to the weights, its special tokens matching config.json
            tokenizer_file=extra.get("tokenizer_json"),
            overwrite=overwrite,
            extra_files=extra.get("tokenizer_files"),
        )
    if target == "megatron":
        from epochal.convert.megatron.legacy import save_megatron_checkpoint

        return save_megatron_checkpoint(
            config,
            state,
            output,
            tensor_parallel=tensor_parallel,
            pipeline_parallel=pipeline_parallel,
            expert_parallel=expert_parallel,
            iteration=ck.step if megatron_iteration is None else megatron_iteration,
            spec=megatron_spec,
            ckpt_format=ckpt_format,
            dtype=dtype,
            overwrite=overwrite,
        )
    given = {"bos": bos_token_id, "eos": eos_token_id, "pad": pad_token_id}
    token_ids = {k: extra.get(k) if v is None else v for k, v in given.items()}
    if target == "safetensors":
        from epochal.train.state.epochal_ckpt import save_consolidated

        # a model without a run tokenizer to rebuild keeps its source's ids
        own_tokenizer = extra.get("run_config") is not None and "token_ids" not in extra

        return save_consolidated(
            config,
            state,
            output,
            step=ck.step,
            run_config=extra.get("run_config"),
            source=source,
            dtype=dtype,
            overwrite=overwrite,
            token_ids=None if own_tokenizer else token_ids,
        )
    if target != "epochal":
        raise ValueError(f"--to {target!r}: not one of {', '.join(TARGETS)}")
    from epochal.train.state.epochal_ckpt import save_epochal_checkpoint

    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    return save_epochal_checkpoint(
        config,
        state,
        output,
        source=source,
        overwrite=overwrite,
        extra_files=labels,
        token_ids=token_ids,
    )


@dataclass
class ModelCheckpoint:
    """A model to run and the tokenizer that goes with it (:func:`load_model_checkpoint`).

    Attributes:
        config, state: our model config and full CPU tensors.
        tokenizer: the checkpoint's tokenizer (a Hugging Face folder's
            ``tokenizer.json``, an epochal run's own), or None.
        eos_token_ids: a Hugging Face model's ``eos_token_id`` (all of a list), or what a
            converted model-only epochal checkpoint records of its source's, else ().
        bos_token_id: the same for ``bos_token_id``, else None.
        run_config: an epochal run's saved ``config.toml`` (a dict), else None.
        chat_folder: the Hugging Face tokenizer folder with the chat template: a
            fine-tuning run's (``sft.tokenizer`` / ``checkpoint.init_from``), a Hugging
            Face model folder holding ``tokenizer_config.json``; else None.
    """

    config: ModelConfig
    state: dict[str, torch.Tensor]
    tokenizer: Any = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    run_config: dict[str, Any] | None = None
    chat_folder: str | None = None


def load_model_checkpoint(
    path: str | os.PathLike,
    fmt: str = "auto",
    *,
    vocab_size: int | None = None,
    with_tokenizer: bool = True,
) -> ModelCheckpoint:
    """Read a checkpoint for inference, with its tokenizer when it has one.

    Megatron checkpoints are read as GPT models (``model_type="gpt"``).

    Args:
        path: an epochal run / checkpoint, a Hugging Face folder or a Megatron checkpoint.
        fmt: ``"auto"`` (:func:`detect_format`) or one of :data:`FORMATS`.
        vocab_size: the unpadded vocabulary when the checkpoint lacks it.
        with_tokenizer: look for the checkpoint's tokenizer (False: leave it None,
            e.g. when the caller builds its own).

    Raises:
        ValueError: every reader's :class:`~epochal.formats.common.ConversionError`.
        OSError: missing files, unsafe pickles.
    """
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "hf":
        from epochal.formats.hf.io import load_hf_checkpoint

        hf = load_hf_checkpoint(path)
        eos = generation_eos_ids(path) or tuple(hf.eos_token_ids)
        out = ModelCheckpoint(hf.config, hf.state, None, eos, hf.bos_token_id)
        if (Path(path) / "tokenizer_config.json").is_file():
            out.chat_folder = str(path)
        tok_file = Path(path) / "tokenizer.json"
        if with_tokenizer and tok_file.is_file():
            from epochal.data.indexed.tokenizer import HuggingFaceTokenizer

            out.tokenizer = HuggingFaceTokenizer(tok_file)
        return out
    if fmt == "megatron":
        from epochal.convert.megatron.legacy import load_megatron_checkpoint

        ck = load_megatron_checkpoint(path, vocab_size=vocab_size, model_type="gpt")
        return ModelCheckpoint(ck.config, ck.state)
    from epochal.train.state.epochal_ckpt import load_epochal_checkpoint, run_tokenizer

    ck = load_epochal_checkpoint(path, vocab_size=vocab_size)
    tokenizer = run_tokenizer(ck) if with_tokenizer else None
    ids = ck.token_ids or {}
    eos = ids.get("eos")
    return ModelCheckpoint(
        ck.config,
        ck.state,
        tokenizer,
        tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
        ids.get("bos"),
        run_config=ck.run_config,
        chat_folder=run_chat_folder(ck.run_config),
    )


def generation_eos_ids(folder: str | os.PathLike) -> tuple[int, ...]:
    """``eos_token_id`` of a Hugging Face folder's ``generation_config.json`` (all of a list).

    ``transformers``' ``generate()`` stops at these when the file exists (they win over
    ``config.json``'s); empty without the file or the key.

    Raises:
        ConversionError: the file is not a JSON object, or the ids are not integers.
    """
    path = Path(folder) / "generation_config.json"
    if not path.is_file():
        return ()
    from epochal.formats.bounded_parse import load_json_file
    from epochal.formats.common import ConversionError

    eos = load_json_file(path, path.name).get("eos_token_id")
    eos = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in eos):
        raise ConversionError(f"{path}: eos_token_id must be an int or a list of ints, got {eos!r}")
    return tuple(eos)


def run_chat_folder(run_config: dict[str, Any] | None) -> str | None:
    """The chat tokenizer folder of the fine-tuning run whose saved config is ``run_config``.

    None for a run without ``[sft]`` rows, or whose folder is gone.
    """
    named = run_chat_tokenizer(run_config)
    return named[0] if named and Path(named[0]).is_dir() else None


def run_chat_tokenizer(run_config: dict[str, Any] | None) -> tuple[str, str] | None:
    """``(folder, option naming it)`` of a fine-tuning run's chat tokenizer, there or not.

    The option is ``sft.tokenizer``, else ``checkpoint.init_from``; None for a run without
    ``[sft]`` rows (or a saved config this version cannot read).
    """
    if not run_config or not (run_config.get("sft") or {}).get("train_file"):
        return None
    from epochal.train.config import config_from_saved
    from epochal.train.inputs.sft import chat_tokenizer_folder

    try:
        config = config_from_saved(run_config)
        folder = chat_tokenizer_folder(config)
    except (ValueError, TypeError):  # a config this version cannot read
        return None
    if not folder:
        return None
    return folder, "sft.tokenizer" if config.sft.tokenizer else "checkpoint.init_from"


def export_tokenizer(
    extra: dict[str, Any], folder: str | None = None, *, without: bool = False
) -> dict[str, Any]:
    """``extra`` with the tokenizer a Hugging Face export ships (:func:`save_checkpoint`).

    Args:
        extra: what :func:`load_checkpoint` read.
        folder: a Hugging Face tokenizer folder to ship instead of the run's
            (``--tokenizer``): its files, ids and ``generation_config.json``.
        without: ship no tokenizer and no generation config (``--no-tokenizer``); the
            token ids stay.

    Raises:
        ConversionError: ``folder`` has no loadable tokenizer, or (neither option given) the
            run is a fine-tuning run whose tokenizer folder is gone (names the folder, the
            option that named it, and both ways on).
    """
    from epochal.formats.common import ConversionError

    files = ("tokenizer_json", "tokenizer_files")
    if folder is not None:
        kept = {k: v for k, v in extra.items() if k not in (*files, "bos", "eos", "pad")}
        return {**kept, **_chat_tokenizer_info(folder, origin="--tokenizer")}
    if without:
        return {k: v for k, v in extra.items() if k not in files}
    missing = extra.get("missing_tokenizer")
    if missing:
        gone, option = missing
        raise ConversionError(
            f"the run's tokenizer folder {gone} ({option}) is gone, so the export would have "
            "no tokenizer, no chat template and no generation config: pass --tokenizer DIR "
            "(a Hugging Face tokenizer folder) to ship that one, or --no-tokenizer to export "
            "the weights without one"
        )
    return extra
