"""The models' embedding tables: ``nn.Embedding`` without its default initialisation on the meta device.

Every epochal model initialises its weights itself (:meth:`~epochal.model.base.TransformerModel.init_weights`),
so ``nn.Embedding``'s own ``normal_`` is overwritten anyway. On the meta device (the
parallel engine and the run checks build models there) it writes nothing, and its meta
implementation imports TorchDynamo, about two seconds of CPU in every process that
builds a model that way; :class:`Embedding` skips it there. Elsewhere, and in its names,
shapes and state-dict keys, it is ``nn.Embedding``.
"""

from __future__ import annotations

from torch import nn

__all__ = ["Embedding"]


class Embedding(nn.Embedding):
    """``nn.Embedding(num_embeddings, embedding_dim, ...)``; ``weight``: ``[num_embeddings, embedding_dim]``."""

    def reset_parameters(self) -> None:
        """``nn.Embedding.reset_parameters``, except on the meta device (no values to write)."""
        if self.weight.is_meta:
            return
        super().reset_parameters()
