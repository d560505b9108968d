"""Megatron-Core local layer names -> the legacy (pre-Core) ``language_model`` nesting, for tests."""

from __future__ import annotations

from typing import Any

_LAYER_RENAMES = [
    ("input_layernorm.", "input_norm."),
    ("self_attention.linear_qkv.", "self_attention.query_key_value."),
    ("self_attention.linear_proj.", "self_attention.dense."),
    ("pre_mlp_layernorm.", "post_attention_norm."),
    ("mlp.linear_fc1.", "mlp.dense_h_to_4h."),
    ("mlp.linear_fc2.", "mlp.dense_4h_to_h."),
]


def legacy_language_model(state: dict, block: str) -> tuple[dict, dict[str, Any]]:
    """Split one rank's Core names into the legacy ``language_model`` dict and the rest.

    Args:
        state: Megatron-Core names of one rank (local layer spec).
        block: the transformer block's Core prefix: ``"decoder"`` (GPT) or ``"encoder"`` (BERT).

    Returns:
        ``(language_model, rest)``: embeddings and layers under their legacy names, and every
        other tensor (heads, output layer) by its Core name; ``_extra_state`` entries dropped.
    """
    lm: dict = {"embedding": {}, "encoder": {}}
    rest: dict[str, Any] = {}
    for name, value in state.items():
        if name.endswith("_extra_state"):
            continue
        if name.startswith("embedding."):
            module, _, param = name[len("embedding.") :].partition(".")
            lm["embedding"].setdefault(module, {})[param] = value
        elif name.startswith(f"{block}.layers."):
            tail = name[len(block) + 1 :]
            for old, new in _LAYER_RENAMES:
                tail = tail.replace(old, new)
            lm["encoder"][tail] = value
        elif name.startswith(f"{block}.final_layernorm."):
            lm["encoder"][name.replace(f"{block}.final_layernorm.", "final_norm.")] = value
        else:
            rest[name] = value
    return lm, rest
