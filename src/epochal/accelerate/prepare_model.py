"""A transformers model given to ``prepare``: epochal's config and weights, and the way back.

:func:`convert_hf_model` reads a ``GPT2LMHeadModel``, ``LlamaForCausalLM``,
``BertForMaskedLM`` / ``BertForPreTraining`` (``megatron-bert`` too),
``EsmForMaskedLM`` or ``T5ForConditionalGeneration`` (or a sequence / token
classifier of BERT, GPT-2, Llama or ESM: :mod:`epochal.accelerate.heads`) in memory through epochal's
Hugging Face converters (:data:`epochal.formats.hf.io.IMPORTERS`): the same
weights, random or pretrained, under epochal's names (vocabulary padded with zero
rows). A model built under ``init_empty_weights`` (parameters on the meta device)
converts its configuration only; its weights must come from ``load_state``.

:func:`parameter_roles` tells, for every epochal parameter, which of the user's
optimizer groups its Hugging Face source is in, or that it is not trained (frozen
with ``requires_grad_(False)``, or in no group of the optimizer): the converters
are run once more on a copy of the state where each tensor holds its group's
number (one byte per element), so fused, split and transposed tensors carry their
group along.

:class:`HFSource.write_back` copies epochal weights (full tensors) into the user's
model through the exporters (:data:`epochal.formats.hf.io.EXPORTERS`), which is
what ``accelerator.unwrap_model`` returns.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from epochal.accelerate.heads import HEAD_FAMILIES, HeadLayout, head_layout
from epochal.formats.common import ConversionError
from epochal.formats.hf.io import EXPORTERS, IMPORTERS, MOE_ARCHITECTURES
from epochal.model.config import ModelConfig

__all__ = [
    "FAMILIES",
    "HFSource",
    "ModelPrepareError",
    "convert_hf_model",
    "fresh_optimizer",
    "ParameterRoles",
    "parameter_roles",
    "weights_fingerprint",
]

#: class-name endings -> what the model computes (the batch semantics of its family)
FAMILIES = (
    (("ForCausalLM", "LMHeadModel"), "causal"),
    (("ForMaskedLM", "ForPreTraining"), "masked"),
    (("ForConditionalGeneration",), "seq2seq"),
)


class ModelPrepareError(ValueError):
    """A model ``prepare`` cannot turn into an epochal model (the message says why)."""


@dataclass
class HFSource:
    """A transformers model and its epochal counterpart.

    Attributes:
        model: the user's ``transformers`` model (kept; :meth:`write_back` fills it).
        architecture: its ``config.model_type`` (a key of ``IMPORTERS``).
        family: ``"causal"``, ``"masked"``, ``"seq2seq"``, ``"sequence"`` or ``"token"``.
        config: epochal's model configuration.
        state: epochal's full state dict (CPU), or None for a model without weights.
        placeholders: names the exporter fills without epochal weights (left alone on
            write-back, e.g. ESM's contact head).
        layout: a classification model's head (:mod:`epochal.accelerate.heads`), or None.
        lm_config: the body's language-model configuration (classification models: what
            the converters read and write; else ``config``).
    """

    model: nn.Module
    architecture: str
    family: str
    config: ModelConfig
    state: dict[str, torch.Tensor] | None
    placeholders: frozenset[str]
    layout: HeadLayout | None = None
    lm_config: ModelConfig | None = None

    def import_state(
        self, hf_state: Mapping[str, torch.Tensor], source: str
    ) -> dict[str, torch.Tensor]:
        """epochal's full state of the Hugging Face ``hf_state`` (any tensor type)."""
        if self.layout is not None:
            return self.layout.import_state(hf_state, self.lm_config or self.config, source)
        return IMPORTERS[self.architecture][1](dict(hf_state), self.config, source)

    def export_state(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Hugging Face names and tensors of epochal's full ``state`` (placeholders included)."""
        if self.layout is not None:
            return self.layout.export_state(state, self.lm_config or self.config)
        return EXPORTERS[self.architecture][1](dict(state), self.config)

    @property
    def vocab_size(self) -> int:
        """The Hugging Face vocabulary size (logits beyond it are padding)."""
        return self.config.vocab_size

    @property
    def hf_config(self) -> Any:
        """The transformers configuration object."""
        return self.model.config

    def hf_state(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Hugging Face names and tensors of epochal's full ``state`` (placeholders left out)."""
        out = self.export_state(state)
        return {k: v for k, v in out.items() if k not in self.placeholders}

    @torch.no_grad()
    def write_back(self, state: Mapping[str, torch.Tensor]) -> nn.Module:
        """Copy epochal's full ``state`` into the user's model (its dtype and device kept); return it.

        A model without weights (``init_empty_weights``) gets new CPU tensors.
        """
        hf_state = self.hf_state(state)
        own = self.model.state_dict()
        meta = any(t.is_meta for t in own.values())
        fitted = {}
        for name, tensor in hf_state.items():
            if name in own:
                target = own[name]
                fitted[name] = tensor.to(
                    device="cpu" if target.is_meta else target.device, dtype=target.dtype
                )
        self.model.load_state_dict(fitted, strict=False, assign=meta)
        if meta and hasattr(self.model, "tie_weights"):
            self.model.tie_weights()
        return self.model


def _family(model: nn.Module) -> str:
    name = type(model).__name__
    for endings, family in (*FAMILIES, *HEAD_FAMILIES):
        if name.endswith(endings):
            return family
    raise ModelPrepareError(
        f"prepare() got a {name}; epochal trains transformers language models with their head: "
        "GPT2LMHeadModel, LlamaForCausalLM, BertForMaskedLM / BertForPreTraining, "
        "EsmForMaskedLM, T5ForConditionalGeneration (AutoModelForCausalLM / "
        "AutoModelForMaskedLM / AutoModelForSeq2SeqLM), and the sequence and token "
        "classification models of BERT, GPT-2, Llama and ESM "
        "(AutoModelForSequenceClassification / AutoModelForTokenClassification)"
    )


def _meta_like(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in state.items()}


def convert_hf_model(
    model: nn.Module,
    *,
    make_vocab_size_divisible_by: int = 128,
    hidden_dropout: float | None = None,
    attention_dropout: float | None = None,
) -> HFSource:
    """Convert the transformers ``model`` (see the module docstring).

    Args:
        model: a ``transformers.PreTrainedModel`` with a language-model head.
        make_vocab_size_divisible_by: epochal's vocabulary padding multiple.
        hidden_dropout / attention_dropout: override the model's dropout (None: keep).

    Raises:
        ModelPrepareError: not a supported transformers model, or an option epochal's
            model cannot reproduce (the converter's reason included).
    """
    config_obj = getattr(model, "config", None)
    if not isinstance(model, nn.Module) or config_obj is None or not hasattr(config_obj, "to_dict"):
        raise ModelPrepareError(f"prepare() needs a transformers model, got {type(model).__name__}")
    family = _family(model)
    hf_config = config_obj.to_dict()
    architecture = hf_config.get("model_type")
    if family in ("sequence", "token"):
        try:
            head_layout(model, family, architecture)
        except ValueError as exc:
            raise ModelPrepareError(str(exc)) from None
    if architecture in MOE_ARCHITECTURES:
        raise ModelPrepareError(
            f"prepare() got a {type(model).__name__}: mixture-of-experts models are not "
            "converted in memory (transformers keeps their experts fused); convert the saved "
            "folder with `epochal convert --to epochal` and train it with `epochal train`"
        )
    if architecture not in IMPORTERS:
        raise ModelPrepareError(
            f"prepare() got a {type(model).__name__} (model_type={architecture!r}); epochal "
            f"converts {sorted(IMPORTERS)}"
        )
    read_config = IMPORTERS[architecture][0]
    hf_state = model.state_dict()
    has_weights = not any(t.is_meta for t in hf_state.values())
    source = f"{type(model).__name__} given to prepare()"
    layout = None
    try:
        if family in ("sequence", "token"):
            layout = head_layout(model, family, architecture)
        # the config readers look at the weights only for their presence and shapes
        config = read_config(
            hf_config,
            hf_state if has_weights else _meta_like(hf_state),
            make_vocab_size_divisible_by,
        )
        changes = {
            k: v
            for k, v in (
                ("hidden_dropout", hidden_dropout),
                ("attention_dropout", attention_dropout),
            )
            if v is not None
        }
        if changes:
            config = dataclasses.replace(config, **changes)
        lm_config = config
        if layout is not None:
            config = layout.model_config(lm_config, int(config_obj.num_labels))
        convert = HFSource(
            model, architecture, family, config, None, frozenset(), layout, lm_config
        )
        state = (
            convert.import_state({k: v.detach().cpu() for k, v in hf_state.items()}, source)
            if has_weights
            else None
        )
        exported = convert.export_state(_meta_like(_state_shapes(config)))
    except (ConversionError, ValueError) as exc:
        raise ModelPrepareError(f"{source}: {exc}") from exc
    placeholders = frozenset(k for k, v in exported.items() if not v.is_meta)
    return dataclasses.replace(convert, state=state, placeholders=placeholders)


def _state_shapes(config: ModelConfig) -> dict[str, torch.Tensor]:
    from epochal.model.build import build_model

    with torch.device("meta"):
        return dict(build_model(config).state_dict())


@dataclass(frozen=True)
class ParameterRoles:
    """What becomes of each epochal parameter in training (:func:`parameter_roles`).

    Attributes:
        groups: epochal parameter name -> the index of the user's optimizer group its
            weights come from (names of untrained parameters left out).
        frozen: epochal parameter names that are not trained: their Hugging Face
            weights have ``requires_grad=False`` or are in no group of the optimizer.
    """

    groups: dict[str, int]
    frozen: frozenset[str]


#: marker values of :func:`parameter_roles` (a user group ``g`` is ``_FIRST_GROUP + g``)
_NOT_A_PARAMETER, _UNTRAINED, _FIRST_GROUP = 0, 1, 2


def parameter_roles(source: HFSource, optimizer: torch.optim.Optimizer | None) -> ParameterRoles:
    """The optimizer group of every trained epochal parameter, and the untrained ones.

    As in PyTorch, a weight is trained when it has ``requires_grad`` and, with an
    ``optimizer``, is in one of its groups: a frozen weight
    (``requires_grad_(False)`` before ``prepare``) and a weight the optimizer does
    not hold keep their values. epochal's parameter of an untrained weight gets
    ``requires_grad=False`` (it gets no gradient, so it is also left out of the
    gradient norm that clipping uses, as Megatron's optimizer leaves it out).

    Raises:
        ModelPrepareError: a parameter of the optimizer is not the model's, more than
            254 groups, or an epochal parameter fuses weights of two groups, or
            trained and untrained weights (named, with what to change).
    """
    group_of: dict[int, int] = {}
    groups = optimizer.param_groups if optimizer is not None else []
    if len(groups) > 255 - _FIRST_GROUP:
        raise ModelPrepareError(
            f"the optimizer has more than {255 - _FIRST_GROUP} parameter groups"
        )
    for index, group in enumerate(groups):
        for p in group["params"]:
            group_of[id(p)] = index
    names = dict(source.model.named_parameters(remove_duplicate=False))
    model_ids = {id(p) for p in names.values()}
    strangers = [i for i in group_of if i not in model_ids]
    if strangers:
        raise ModelPrepareError(
            f"the optimizer holds {len(strangers)} parameters that are not the model's; "
            "build it from model.parameters() / model.named_parameters()"
        )

    def mark(p: torch.Tensor) -> int:
        if not p.requires_grad or (optimizer is not None and id(p) not in group_of):
            return _UNTRAINED
        return _FIRST_GROUP + group_of.get(id(p), 0)

    markers = {}
    for name, tensor in source.model.state_dict().items():
        value = mark(names[name]) if name in names else _NOT_A_PARAMETER
        markers[name] = torch.full(tuple(tensor.shape), value, dtype=torch.uint8)
    marked = source.import_state(markers, "optimizer groups")
    out: dict[str, int] = {}
    frozen: set[str] = set()
    for name, tensor in marked.items():
        values = [int(v) for v in torch.unique(tensor).tolist() if v != _NOT_A_PARAMETER]
        if _UNTRAINED in values and len(values) > 1:
            sources = _hf_sources(source, name)
            raise ModelPrepareError(
                f"epochal's parameter {name} fuses the weights {sources}, of which some are "
                "frozen (requires_grad=False) or in no optimizer group and some are trained; "
                "epochal cannot train part of it: freeze all of them or none, and give the "
                "optimizer all of them or none"
            )
        if len(values) > 1:
            raise ModelPrepareError(
                f"epochal's parameter {name} fuses weights of optimizer groups "
                f"{[v - _FIRST_GROUP for v in values]}; put those weights in one group"
            )
        if values == [_UNTRAINED]:
            frozen.add(name)
        elif values:
            out[name] = values[0] - _FIRST_GROUP
    return ParameterRoles(out, frozenset(frozen))


def _hf_sources(source: HFSource, name: str) -> list[str]:
    """The Hugging Face weights that make epochal's parameter ``name`` (each marked by its index)."""
    state = source.model.state_dict()
    keys = list(state)
    markers = {
        k: torch.full(tuple(v.shape), i + 1, dtype=torch.int32)
        for i, (k, v) in enumerate(state.items())
    }
    marked = source.import_state(markers, "optimizer groups")
    return [keys[int(v) - 1] for v in torch.unique(marked[name]).tolist() if v > 0]


def _same_as_initial(value: Any, initial: Any) -> bool:
    if isinstance(initial, torch.Tensor):
        if not isinstance(value, torch.Tensor) or value.dtype != initial.dtype:
            return False
        if initial.numel() == 1:
            return bool((value == initial.reshape(())).all())
        return value.shape == initial.shape and bool((value == initial).all())
    return type(value) is type(initial) and value == initial


def fresh_optimizer(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` has not stepped: no state, or only what its constructor makes.

    Some optimizers fill their state when built (``Adagrad``: ``step`` 0 and ``sum``
    = ``initial_accumulator_value``). The same class is built again with each
    group's options (and the defaults its constructor takes) over a one-element stand-in of every parameter; the state is
    fresh when each parameter's has the same keys and values (a stand-in's single
    value filling the parameter-shaped tensors). An optimizer that cannot be built
    that way counts as not fresh.
    """
    if not optimizer.state:
        return True
    params: list[torch.Tensor] = []
    stand_ins: list[torch.Tensor] = []
    groups = []
    for group in optimizer.param_groups:
        mine = [
            torch.zeros(1, dtype=p.dtype, device=p.device, requires_grad=p.requires_grad)
            for p in group["params"]
        ]
        params += group["params"]
        stand_ins += mine
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": mine})
    known = inspect.signature(type(optimizer).__init__).parameters
    accepted = {k: v for k, v in optimizer.defaults.items() if k in known}
    try:
        rebuilt = type(optimizer)(groups, **accepted)
    except Exception:  # an optimizer whose constructor needs more than its groups
        return False
    for p, stand_in in zip(params, stand_ins):
        state = optimizer.state.get(p, {})
        initial = rebuilt.state.get(stand_in, {})
        if set(state) != set(initial):
            return False
        if not all(_same_as_initial(state[k], initial[k]) for k in state):
            return False
    return True


def weights_fingerprint(model: nn.Module) -> torch.Tensor:
    """float64 ``[n]``: the sum of each parameter (compared over ranks: same weights everywhere)."""
    sums = [p.detach().double().sum().cpu() for p in model.parameters() if not p.is_meta]
    return torch.stack(sums) if sums else torch.zeros(1, dtype=torch.float64)
