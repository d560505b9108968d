"""transformers' classification models given to ``prepare``: their heads on epochal's models.

``AutoModelForSequenceClassification`` and ``AutoModelForTokenClassification`` of
BERT, GPT-2, Llama (and the decoders converted like it: Qwen2, Qwen3, Mistral) and ESM become epochal models with a classifier head
(:class:`~epochal.model.heads.ClassifierHead`, ``model.head`` ``"pooled_classifier"`` /
``"token_classifier"``) that computes what the transformers class computes:

============================  =====================  ===========================================
class                         position classified    head (Hugging Face names)
============================  =====================  ===========================================
BertForSequenceClassification the first ([CLS])      ``bert.pooler.dense`` + tanh, dropout, ``classifier``
BertForTokenClassification    every token            dropout, ``classifier``
GPT2ForSequenceClassification the last non-padding   ``score`` (no bias, no dropout)
GPT2ForTokenClassification    every token            dropout, ``classifier``
LlamaForSequenceClassification the last non-padding  ``score`` (no bias, no dropout)
LlamaForTokenClassification   every token            dropout, ``score``
EsmForSequenceClassification  the first (<cls>)      dropout, ``classifier.dense`` + tanh, dropout,
                                                     ``classifier.out_proj``
EsmForTokenClassification     every token            dropout, ``classifier``
============================  =====================  ===========================================

"The last non-padding token" is transformers' rule: the rightmost position whose
id is not ``config.pad_token_id`` (the last position when there is no
``pad_token_id``, which transformers allows for one row only).

The encoder or decoder body is converted by epochal's language-model converters
(:mod:`epochal.formats.hf`): its weights are read as the language model's would
be, with a stand-in of zeros for the language-model head the classifier lacks,
which is then dropped; writing back runs the exporter the same way and keeps the
body. So every conversion rule (fused / transposed tensors, the padded vocabulary)
is the language model's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from epochal.formats.hf.io import EXPORTERS, IMPORTERS
from epochal.model.config import ModelConfig

__all__ = ["HEAD_FAMILIES", "HeadLayout", "head_layout"]

#: class-name endings of the classification models -> their family
HEAD_FAMILIES = (
    (("ForSequenceClassification",), "sequence"),
    (("ForTokenClassification",), "token"),
)

#: model_type -> the body's prefix in the classification model
_BODY = {
    "bert": "bert.",
    "gpt2": "transformer.",
    "llama": "model.",
    "qwen2": "model.",
    "qwen3": "model.",
    "mistral": "model.",
    "esm": "esm.",
}
#: names of epochal's language-model head, absent from a classifier model
_LM_ONLY = ("lm_head.", "output.", "pooler.", "binary_head.")


@dataclass(frozen=True)
class HeadLayout:
    """How one transformers classification class maps onto epochal's classifier head.

    Attributes:
        architecture: ``config.model_type``.
        family: ``"sequence"`` or ``"token"``.
        pooling: ``"first"`` / ``"last"`` (sequence classification), ``"every"`` (token).
        transform: ``ModelConfig.head_transform``.
        dense: the Hugging Face name of the transform's dense layer (or None).
        out: the Hugging Face name of the classifier layer.
        bias: the classifier has a bias.
        dropout: the head's dropout.
    """

    architecture: str
    family: str
    pooling: str
    transform: str
    dense: str | None
    out: str
    bias: bool
    dropout: float

    @property
    def body(self) -> str:
        """The body's prefix (``bert.``, ``transformer.``, ``model.``, ``esm.``)."""
        return _BODY[self.architecture]

    def head_pairs(self) -> list[tuple[str, str]]:
        """``(epochal name, Hugging Face name)`` of every head tensor."""
        pairs = [("head.out.weight", f"{self.out}.weight")]
        if self.bias:
            pairs.append(("head.out.bias", f"{self.out}.bias"))
        if self.dense is not None:
            pairs += [("head.dense.weight", f"{self.dense}.weight")]
            pairs += [("head.dense.bias", f"{self.dense}.bias")]
        return pairs

    def model_config(self, lm_config: ModelConfig, num_labels: int) -> ModelConfig:
        """epochal's configuration of the classifier model (the language model's, head swapped)."""
        return dataclasses.replace(
            lm_config,
            head="pooled_classifier" if self.family == "sequence" else "token_classifier",
            num_labels=num_labels,
            head_transform=self.transform,
            head_bias=self.bias,
            head_dropout=self.dropout,
            head_hidden_size=None,
        )

    # ------------------------------------------------------------ conversion
    def _lm_stand_in(
        self, lm_config: ModelConfig, like: torch.Tensor, body: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The Hugging Face language model's tensors outside the body: zeros of ``like``'s dtype."""
        from epochal.model.build import build_model

        with torch.device("meta"):
            shapes = dict(build_model(lm_config).state_dict())
        zeros = {k: torch.zeros(v.shape, dtype=torch.float32) for k, v in shapes.items()}
        exported = EXPORTERS[self.architecture][1](zeros, lm_config)
        return {
            k: torch.zeros(v.shape, dtype=like.dtype)
            for k, v in exported.items()
            if not k.startswith(self.body) and k not in body
        }

    def import_state(
        self,
        hf_state: Mapping[str, torch.Tensor],
        lm_config: ModelConfig,
        source: str,
    ) -> dict[str, torch.Tensor]:
        """epochal's state of the classification model's Hugging Face ``hf_state``.

        Any tensor type works (the optimizer-group markers are uint8): the stand-in
        language-model head takes the dtype of the first tensor.
        """
        head_names = {hf for _, hf in self.head_pairs()}
        body = {
            k: v
            for k, v in hf_state.items()
            if k.startswith(self.body) and k not in head_names and not self._is_pooler(k)
        }
        like = next(iter(hf_state.values()))
        full = {**body, **self._lm_stand_in(lm_config, like, body)}
        ours = IMPORTERS[self.architecture][1](full, lm_config, source)
        out = {k: v for k, v in ours.items() if not k.startswith(_LM_ONLY)}
        for name, hf in self.head_pairs():
            out[name] = hf_state[hf]
        return out

    def _is_pooler(self, name: str) -> bool:
        """BERT's pooler outside the head (``BertForTokenClassification`` has none)."""
        return name.startswith(f"{self.body}pooler.")

    def export_state(
        self, state: Mapping[str, torch.Tensor], lm_config: ModelConfig
    ) -> dict[str, torch.Tensor]:
        """Hugging Face names and tensors of the classifier model's epochal ``state``."""
        from epochal.model.build import build_model

        with torch.device("meta"):
            shapes = dict(build_model(lm_config).state_dict())
        full = {k: v for k, v in state.items() if not k.startswith("head.")}
        for name, meta in shapes.items():
            if name not in full:
                if name == "output.weight" and lm_config.tie_embeddings:
                    full[name] = full["tok_embeddings.weight"]
                else:
                    full[name] = torch.zeros(meta.shape, dtype=torch.float32)
        hf = EXPORTERS[self.architecture][1](full, lm_config)
        out = {k: v for k, v in hf.items() if k.startswith(self.body) and not self._is_pooler(k)}
        for name, hf_name in self.head_pairs():
            if name in state:
                out[hf_name] = state[name]
        return out


def _dropout(hf: Any, *names: str, default: float = 0.1) -> float:
    for name in names:
        value = getattr(hf, name, None)
        if value is not None:
            return float(value)
    return default


def head_layout(model: torch.nn.Module, family: str, architecture: str) -> HeadLayout:
    """The :class:`HeadLayout` of the transformers classification ``model``.

    Raises:
        ValueError: a model type epochal has no classifier mapping for (the message
            names the class and what is supported).
    """
    hf = model.config
    name = type(model).__name__
    if architecture not in _BODY:
        raise ValueError(
            f"prepare() got a {name} (model_type={architecture!r}); epochal trains "
            "AutoModelForSequenceClassification / AutoModelForTokenClassification of BERT, "
            "GPT-2, Llama, Qwen2, Qwen3, Mistral and ESM: use one of those, or its "
            "language model (AutoModelForCausalLM / AutoModelForMaskedLM)"
        )
    state = model.state_dict()
    if architecture == "bert":
        drop = _dropout(hf, "classifier_dropout", "hidden_dropout_prob")
        if family == "sequence":
            if "bert.pooler.dense.weight" not in state:
                raise ValueError(f"{name} has no pooler (bert.pooler.dense): it cannot classify")
            return HeadLayout(
                architecture,
                family,
                "first",
                "pooler",
                "bert.pooler.dense",
                "classifier",
                True,
                drop,
            )
        return HeadLayout(architecture, family, "every", "none", None, "classifier", True, drop)
    if architecture == "esm":
        drop = _dropout(hf, "hidden_dropout_prob")
        if family == "sequence":
            return HeadLayout(
                architecture,
                family,
                "first",
                "dense_tanh",
                "classifier.dense",
                "classifier.out_proj",
                True,
                drop,
            )
        return HeadLayout(architecture, family, "every", "none", None, "classifier", True, drop)
    # gpt2 and the Llama-style decoders (llama, qwen2, qwen3, mistral)
    if family == "sequence":
        return HeadLayout(architecture, family, "last", "none", None, "score", False, 0.0)
    drop = _dropout(hf, "classifier_dropout", "hidden_dropout")
    out = "classifier" if architecture == "gpt2" else "score"
    bias = f"{out}.bias" in state
    return HeadLayout(architecture, family, "every", "none", None, out, bias, drop)
