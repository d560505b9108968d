"""The fine-tuning head and LoRA options of :class:`epochal.model.config.ModelConfig` and their checks."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = [
    "CLASSIFIER_HEADS",
    "HEADS",
    "HEAD_FIELDS",
    "HEAD_TRANSFORMS",
    "LORA_TARGETS",
    "validate_head",
]

#: Encoder heads: the masked-LM head (pretraining) or a fine-tuning head (:mod:`epochal.model.heads`).
HEADS = (
    "mlm",
    "sequence_regression",
    "sequence_classification",
    "residue_classification",
    "pooled_classifier",
    "token_classifier",
)
#: Hugging Face's classification heads (:class:`epochal.model.heads.ClassifierHead`); GPT models
#: take them too.
CLASSIFIER_HEADS = ("pooled_classifier", "token_classifier")
#: ``head_transform`` values: what a classifier head does before its last linear layer.
HEAD_TRANSFORMS = ("none", "pooler", "dense_tanh")
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


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def validate_head(self: Any, _require: Callable[[bool, str, str], None]) -> None:
    """Check the head / LoRA fields of ``ModelConfig`` ``self`` (``_require(cond, option, message)`` raises)."""
    _require(self.head in HEADS, "head", f"must be one of {HEADS}, got {self.head!r}")
    minimum = 2 if self.head.endswith("classification") else 1
    _require(
        isinstance(self.num_labels, int) and self.num_labels >= minimum,
        "num_labels",
        f"must be an integer >= {minimum} for head={self.head!r}, got {self.num_labels!r}",
    )
    h = self.head_hidden_size
    _require(h is None or h >= 1, "head_hidden_size", f"must be None or >= 1, got {h!r}")
    for name in ("head_dropout", "lora_dropout"):
        v = getattr(self, name)
        _require(_is_real(v) and 0 <= v < 1, name, f"must be in [0, 1), got {v!r}")
    _require(
        self.residue_head in ("conv", "linear"),
        "residue_head",
        f"must be 'conv' or 'linear', got {self.residue_head!r}",
    )
    _require(
        self.head_transform in HEAD_TRANSFORMS,
        "head_transform",
        f"must be one of {HEAD_TRANSFORMS}, got {self.head_transform!r}",
    )
    _require(isinstance(self.head_bias, bool), "head_bias", "must be true or false")
    if self.head not in CLASSIFIER_HEADS:
        for name, default in (("head_transform", "none"), ("head_bias", True)):
            _require(
                getattr(self, name) == default,
                name,
                f"is an option of the classifier heads {CLASSIFIER_HEADS}, not head={self.head!r}",
            )
    if self.type == "gpt":
        _require(
            self.head in ("mlm", *CLASSIFIER_HEADS),
            "head",
            f"a GPT model takes head='mlm' (its language-model output) or one of "
            f"{CLASSIFIER_HEADS}, got {self.head!r}",
        )
        for name in ("freeze_encoder", "lora_rank"):
            _require(not getattr(self, name), name, "is an encoder option (model.type 'bert')")
    _require(self.lora_rank >= 0, "lora_rank", f"must be >= 0, got {self.lora_rank!r}")
    _require(_is_real(self.lora_alpha) and self.lora_alpha > 0, "lora_alpha", "must be > 0")
    targets = self.lora_targets
    bad = [t for t in targets if t not in LORA_TARGETS]
    _require(
        not bad and bool(targets),
        "lora_target_modules",
        f"must list some of {LORA_TARGETS} (comma-separated), got {self.lora_target_modules!r}",
    )
    _require(
        not (self.bert_binary_head and self.head != "mlm"),
        "bert_binary_head",
        f"must be false with a fine-tuning head (head={self.head!r})",
    )
    if self.head == "mlm":
        for name in ("freeze_encoder", "lora_rank"):
            _require(
                not getattr(self, name),
                name,
                "needs a fine-tuning head (model.head), not the masked-LM head",
            )
