"""Encoder-decoder generation (T5): the encoder runs once, the decoder decodes with caches.

:func:`~epochal.model.generation.decoding.generate` sends an encoder-decoder model
(``model.is_encoder_decoder``, e.g. :class:`~epochal.model.T5Model`) here. The prompts
are the encoder's input (right-padded, with a padding mask, so learned positions
start at 0 in every row); the decoder starts every row with
``decoder_start_token_id`` (T5: the pad id 0) and then runs the same greedy,
sampling and beam-search loops as decoder-only models (one shared implementation),
seeing the decoder through :class:`DecoderSteps`:

- the decoder's self-attention keys/values grow in the
  :class:`~epochal.model.generation.kv_cache.KVCache`;
- each decoder layer's cross-attention keys/values are computed from the encoder
  output at the first step and reused (:meth:`KVCache.cross_layer`);
- the encoder output and its mask ride in :attr:`KVCache.rows`, so beam search's
  row reordering moves them with the beams.

The result is a :class:`~epochal.model.generation.decoding.GenerationOutput` whose
``sequences`` are the decoder sequences (``[decoder_start, generated...]``, as
Hugging Face returns them; ``prompt_lengths`` are 1) and ``tokens`` the generated
tokens. The semantics match Hugging Face ``generate()`` for T5 (greedy and beam
search give the same tokens; tested against ``T5ForConditionalGeneration``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from epochal.model.generation.config import (
    GenerationConfig,
    GenerationConfigError,
    GenerationOutput,
)
from epochal.model.generation.kv_cache import KVCache
from epochal.model.generation.search import _beam_search, _device, _prepare, _sample_or_greedy

__all__ = ["DecoderSteps", "generate_encoder_decoder"]


class DecoderSteps(nn.Module):
    """An encoder-decoder model's decoder behind the decoder-only generation interface.

    ``forward(tokens, position_ids, attention_mask, kv_cache, logits_to_keep)`` runs
    ``model.decode`` on the new decoder ``tokens`` against the encoder output held in
    ``kv_cache.rows`` (positions and masks are the model's own: every decoder row
    starts with the same token, so there is no padding).

    Args:
        model: the encoder-decoder model (``encode`` / ``decode``).
        encoder_output: ``[b, s_enc, hidden]``.
        encoder_mask: ``[b, s_enc]`` (1 = token) or None.
    """

    def __init__(
        self, model: nn.Module, encoder_output: torch.Tensor, encoder_mask: torch.Tensor | None
    ) -> None:
        super().__init__()
        self.model = model
        self.config = model.config
        self._encoder_output = encoder_output
        self._encoder_mask = encoder_mask

    def new_cache(self, total: int) -> KVCache:
        """A cache of ``total`` decoder slots carrying the encoder output and mask as rows."""
        cache = KVCache(total)
        cache.rows["encoder_output"] = self._encoder_output
        if self._encoder_mask is not None:
            cache.rows["encoder_mask"] = self._encoder_mask
        return cache

    def forward(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        logits_to_keep: int | None = None,
    ) -> torch.Tensor:
        """Decoder logits ``[b, s or logits_to_keep, padded_vocab]`` of the new ``tokens``."""
        if kv_cache is None:
            raise ValueError("DecoderSteps needs the KVCache made by new_cache()")
        logits = self.model.decode(
            tokens,
            kv_cache.rows["encoder_output"],
            kv_cache.rows.get("encoder_mask"),
            kv_cache=kv_cache,
        )
        return logits if logits_to_keep is None else logits[:, -logits_to_keep:]


def generate_encoder_decoder(
    model: nn.Module, prompts: Sequence[Sequence[int]], cfg: GenerationConfig
) -> GenerationOutput:
    """Generate decoder sequences for encoder prompts (see the module docstring).

    Raises:
        GenerationConfigError: an invalid option or prompt, a decoder start id outside
            the vocabulary, or (learned positions) a prompt or output longer than
            ``max_position_embeddings``.
    """
    rows, vocab, longest = _prepare(model, prompts, cfg, check_positions=False)
    config = model.config
    start = cfg.decoder_start_token_id
    if start is None:
        start = config.pad_token_id if config.pad_token_id is not None else 0
    if not 0 <= start < config.padded_vocab_size:
        raise GenerationConfigError(
            f"decoder_start_token_id: {start} is outside [0, {config.padded_vocab_size})"
        )
    if config.position_embedding_type == "learned_absolute":
        limit = config.max_position_embeddings
        if longest > limit or 1 + cfg.max_new_tokens > limit:
            raise GenerationConfigError(
                f"max_new_tokens: the longest prompt ({longest} tokens) and the decoder "
                f"(1 + max_new_tokens = {1 + cfg.max_new_tokens}) must each fit the model's "
                f"max_position_embeddings={limit}"
            )
    device = _device(model)
    encoder_tokens = torch.zeros(len(rows), longest, dtype=torch.long)
    encoder_mask = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, row in enumerate(rows):  # right-padded: positions start at 0 in every row
        encoder_tokens[i, : len(row)] = torch.as_tensor(row)
        encoder_mask[i, : len(row)] = 1
    encoder_tokens, encoder_mask = encoder_tokens.to(device), encoder_mask.to(device)
    padded = bool((encoder_mask == 0).any())
    was_training = model.training
    model.eval()
    try:
        encoder_output = model.encode(encoder_tokens, encoder_mask if padded else None)
        steps = DecoderSteps(model, encoder_output, encoder_mask if padded else None)
        starts = [[int(start)] for _ in rows]
        if cfg.num_beams > 1:
            return _beam_search(steps, starts, cfg, vocab)
        return _sample_or_greedy(steps, starts, cfg, vocab)
    finally:
        model.train(was_training)
