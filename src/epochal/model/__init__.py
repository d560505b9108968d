"""The GPT model (no parallelism inside; :mod:`epochal.parallel` applies it from outside).

Public names: :class:`ModelConfig`, :class:`ConfigError`, :class:`GPTModel`,
:class:`TransformerBlock`, :class:`Attention`, :class:`MLP`, :class:`KVCache`,
:func:`generate`, :class:`GenerationConfig`, :class:`GenerationOutput`. See
:mod:`epochal.model.gpt` for the parameter names and the pipeline/tying rules.
"""

from epochal._lazy import lazy_exports

_EXPORTS = {
    "ModelConfig": "config",
    "ConfigError": "config",
    "GPTModel": "gpt",
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
