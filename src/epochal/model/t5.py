"""``T5Model``: an encoder-decoder transformer (Megatron's T5, Hugging Face T5 v1.0 / v1.1 / mT5).

One assembly of the shared layers (:mod:`epochal.model.layers`): an encoder of
bidirectional blocks over the source, a decoder of causal self-attention +
cross-attention blocks over the target, and an output head. Two configurations
users meet (both ``ModelConfig.type = "t5"``):

- Megatron-LM's T5 (``T5Model`` of Megatron-Core, legacy ``t5_model``): learned
  absolute positions shared by both stacks, LayerNorm, GELU, biases, the usual
  ``1/sqrt(head_dim)`` scale, the head tied to the word embeddings with a bias
  (``output_bias=True``).
- Hugging Face ``T5ForConditionalGeneration``: ``position_embedding_type =
  "relative"`` (a bias table per stack), RMSNorm without bias, no linear biases,
  ``softmax_scale = 1.0``; v1.0 uses ReLU and a tied head with
  ``scale_decoder_output=True`` (``hidden ** -0.5`` before the head); v1.1 / mT5 use
  ``"gated_gelu"`` and an untied head.

Structure and parameter names (stable; the parallel plans and converters use them)::

    tok_embeddings.weight             [padded_vocab, hidden]  shared by encoder and decoder
    pos_embeddings.weight             [max_positions, hidden] (learned_absolute; shared)
    encoder_relative_bias.weight      [buckets, heads]        (relative; bidirectional)
    decoder_relative_bias.weight      [buckets, heads]        (relative; one-directional)
    layers.{i}, i < E                 encoder blocks (:class:`~epochal.model.layers.block.TransformerBlock`,
                                      bidirectional): attention_norm, attention.wq/wk/wv/wo,
                                      ffn_norm, mlp.fc1/fc2 (or mlp.w1/w3/w2 gated)
    layers.{i}, E <= i < E + D        decoder blocks (:class:`~epochal.model.layers.block.DecoderBlock`):
                                      as above plus cross_attention_norm,
                                      cross_attention.wq/wk/wv/wo (keys/values from the encoder output)
    encoder_norm.weight (/.bias)      [hidden]   the encoder's final norm
    decoder_norm.weight (/.bias)      [hidden]   the decoder's final norm
    output.weight                     [padded_vocab, hidden]  tied to tok_embeddings unless untied
    output.bias                       [padded_vocab]          (output_bias only)

``E = config.num_encoder_layers``, ``D = config.num_decoder_layers``; one
``layers`` dict holds both stacks (global block ids, as Megatron numbers layers
per stack but the parallel wrappers want one list of blocks):
:meth:`T5Model.encoder_blocks` / :meth:`T5Model.decoder_blocks` give each stack.

Forward::

    enc = encoder_norm(encoder blocks(embed(encoder_tokens)))           (encode)
    h   = decoder_norm(decoder blocks(embed(decoder_tokens), enc))       (decode)
    logits = output(h * hidden ** -0.5 if scale_decoder_output else h)

Positions start at 0 in each stack (Megatron's ``t5_position_ids``); learned positions
can be given instead (``encoder_position_ids`` / ``decoder_position_ids``: the global
positions of the tokens passed, e.g. one context-parallel rank's chunks). Dropout
(``hidden_dropout``) follows the embeddings and every residual branch.

The model has no parallelism inside and returns logits; the loss is computed
outside (:class:`~epochal.parallel.step_model.StepModel`, the train step).
Pipeline stages are not supported for T5 (the parallel layer refuses them).
"""

from __future__ import annotations

import torch
from torch import nn

from epochal.model.base import TransformerModel
from epochal.model.config import ModelConfig
from epochal.model.generation.kv_cache import KVCache
from epochal.model.layers.attention import padding_attention_mask
from epochal.model.layers.block import DecoderBlock, TransformerBlock
from epochal.model.layers.embedding import Embedding
from epochal.model.layers.norms import build_norm
from epochal.model.layers.relative_bias import RelativePositionBias

__all__ = ["T5Model"]


class T5Model(TransformerModel):
    """Encoder-decoder transformer (see the module docstring).

    Args:
        config: the model's hyper-parameters (``type="t5"``).
        seed: initialization seed (see :class:`~epochal.model.base.TransformerModel`).

    Raises:
        ValueError: ``config.type`` is not ``"t5"``.
    """

    LAST_STAGE_MODULES = ("encoder_norm", "decoder_norm", "output")
    #: :func:`epochal.model.generate` treats the prompts as the encoder's input.
    is_encoder_decoder = True

    def __init__(self, config: ModelConfig, *, seed: int = 0) -> None:
        if config.type != "t5":
            raise ValueError(
                f"T5Model needs model.type='t5', got {config.type!r} (use build_model)"
            )
        super().__init__(config, seed=seed)

    def _build(self, config: ModelConfig) -> None:
        h = config.hidden_size
        self.tok_embeddings: nn.Embedding | None = Embedding(config.padded_vocab_size, h)
        self.pos_embeddings: nn.Embedding | None = None
        if config.position_embedding_type == "learned_absolute":
            self.pos_embeddings = Embedding(config.max_position_embeddings, h)
        self.encoder_relative_bias: RelativePositionBias | None = None
        self.decoder_relative_bias: RelativePositionBias | None = None
        if config.position_embedding_type == "relative":
            for name, bidirectional in (("encoder", True), ("decoder", False)):
                bias = RelativePositionBias(
                    config.num_attention_heads,
                    num_buckets=config.relative_attention_num_buckets,
                    max_distance=config.relative_attention_max_distance,
                    bidirectional=bidirectional,
                )
                setattr(self, f"{name}_relative_bias", bias)
        self.embedding_dropout = nn.Dropout(config.hidden_dropout)
        n_enc = config.num_encoder_layers
        blocks: dict[str, nn.Module] = {
            str(i): TransformerBlock(config, i, mask_kind="bidirectional") for i in range(n_enc)
        }
        for i in range(n_enc, n_enc + config.num_decoder_layers):
            blocks[str(i)] = DecoderBlock(config, i)
        self.layers = nn.ModuleDict(blocks)
        self.encoder_norm: nn.Module | None = build_norm(config)
        self.decoder_norm: nn.Module | None = build_norm(config)
        self.output: nn.Linear | None = nn.Linear(
            h, config.padded_vocab_size, bias=config.output_bias
        )
        self.rope_cos = None
        self.rope_sin = None
        self.tie_weights()

    # ------------------------------------------------------------------- stacks
    def encoder_blocks(self) -> list[nn.Module]:
        """The encoder's blocks (``layers`` ids below ``num_encoder_layers``), in order.

        By id, not by class: wrappers (activation recompute, compile) keep the ids.
        """
        n = self.config.num_encoder_layers
        return [b for key, b in self.layers.items() if int(key) < n]

    def decoder_blocks(self) -> list[nn.Module]:
        """The decoder's blocks (the ids from ``num_encoder_layers`` on), in order."""
        n = self.config.num_encoder_layers
        return [b for key, b in self.layers.items() if int(key) >= n]

    def block_segments(self) -> list[list[str]]:
        """The ``layers`` keys of each stack: ``[encoder keys, decoder keys]``.

        Blocks of one segment take the same inputs; a wrapper that runs several
        blocks as one (activation recompute groups) must stay within a segment.
        """
        n = self.config.num_encoder_layers
        keys = list(self.layers.keys())
        return [[k for k in keys if int(k) < n], [k for k in keys if int(k) >= n]]

    def _embed(
        self, tokens: torch.Tensor, offset: int, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        s = tokens.shape[1]
        h = self.tok_embeddings(tokens)
        if position_ids is not None and self.pos_embeddings is None:
            raise ValueError(
                "position ids need learned positions (model.position_embedding_type="
                f"'learned_absolute'), not {self.config.position_embedding_type!r}: the "
                "relative bias is computed over the whole sequence"
            )
        if self.pos_embeddings is not None:
            if position_ids is None:
                position_ids = torch.arange(offset, offset + s, device=tokens.device).unsqueeze(0)
                last = offset + s
            else:  # given positions (a rank's chunks): the furthest one must fit
                last = int(position_ids.max()) + 1 if position_ids.numel() else 0
            if last > self.config.max_position_embeddings:
                raise ValueError(
                    f"sequence length {last} exceeds max_position_embeddings="
                    f"{self.config.max_position_embeddings}"
                )
            h = h + self.pos_embeddings(position_ids)
        return self.embedding_dropout(h)

    # ------------------------------------------------------------------- forward
    def encode(
        self,
        encoder_tokens: torch.Tensor,
        encoder_padding_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the encoder.

        Args:
            encoder_tokens: int64 ``[b, s_enc]``.
            encoder_padding_mask: ``[b, s_enc]``, 1/True = real token, 0/False =
                padding (hidden from attention); ``None`` = no padding.
            position_ids: int64 ``[1 or b, s_enc]``, the tokens' positions (learned
                positions only); ``None`` = ``0 .. s_enc - 1``.

        Returns:
            The encoder output ``[b, s_enc, hidden]`` (after ``encoder_norm``).

        Raises:
            ValueError: learned positions and ``s_enc > max_position_embeddings``;
                ``position_ids`` with the relative bias.
        """
        h = self._embed(encoder_tokens, 0, position_ids)
        mask = None
        if encoder_padding_mask is not None:
            mask = padding_attention_mask(encoder_padding_mask)
        bias = None
        if self.encoder_relative_bias is not None:
            s = encoder_tokens.shape[1]
            bias = self.encoder_relative_bias(s, s)
        for block in self.encoder_blocks():
            h = block(h, None, mask, None, bias)  # (x, rope, mask, kv_cache, position_bias)
        return self.encoder_norm(h)

    def decode(
        self,
        decoder_tokens: torch.Tensor,
        encoder_output: torch.Tensor,
        encoder_padding_mask: torch.Tensor | None = None,
        decoder_padding_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the decoder and the output head over ``encoder_output``.

        Args:
            decoder_tokens: int64 ``[b, s_dec]`` (the new tokens when a cache is given).
            encoder_output: ``[b, s_enc, hidden]`` from :meth:`encode`.
            encoder_padding_mask: ``[b, s_enc]`` (as in :meth:`encode`), hiding
                padded encoder positions from the cross-attention.
            decoder_padding_mask: ``[b, s_k]`` over the decoder's keys (``s_k =
                s_dec``, or ``cache.length + s_dec`` with a cache), 1 = real, 0 =
                padding; combined with the causal mask.
            kv_cache: a :class:`~epochal.model.generation.kv_cache.KVCache` for
                incremental decoding of the self-attention: ``decoder_tokens``
                continue after the ``cache.length`` cached tokens (positions and
                the relative bias are offset), and the cache is advanced.
            position_ids: int64 ``[1 or b, s_dec]``, the decoder tokens' positions
                (learned positions only); ``None`` = from the cache's length on.

        Returns:
            Logits ``[b, s_dec, padded_vocab_size]``.

        Raises:
            ValueError: learned positions and a sequence longer than
                ``max_position_embeddings``; ``position_ids`` with the relative bias.
        """
        past = 0 if kv_cache is None else kv_cache.length
        s = decoder_tokens.shape[1]
        h = self._embed(decoder_tokens, past, position_ids)
        self_mask = None
        if decoder_padding_mask is not None:
            self_mask = padding_attention_mask(decoder_padding_mask)
        context_mask = None
        if encoder_padding_mask is not None:
            context_mask = padding_attention_mask(encoder_padding_mask)
        bias = None
        if self.decoder_relative_bias is not None:
            bias = self.decoder_relative_bias(s, past + s, offset=past)
        for block in self.decoder_blocks():
            # (x, context, mask, context_mask, kv_cache, position_bias)
            h = block(h, encoder_output, self_mask, context_mask, kv_cache, bias)
        if kv_cache is not None:
            kv_cache.advance(s)
        h = self.decoder_norm(h)
        if self.config.scale_decoder_output:
            h = h * self.config.hidden_size**-0.5
        return self.output(h)

    def forward(
        self,
        encoder_tokens: torch.Tensor,
        decoder_tokens: torch.Tensor,
        encoder_padding_mask: torch.Tensor | None = None,
        decoder_padding_mask: torch.Tensor | None = None,
        encoder_position_ids: torch.Tensor | None = None,
        decoder_position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Encode ``encoder_tokens``, then decode ``decoder_tokens`` (teacher forcing).

        Args:
            encoder_tokens: int64 ``[b, s_enc]``.
            decoder_tokens: int64 ``[b, s_dec]``.
            encoder_padding_mask: ``[b, s_enc]``, 1 = real token, 0 = padding
                (Megatron's ``enc_mask`` as a padding mask); ``None`` = none.
            decoder_padding_mask: ``[b, s_dec]``, likewise for the decoder.
            encoder_position_ids, decoder_position_ids: int64 ``[1 or b, s]``, each
                stack's positions (learned positions only; ``None`` = from 0).

        Returns:
            Decoder logits ``[b, s_dec, padded_vocab_size]``.
        """
        encoder_output = self.encode(encoder_tokens, encoder_padding_mask, encoder_position_ids)
        return self.decode(
            decoder_tokens,
            encoder_output,
            encoder_padding_mask,
            decoder_padding_mask,
            position_ids=decoder_position_ids,
        )
