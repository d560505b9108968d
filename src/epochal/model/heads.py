"""Fine-tuning heads of the encoders (BERT, ESM), as BioNeMo's ESM-2 fine-tuning models.

``ModelConfig.head`` picks one; :class:`~epochal.model.BertModel` then builds it as
``head`` in place of the masked-LM head (``lm_head`` / ``output``):

- ``"sequence_regression"`` / ``"sequence_classification"``: :class:`SequenceHead`,
  BioNeMo's ``ESM2FineTuneSeqModel``: the last hidden states averaged over the
  residues (:func:`mean_over_residues`: ``<cls>``, ``<eos>`` and padding excluded),
  then ``MegatronMLPHead``: ``Linear(hidden, 256) -> ReLU -> Dropout(0.25) ->
  Linear(256, num_labels)``. Output ``[b, num_labels]`` (regression values or
  class logits).
- ``"residue_classification"``: :class:`ResidueHead`, per token ``[b, s, num_labels]``:
  ``residue_head = "conv"`` is BioNeMo's ``MegatronConvNetHead`` (``Conv2d(hidden,
  32, (7, 1), padding (3, 0)) -> ReLU -> Dropout(0.25) -> Conv2d(32, num_labels,
  (7, 1), padding (3, 0))`` over ``[b, hidden, s, 1]``: two 7-wide convolutions
  along the sequence); ``"linear"`` is ``Dropout -> Linear(hidden, num_labels)``.
  BioNeMo convolves over every position, padding included, and so does this head
  (its outputs at residues next to padding therefore see the padded positions'
  hidden states; only valid positions enter the loss).

Packed sequences (``cu_seqlens``, one row ``[1, T, h]`` of proteins back to back):
the sequence head averages each protein over its own residues (``[n, num_labels]``),
the linear residue head is per token anyway; the convolutional one refuses them
(it would read the neighbouring protein where the padded run reads padding).

Parameter names (``head.*``) are what a pretrained encoder checkpoint lacks: a
fine-tuning run initialised from one starts them fresh.
"""

from __future__ import annotations

import torch
from torch import nn

from epochal.model.config import ModelConfig
from epochal.model.layers.packing import PackedSequences

__all__ = [
    "ClassifierHead",
    "ResidueHead",
    "SequenceHead",
    "build_head",
    "mean_over_residues",
]

#: BioNeMo's widths: the sequence MLP's hidden layer and the convolution's channels.
SEQUENCE_HIDDEN = 256
CONV_CHANNELS = 32


def mean_over_residues(
    hidden: torch.Tensor, residue_mask: torch.Tensor, cu_seqlens: torch.Tensor | None = None
) -> torch.Tensor:
    """Average ``hidden`` ``[b, s, h]`` over the positions where ``residue_mask`` ``[b, s]`` is set.

    Args:
        hidden: ``[b, s, h]``; packed sequences: one row ``[1, T, h]``.
        residue_mask: ``[b, s]`` (packed ``[1, T]``), 1 = a residue.
        cu_seqlens: packed sequences' boundaries (int ``[n + 1]``), or None.

    Returns:
        ``[b, h]`` (packed: ``[n, h]``, one per sequence) in ``hidden``'s dtype (a
        sequence without residues gives zeros).
    """
    mask = residue_mask.to(hidden.dtype).unsqueeze(-1)
    if cu_seqlens is None:
        count = mask.sum(1).clamp(min=1.0)
        return (hidden * mask).sum(1) / count
    packed = PackedSequences.from_cu_seqlens(cu_seqlens.to(hidden.device), total=hidden.shape[1])
    count = packed.segment_sum(mask[0]).clamp(min=1.0)
    return packed.segment_sum((hidden * mask)[0]) / count


class SequenceHead(nn.Module):
    """BioNeMo's ``MegatronMLPHead`` on the residue mean: ``[b, s, h] -> [b, num_labels]``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        width = config.head_hidden_size or SEQUENCE_HIDDEN
        self.fc1 = nn.Linear(config.hidden_size, width)
        self.fc2 = nn.Linear(width, config.num_labels)
        self.dropout = nn.Dropout(config.head_dropout)

    def forward(
        self,
        hidden: torch.Tensor,
        residue_mask: torch.Tensor,
        cu_seqlens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Predictions ``[b, num_labels]`` of hidden states ``[b, s, h]`` (``residue_mask`` ``[b, s]``).

        Packed sequences (``cu_seqlens``, hidden ``[1, T, h]``): ``[n, num_labels]``,
        each sequence averaged over its own residues.
        """
        pooled = mean_over_residues(hidden, residue_mask, cu_seqlens)
        return self.fc2(self.dropout(torch.relu(self.fc1(pooled))))


class ResidueHead(nn.Module):
    """Per-residue logits ``[b, s, num_labels]``: BioNeMo's convolutional head or a linear one."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.kind = config.residue_head
        self.dropout = nn.Dropout(config.head_dropout)
        if self.kind == "conv":
            width = config.head_hidden_size or CONV_CHANNELS
            self.conv1 = nn.Conv2d(config.hidden_size, width, kernel_size=(7, 1), padding=(3, 0))
            self.conv2 = nn.Conv2d(width, config.num_labels, kernel_size=(7, 1), padding=(3, 0))
        else:
            self.linear = nn.Linear(config.hidden_size, config.num_labels)

    def forward(
        self,
        hidden: torch.Tensor,
        residue_mask: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``[b, s, num_labels]`` of hidden states ``[b, s, h]`` (the mask is not used).

        Packed sequences (``cu_seqlens``, ``[1, T, h]``) need the linear head: the
        convolution reads a protein's padded neighbours, which a packed row lacks.

        Raises:
            ValueError: packed sequences with the convolutional head.
        """
        if self.kind == "linear":
            return self.linear(self.dropout(hidden))
        if cu_seqlens is not None:
            raise ValueError(
                "the convolutional residue head (residue_head='conv') cannot run on packed "
                "sequences; use residue_head='linear' or unpacked batches"
            )
        x = hidden.permute(0, 2, 1).unsqueeze(-1)  # [b, h, s, 1]
        x = self.dropout(torch.relu(self.conv1(x)))
        return self.conv2(x).squeeze(-1).permute(0, 2, 1)


class ClassifierHead(nn.Module):
    """Hugging Face's classification heads: ``*ForSequenceClassification`` / ``*ForTokenClassification``.

    ``head="pooled_classifier"`` picks one position per sequence: the hidden states
    averaged over ``residue_mask`` ``[b, s]``, which the caller sets at that one
    position (BERT / ESM: the first token; GPT-2 / Llama: the last non-padding
    token), so the average is that position's hidden state exactly; output
    ``[b, num_labels]``. ``head="token_classifier"`` classifies every position:
    ``[b, s, num_labels]``. Before the classifier ``out`` (``Linear(hidden,
    num_labels)``, bias per ``head_bias``), ``head_transform`` does what the
    transformers class does:

    - ``"none"``: ``out(dropout(x))`` (BERT / GPT-2 / ESM token classification; GPT-2 /
      Llama sequence classification with ``head_dropout=0``);
    - ``"pooler"``: ``out(dropout(tanh(dense(x))))`` (BERT's pooler, then its classifier);
    - ``"dense_tanh"``: ``out(dropout(tanh(dense(dropout(x)))))`` (ESM's classification head).

    Parameters: ``dense.*`` ``[hidden, hidden]`` (with a transform), ``out.*``.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.pooled = config.head == "pooled_classifier"
        self.transform = config.head_transform
        self.dropout = nn.Dropout(config.head_dropout)
        self.dense = nn.Linear(h, h) if self.transform != "none" else None
        self.out = nn.Linear(h, config.num_labels, bias=config.head_bias)

    def forward(
        self,
        hidden: torch.Tensor,
        residue_mask: torch.Tensor,
        cu_seqlens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``[b, num_labels]`` (pooled) or ``[b, s, num_labels]`` of ``hidden`` ``[b, s, h]``."""
        x = mean_over_residues(hidden, residue_mask, cu_seqlens) if self.pooled else hidden
        if self.transform == "pooler":
            x = self.dropout(torch.tanh(self.dense(x)))
        elif self.transform == "dense_tanh":
            x = self.dropout(torch.tanh(self.dense(self.dropout(x))))
        else:
            x = self.dropout(x)
        return self.out(x)


def build_head(config: ModelConfig) -> nn.Module | None:
    """The fine-tuning head ``config.head`` names, or None for the masked-LM head."""
    if config.head == "mlm":
        return None
    if config.head in ("pooled_classifier", "token_classifier"):
        return ClassifierHead(config)
    if config.head == "residue_classification":
        return ResidueHead(config)
    return SequenceHead(config)
