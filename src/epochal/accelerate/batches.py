"""A transformers batch as epochal's train steps read it, with the transformers model's loss.

``model(**batch)`` receives what the user's collator made (``input_ids``,
``attention_mask``, ``labels`` with -100 where no loss is taken, ...); the
engine splits it into micro-batches and turns each into the keys of epochal's
train steps (:mod:`epochal.train.steps`), so that the step's loss (a token mean
under ``loss_mask``) is the one the transformers model reports:

- **causal** (GPT-2, Llama): ``tokens = input_ids``, ``position_ids`` when the batch
  has them (the model's positions, as transformers uses them); the targets are ``labels``
  (``input_ids`` when the batch has none, as Accelerate's Megatron backend does)
  shifted left by one, the last position without a target, so position ``t``
  predicts label ``t + 1``; ``loss_mask`` is 1 where that label is not -100.
  Padding must be on the right and every position that has a target must be a
  real token (``attention_mask`` 1): then causal attention makes the padding
  invisible, as in transformers. Other paddings raise :class:`BatchError`.
- **masked** (BERT, ESM): ``tokens``, ``padding_mask = attention_mask``, ``types =
  token_type_ids`` (zeros when absent, as transformers), ``labels`` with
  ``loss_mask = labels != -100``; ``next_sentence_label`` becomes the binary head's
  ``is_random``.
- **sequence** / **token** (classifiers, :mod:`epochal.accelerate.heads`): ``tokens``,
  ``padding_mask = attention_mask``, ``types = token_type_ids`` (BERT), ``residue_mask``
  (a sequence classifier: 1 at the position it classifies by: the first token, or for
  GPT-2 / Llama the last one that is not ``pad_token_id``, transformers' rule) and
  ``labels`` (token classifiers: padded with -100; sequence classifiers: int64 for
  single-label classification, float otherwise). Evaluation batches may leave
  ``labels`` out. A causal body needs right padding, as above.
- **megatron** (``MegatronLMDummyDataLoader``'s batches): already epochal's GPT keys
  (``tokens``, ``labels``, ``loss_mask``, ...), split only.
- **seq2seq** (T5): ``text_enc = input_ids``, ``enc_mask = attention_mask``,
  ``text_dec = decoder_input_ids`` or ``labels`` shifted right behind the decoder
  start token (-100 read as the pad id), ``dec_mask = decoder_attention_mask`` (ones
  when absent: transformers masks no decoder position then), ``labels``, ``loss_mask``.

A key a family does not take raises :class:`BatchError` naming it (nothing is
dropped): GPT-2's ``token_type_ids`` (added through its token embedding; epochal's
causal models have no token types), ``position_ids`` of masked and
sequence-to-sequence models, ``token_type_ids`` of a model without token types, and
any key transformers' model does not take.

Under pipeline parallelism every micro-batch is padded to one length (the
pipeline's buffers have one shape), and under sequence parallelism to a multiple
of the tensor-parallel size; padded positions carry no loss and, for encoders,
are masked out of attention (decoders are causal).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["BatchAdapter", "BatchError"]

IGNORE = -100

#: the batch keys each family's transformers models take
_KEYS = {
    "causal": {"input_ids", "labels", "attention_mask", "position_ids"},
    "masked": {"input_ids", "labels", "attention_mask", "token_type_ids", "next_sentence_label"},
    "sequence": {"input_ids", "labels", "attention_mask", "token_type_ids"},
    "token": {"input_ids", "labels", "attention_mask", "token_type_ids"},
    "seq2seq": {
        "input_ids",
        "attention_mask",
        "labels",
        "decoder_input_ids",
        "decoder_attention_mask",
    },
}

#: why a key a model of the family might get cannot be honoured, and what to do
_REFUSED = {
    ("causal", "token_type_ids"): (
        "epochal's causal models have no token-type embeddings (GPT-2 adds token_type_ids "
        "through its token embedding); leave them out of the batch (tokenizer(..., "
        "return_token_type_ids=False) or remove the column)"
    ),
    ("masked", "position_ids"): (
        "the prepared model uses the default positions 0..s-1; leave position_ids out"
    ),
    ("seq2seq", "position_ids"): "T5 has no position_ids (relative attention); leave them out",
    ("sequence", "position_ids"): (
        "the prepared classifier uses the default positions 0..s-1; leave position_ids out"
    ),
    ("token", "position_ids"): (
        "the prepared classifier uses the default positions 0..s-1; leave position_ids out"
    ),
}

#: transformers' ``problem_type`` values (``config.problem_type``)
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


class BatchError(ValueError):
    """A batch the transformers model's loss cannot be reproduced on (the message says why)."""


def _need(batch: Mapping[str, Any], key: str, family: str) -> torch.Tensor:
    value = batch.get(key)
    if not isinstance(value, torch.Tensor):
        raise BatchError(
            f"a {family} model's batch needs a tensor {key!r} (got keys {sorted(batch)})"
        )
    return value


def _pad_right(t: torch.Tensor, length: int, value: float) -> torch.Tensor:
    if t.shape[1] >= length:
        return t
    pad = t.new_full((t.shape[0], length - t.shape[1], *t.shape[2:]), value)
    return torch.cat([t, pad], dim=1)


class BatchAdapter:
    """Turns transformers batches into epochal micro-batches for one model family.

    Args:
        family: ``"causal"``, ``"masked"``, ``"seq2seq"``, ``"sequence"`` or ``"token"``.
        num_microbatches: micro-batches per step (the batch is split evenly).
        uses_token_types: masked models with token-type embeddings.
        fixed_length: pad every micro-batch to this length (pipeline parallelism), or None.
        multiple_of: pad lengths to a multiple of this (sequence parallelism).
        decoder_start_token_id / pad_token_id: T5's decoder inputs from ``labels``.
        classifier: a classifier's options (see the attribute).
    """

    def __init__(
        self,
        family: str,
        *,
        num_microbatches: int,
        uses_token_types: bool = False,
        fixed_length: int | None = None,
        fixed_decoder_length: int | None = None,
        multiple_of: int = 1,
        decoder_start_token_id: int = 0,
        pad_token_id: int = 0,
        classifier: dict[str, Any] | None = None,
    ) -> None:
        self.family = family
        self.num_microbatches = num_microbatches
        self.uses_token_types = uses_token_types
        self.fixed_length = fixed_length
        self.fixed_decoder_length = fixed_decoder_length
        self.multiple_of = multiple_of
        self.decoder_start_token_id = decoder_start_token_id
        self.pad_token_id = pad_token_id
        #: classification models: ``pooling`` ("first" / "last" / "every"), ``causal`` (a
        #: GPT body), ``pad_token_id`` (None allowed), ``hf_config`` (``problem_type``,
        #: ``num_labels``)
        self.classifier = classifier or {}

    # ------------------------------------------------------------------ split
    def split(self, batch: Mapping[str, Any]) -> list[dict[str, torch.Tensor]]:
        """The step's micro-batches (epochal keys) of ``batch``.

        Raises:
            BatchError: missing keys, a batch size not divisible into the micro-batches,
                or a padding the model's loss cannot be reproduced on.
        """
        if not isinstance(batch, Mapping) or not batch:
            raise BatchError("model(**batch) needs keyword tensors (input_ids=..., labels=...)")
        self._check_keys(batch)
        first = _need(batch, "tokens" if self.family == "megatron" else "input_ids", self.family)
        rows = first.shape[0]
        n = self.num_microbatches
        if rows % n:
            raise BatchError(
                f"the batch has {rows} samples, not divisible into {n} micro-batches: pass the "
                "prepared loader's batches to model(**batch)"
            )
        size = rows // n
        if (
            self.classifier.get("pooling") == "last"
            and self.classifier.get("pad_token_id") is None
            and rows != 1
        ):
            raise BatchError(
                "the model's config has no pad_token_id, so the last token of each row cannot "
                "be told from padding (transformers refuses batches of more than one row then): "
                "set model.config.pad_token_id = tokenizer.pad_token_id"
            )
        tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
        for key, value in tensors.items():
            if value.dim() == 0 or value.shape[0] != rows:
                raise BatchError(
                    f"batch[{key!r}] has {tuple(value.shape)[:1] or 'no'} rows, input_ids has {rows}"
                )
        convert = {
            "causal": self._causal,
            "masked": self._masked,
            "seq2seq": self._seq2seq,
            "sequence": self._classify,
            "token": self._classify,
            "megatron": dict,
        }[self.family]
        return [
            convert({k: v[i * size : (i + 1) * size] for k, v in tensors.items()}) for i in range(n)
        ]

    def _check_keys(self, batch: Mapping[str, Any]) -> None:
        if self.family == "megatron":  # epochal's own GPT keys, as the dummy loader yields them
            return
        allowed = _KEYS[self.family]
        for key, value in batch.items():
            if value is None:
                continue
            reason = _REFUSED.get((self.family, key))
            encoder = self.family == "masked" or (
                self.family in ("sequence", "token") and not self.classifier.get("causal")
            )
            if key == "token_type_ids" and encoder and not self.uses_token_types:
                reason = "the model has no token-type embeddings; leave token_type_ids out"
            if key == "token_type_ids" and self.classifier.get("causal"):
                reason = _REFUSED[("causal", key)]
            if reason is None and key not in allowed:
                reason = (
                    f"a {self.family} model takes {sorted(allowed)}; remove the key from the "
                    "batch (e.g. dataset.remove_columns) or compute what it is for separately"
                )
            if reason is not None:
                raise BatchError(f"batch[{key!r}] cannot be used: {reason}")
            if not isinstance(value, torch.Tensor):
                raise BatchError(
                    f"batch[{key!r}] is a {type(value).__name__}, not a tensor: collate it into "
                    "a tensor (transformers.default_data_collator / DataCollatorWithPadding)"
                )

    def _length(self, actual: int, fixed: int | None, what: str) -> int:
        if fixed is not None:
            if actual > fixed:
                raise BatchError(
                    f"a batch's {what} length {actual} exceeds the {fixed} fixed for pipeline "
                    "parallelism (the first batch's, or MegatronLMPlugin.seq_length): set seq_length"
                )
            actual = fixed
        m = self.multiple_of
        return -(-actual // m) * m

    # --------------------------------------------------------------- families
    def _causal(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        tokens = b["input_ids"].long()
        source = b.get("labels", tokens).long()
        targets = torch.full_like(source, IGNORE)
        targets[:, :-1] = source[:, 1:]
        mask = targets != IGNORE
        attention = b.get("attention_mask")
        if attention is not None and not bool(attention.bool().all()):
            real = attention.bool()
            if bool((real[:, 1:] & ~real[:, :-1]).any()):
                raise BatchError(
                    "attention_mask has padding before real tokens (left padding or holes); "
                    "a causal model's batches must be padded on the right (tokenizer.padding_side='right')"
                )
            if bool((mask & ~real).any()):
                raise BatchError(
                    "labels give a target to a padding position (attention_mask 0); set those "
                    "labels to -100 (DataCollatorForLanguageModeling(mlm=False) does)"
                )
        length = self._length(tokens.shape[1], self.fixed_length, "sequence")
        out = {
            "tokens": _pad_right(tokens, length, 0),
            "labels": _pad_right(targets.clamp(min=0), length, 0),
            "loss_mask": _pad_right(mask.float(), length, 0.0),
        }
        if "position_ids" in b:
            positions = b["position_ids"].long()
            if positions.shape != tokens.shape:
                raise BatchError(
                    f"batch['position_ids'] has shape {tuple(positions.shape)}, input_ids "
                    f"{tuple(tokens.shape)}: give one position per token"
                )
            out["position_ids"] = _pad_right(positions, length, 0)
        return out

    def _masked(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        tokens = b["input_ids"].long()
        labels = _need(b, "labels", self.family).long()
        padding = b.get("attention_mask")
        padding = torch.ones_like(tokens) if padding is None else padding.long()
        length = self._length(tokens.shape[1], self.fixed_length, "sequence")
        out = {
            "tokens": _pad_right(tokens, length, 0),
            "labels": _pad_right(labels, length, IGNORE),
            "loss_mask": _pad_right((labels != IGNORE).float(), length, 0.0),
            "padding_mask": _pad_right(padding, length, 0),
        }
        if self.uses_token_types:
            types = b.get("token_type_ids")
            types = torch.zeros_like(tokens) if types is None else types.long()
            out["types"] = _pad_right(types, length, 0)
        if "next_sentence_label" in b:
            out["is_random"] = b["next_sentence_label"].long().reshape(-1)
        return out

    def _seq2seq(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        enc = b["input_ids"].long()
        labels = _need(b, "labels", self.family).long()
        enc_mask = b.get("attention_mask")
        enc_mask = torch.ones_like(enc) if enc_mask is None else enc_mask.long()
        dec = b.get("decoder_input_ids")
        if dec is None:
            dec = torch.full_like(labels, self.decoder_start_token_id)
            dec[:, 1:] = labels[:, :-1].masked_fill(labels[:, :-1] == IGNORE, self.pad_token_id)
        dec_mask = b.get("decoder_attention_mask")
        dec_mask = torch.ones_like(dec) if dec_mask is None else dec_mask.long()
        enc_len = self._length(enc.shape[1], self.fixed_length, "encoder")
        dec_len = self._length(dec.shape[1], self.fixed_decoder_length, "decoder")
        return {
            "text_enc": _pad_right(enc, enc_len, 0),
            "enc_mask": _pad_right(enc_mask, enc_len, 0),
            "text_dec": _pad_right(dec.long(), dec_len, self.pad_token_id),
            "dec_mask": _pad_right(dec_mask, dec_len, 0),
            "labels": _pad_right(labels, dec_len, IGNORE),
            "loss_mask": _pad_right((labels != IGNORE).float(), dec_len, 0.0),
        }

    # -------------------------------------------------------- classification
    @property
    def problem_type(self) -> str | None:
        """transformers' ``config.problem_type`` (None until a labelled batch decided it)."""
        hf = self.classifier.get("hf_config")
        return None if hf is None else getattr(hf, "problem_type", None)

    def decide_problem_type(self, labels: torch.Tensor) -> str:
        """transformers' rule: ``config.problem_type``, or set from ``num_labels`` / the labels' dtype.

        As transformers' models do at their first labelled forward, the decision is
        written into the model's ``config.problem_type`` (``save_pretrained`` keeps it).

        Raises:
            BatchError: a ``problem_type`` transformers does not know.
        """
        hf = self.classifier["hf_config"]
        kind = getattr(hf, "problem_type", None)
        if kind is None:
            n = int(hf.num_labels)
            if n == 1:
                kind = "regression"
            elif labels.dtype in (torch.long, torch.int):
                kind = "single_label_classification"
            else:
                kind = "multi_label_classification"
            hf.problem_type = kind
        if kind not in PROBLEM_TYPES:
            raise BatchError(f"config.problem_type must be one of {PROBLEM_TYPES}, got {kind!r}")
        return kind

    def _pool_positions(self, tokens: torch.Tensor, length: int) -> torch.Tensor:
        """int64 ``[b, length]``: 1 at the position each row is classified by (or 1 everywhere)."""
        pooling = self.classifier.get("pooling", "every")
        rows, s = tokens.shape
        if pooling == "every":
            return torch.ones((rows, length), dtype=torch.long)
        out = torch.zeros((rows, length), dtype=torch.long)
        if pooling == "first":
            out[:, 0] = 1
            return out
        pad = self.classifier.get("pad_token_id")
        if pad is None:  # transformers: the last position (one row only: see split)
            out[:, s - 1] = 1
            return out
        positions = torch.arange(s, device=tokens.device)
        last = (positions * (tokens != pad).long()).argmax(-1)
        out[torch.arange(rows), last.cpu()] = 1
        return out

    def _classify(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        tokens = b["input_ids"].long()
        attention = b.get("attention_mask")
        padding = torch.ones_like(tokens) if attention is None else attention.long()
        if self.classifier.get("causal") and not bool(padding.bool().all()):
            real = padding.bool()
            if bool((real[:, 1:] & ~real[:, :-1]).any()):
                raise BatchError(
                    "attention_mask has padding before real tokens (left padding or holes); "
                    "a causal model's batches must be padded on the right "
                    "(tokenizer.padding_side='right')"
                )
        length = self._length(tokens.shape[1], self.fixed_length, "sequence")
        out = {
            "tokens": _pad_right(tokens, length, 0),
            "padding_mask": _pad_right(padding, length, 0),
            "residue_mask": self._pool_positions(tokens, length).to(tokens.device),
        }
        labels = b.get("labels")
        if self.family == "token":
            if labels is None:
                labels = torch.full_like(tokens, IGNORE)
            if labels.shape != tokens.shape:
                raise BatchError(
                    f"a token classifier's labels have one class per token: shape "
                    f"{tuple(tokens.shape)} like input_ids, got {tuple(labels.shape)}"
                )
            out["labels"] = _pad_right(labels.long(), length, IGNORE)
        else:
            kind = self.problem_type or "single_label_classification"
            if labels is None:
                n = int(self.classifier["hf_config"].num_labels)
                labels = (
                    torch.zeros(tokens.shape[0], dtype=torch.long)
                    if kind == "single_label_classification"
                    else torch.zeros((tokens.shape[0], n))
                )
            out["labels"] = (
                labels.long() if kind == "single_label_classification" else labels.float()
            )
        if self.uses_token_types:
            types = b.get("token_type_ids")
            types = torch.zeros_like(tokens) if types is None else types.long()
            out["types"] = _pad_right(types, length, 0)
        return out
