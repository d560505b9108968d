"""Checkpoint conversion: epochal <-> Hugging Face (GPT-2, Llama, BERT, MegatronBERT, ESM-2)
<-> Megatron-LM (legacy layout, GPT).

Public names: :func:`load_hf_checkpoint`, :func:`save_hf_checkpoint`,
:func:`load_megatron_checkpoint`, :func:`save_megatron_checkpoint`,
:func:`safe_torch_load`, :class:`ConversionError`, :class:`UnsafeCheckpointError`.
Every converter works on ``(ModelConfig, state_dict)`` pairs with the parameter
names of ``epochal.model.build_model(config)`` (see :mod:`epochal.formats.common`).
"""

from epochal._lazy import lazy_exports

_EXPORTS = {
    "ConversionError": "epochal.formats.common",
    "UnsafeCheckpointError": "epochal.formats.safe_load",
    "safe_torch_load": "epochal.formats.safe_load",
    "load_hf_checkpoint": "epochal.formats.hf.io",
    "save_hf_checkpoint": "epochal.formats.hf.io",
    "load_megatron_checkpoint": "megatron.legacy",
    "save_megatron_checkpoint": "megatron.legacy",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
