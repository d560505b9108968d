"""Fine-tuning starts: the encoder's weights from a pretrained run or a Hugging Face folder.

``checkpoint.init_from`` of a run with a fine-tuning head (``model.head``) names an
epochal run / checkpoint (any layout) or a Hugging Face ESM / BERT folder (masked-LM
or bare encoder, :func:`epochal.formats.hf.encoder.load_hf_encoder`):

- :func:`finetune_overrides` (``epochal train``, before the configuration is built)
  takes the encoder's shape (every ``[model]`` field but the head / LoRA fields and
  the dropouts) from the checkpoint, so a fine-tuning config names only its head;
- :func:`load_encoder_weights` (the trainer's ``init_from`` seam) loads every weight
  the checkpoint has into this rank's model parts (sharded as they are), ignores what
  the model has no use for (the masked-LM head), and names in one line the weights
  the checkpoint lacks: only the head's and the adapters' may be missing.

A run without a fine-tuning head (``model.head = "mlm"``: a GPT, or an encoder that
goes on pretraining) may name a Hugging Face folder of any class
:func:`epochal.formats.hf.io.load_hf_checkpoint` reads (Llama, Qwen2 / Qwen2.5, Qwen3,
Mistral, GPT-2, BERT, ESM-2, T5): its whole ``[model]`` configuration then comes from the
folder's ``config.json`` (:func:`finetune_overrides`; a preset's ``[model]`` gives way to
it, :func:`~epochal.train.config.build_config`'s ``init_model``), a ``[model]`` option that
contradicts it is refused, and the weights load through the same seam. Options are
compared resolved (:meth:`~epochal.model.config.ModelConfig.resolved_dict`): the folder's
``intermediate_size`` equal to the default width reads back as ``ffn_hidden_size = None``
and is the same model as that width spelled out.

Errors (:class:`~epochal.train.state.checkpoint.CheckpointError`): a checkpoint of
another model type, an encoder weight the checkpoint lacks, a head weight whose shape
differs from the checkpoint's (another ``num_labels`` or head kind).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from epochal.model.build import build_model
from epochal.model.config import ModelConfig
from epochal.model.init import canonical_name
from epochal.model.lora import is_lora_name
from epochal.train.config.model import CHECKPOINT_KEPT_FIELDS
from epochal.train.state.checkpoint import CheckpointError
from epochal.train.state.errors import refuse_other_model

__all__ = [
    "copy_full_state",
    "finetune_overrides",
    "is_hf_folder",
    "load_encoder_weights",
    "read_encoder",
]

#: ``[model]`` fields a fine-tuning config keeps (the rest come from the checkpoint).
KEPT_FIELDS = CHECKPOINT_KEPT_FIELDS


def is_hf_folder(path: str | Path) -> bool:
    """A Hugging Face model folder (``config.json``, no epochal ``trainer_state.json``)."""
    p = Path(path)
    return (p / "config.json").is_file() and not (p / "trainer_state.json").is_file()


def read_encoder(
    path: str | Path, *, option: str = "checkpoint.init_from"
) -> tuple[ModelConfig, dict[str, torch.Tensor], bool]:
    """``(config, full CPU state, has_lm_head)`` of a run, checkpoint or Hugging Face folder.

    Args:
        option: the option that named ``path`` (``--checkpoint`` for ``epochal embed``),
            for the message.

    Raises:
        CheckpointError: nothing readable there (the option and the reader's reason named).
    """
    from epochal.formats.common import ConversionError

    try:
        if is_hf_folder(path):
            from epochal.formats.bounded_parse import load_json_file
            from epochal.formats.hf.encoder import ENCODER_LAYOUTS, load_hf_encoder
            from epochal.formats.hf.io import load_hf_checkpoint

            config_json = Path(path) / "config.json"
            if load_json_file(config_json, config_json.name).get("model_type") in ENCODER_LAYOUTS:
                hf, has_lm_head = load_hf_encoder(path)
                return hf.config, hf.state, has_lm_head
            hf = load_hf_checkpoint(path)  # a decoder (Llama, Qwen2/3, Mistral, GPT-2) or T5
            return hf.config, hf.state, True
        from epochal.train.state.epochal_ckpt import load_epochal_checkpoint

        ck = load_epochal_checkpoint(path)
        return ck.config, ck.state, ck.config.head == "mlm"
    except (ConversionError, FileNotFoundError) as exc:
        raise CheckpointError(f"{option}={str(path)!r}: {exc}") from exc


def finetune_overrides(config_file: str | None, overrides: list[str]) -> list[str] | None:
    """``--model.<field>=<value>`` overrides giving a run the shape of its ``checkpoint.init_from``.

    When the config file and ``overrides`` (read as ``epochal train`` reads them) name a
    fine-tuning ``model.head`` and a ``checkpoint.init_from``, every ``[model]`` field of
    the checkpoint's encoder but the head / LoRA fields and the dropouts (unset ones
    left out); to be placed *before* the user's overrides, which still win. Without a
    fine-tuning head, when ``checkpoint.init_from`` is a Hugging Face folder: every
    ``[model]`` field the user did not set, from the folder (see the module docstring).

    Returns:
        The overrides, or None when the run is neither.

    Raises:
        CheckpointError: the checkpoint cannot be read, holds no encoder for a fine-tuning
            head (a GPT or T5 model), or a ``[model]`` option contradicts a Hugging Face folder.
    """
    import json
    import tomllib

    from epochal.train.config import parse_overrides

    values: dict[str, Any] = {}
    if config_file:
        try:
            values = tomllib.loads(Path(config_file).read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return None  # build_config reports it
    given = parse_overrides(list(overrides))
    for section in ("model", "checkpoint"):
        values.setdefault(section, {}).update(given.get(section, {}))
    head = values["model"].get("head", "mlm")
    init = values["checkpoint"].get("init_from", "")
    if not init:
        return None
    if head == "mlm":
        return _hf_model_overrides(init, values["model"]) if is_hf_folder(init) else None
    source, _, _ = read_encoder(init)
    if not source.is_encoder:  # say so here, not as an option of the copied shape
        raise CheckpointError(
            f"checkpoint.init_from={str(init)!r} holds a {source.type!r} model, but a "
            f"fine-tuning head (model.head={head!r}) needs a pretrained 'bert' or 'esm' encoder"
        )
    out = []
    for f in dataclasses.fields(source):
        value = getattr(source, f.name)
        if f.name in KEPT_FIELDS or value is None:
            continue
        literal = json.dumps(value) if isinstance(value, (bool, str)) else repr(value)
        out.append(f"--model.{f.name}={literal}")
    return out


def _hf_model_overrides(init: str | Path, given: dict[str, Any]) -> list[str]:
    """The ``--model.*`` overrides of a run whose ``checkpoint.init_from`` is a Hugging Face folder.

    Every ``[model]`` field comes from the folder's ``config.json`` (as
    :func:`epochal.formats.hf.io.load_hf_checkpoint` reads it). The config file and
    the command line may set the dropouts and the head / LoRA fields (:data:`KEPT_FIELDS`);
    any other field they set must equal the folder's (Megatron-Bridge and NeMo take the
    architecture from the Hugging Face model the same way).

    Raises:
        CheckpointError: the folder cannot be read, or a ``[model]`` option contradicts
            it (each such option named, with both values).
    """
    import json

    from epochal.formats.bounded_parse import load_json_file
    from epochal.formats.common import ConversionError
    from epochal.formats.hf.encoder import ENCODER_LAYOUTS
    from epochal.formats.hf.io import load_hf_config

    config_json = Path(init) / "config.json"
    try:
        if load_json_file(config_json, config_json.name).get("model_type") in ENCODER_LAYOUTS:
            source = read_encoder(init)[0]  # bare encoders too
        else:
            source = load_hf_config(init)  # the shape only: a decoder's weights are not read
    except (ConversionError, FileNotFoundError) as exc:
        raise CheckpointError(f"checkpoint.init_from={str(init)!r}: {exc}") from exc
    theirs = {f.name: getattr(source, f.name) for f in dataclasses.fields(source)}
    clash = [
        f"model.{k}={v!r} (the folder's is {source.resolved_dict().get(k, theirs[k])!r})"
        for k, v in given.items()
        if k in theirs and k not in KEPT_FIELDS and _differs(source, k, v)
    ]
    if clash:
        raise CheckpointError(
            f"checkpoint.init_from={str(init)!r} is a Hugging Face folder: the model's "
            "configuration comes from its config.json, and these options contradict it: "
            + "; ".join(clash)
            + " (leave them unset)"
        )
    out = []
    for name, value in theirs.items():
        if value is None or name in given:
            continue
        literal = json.dumps(value) if isinstance(value, (bool, str)) else repr(value)
        out.append(f"--model.{name}={literal}")
    return out


def _differs(source: ModelConfig, name: str, value: Any) -> bool:
    """Whether ``model.<name>=value`` gives another model than ``source`` (compared resolved)."""
    if value == getattr(source, name):
        return False
    try:
        other = dataclasses.replace(source, **{name: value})
    except (ValueError, TypeError):  # ConfigError: not a value of this model at all
        return True
    return other.resolved_dict().get(name) != source.resolved_dict().get(name)


def _check_type(source: ModelConfig, model_type: str, where: Any) -> None:
    if source.type != model_type:
        raise CheckpointError(
            f"checkpoint.init_from={str(where)!r} holds a {source.type!r} model, but "
            f"model.type={model_type!r}; start from a checkpoint of a {model_type!r} model"
        )


def _encoder_fields(config: ModelConfig) -> dict[str, Any]:
    """The fields that must match the checkpoint's, derived ones resolved (:meth:`ModelConfig.resolved_dict`)."""
    return {k: v for k, v in config.resolved_dict().items() if k not in KEPT_FIELDS}


def load_encoder_weights(
    model_parts: list[nn.Module], model_config: ModelConfig, folder: str | Path, log: Any = None
) -> list[str]:
    """Load the checkpoint's weights into ``model_parts`` (see the module docstring).

    Args:
        model_parts: this rank's parts (pipeline stages; tensor-/data-parallel DTensors allowed).
        model_config: the fine-tuning model's config.
        folder: ``checkpoint.init_from``.
        log: ``log(str)`` for the line naming the weights that start fresh.

    Returns:
        The names of the weights initialised fresh (sorted).

    Raises:
        CheckpointError: see the module docstring.
    """
    source, state, _ = read_encoder(folder)
    _check_type(source, model_config.type, folder)
    ours, theirs = _encoder_fields(model_config), _encoder_fields(source)
    refuse_other_model(folder, ours, theirs)
    with torch.device("meta"):
        whole = build_model(model_config)
    shapes = {name: tuple(p.shape) for name, p in whole.state_dict().items()}
    missing = sorted(k for k in shapes if k not in state)
    bad = [k for k in missing if not (k.startswith("head.") or is_lora_name(k))]
    if bad:
        raise CheckpointError(f"{folder} lacks encoder weights the model needs: {bad[:8]}")
    misfit = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {shapes[k]}"
        for k in shapes
        if k in state and tuple(state[k].shape) != shapes[k]
    ]
    if misfit:
        raise CheckpointError(
            f"the head does not fit {folder}: "
            + "; ".join(misfit[:4])
            + " (another model.head or model.num_labels?)"
        )
    for part in model_parts:
        copy_full_state(part, state)
    if log is not None:
        fresh = ", ".join(missing) if missing else "none"
        log(f"initialised from {folder}; weights it lacks start fresh: {fresh}")
    return missing


@torch.no_grad()
def copy_full_state(part: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy full (unsharded) tensors into the part's parameters, sharded as they are, and
    into its persistent buffers (an MoE layer's balancing bias).

    ``state`` maps canonical names (``tok_embeddings.weight``) to whole tensors;
    tensor-parallel and FSDP parameters (DTensors) take their own shard, others the
    whole tensor. Tensors ``state`` does not name are left as they are.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    for name, param in part.named_parameters():
        full = state.get(canonical_name(name))
        if full is None:
            continue
        if isinstance(param, DTensor):
            local = distribute_tensor(
                full.to(param.device, param.dtype),
                param.device_mesh,
                param.placements,
                src_data_rank=None,
            ).to_local()
            param.to_local().copy_(local)
        else:
            param.copy_(full.to(param.device, param.dtype))
    persistent = set(part.state_dict(keep_vars=True))
    for name, buffer in part.named_buffers():  # saved buffers too (an MoE layer's balancing bias)
        full = state.get(canonical_name(name))
        if full is not None and name in persistent:
            buffer.copy_(full.to(buffer.device, buffer.dtype))
