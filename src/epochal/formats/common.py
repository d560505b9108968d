"""Helpers every checkpoint format shares (its readers and writers, the converters): errors,
vocabulary padding, key checks.

A converted model is always a pair ``(ModelConfig, state_dict)`` where the state
dict uses the parameter names of ``epochal.model.build_model(config)`` (see
:mod:`epochal.model.gpt` and :mod:`epochal.model.bert`) and holds full (unsharded) CPU tensors. With tied
embeddings it holds ``tok_embeddings.weight`` and ``output.weight`` as the same
tensor, exactly as ``GPTModel.state_dict()`` does, so
``model.load_state_dict(state, strict=True)`` works.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import torch

from epochal.model.config import ModelConfig

__all__ = [
    "ConversionError",
    "check_keys",
    "check_shapes",
    "complete_tied",
    "expected_keys",
    "normalize_config",
    "resize_rows",
]


class ConversionError(ValueError):
    """A checkpoint cannot be converted (unsupported option, missing or extra tensors, bad shape)."""


def resize_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """Cut or zero-pad ``tensor`` along dim 0 to ``rows`` rows (vocabulary padding).

    Args:
        tensor: ``[n, ...]``.
        rows: the wanted number of rows.

    Returns:
        ``[rows, ...]``: the first ``min(n, rows)`` rows of ``tensor``, then zeros.
    """
    n = tensor.shape[0]
    if n == rows:
        return tensor
    if n > rows:
        return tensor[:rows].clone()
    out = tensor.new_zeros((rows, *tensor.shape[1:]))
    out[:n] = tensor
    return out


def expected_keys(config: ModelConfig) -> list[str]:
    """The state-dict keys of ``build_model(config)`` (tied output included), in model order."""
    from epochal.model.build import build_model

    with torch.device("meta"):
        model = build_model(config)
    return list(model.state_dict().keys())


def check_keys(
    present: Iterable[str], expected: Iterable[str], source: str, *, ignore: tuple[str, ...] = ()
) -> None:
    """Raise :class:`ConversionError` naming ``source`` if keys are missing or unexpected.

    Args:
        present: the keys found.
        expected: the keys required.
        source: the file or checkpoint named in the message.
        ignore: suffixes of present keys that are allowed and dropped (buffers).
    """
    present_set = {k for k in present if not k.endswith(ignore)} if ignore else set(present)
    expected_set = set(expected)
    missing = sorted(expected_set - present_set)
    extra = sorted(present_set - expected_set)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if extra:
            parts.append(f"unexpected {extra[:8]}{' ...' if len(extra) > 8 else ''}")
        raise ConversionError(f"{source}: tensor names do not match the model: {'; '.join(parts)}")


def complete_tied(
    config: ModelConfig, state: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Return ``state`` with ``output.weight`` set to ``tok_embeddings.weight`` when tied."""
    out = dict(state)
    if config.tie_embeddings and "tok_embeddings.weight" in out:
        out["output.weight"] = out["tok_embeddings.weight"]
    return out


def attach_output_head(
    config: ModelConfig,
    state: Mapping[str, torch.Tensor],
    head: torch.Tensor | None,
    *,
    source: str,
    head_name: str,
) -> dict[str, torch.Tensor]:
    """Return ``state`` with ``output.weight``: the embedding when tied, else ``head``
    padded to ``config.padded_vocab_size`` rows.

    Args:
        head: the source's output matrix ``[vocab, hidden]`` (``None`` if it had none;
            ignored when tied).
        source, head_name: the file and the source's tensor name, for the error.

    Raises:
        ConversionError: untied embeddings and no ``head``.
    """
    if config.tie_embeddings:
        return complete_tied(config, state)
    if head is None:
        raise ConversionError(f"{source}: missing tensor {head_name!r} (untied embeddings)")
    return {**state, "output.weight": resize_rows(head, config.padded_vocab_size)}


def check_shapes(state: Mapping[str, torch.Tensor], config: ModelConfig, source: str) -> None:
    """Raise :class:`ConversionError` if a tensor's shape differs from ``build_model(config)``'s."""
    from epochal.model.build import build_model

    with torch.device("meta"):
        reference = build_model(config).state_dict()
    check_keys(state.keys(), reference.keys(), source)
    for name, ref in reference.items():
        if tuple(state[name].shape) != tuple(ref.shape):
            raise ConversionError(
                f"{source}: {name} has shape {tuple(state[name].shape)}, the model expects {tuple(ref.shape)}"
            )


def normalize_config(config: ModelConfig) -> ModelConfig:
    """Return ``config`` with derived options set to ``None`` where they equal their default.

    ``ffn_hidden_size``, ``kv_channels``, ``num_query_groups`` and ``add_qkv_bias``
    become ``None`` when the explicit value is what ``None`` means, so that an
    imported config compares equal to the one that was exported.
    """
    defaults = dataclasses.replace(
        config, ffn_hidden_size=None, kv_channels=None, num_query_groups=None, add_qkv_bias=None
    )
    changes = {}
    if config.ffn_hidden_size == defaults.ffn_size:
        changes["ffn_hidden_size"] = None
    if config.kv_channels is not None and config.hidden_size % config.num_attention_heads == 0:
        if config.kv_channels == config.hidden_size // config.num_attention_heads:
            changes["kv_channels"] = None
    if config.num_query_groups == config.num_attention_heads:
        changes["num_query_groups"] = None
    if config.add_qkv_bias == config.add_bias_linear:
        changes["add_qkv_bias"] = None
    return dataclasses.replace(config, **changes) if changes else config
