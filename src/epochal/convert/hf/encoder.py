"""Hugging Face encoder folders with or without their masked-LM head (``EsmModel``, ``BertModel``).

:func:`epochal.convert.hf.io.load_hf_checkpoint` reads ``EsmForMaskedLM`` /
``BertForMaskedLM`` folders. Fine-tuning and embeddings also take the bare encoders
``transformers`` saves as ``EsmModel`` / ``BertModel`` / ``MegatronBertModel``:
their tensors have no ``esm.`` / ``bert.`` prefix, no masked-LM head and usually a
pooler. :func:`load_hf_encoder` reads both: the prefix is added, the pooler dropped,
and a missing masked-LM head is filled with zeros (so the importer's checks still
apply to every encoder tensor) and reported as ``has_lm_head=False``: such a model's
``lm_head`` / ``output`` must not be used (a fine-tuning head replaces them; embeddings
do not need them).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from epochal.convert.common import ConversionError
from epochal.convert.hf.bert import BERT, MEGATRON_BERT, EncoderLayout
from epochal.convert.hf.esm import ESM
from epochal.convert.hf.io import IMPORTERS, HFModel, _read_json, _read_weights

__all__ = ["ENCODER_LAYOUTS", "load_hf_encoder"]

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
