"""Key/value cache for incremental decoding (used by :mod:`epochal.model.generation.decoding`).

Encoder-decoder models also keep, per decoder layer, the cross-attention keys and
values (:meth:`KVCache.cross_layer`, computed from the encoder output at the first
step) and the encoder's output and mask (:attr:`KVCache.rows`); both follow the
batch rows when beam search reorders them.

A :class:`KVCache` is passed to ``GPTModel.forward(..., kv_cache=cache)``. Each
attention layer appends its new keys and values to its own
:class:`LayerKVCache` slot and attends over everything cached so far; the model
then advances :attr:`KVCache.length` by the number of tokens it just processed.

Layout: per layer, keys and values are stored as ``[b, kv_heads, max_length,
head_dim]`` buffers allocated on the first update, with the dtype, device and
head count of the tensors written. The head count is whatever the attention
module computes, so a tensor-parallel module (column-sharded ``wk``/``wv``)
caches only its own heads; the cache itself knows nothing about parallelism.

Slot ``t`` of the cache holds the token processed ``t``-th (across calls), so
the attention of a query in slot ``t`` may use keys in slots ``<= t`` (the
causal mask is offset by :attr:`KVCache.length`). Padding, per-row positions
and per-row masks are the caller's business (``position_ids`` and
``attention_mask`` of :meth:`GPTModel.forward`).
"""

from __future__ import annotations

import torch

__all__ = ["CrossKVCache", "KVCache", "LayerKVCache"]


class KVCache:
    """Keys and values of every layer for ``max_length`` token slots.

    Args:
        max_length: number of token slots (prompt + generated tokens), >= 1.

    Raises:
        ValueError: if ``max_length < 1``.
    """

    def __init__(self, max_length: int) -> None:
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self.max_length = int(max_length)
        #: number of token slots already filled (the offset of the next token).
        self.length = 0
        self._layers: dict[int, LayerKVCache] = {}
        self._cross: dict[int, CrossKVCache] = {}
        #: tensors that follow the batch rows (an encoder's output and padding mask):
        #: :meth:`reorder` selects their rows too.
        self.rows: dict[str, torch.Tensor] = {}

    def layer(self, layer_id: int) -> LayerKVCache:
        """The slot of layer ``layer_id`` (created on first use)."""
        slot = self._layers.get(layer_id)
        if slot is None:
            slot = self._layers[layer_id] = LayerKVCache(self)
        return slot

    def cross_layer(self, layer_id: int) -> CrossKVCache:
        """The cross-attention slot of layer ``layer_id`` (encoder-decoder models; created on first use)."""
        slot = self._cross.get(layer_id)
        if slot is None:
            slot = self._cross[layer_id] = CrossKVCache()
        return slot

    def advance(self, num_tokens: int) -> None:
        """Mark ``num_tokens`` more slots as filled (called by the model after a forward).

        Raises:
            ValueError: if this would exceed ``max_length``.
        """
        if self.length + num_tokens > self.max_length:
            raise ValueError(
                f"KV cache overflow: {self.length} + {num_tokens} tokens > max_length={self.max_length}"
            )
        self.length += num_tokens

    @torch.no_grad()
    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows in place: row ``i`` becomes old row ``index[i]`` (beam search).

        Args:
            index: int64 ``[b']`` of row indices (``b'`` may differ from ``b``).
        """
        for slot in self._layers.values():
            slot.reorder(index)
        for cross in self._cross.values():
            cross.reorder(index)
        for name, tensor in self.rows.items():
            self.rows[name] = tensor.index_select(0, index.to(tensor.device))


class CrossKVCache:
    """One layer's cross-attention keys and values: computed from the encoder output once.

    ``keys`` / ``values`` are ``[b, kv_heads, s_ctx, head_dim]`` (None until the
    first decoder step); they do not grow and only follow the rows on a reorder.
    """

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (see :meth:`KVCache.reorder`)."""
        if self.keys is None:
            return
        index = index.to(self.keys.device)
        self.keys = self.keys.index_select(0, index)
        self.values = self.values.index_select(0, index)


class LayerKVCache:
    """One layer's keys and values; see :class:`KVCache`."""

    def __init__(self, parent: KVCache) -> None:
        self._parent = parent
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def offset(self) -> int:
        """Number of slots filled before the current forward (the first new token's slot)."""
        return self._parent.length

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new keys/values after the cached ones; return all of them.

        Args:
            k, v: ``[b, kv_heads, s, head_dim]`` for the ``s`` new tokens.

        Returns:
            ``(keys, values)``, each ``[b, kv_heads, offset + s, head_dim]`` (views
            of the cache buffers).

        Raises:
            ValueError: if the tokens do not fit or the shape changed.
        """
        b, heads, s, hd = k.shape
        start = self.offset
        end = start + s
        max_length = self._parent.max_length
        if end > max_length:
            raise ValueError(f"KV cache overflow: {start} + {s} tokens > max_length={max_length}")
        if self.keys is None:
            shape = (b, heads, max_length, hd)
            self.keys = k.new_empty(shape)
            self.values = v.new_empty(shape)
        elif self.keys.shape[:2] != (b, heads) or self.keys.shape[3] != hd:
            raise ValueError(
                f"KV cache holds [b={self.keys.shape[0]}, heads={self.keys.shape[1]}, "
                f"head_dim={self.keys.shape[3]}], got keys of shape {tuple(k.shape)}"
            )
        self.keys[:, :, start:end] = k
        self.values[:, :, start:end] = v
        return self.keys[:, :, :end], self.values[:, :, :end]

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (see :meth:`KVCache.reorder`).

        With an unchanged batch size only the filled slots are copied (beam search
        reorders every step); otherwise the buffers are rebuilt with ``b'`` rows.
        """
        if self.keys is None:
            return
        index = index.to(self.keys.device)
        filled = self._parent.length
        if index.numel() == self.keys.shape[0]:
            self.keys[:, :, :filled] = self.keys[:, :, :filled].index_select(0, index)
            self.values[:, :, :filled] = self.values[:, :, :filled].index_select(0, index)
        else:
            self.keys = self.keys.index_select(0, index)
            self.values = self.values.index_select(0, index)
