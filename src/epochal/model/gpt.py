"""``GPTModel``: a decoder-only transformer whose parallelism is applied from outside.

Structure and parameter names (stable; the parallel plans, the checkpoint
converters and the checkpoints use them)::

    tok_embeddings.weight             [padded_vocab, hidden]       nn.Embedding
    pos_embeddings.weight             [max_positions, hidden]      (learned_absolute only)
    layers.{i}.attention_norm.weight  [hidden]   (+ .bias with LayerNorm)
    layers.{i}.attention.wq.weight    [heads * head_dim, hidden]   (+ .bias if qkv_bias)
    layers.{i}.attention.wk.weight    [groups * head_dim, hidden]  (+ .bias if qkv_bias)
    layers.{i}.attention.wv.weight    [groups * head_dim, hidden]  (+ .bias if qkv_bias)
    layers.{i}.attention.wo.weight    [hidden, heads * head_dim]   (+ .bias if add_bias_linear)
    layers.{i}.attention.q_layernorm.weight / .k_layernorm.weight
                                      [head_dim]  (qk_layernorm only; + .bias with LayerNorm)
    layers.{i}.ffn_norm.weight        [hidden]   (+ .bias with LayerNorm)
    layers.{i}.mlp.fc1.weight / .fc2.weight          (gelu, gelu_tanh)
    layers.{i}.mlp.w1 / .w3 / .w2 (gate, up, down)   (swiglu)   (+ biases if add_bias_linear)
    norm.weight                       [hidden]   (+ .bias with LayerNorm)
    output.weight                     [padded_vocab, hidden]       nn.Linear, no bias
    head.*                            a classifier head instead of ``output`` (``config.head``
                                      ``"pooled_classifier"`` / ``"token_classifier"``,
                                      :class:`~epochal.model.heads.ClassifierHead`; last stage)

``layers`` is an ``nn.ModuleDict`` keyed ``"0" .. "L-1"``; a pipeline stage deletes
the keys it does not own (names stay global).

Tied embeddings (``untie_embeddings_and_output_weights=False``, the default):
``output.weight`` IS ``tok_embeddings.weight`` (one ``nn.Parameter`` registered
under both modules, set by :meth:`GPTModel.tie_weights`). ``state_dict()`` then
holds both keys with the same tensor; ``named_parameters()`` lists it once as
``tok_embeddings.weight``. After a pipeline split the first stage keeps it as
``tok_embeddings.weight`` and the last as ``output.weight``; both start equal
(:mod:`epochal.model.init` draws the same values for both names) and the
pipeline layer must sum their gradients (Megatron's embedding group).
``Module.to_empty`` unties them; :meth:`init_weights` re-ties.

Pipeline stages (torchtitan's pattern): set ``tok_embeddings`` / ``pos_embeddings``
to ``None`` on every stage but the first and ``norm`` / ``output`` to ``None`` on
every stage but the last (``GPTModel.FIRST_STAGE_MODULES`` /
``LAST_STAGE_MODULES``); ``forward`` then takes / returns hidden states
``[b, s, hidden]`` instead of token ids / logits.

Buffers: ``rope_cos`` / ``rope_sin`` (``[max_position_embeddings, rotary_dim]``,
RoPE only, the config's ``rope_scaling_*`` applied; KV-cache decoding and every
pipeline stage index these same tables) on the model and
``layers.{i}.attention.alibi_slopes`` (ALiBi only) are non-persistent (not in
checkpoints), so every stage has them. They follow ``.to(device)``; after
``to_empty`` (meta-device construction) call :meth:`init_buffers`
(``init_weights`` does it).

The model returns logits; the loss is computed outside (the trainer; a
vocabulary-parallel loss under tensor parallelism).

Incremental decoding (:mod:`epochal.model.generation.decoding`): ``forward(tokens,
kv_cache=cache)`` with a :class:`~epochal.model.kv_cache.KVCache` processes the
new ``tokens`` after the ``cache.length`` tokens already cached (default
positions continue from there) and advances the cache; ``logits_to_keep=n``
runs the final norm and head on the last ``n`` positions only.
"""

from __future__ import annotations

import torch
from torch import nn

from epochal.model.base import TransformerModel
from epochal.model.config import ModelConfig
from epochal.model.generation.kv_cache import KVCache
from epochal.model.heads import build_head
from epochal.model.layers.block import TransformerBlock
from epochal.model.layers.embedding import Embedding
from epochal.model.layers.norms import build_norm

__all__ = ["GPTModel"]


class GPTModel(TransformerModel):
    """GPT decoder: embeddings -> blocks -> final norm -> output head.

    Args:
        config: the model's hyper-parameters (``type="gpt"``).
        seed: initialization seed (see :class:`~epochal.model.base.TransformerModel`).

    Raises:
        ValueError: ``config.type`` is not ``"gpt"``.
    """

    LAST_STAGE_MODULES = ("norm", "output", "head")

    def __init__(self, config: ModelConfig, *, seed: int = 0) -> None:
        if config.type != "gpt":
            raise ValueError(
                f"GPTModel needs model.type='gpt', got {config.type!r} (use build_model)"
            )
        super().__init__(config, seed=seed)

    def _build(self, config: ModelConfig) -> None:
        h = config.hidden_size
        self.tok_embeddings: nn.Embedding | None = Embedding(config.padded_vocab_size, h)
        self.pos_embeddings: nn.Embedding | None = None
        if config.position_embedding_type == "learned_absolute":
            self.pos_embeddings = Embedding(config.max_position_embeddings, h)
        self.embedding_dropout = nn.Dropout(config.hidden_dropout)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(config, i) for i in range(config.num_layers)}
        )
        self.norm: nn.Module | None = build_norm(config)
        #: a classifier head (``config.head``, :class:`~epochal.model.heads.ClassifierHead`)
        self.head: nn.Module | None = build_head(config)
        self.output: nn.Linear | None = (
            nn.Linear(h, config.padded_vocab_size, bias=False) if self.head is None else None
        )
        self._register_rope()
        self.tie_weights()

    # ------------------------------------------------------------------- forward
    def forward(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        logits_to_keep: int | None = None,
        residue_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the (stage of the) model.

        Args:
            tokens: int64 token ids ``[b, s]`` when ``tok_embeddings`` is present,
                else hidden states ``[b, s, hidden]`` from the previous stage.
            position_ids: int64 ``[b, s]`` or ``[1, s]``; default ``0..s-1``
                (Megatron's ``reset_position_ids`` passes per-document positions).
            attention_mask: optional bool ``[b or 1, 1, s, s]``, True = masked
                out (Megatron's convention, e.g. ``reset_attention_mask``);
                the causal mask is always applied as well. With a cache the
                mask is ``[b or 1, 1, s, cache.length + s]`` (over all keys).
            kv_cache: a :class:`~epochal.model.kv_cache.KVCache` for incremental
                decoding: keys/values of ``tokens`` are appended to it, attention
                covers the cached tokens too, default positions start at
                ``cache.length``, and the cache is advanced by ``s``.
            logits_to_keep: if set, only the last ``logits_to_keep`` positions go
                through the final norm and output head (the output then has
                that many positions); ignored on stages without ``output``.
            residue_mask: a classifier head's positions ``[b, s]`` (``"pooled_classifier"``:
                1 at the one position each sequence is classified by); default every position.

        Returns:
            Logits ``[b, s, padded_vocab_size]`` (dtype of the output layer, e.g.
            bf16 under autocast) when ``output`` is present; a classifier head's logits
            (``[b, num_labels]`` or ``[b, s, num_labels]``); else hidden states
            ``[b, s, hidden]``.

        Raises:
            ValueError: if the sequence (cached tokens included) is longer than
                ``max_position_embeddings``.
        """
        s = tokens.shape[1]
        past = 0 if kv_cache is None else kv_cache.length
        if past + s > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {past + s} exceeds max_position_embeddings={self.config.max_position_embeddings}"
            )
        if position_ids is None:
            position_ids = torch.arange(past, past + s, device=tokens.device).unsqueeze(0)
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                h = h + self.pos_embeddings(position_ids)
            h = self.embedding_dropout(h)
        else:
            h = tokens
        rope = None
        if self.rope_cos is not None:
            rope = (self.rope_cos[position_ids], self.rope_sin[position_ids])
        for layer in self.layers.values():
            if kv_cache is None:
                h = layer(h, rope, attention_mask)
            else:
                h = layer(h, rope, attention_mask, kv_cache=kv_cache)
        if kv_cache is not None:
            kv_cache.advance(s)
        if logits_to_keep is not None and self.output is not None:
            h = h[:, -logits_to_keep:]
        if self.norm is not None:
            h = self.norm(h)
        if self.head is not None:
            return self.head(
                h, torch.ones_like(h[..., 0]) if residue_mask is None else residue_mask
            )
        if self.output is not None:
            h = self.output(h)
        return h
