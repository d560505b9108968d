"""The fine-tuning head and LoRA options of :class:`epochal.model.config.ModelConfig` and their checks."""

from __future__ import annotations

import typing
from typing import Any, Literal

from epochal._checks import check_fields, is_int, require

__all__ = [
    "CLASSIFIER_HEADS",
    "HEADS",
    "HEAD_FIELDS",
    "HEAD_TRANSFORMS",
    "LORA_TARGETS",
    "validate_head",
]

#: Encoder heads: the masked-LM head (pretraining) or a fine-tuning head (:mod:`epochal.model.heads`).
Head = Literal[
    "mlm",
    "sequence_regression",
    "sequence_classification",
    "residue_classification",
    "pooled_classifier",
    "token_classifier",
]
HEADS: tuple[str, ...] = typing.get_args(Head)
#: Hugging Face's classification heads (:class:`epochal.model.heads.ClassifierHead`); GPT models
#: take them too.
CLASSIFIER_HEADS = ("pooled_classifier", "token_classifier")
#: ``head_transform`` values: what a classifier head does before its last linear layer.
HeadTransform = Literal["none", "pooler", "dense_tanh"]
HEAD_TRANSFORMS: tuple[str, ...] = typing.get_args(HeadTransform)
#: ``residue_head`` values: the per-residue head's layers.
ResidueHead = Literal["conv", "linear"]
#: Projections LoRA adapters may wrap (:mod:`epochal.model.lora`).
LORA_TARGETS = ("wq", "wk", "wv", "wo", "fc1", "fc2")
#: Encoder fields of the fine-tuning heads and LoRA (:mod:`epochal.model.heads`).
HEAD_FIELDS = (
    "head",
    "num_labels",
    "head_hidden_size",
    "head_dropout",
    "residue_head",
    "head_transform",
    "head_bias",
    "freeze_encoder",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
)


def validate_head(self: Any) -> None:
    """The rules of the head / LoRA fields of ``ModelConfig`` ``self`` (their ``"head"`` group).

    Raises:
        ConfigError: the first field that breaks one, named.
    """
    check_fields(self, "head")
    minimum = 2 if self.head.endswith("classification") else 1
    require(
        is_int(self.num_labels) and self.num_labels >= minimum,
        "num_labels",
        f"must be an integer >= {minimum} for head={self.head!r}, got {self.num_labels!r}",
    )
    if self.head not in CLASSIFIER_HEADS:
        for name, default in (("head_transform", "none"), ("head_bias", True)):
            require(
                getattr(self, name) == default,
                name,
                f"is an option of the classifier heads {CLASSIFIER_HEADS}, not head={self.head!r}",
            )
    if self.type == "gpt":
        require(
            self.head in ("mlm", *CLASSIFIER_HEADS),
            "head",
            f"a GPT model takes head='mlm' (its language-model output) or one of "
            f"{CLASSIFIER_HEADS}, got {self.head!r}",
        )
        for name in ("freeze_encoder", "lora_rank"):
            require(not getattr(self, name), name, "is an encoder option (model.type 'bert')")
    targets = self.lora_targets
    bad = [t for t in targets if t not in LORA_TARGETS]
    require(
        not bad and bool(targets),
        "lora_target_modules",
        f"must list some of {LORA_TARGETS} (comma-separated), got {self.lora_target_modules!r}",
    )
    require(
        not (self.bert_binary_head and self.head != "mlm"),
        "bert_binary_head",
        f"must be false with a fine-tuning head (head={self.head!r})",
    )
    if self.head == "mlm":
        for name in ("freeze_encoder", "lora_rank"):
            require(
                not getattr(self, name),
                name,
                "needs a fine-tuning head (model.head), not the masked-LM head",
            )
