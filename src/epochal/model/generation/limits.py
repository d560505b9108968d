"""What a generation request may ask for, checked before anything is allocated.

Unchecked, ``epochal generate --num-beams 1000000`` would end in ``std::bad_alloc`` and a
checkpoint declaring 10^12 positions in ``tried to allocate 4000000000000 bytes``:
:func:`check_generation_sizes` refuses them first, with the option (or the
checkpoint's field) and both sizes in the message.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["check_generation_sizes"]

_GIB = 2**30


def check_generation_sizes(
    config: Any,
    gen: Any,
    prompts: list[list[int]],
    dtype: torch.dtype,
    *,
    memory: tuple[int, str] | None,
    source: str = "the checkpoint",
) -> None:
    """Refuse beams, positions and KV caches that cannot fit.

    - ``num_beams`` at most the model's vocabulary (no more distinct continuations
      exist after one step; Hugging Face draws ``2 * num_beams`` candidates from it);
    - the position tables the model builds (RoPE ``cos``/``sin``, float32
      ``[max_position_embeddings, rotary_dim]`` each) within ``memory``;
    - the KV cache (``prompts * beams`` rows of prompt + new tokens, every layer's keys
      and values in ``dtype``) and one step's float32 logits within ``memory``.

    Args:
        config: the model's :class:`~epochal.model.ModelConfig`.
        gen: the :class:`~epochal.model.generation.decoding.GenerationConfig`.
        prompts: the prompts' token ids.
        dtype: the model's dtype.
        memory: ``(bytes, what)`` of the device (None: only the vocabulary bound).
        source: the checkpoint, for messages.

    Raises:
        ValueError: naming ``--num-beams`` / ``--max-new-tokens`` or the checkpoint's
            ``max_position_embeddings``, with the sizes.
    """
    if gen.num_beams > config.vocab_size:
        raise ValueError(
            f"--num-beams {gen.num_beams:,} exceeds the model's vocabulary of "
            f"{config.vocab_size:,} tokens (beam search keeps at most that many distinct "
            "continuations); use fewer beams"
        )
    if memory is None:
        return
    limit, where = memory
    if config.position_embedding_type == "rope":
        tables = 2 * config.max_position_embeddings * config.rotary_dim * 4
        if tables > limit:
            raise ValueError(
                f"{source}: the model declares max_position_embeddings="
                f"{config.max_position_embeddings:,}; its RoPE tables alone would need "
                f"{tables / _GIB:,.0f} GiB, more than this machine's {limit / _GIB:,.0f} GiB "
                f"of {where}"
            )
    rows = len(prompts) * (gen.num_beams if gen.num_beams > 1 else gen.num_return_sequences)
    length = max((len(p) for p in prompts), default=0) + gen.max_new_tokens + 1
    item = torch.empty((), dtype=dtype).element_size()
    kv = rows * length * config.num_layers * 2 * config.num_kv_heads * config.head_dim * item
    logits = rows * config.padded_vocab_size * 4 * 3  # logits, log-probabilities, scores
    if kv + logits > limit:
        option = "--num-beams" if gen.num_beams > 1 else "--max-new-tokens"
        raise ValueError(
            f"{option}: {len(prompts)} prompt(s) x {max(gen.num_beams, 1):,} beam(s) of up to "
            f"{length:,} tokens need about {(kv + logits) / _GIB:,.1f} GiB for the KV cache and "
            f"logits, more than this machine's {limit / _GIB:,.0f} GiB of {where}; use fewer "
            "beams, prompts or new tokens"
        )
