"""Text generation with a KV cache: greedy, sampling (temperature / top-k / top-p) and beam search.

``generate(model, prompts, GenerationConfig(...))`` works on any module with
:class:`~epochal.model.GPTModel`'s ``forward(tokens, position_ids,
attention_mask, kv_cache=..., logits_to_keep=...)`` signature, on one process or
with tensor parallelism applied from outside (every rank runs the same call with
the same prompts; sharded logits that are DTensors are gathered with
``full_tensor()``). The model is put in eval mode for the call and restored.

Batches of prompts of different lengths are left-padded: each row gets its own
positions (``0`` at its first real token) and a mask that hides its padding, so
a prompt generates the same tokens alone or in a batch (up to floating-point
summation order). The model's padded vocabulary rows (ids ``>= vocab_size``)
are never produced: their logits are dropped before any choice.

Decoding strategies (semantics of Megatron-LM's text generation and of
Hugging Face ``generate``):

- greedy (``do_sample=False, num_beams=1``): argmax at every step;
- sampling (``do_sample=True``): logits / ``temperature``, then top-k (``top_k > 0``)
  and top-p (``0 < top_p < 1``: keep the smallest set of most likely tokens whose
  probability reaches ``top_p``) filtering, then a draw. After every step
  ``top_p *= top_p_decay`` (if ``top_p_decay > 0``), floored at ``top_p_bound``
  (if > 0), as Megatron's ``--top_p_decay``/``--top_p_bound``. Unlike Megatron,
  top-k and top-p may be combined (top-k applies first, as in Hugging Face).
  Row ``i`` of a batch draws from its own ``torch.Generator`` seeded from
  ``(seed, i)``, so results do not depend on the global RNG, and the first prompt
  of a batch samples what it samples alone with the same seed;
- beam search (``num_beams > 1``): Hugging Face's algorithm (transformers 4.50+,
  same results): at each step the ``2 * num_beams`` (more with several stop
  tokens) best continuations by summed log-probability are kept, those ending
  in a stop token become finished hypotheses scored
  ``sum_logprobs / generated_length ** length_penalty``, the best
  ``num_beams`` others continue; ``early_stopping`` as in Hugging Face
  (``False``: stop when no running beam can beat the worst finished one at its
  current length; ``True``: stop when ``num_beams`` hypotheses are finished).

The stop token(s) end a row (the stop token is part of the output); ``add_bos``
prepends ``bos_token_id`` to every prompt (Megatron's ``add_BOS``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import nn

from epochal.model.generation.config import (
    GenerationConfig,
    GenerationConfigError,
    GenerationOutput,
)
from epochal.model.generation.encoder_decoder import generate_encoder_decoder
from epochal.model.generation.search import (
    _beam_search,
    _prepare,
    _sample_or_greedy,
    candidates,
    filter_logits,
)

__all__ = [
    "GenerationConfig",
    "GenerationConfigError",
    "GenerationOutput",
    "beam_search",
    "candidates",
    "filter_logits",
    "generate",
]


@torch.no_grad()
def generate(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    config: GenerationConfig | None = None,
    **overrides: object,
) -> GenerationOutput:
    """Generate continuations of token-id prompts.

    Args:
        model: a :class:`~epochal.model.GPTModel` (or a module with its forward
            signature and a ``config`` with ``vocab_size`` / ``max_position_embeddings``),
            or an encoder-decoder model (``is_encoder_decoder``, e.g.
            :class:`~epochal.model.T5Model`): the prompts are then the encoder's
            input (see :mod:`epochal.model.generation.encoder_decoder`).
        prompts: token ids per prompt (lists of different lengths are fine).
        config: the options (default :class:`GenerationConfig()`).
        **overrides: fields replacing those of ``config`` (``max_new_tokens=8`` ...).

    Returns:
        A :class:`GenerationOutput`.

    Raises:
        GenerationConfigError: an invalid option, an empty or out-of-vocabulary
            prompt, a stop or pad id outside the vocabulary, or prompt +
            ``max_new_tokens`` longer than the model's positions.
    """
    cfg = config or GenerationConfig()
    if overrides:
        cfg = replace(cfg, **overrides)
    if getattr(model, "is_encoder_decoder", False):
        return generate_encoder_decoder(model, prompts, cfg)
    rows, vocab, _ = _prepare(model, prompts, cfg)
    was_training = model.training
    model.eval()
    try:
        if cfg.num_beams > 1:
            return _beam_search(model, rows, cfg, vocab)
        return _sample_or_greedy(model, rows, cfg, vocab)
    finally:
        model.train(was_training)


@torch.no_grad()
def beam_search(
    model: nn.Module, prompts: Sequence[Sequence[int]], config: GenerationConfig
) -> GenerationOutput:
    """Beam search with ``config.num_beams`` beams, one beam included (Megatron-LM's ``beam_width=1``).

    :func:`generate` decodes ``num_beams=1`` greedily, as Hugging Face does; this runs
    the beam search itself for any ``num_beams >= 1`` (a single beam still keeps
    finished hypotheses and may continue past a stop token when a longer
    continuation scores better). Decoder-only models; arguments as :func:`generate`'s.
    """
    if config.do_sample:
        raise GenerationConfigError("do_sample: beam search does not sample")
    rows, vocab, _ = _prepare(model, prompts, config)
    was_training = model.training
    model.eval()
    try:
        return _beam_search(model, rows, config, vocab)
    finally:
        model.train(was_training)
