"""The model family: GPT, BERT, ESM and T5 (no parallelism inside; :mod:`epochal.parallel` applies it).

:func:`build_model` builds any of them from a :class:`ModelConfig` (its ``type``).
Public names: :class:`ModelConfig`, :class:`ConfigError`, :func:`build_model`,
:class:`GPTModel`, :class:`BertModel`, :class:`T5Model`,
:class:`TransformerBlock`, :class:`Attention`, :class:`MLP`, :class:`KVCache`,
:func:`generate`, :class:`GenerationConfig`, :class:`GenerationOutput`. See
:mod:`epochal.model.gpt` and :mod:`epochal.model.bert` for the parameter names and
the pipeline/tying rules.
"""

from epochal._lazy import lazy_exports

_EXPORTS = {
    "ModelConfig": "config",
    "ConfigError": "config",
    "GPTModel": "gpt",
    "BertModel": "bert",
    "T5Model": "t5",
    "DecoderBlock": "layers.block",
    "RelativePositionBias": "layers.relative_bias",
    "build_model": "build",
    "TransformerBlock": "layers.block",
    "Attention": "layers.attention",
    "MLP": "layers.mlp",
    "KVCache": "generation.kv_cache",
    "generate": "generation.decoding",
    "GenerationConfig": "generation.decoding",
    "GenerationOutput": "generation.decoding",
    "training_flops_per_token": "flops",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
