"""``BertModel``: a bidirectional encoder with a masked-LM head (BERT, and ESM-2 configured).

One assembly serves ``ModelConfig.type`` ``"bert"`` (Megatron-LM's ``BertModel``
with ``transformer_block_type="pre_ln"``; the original BERT / Hugging Face
``BertForMaskedLM`` / ``BertForPreTraining`` with ``"post_ln"``) and ``"esm"``
(Hugging Face ``EsmForMaskedLM``: rotary positions, pre-LN, no token types,
``token_dropout``). Layers are the GPT model's (:mod:`epochal.model.layers`) with
bidirectional attention.

Structure and parameter names (shared parts named as in :mod:`epochal.model.gpt`,
so the parallel plans and the pipeline-stage convention carry over)::

    tok_embeddings.weight             [padded_vocab, hidden]
    pos_embeddings.weight             [max_positions, hidden]   (learned_absolute only)
    tokentype_embeddings.weight       [num_tokentypes, hidden]  (num_tokentypes > 0)
    embedding_norm.weight / .bias     [hidden]                  (post_ln only; HF embeddings.LayerNorm)
    layers.{i}.*                      as GPTModel's blocks (attention_norm, attention.wq/wk/wv/wo,
                                      ffn_norm, mlp.fc1/fc2); post_ln applies the norms after the
                                      residual sums (:mod:`epochal.model.layers.block`)
    norm.weight / .bias               [hidden]                  (pre_ln only: the final norm)
    lm_head.dense.weight / .bias      [hidden, hidden]          masked-LM transform
    lm_head.norm.weight / .bias       [hidden]
    lm_head.bias                      [padded_vocab]            the decoder's bias
    output.weight                     [padded_vocab, hidden]    the decoder; tied to tok_embeddings
    pooler.dense.weight / .bias       [hidden, hidden]          (bert_binary_head only)
    binary_head.weight / .bias        [2, hidden]               (bert_binary_head only)
    head.*                            a fine-tuning head (config.head != "mlm",
                                      :mod:`epochal.model.heads`), instead of lm_head/output
    layers.{i}.*.lora_a / .lora_b     LoRA adapters (config.lora_rank > 0, :mod:`epochal.model.lora`)

Forward (full model)::

    e = tok_embeddings(tokens) [token_dropout rescaling, ESM] + pos_embeddings(positions)
        + tokentype_embeddings(token_types);  e = embedding_norm(e) (post_ln);
        e = e * padding_mask (ESM, as Hugging Face); dropout (not for ESM, as Hugging Face)
    h = layers(e) with bidirectional attention, padded keys masked;  h = norm(h) (pre_ln)
    mlm_logits = output(lm_head.norm(act(lm_head.dense(h)))) + lm_head.bias
    binary_logits = binary_head(tanh(pooler.dense(h[:, 0])))        (bert_binary_head)
    predictions = head(h, residue_mask)                             (a fine-tuning head)

``act`` is ``config.activation`` (``gelu`` = erf, as BERT and ESM; ``gelu_tanh``
= Megatron's ``--openai-gelu``). Tied embeddings and pipeline stages follow
:mod:`epochal.model.gpt`: on every stage but the first, ``tok_embeddings``,
``pos_embeddings``, ``tokentype_embeddings`` and ``embedding_norm`` are ``None``
(``BertModel.FIRST_STAGE_MODULES``); on every stage but the last, ``norm``,
``lm_head``, ``output``, ``pooler`` and ``binary_head`` are ``None``
(``BertModel.LAST_STAGE_MODULES``); ``forward`` then takes / returns hidden states
``[b, s, hidden]``. ``padding_mask`` must be passed to every stage.

Packed sequences (``forward(..., cu_seqlens=...)``, see
:mod:`epochal.model.layers.packing`): ``tokens`` is one row ``[1, T]`` of
sequences back to back; attention stays within each sequence, positions
(rotary or learned) restart at 0 for each, ESM's token-dropout ratio is taken per
sequence, the binary head pools each sequence's first token, and
``max_position_embeddings`` bounds the longest sequence rather than ``T``. Each
sequence then gets the logits it would get alone in a padded batch (up to float
rounding). ``padding_mask`` (if given) only zeroes ESM's padded embeddings: a
padded tail must be a sequence of its own in ``cu_seqlens``. ``cu_seqlens``
must be passed to every pipeline stage.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from epochal.model.base import TransformerModel
from epochal.model.config import ModelConfig
from epochal.model.heads import build_head
from epochal.model.layers.attention import padding_attention_mask
from epochal.model.layers.block import TransformerBlock
from epochal.model.layers.embedding import Embedding
from epochal.model.layers.norms import build_norm
from epochal.model.layers.packing import PackedSequences
from epochal.model.lora import apply_lora, trainable

__all__ = ["BertModel", "BertLMHead", "BertPooler", "ESM_MASK_RATIO_TRAIN"]

#: The masking ratio ESM was trained with (15% selected x 80% replaced by the mask);
#: Hugging Face ``EsmEmbeddings`` hard-codes it for ``token_dropout``.
ESM_MASK_RATIO_TRAIN = 0.15 * 0.8


class BertLMHead(nn.Module):
    """The masked-LM transform ``norm(act(dense(h)))`` and the decoder's ``bias``.

    The decoder matrix itself is the model's ``output`` (tied to the word
    embeddings like GPT's head), so vocabulary-parallel plans treat it alike.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = build_norm(config)
        self.bias = nn.Parameter(torch.empty(config.padded_vocab_size))
        self.approximate = "tanh" if config.activation == "gelu_tanh" else "none"

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``[..., hidden] -> [..., hidden]`` (the transform; add :attr:`bias` after the decoder)."""
        return self.norm(F.gelu(self.dense(h), approximate=self.approximate))

    def add_bias(self, logits: torch.Tensor) -> torch.Tensor:
        """The decoder's logits ``[..., V]`` plus :attr:`bias` (a seam: a parallel plan may
        replace it, e.g. to sum the bias gradient in fixed chunks)."""
        return logits + self.bias


class BertPooler(nn.Module):
    """``tanh(dense(h[:, 0]))``: the first ([CLS]) token's pooled representation ``[b, hidden]``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, h: torch.Tensor, first_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """``[b, s, hidden] -> [b, hidden]``.

        ``first_tokens`` (packed sequences, ``b == 1``): int64 ``[n]``, where each
        sequence starts; the result is then ``[n, hidden]``, one row per sequence.
        """
        first = h[:, 0] if first_tokens is None else h[0, first_tokens]
        return torch.tanh(self.dense(first))


class BertModel(TransformerModel):
    """BERT / ESM encoder with the masked-LM head and the optional binary head.

    Args:
        config: the model's hyper-parameters (``type`` ``"bert"`` or ``"esm"``).
        seed: initialization seed (see :class:`~epochal.model.base.TransformerModel`).

    Raises:
        ValueError: ``config.type`` is not an encoder type.
    """

    EMBEDDING_MODULES = ("tok_embeddings", "pos_embeddings", "tokentype_embeddings")
    FIRST_STAGE_MODULES = (
        "tok_embeddings",
        "pos_embeddings",
        "tokentype_embeddings",
        "embedding_norm",
    )
    LAST_STAGE_MODULES = ("norm", "lm_head", "output", "pooler", "binary_head", "head")

    def __init__(self, config: ModelConfig, *, seed: int = 0) -> None:
        if not config.is_encoder:
            raise ValueError(
                f"BertModel needs model.type 'bert' or 'esm', got {config.type!r} (use build_model)"
            )
        super().__init__(config, seed=seed)

    def _build(self, config: ModelConfig) -> None:
        h = config.hidden_size
        post_ln = config.transformer_block_type == "post_ln"
        self.tok_embeddings: nn.Embedding | None = Embedding(config.padded_vocab_size, h)
        self.pos_embeddings: nn.Embedding | None = None
        if config.position_embedding_type == "learned_absolute":
            self.pos_embeddings = Embedding(config.max_position_embeddings, h)
        self.tokentype_embeddings: nn.Embedding | None = None
        if config.num_tokentypes > 0:
            self.tokentype_embeddings = Embedding(config.num_tokentypes, h)
        self.embedding_norm: nn.Module | None = build_norm(config) if post_ln else None
        esm = config.type == "esm"
        self.embedding_dropout = nn.Dropout(0.0 if esm else config.hidden_dropout)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(config, i) for i in range(config.num_layers)}
        )
        self.norm: nn.Module | None = None if post_ln else build_norm(config)
        self.head: nn.Module | None = build_head(config)
        mlm = self.head is None
        self.lm_head: BertLMHead | None = BertLMHead(config) if mlm else None
        self.output: nn.Linear | None = (
            nn.Linear(h, config.padded_vocab_size, bias=False) if mlm else None
        )
        self.pooler: BertPooler | None = None
        self.binary_head: nn.Linear | None = None
        if config.bert_binary_head:
            self.pooler = BertPooler(config)
            self.binary_head = nn.Linear(h, 2)
        if config.lora_rank > 0:
            apply_lora(self.layers, config)
        self.apply_trainable()
        self._register_rope()
        self.tie_weights()

    def apply_trainable(self) -> None:
        """Set ``requires_grad`` per :func:`epochal.model.lora.trainable` (frozen encoder, LoRA).

        Called after building and again by plans that re-create parameters (tensor parallelism).
        """
        if self.config.head == "mlm":
            return
        for name, param in self.named_parameters():
            param.requires_grad_(trainable(name, self.config))

    # ------------------------------------------------------------------- forward
    def embed(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor,
        token_types: torch.Tensor | None,
        padding_mask: torch.Tensor | None,
        packed: PackedSequences | None = None,
        mask_ratio: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The embedding stage: token ids ``[b, s]`` -> ``[b, s, hidden]`` (see the module docstring).

        ``packed``: ``tokens`` is a packed row ``[1, T]``; ESM's token dropout then
        counts masks per sequence. ``mask_ratio``: ESM's token dropout's ratios
        ``[b, s]`` (:meth:`mask_ratio_of`; None: counted from ``tokens``).

        Raises:
            ValueError: ``token_types`` given to a model without a token-type table.
        """
        c = self.config
        h = self.tok_embeddings(tokens)
        if c.token_dropout:
            h = h.masked_fill((tokens == c.mask_token_id).unsqueeze(-1), 0.0)
            if mask_ratio is None:
                mask_ratio = self.mask_ratio_of(tokens, padding_mask, packed)
            h = (h * (1 - ESM_MASK_RATIO_TRAIN) / (1 - mask_ratio)[:, :, None]).to(h.dtype)
        if self.pos_embeddings is not None:
            h = h + self.pos_embeddings(position_ids)
        if self.tokentype_embeddings is not None:
            if token_types is None:
                token_types = torch.zeros_like(tokens)
            h = h + self.tokentype_embeddings(token_types)
        elif token_types is not None:
            raise ValueError(
                "token_types given, but the model has no token types (num_tokentypes=0)"
            )
        if self.embedding_norm is not None:
            h = self.embedding_norm(h)
        if c.type == "esm" and padding_mask is not None:
            h = (h * padding_mask.unsqueeze(-1)).to(h.dtype)
        return self.embedding_dropout(h)

    def mask_ratio_of(
        self,
        tokens: torch.Tensor,
        padding_mask: torch.Tensor | None = None,
        packed: PackedSequences | None = None,
    ) -> torch.Tensor:
        """ESM's token dropout: each token's sequence's ratio of ``<mask>`` tokens, float ``[b, s]``.

        The ratio is the sequence's mask count over its length (its real tokens under
        ``padding_mask``; each sequence of a ``packed`` row ``[1, T]``). A caller that
        gives the model a slice of every sequence (context parallelism) computes the
        ratios on the whole sequences and passes its slice as ``mask_ratio``.
        """
        is_mask = tokens == self.config.mask_token_id
        if packed is not None:  # per sequence: [n] ratios, then one per token [1, T]
            lengths = torch.tensor(packed.lengths, device=tokens.device)
            observed = packed.segment_sum(is_mask[0].long()).float() / lengths
            return observed[packed.document_ids()].unsqueeze(0)
        if padding_mask is not None:
            lengths = padding_mask.sum(-1)
        else:
            lengths = torch.full_like(tokens[:, 0], tokens.shape[1])
        return (is_mask.sum(-1).float() / lengths)[:, None].expand(tokens.shape)

    def forward(
        self,
        tokens: torch.Tensor,
        token_types: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        residue_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mask_ratio: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run the (stage of the) encoder.

        Args:
            tokens: int64 token ids ``[b, s]`` when ``tok_embeddings`` is present,
                else hidden states ``[b, s, hidden]`` from the previous stage.
            token_types: int64 ``[b, s]`` segment ids in ``[0, num_tokentypes)``
                (Megatron's ``types``); default zeros. Only for models with token types.
            padding_mask: ``[b, s]``, 1/True = real token, 0/False = padding
                (Megatron's ``padding_mask``); padded keys are masked out of
                attention. ``None`` = no padding. Every sequence needs a real token.
            position_ids: int64 ``[b or 1, s]``; default ``0..s-1`` (packed: each
                token's position within its sequence).
            cu_seqlens: packed sequences: integer ``[n + 1]``, the cumulative
                sequence lengths of the row ``tokens`` ``[1, T]`` (``0, l_0, l_0 + l_1,
                ..., T``); see the module docstring. ``None`` = a padded batch.
            residue_mask: ``[b, s]``, 1 = a residue (not ``<cls>``/``<eos>``/padding):
                the positions a sequence head averages over (default: ``padding_mask``,
                or every position). Only the last stage's head uses it.
            attention_mask: optional bool ``[b or 1, 1, s or 1, s_k]``, True = masked
                out: replaces the attention mask ``padding_mask`` gives (which then
                only zeroes ESM's padded embeddings), e.g. a document mask; not with
                ``cu_seqlens``. Context parallelism passes packed rows this way.
            mask_ratio: ESM's token dropout only: float ``[b, s]``, each token's
                sequence's ratio of ``<mask>`` tokens (:meth:`mask_ratio_of`); default
                counted from ``tokens``. For a caller whose ``tokens`` are a slice of
                each sequence (context parallelism), as ``position_ids`` are.

        Returns:
            MLM logits ``[b, s, padded_vocab_size]``; with ``bert_binary_head``
            the pair ``(mlm_logits, binary_logits [b, 2])`` (packed: ``[n, 2]``, one
            row per sequence); with a fine-tuning head its predictions (``[b, num_labels]``
            or ``[b, s, num_labels]``; packed: ``[n, num_labels]``, one row per
            sequence, or ``[1, T, num_labels]``). Hidden states ``[b, s, hidden]`` on a
            stage without ``output`` or ``head``.

        Raises:
            ValueError: a sequence longer than ``max_position_embeddings``,
                ``token_types`` without a token-type table, or packed sequences
                with a batch dimension other than 1 or a ``cu_seqlens`` that does not
                cover the row (:meth:`PackedSequences.from_cu_seqlens`), or packed
                sequences with the convolutional residue head.
        """
        h = self.encode(
            tokens, token_types, padding_mask, position_ids, cu_seqlens, attention_mask, mask_ratio
        )
        if self.head is not None:
            if residue_mask is None:
                residue_mask = (
                    padding_mask if padding_mask is not None else torch.ones_like(h[..., 0])
                )
            if cu_seqlens is None:
                return self.head(h, residue_mask)
            return self.head(h, residue_mask, cu_seqlens=cu_seqlens)
        if self.output is None:
            return h
        logits = self.lm_head.add_bias(self.output(self.lm_head(h)))
        if self.binary_head is None:
            return logits
        if cu_seqlens is None:
            return logits, self.binary_head(self.pooler(h))
        # the whole row (under sequence parallelism ``h`` is this rank's shard of it)
        starts = PackedSequences.from_cu_seqlens(
            cu_seqlens.to(h.device), total=tokens.shape[1]
        ).starts()
        return logits, self.binary_head(self.pooler(h, first_tokens=starts))

    def encode(
        self,
        tokens: torch.Tensor,
        token_types: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mask_ratio: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The (stage's) last hidden states ``[b, s, hidden]``, after the final norm (pre-LN).

        Arguments as :meth:`forward`; on the whole model these are the hidden states
        embeddings are read from (Hugging Face's ``last_hidden_state``).
        """
        s = tokens.shape[1]
        packed = None
        if cu_seqlens is not None:
            if tokens.shape[0] != 1:
                raise ValueError(
                    f"packed sequences (cu_seqlens) need one row [1, T], got batch {tokens.shape[0]}"
                )
            if attention_mask is not None:
                raise ValueError("packed sequences (cu_seqlens) take no attention_mask")
            packed = PackedSequences.from_cu_seqlens(cu_seqlens.to(tokens.device), total=s)
            s = packed.max_seqlen
        if position_ids is None and s > self.config.max_position_embeddings:
            # given position ids (context parallelism's chunks of a packed row) are the
            # caller's: the row's local length is then no sequence length
            raise ValueError(
                f"sequence length {s} exceeds max_position_embeddings="
                f"{self.config.max_position_embeddings}"
            )
        if position_ids is None:
            if packed is not None:
                position_ids = packed.position_ids()
            else:
                position_ids = torch.arange(s, device=tokens.device).unsqueeze(0)
        if self.tok_embeddings is not None:
            h = self.embed(tokens, position_ids, token_types, padding_mask, packed, mask_ratio)
        else:
            h = tokens
        rope = None
        if self.rope_cos is not None:
            rope = (self.rope_cos[position_ids], self.rope_sin[position_ids])
        if packed is not None:
            for layer in self.layers.values():
                h = layer(h, rope, None, packed=packed)
        else:
            mask = attention_mask
            if mask is None and padding_mask is not None:
                mask = padding_attention_mask(padding_mask)
            for layer in self.layers.values():
                h = layer(h, rope, mask)
        if self.norm is not None:
            h = self.norm(h)
        return h
