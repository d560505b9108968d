"""Hugging Face encoder folders with or without their masked-LM head (``EsmModel``, ``BertModel``).

:func:`epochal.formats.hf.io.load_hf_checkpoint` reads ``EsmForMaskedLM`` /
``BertForMaskedLM`` folders. Fine-tuning and embeddings also take the bare encoders
``transformers`` saves as ``EsmModel`` / ``BertModel`` / ``MegatronBertModel``:
their tensors have no ``esm.`` / ``bert.`` prefix, no masked-LM head and usually a
pooler. :func:`load_hf_encoder` reads both: the prefix is added, the pooler dropped,
and a missing masked-LM head is filled with zeros (so the importer's checks still
apply to every encoder tensor) and reported as ``has_lm_head=False``: such a model's
``lm_head`` / ``output`` must not be used (a fine-tuning head replaces them; embeddings
do not need them). :func:`save_hf_encoder` writes a fine-tuned model's encoder that
way, its head in a file next to it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch

from epochal.formats.common import ConversionError
from epochal.formats.hf.bert import BERT, MEGATRON_BERT, EncoderLayout
from epochal.formats.hf.esm import ESM
from epochal.formats.hf.files import read_json as _read_json
from epochal.formats.hf.files import read_weights as _read_weights
from epochal.formats.hf.io import IMPORTERS, HFModel
from epochal.model.config import ModelConfig

__all__ = ["ENCODER_LAYOUTS", "load_hf_encoder", "save_hf_encoder"]

#: Hugging Face ``model_type`` -> the encoder's names.
ENCODER_LAYOUTS: dict[str, EncoderLayout] = {
    "esm": ESM,
    "bert": BERT,
    "megatron-bert": MEGATRON_BERT,
}


def load_hf_encoder(
    folder: str | os.PathLike, *, make_vocab_size_divisible_by: int = 128
) -> tuple[HFModel, bool]:
    """Read an ESM / BERT folder, masked-LM or bare encoder: ``(model, has_lm_head)``.

    Raises:
        FileNotFoundError: no folder, ``config.json`` or weights.
        ConversionError: not an encoder (``model_type`` named), or tensors that do not fit.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: not a folder")
    hf_config = _read_json(folder / "config.json")
    hf_type = hf_config.get("model_type")
    if hf_type not in ENCODER_LAYOUTS:
        raise ConversionError(
            f"{folder / 'config.json'}: model_type={hf_type!r} is not an encoder "
            f"(one of {sorted(ENCODER_LAYOUTS)})"
        )
    layout = ENCODER_LAYOUTS[hf_type]
    weights = _read_weights(folder)
    if not any(k.startswith(layout.prefix) for k in weights):
        weights = {layout.prefix + k: v for k, v in weights.items() if not k.startswith("pooler.")}
    has_lm_head = f"{layout.head_dense}.weight" in weights
    if not has_lm_head:
        h = int(hf_config["hidden_size"])
        v = int(hf_config["vocab_size"])
        for name, shape in (
            (f"{layout.head_dense}.weight", (h, h)),
            (f"{layout.head_dense}.bias", (h,)),
            (f"{layout.head_norm}.weight", (h,)),
            (f"{layout.head_norm}.bias", (h,)),
            (layout.head_bias, (v,)),
        ):
            weights[name] = torch.zeros(shape)
    read_config, read_state = IMPORTERS[hf_type]
    config = read_config(hf_config, weights, make_vocab_size_divisible_by)
    state = read_state(weights, config, str(folder))
    return HFModel(
        config=config, state=state, hf_config=hf_config, architecture=hf_type
    ), has_lm_head


def save_hf_encoder(
    config: ModelConfig, state: dict[str, torch.Tensor], folder: str | os.PathLike, **kwargs: Any
) -> Path:
    """Write a fine-tuned model's encoder as a bare Hugging Face encoder (``EsmModel``, ``BertModel``).

    Hugging Face has no class with BioNeMo's heads, so the folder holds the encoder
    (``architectures: ["EsmModel"]``; ``transformers`` loads it with ``EsmModel`` /
    ``AutoModel``) and, next to it, the head: ``epochal_head.safetensors`` (``head.*``)
    and ``epochal_head.json`` (the head's ``[model]`` fields). LoRA adapters must be
    merged first (:func:`epochal.model.lora.merge_lora_state`).

    Args:
        config: the fine-tuned model's config (``head`` != ``"mlm"``, ``lora_rank`` 0).
        state: its full state dict.
        folder: the output folder.
        **kwargs: passed to :func:`~epochal.formats.hf.io.save_hf_checkpoint`.

    Raises:
        ConversionError: adapters not merged, or not an encoder.
    """
    from safetensors.torch import load_file, save_file

    from epochal.formats.hf.io import save_hf_checkpoint
    from epochal.model.config import HEAD_FIELDS

    if config.lora_rank:
        raise ConversionError("merge the LoRA adapters first (epochal convert merges them)")
    if not config.is_encoder:
        raise ConversionError(f"model.type={config.type!r} is not an encoder")
    mlm = dataclasses.replace(config, **{k: getattr(ModelConfig, k) for k in HEAD_FIELDS})
    h, v = config.hidden_size, config.padded_vocab_size
    placeholder = {
        "lm_head.dense.weight": torch.zeros(h, h),
        "lm_head.dense.bias": torch.zeros(h),
        "lm_head.norm.weight": torch.ones(h),
        "lm_head.norm.bias": torch.zeros(h),
        "lm_head.bias": torch.zeros(v),
    }
    encoder = {k: t for k, t in state.items() if not k.startswith("head.")}
    out = save_hf_checkpoint(mlm, {**encoder, **placeholder}, folder, **kwargs)
    layout = ENCODER_LAYOUTS[mlm_architecture(mlm)]
    weights = load_file(str(out / "model.safetensors"))
    bare = {
        k[len(layout.prefix) :]: t
        for k, t in weights.items()
        if k.startswith(layout.prefix) and ".contact_head." not in f".{k}"
    }
    save_file(bare, str(out / "model.safetensors"), metadata={"format": "pt"})
    hf_config = json.loads((out / "config.json").read_text())
    hf_config["architectures"] = ["EsmModel" if config.type == "esm" else "BertModel"]
    (out / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    head = {k: t.contiguous() for k, t in state.items() if k.startswith("head.")}
    save_file(head, str(out / "epochal_head.safetensors"))
    fields = {k: getattr(config, k) for k in HEAD_FIELDS}
    (out / "epochal_head.json").write_text(json.dumps(fields, indent=1) + "\n")
    return out


def mlm_architecture(config: ModelConfig) -> str:
    """The Hugging Face ``model_type`` the masked-LM export of ``config`` writes."""
    from epochal.formats.hf.io import hf_architecture_for

    return hf_architecture_for(config)
