"""Read and write Hugging Face model folders (``config.json`` + weights).

Reading accepts ``model.safetensors``, a sharded ``model.safetensors.index.json``,
or ``pytorch_model.bin`` (loaded with ``weights_only=True``). Writing produces
``config.json`` and one ``model.safetensors`` (tensors contiguous, in the
requested dtype), written into a temporary folder that is renamed into place
when complete. ``transformers`` is not needed for either.

The architecture is chosen by ``config.json``'s ``model_type`` on import
(:data:`IMPORTERS`: ``gpt2``, ``llama``, ``qwen2``, ``qwen3``, ``mistral``, ``mixtral``,
``qwen2_moe``, ``qwen3_moe``, ``bert``,
``megatron-bert``, ``esm``, ``t5``, ``mt5``) and on
export by the model (:func:`hf_architecture_for`; or named explicitly): a GPT with
learned absolute positions -> ``GPT2LMHeadModel``, with RoPE -> ``Qwen3ForCausalLM``
(QK-norm), ``Qwen2ForCausalLM`` (biases on q/k/v only), ``MistralForCausalLM``
(a sliding window) or ``LlamaForCausalLM``; a BERT -> ``BertForMaskedLM`` / ``BertForPreTraining``
(post-LN) or ``MegatronBertForMaskedLM`` / ``MegatronBertForPreTraining``
(pre-LN); an ESM -> ``EsmForMaskedLM``; a T5 -> ``T5ForConditionalGeneration`` (or
``MT5ForConditionalGeneration`` when ``mt5`` is named).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from epochal._atomic import atomic_directory
from epochal.formats.checked_config import (
    HF_ROPE_SCHEMA,
    HF_SCHEMAS,
    check_fields,
    check_positions,
    check_vocab_rows,
)
from epochal.formats.common import ConversionError, check_shapes, complete_tied
from epochal.formats.hf import bert as hf_bert
from epochal.formats.hf import esm as hf_esm
from epochal.formats.hf import glm4_moe as hf_glm4_moe
from epochal.formats.hf import gpt2 as hf_gpt2
from epochal.formats.hf import llama as hf_llama
from epochal.formats.hf import mistral as hf_mistral
from epochal.formats.hf import moe as hf_moe
from epochal.formats.hf import qwen2 as hf_qwen2
from epochal.formats.hf import qwen3 as hf_qwen3
from epochal.formats.hf import t5 as hf_t5
from epochal.formats.hf.files import read_json as _read_json
from epochal.formats.hf.files import read_weights as _read_weights
from epochal.formats.hf.files import tensor_names
from epochal.formats.hf.tied_head import HEAD, TIED_EMBEDDINGS, tie_as_transformers
from epochal.formats.hf.tokenizer import hf_tokenizer_files
from epochal.model.config import ConfigError, ModelConfig

__all__ = [
    "EXPORTERS",
    "IMPORTERS",
    "HFModel",
    "hf_architecture_for",
    "hf_architectures_holding",
    "load_hf_checkpoint",
    "load_hf_config",
    "save_hf_checkpoint",
]

Architecture = Literal[
    "gpt2",
    "llama",
    "qwen2",
    "qwen3",
    "mistral",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "glm4_moe",
    "bert",
    "megatron-bert",
    "esm",
    "t5",
    "mt5",
]
#: the Hugging Face architectures of a GPT (``model.type="gpt"``).
#: the mixture-of-experts architectures among :data:`GPT_ARCHITECTURES`
MOE_ARCHITECTURES = (*hf_moe.MOE_FAMILIES, "glm4_moe")
GPT_ARCHITECTURES = ("gpt2", "llama", "qwen2", "qwen3", "mistral", *MOE_ARCHITECTURES)
ConfigReader = Callable[[dict[str, Any], dict[str, torch.Tensor], int], ModelConfig]
StateReader = Callable[[dict[str, torch.Tensor], ModelConfig, str], dict[str, torch.Tensor]]


#: ``model_type`` -> (config reader ``(hf_config, weights, padding multiple)``,
#: state reader ``(weights, config, source)``), before :func:`_transformers_loss`.
_READERS: dict[str, tuple[ConfigReader, StateReader]] = {
    "gpt2": (
        lambda hf, w, m: hf_gpt2.ours_config_from_gpt2(hf, make_vocab_size_divisible_by=m),
        lambda w, c, src: hf_gpt2.ours_state_from_gpt2(w, c, source=src),
    ),
    "llama": (
        lambda hf, w, m: hf_llama.ours_config_from_llama(hf, make_vocab_size_divisible_by=m),
        lambda w, c, src: hf_llama.ours_state_from_llama(w, c, source=src),
    ),
    "qwen2": (
        lambda hf, w, m: hf_qwen2.ours_config_from_qwen2(hf, make_vocab_size_divisible_by=m),
        lambda w, c, src: hf_llama.decoder_state_to_ours(w, c, source=src),
    ),
    "qwen3": (
        lambda hf, w, m: hf_qwen3.ours_config_from_qwen3(hf, make_vocab_size_divisible_by=m),
        lambda w, c, src: hf_llama.decoder_state_to_ours(w, c, source=src),
    ),
    "mistral": (
        lambda hf, w, m: hf_mistral.ours_config_from_mistral(hf, make_vocab_size_divisible_by=m),
        lambda w, c, src: hf_llama.decoder_state_to_ours(w, c, source=src),
    ),
    **{
        kind: (
            lambda hf, w, m, _k=kind: hf_moe.ours_config_from_moe(
                hf, _k, make_vocab_size_divisible_by=m
            ),
            lambda w, c, src, _k=kind: hf_llama.decoder_state_to_ours(
                w, c, source=src, moe_module=hf_moe.moe_module_to_ours(_k)
            ),
        )
        for kind in hf_moe.MOE_FAMILIES
    },
    "glm4_moe": (
        lambda hf, w, m: hf_glm4_moe.ours_config_from_glm4_moe(hf, make_vocab_size_divisible_by=m),
        lambda w, c, src: hf_glm4_moe.ours_state_from_glm4_moe(w, c, source=src),
    ),
    "bert": (
        lambda hf, w, m: hf_bert.ours_config_from_bert(
            hf, pre_ln=False, binary_head=hf_bert.has_binary_head(w), make_vocab_size_divisible_by=m
        ),
        lambda w, c, src: hf_bert.ours_state_from_bert(w, c, source=src),
    ),
    "megatron-bert": (
        lambda hf, w, m: hf_bert.ours_config_from_bert(
            hf, pre_ln=True, binary_head=hf_bert.has_binary_head(w), make_vocab_size_divisible_by=m
        ),
        lambda w, c, src: hf_bert.ours_state_from_bert(w, c, source=src),
    ),
    "esm": (
        lambda hf, w, m: hf_esm.ours_config_from_esm(hf, make_vocab_size_divisible_by=m),
        lambda w, c, src: hf_esm.ours_state_from_esm(w, c, source=src),
    ),
    "t5": (
        lambda hf, w, m: hf_t5.ours_config_from_t5(hf, w, make_vocab_size_divisible_by=m),
        lambda w, c, src: hf_t5.ours_state_from_t5(w, c, source=src),
    ),
    "mt5": (
        lambda hf, w, m: hf_t5.ours_config_from_t5(hf, w, make_vocab_size_divisible_by=m),
        lambda w, c, src: hf_t5.ours_state_from_t5(w, c, source=src),
    ),
}


def _transformers_loss(read_config: ConfigReader) -> ConfigReader:
    """A config reader whose models leave their padded ids out of the loss.

    A Hugging Face model's logits have ``vocab_size`` columns; ours are padded to a
    multiple of ``make_vocab_size_divisible_by``. With ``padded_vocab_in_softmax=False``
    the padded ids join no softmax, so training and evaluation report transformers' loss.
    """

    def read(hf: dict[str, Any], weights: dict[str, torch.Tensor], multiple: int) -> ModelConfig:
        config = read_config(hf, weights, multiple)
        return dataclasses.replace(config, padded_vocab_in_softmax=False)

    return read


#: ``model_type`` -> (config reader ``(hf_config, weights, padding multiple)``,
#: state reader ``(weights, config, source)``).
IMPORTERS: dict[str, tuple[ConfigReader, StateReader]] = {
    kind: (_transformers_loss(read_config), read_state)
    for kind, (read_config, read_state) in _READERS.items()
}


def _decoder_writer(
    config_writer: Callable[[ModelConfig], dict[str, Any]],
) -> Callable[[dict[str, torch.Tensor], ModelConfig], dict[str, torch.Tensor]]:
    """The state writer of a Llama-shaped family: its config writer validates, then Llama's names."""

    def write(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
        config_writer(config)  # refuses what the family cannot hold
        return hf_llama.decoder_state_from_ours(state, config)

    return write


def _moe_exporter(kind: str) -> tuple[Callable[..., dict[str, Any]], Callable[..., Any]]:
    """The (config writer, state writer) of a mixture-of-experts family."""

    def config_writer(config: ModelConfig, **kwargs: Any) -> dict[str, Any]:
        return hf_moe.moe_config_from_ours(config, kind, **kwargs)

    def write(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
        config_writer(config)  # refuses what the family cannot hold
        return hf_llama.decoder_state_from_ours(state, config, hf_moe.moe_module_from_ours(kind))

    return config_writer, write


#: architecture -> (``config.json`` writer, state writer), both from ``(config[, state])``.
EXPORTERS: dict[
    str, tuple[Callable[..., dict[str, Any]], Callable[..., dict[str, torch.Tensor]]]
] = {
    "gpt2": (hf_gpt2.gpt2_config_from_ours, hf_gpt2.gpt2_state_from_ours),
    "llama": (hf_llama.llama_config_from_ours, hf_llama.llama_state_from_ours),
    "qwen2": (hf_qwen2.qwen2_config_from_ours, _decoder_writer(hf_qwen2.qwen2_config_from_ours)),
    "qwen3": (hf_qwen3.qwen3_config_from_ours, _decoder_writer(hf_qwen3.qwen3_config_from_ours)),
    "mistral": (
        hf_mistral.mistral_config_from_ours,
        _decoder_writer(hf_mistral.mistral_config_from_ours),
    ),
    **{kind: _moe_exporter(kind) for kind in hf_moe.MOE_FAMILIES},
    "glm4_moe": (hf_glm4_moe.glm4_moe_config_from_ours, hf_glm4_moe.glm4_moe_state_from_ours),
    "bert": (hf_bert.bert_config_from_ours, hf_bert.bert_state_from_ours),
    "megatron-bert": (hf_bert.bert_config_from_ours, hf_bert.bert_state_from_ours),
    "esm": (hf_esm.esm_config_from_ours, hf_esm.esm_state_from_ours),
    "t5": (hf_t5.t5_config_from_ours, hf_t5.t5_state_from_ours),
    "mt5": (
        lambda c: hf_t5.t5_config_from_ours(c, architecture="mt5"),
        hf_t5.t5_state_from_ours,
    ),
}


@dataclass
class HFModel:
    """A model read from a Hugging Face folder.

    Attributes:
        config: our model config.
        state: our state dict (full CPU tensors, vocabulary padded).
        hf_config: the ``config.json`` dict as read.
        architecture: the ``model_type`` read (a key of :data:`IMPORTERS`).
    """

    config: ModelConfig
    state: dict[str, torch.Tensor]
    hf_config: dict[str, Any]
    architecture: Architecture

    @property
    def eos_token_id(self) -> int | None:
        """``eos_token_id`` of ``config.json`` (the first one if it is a list)."""
        eos = self.hf_config.get("eos_token_id")
        return eos[0] if isinstance(eos, list) and eos else eos

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every ``eos_token_id`` of ``config.json`` (an int or a list; empty if unset)."""
        eos = self.hf_config.get("eos_token_id")
        eos = eos if isinstance(eos, list) else [] if eos is None else [eos]
        return tuple(int(t) for t in eos)

    @property
    def bos_token_id(self) -> int | None:
        """``bos_token_id`` of ``config.json``."""
        return self.hf_config.get("bos_token_id")


#: suffixes of the input embedding's name in each family's weights.
_EMBEDDING_SUFFIXES = (
    "wte.weight",
    "embed_tokens.weight",
    "embeddings.word_embeddings.weight",
    "shared.weight",
)


def check_hf_config(
    hf_config: dict[str, Any], weights: dict[str, torch.Tensor], path: Path
) -> None:
    """Validate ``config.json`` field by field and against the weights' embedding rows.

    Raises:
        ConversionError: a field of the wrong type or range, a missing required field,
            too many positions, or ``vocab_size`` contradicting the embedding (named).
    """
    hf_type = hf_config["model_type"]
    source = str(path)
    check_fields(hf_config, HF_SCHEMAS[hf_type], source)
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(hf_config.get(key), dict):
            check_fields(hf_config[key], HF_ROPE_SCHEMA, source, prefix=f"{key}.")
    for key in ("n_positions", "max_position_embeddings"):
        check_positions(hf_config.get(key), source, key)
    name = next((n for n in sorted(weights) if n.endswith(_EMBEDDING_SUFFIXES)), None)
    if name is not None and weights[name].dim() == 2:
        check_vocab_rows(
            source, "vocab_size", hf_config["vocab_size"], int(weights[name].shape[0]), name
        )


def load_hf_checkpoint(
    folder: str | os.PathLike,
    *,
    make_vocab_size_divisible_by: int = 128,
    model_type: str | None = None,
) -> HFModel:
    """Read a Hugging Face model folder into our config and parameter names.

    The returned config is accepted by :func:`epochal.model.build_model` and the
    state loads into that model (``load_state_dict(strict=True)``).

    Args:
        folder: the model folder (``config.json`` + weights) of a ``GPT2LMHeadModel``,
            ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``,
            ``MistralForCausalLM``, ``BertForMaskedLM`` / ``BertForPreTraining``,
            ``MegatronBertForMaskedLM`` / ``MegatronBertForPreTraining``, ``EsmForMaskedLM``,
            ``T5ForConditionalGeneration`` or ``MT5ForConditionalGeneration``.
        make_vocab_size_divisible_by: our vocabulary padding multiple.
        model_type: if given, our ``ModelConfig.type`` the caller expects
            (``"gpt"``, ``"bert"``, ``"esm"``, ``"t5"``); a folder holding another type is refused.

    Raises:
        FileNotFoundError: the folder, ``config.json`` or the weights are missing.
        ConversionError: unsupported ``model_type`` or option, a model of another
            type than ``model_type``, or tensors that do not match the config.
        UnsafeCheckpointError: a ``.bin`` file holds non-tensor objects.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: not a folder")
    hf_config = _read_json(folder / "config.json")
    hf_type = hf_config.get("model_type")
    if not isinstance(hf_type, str) or hf_type not in IMPORTERS:
        raise ConversionError(
            f"{folder / 'config.json'}: model_type={hf_type!r} is not supported "
            f"(one of {sorted(IMPORTERS)})"
        )
    weights = _read_weights(folder)
    check_hf_config(hf_config, weights, folder / "config.json")
    read_config, read_state = IMPORTERS[hf_type]
    try:
        config = read_config(hf_config, weights, make_vocab_size_divisible_by)
    except ConfigError as exc:  # a combination of valid fields the model refuses
        raise ConversionError(f"{folder / 'config.json'}: {exc}") from exc
    config, weights = tie_as_transformers(config, weights, hf_type, str(folder))
    if model_type is not None and config.type != model_type:
        raise ConversionError(
            f"{folder}: holds a {config.type!r} model (Hugging Face {hf_type!r}), "
            f"expected model.type={model_type!r}"
        )
    try:
        state = read_state(weights, config, str(folder))
    except (RuntimeError, IndexError) as exc:  # a reshape the tensors' shapes do not allow
        raise ConversionError(
            f"{folder}: the weights do not fit config.json ({type(exc).__name__}: {exc})"
        ) from exc
    return HFModel(config=config, state=state, hf_config=hf_config, architecture=hf_type)


#: ``model_type``s whose configuration reader also looks at the weights (BERT's binary
#: head, T5's tied head); the others' configuration is ``config.json`` alone.
_CONFIG_FROM_WEIGHTS = ("bert", "megatron-bert", "t5", "mt5")


def load_hf_config(
    folder: str | os.PathLike, *, make_vocab_size_divisible_by: int = 128
) -> ModelConfig:
    """The model configuration of a Hugging Face folder, reading the weights only where needed.

    The same configuration :func:`load_hf_checkpoint` returns, without loading a
    decoder's (or ESM's) weights: for a run that only needs the model's shape.

    Raises:
        FileNotFoundError: the folder or ``config.json`` is missing.
        ConversionError: unsupported ``model_type`` or option (named).
    """
    folder = Path(folder)
    hf_config = _read_json(folder / "config.json")
    hf_type = hf_config.get("model_type")
    if not isinstance(hf_type, str) or hf_type not in IMPORTERS:
        raise ConversionError(
            f"{folder / 'config.json'}: model_type={hf_type!r} is not supported "
            f"(one of {sorted(IMPORTERS)})"
        )
    if hf_type in _CONFIG_FROM_WEIGHTS:
        return load_hf_checkpoint(
            folder, make_vocab_size_divisible_by=make_vocab_size_divisible_by
        ).config
    check_hf_config(hf_config, {}, folder / "config.json")
    try:
        config = IMPORTERS[hf_type][0](hf_config, {}, make_vocab_size_divisible_by)
    except ConfigError as exc:
        raise ConversionError(f"{folder / 'config.json'}: {exc}") from exc
    if config.tie_embeddings and hf_type in TIED_EMBEDDINGS:
        names = tensor_names(folder)
        if names is None or HEAD in names:  # tied or not is decided by the tensors' values
            return load_hf_checkpoint(
                folder, make_vocab_size_divisible_by=make_vocab_size_divisible_by
            ).config
    return config


def hf_architecture_for(config: ModelConfig) -> Architecture:
    """The default Hugging Face architecture of ``config``.

    GPT: ``"gpt2"`` for learned absolute positions; with RoPE and experts ``"glm4_moe"``
    (sigmoid routing), ``"qwen3_moe"`` (QK-norm), ``"qwen2_moe"`` (a shared expert) or
    ``"mixtral"``; else ``"qwen3"`` when it has
    QK-norm, ``"qwen2"`` with biases on q/k/v but not on the other linears,
    ``"mistral"`` with a sliding window, else ``"llama"`` (each exporter then refuses
    what its class cannot hold, naming it). BERT:
    ``"bert"`` (post-LN) or ``"megatron-bert"`` (pre-LN). ESM: ``"esm"``. T5: ``"t5"``.

    Raises:
        ConversionError: a GPT position encoding with no Hugging Face target here.
    """
    if config.type == "bert":
        return "megatron-bert" if config.transformer_block_type == "pre_ln" else "bert"
    if config.type == "esm":
        return "esm"
    if config.type == "t5":
        return "t5"
    if config.position_embedding_type == "learned_absolute":
        return "gpt2"
    if config.position_embedding_type == "rope":
        if config.num_experts is not None:
            if config.moe_router_score_function == "sigmoid":
                return "glm4_moe"
            if config.qk_layernorm:
                return "qwen3_moe"
            return "qwen2_moe" if config.moe_shared_expert_intermediate_size else "mixtral"
        if config.qk_layernorm:
            return "qwen3"
        if config.qkv_bias and not config.add_bias_linear:
            return "qwen2"
        if config.sliding_window is not None:
            return "mistral"
        return "llama"
    raise ConversionError(
        f"position_embedding_type={config.position_embedding_type!r} has no Hugging Face export "
        "(GPT-2 needs learned_absolute, Llama needs rope)"
    )


def _export_refusals(config: ModelConfig) -> dict[str, str | None]:
    """Each candidate architecture's refusal of ``config`` (None: it holds the model).

    GPT models are tried against every GPT architecture; another model type against
    its own (:func:`hf_architecture_for`).
    """
    if config.type == "gpt":
        candidates: tuple[str, ...] = GPT_ARCHITECTURES
    else:
        try:
            candidates = (hf_architecture_for(config),)
        except ConversionError:
            return {}
    out: dict[str, str | None] = {}
    for arch in candidates:
        try:
            EXPORTERS[arch][0](config)
        except ConversionError as exc:
            out[arch] = str(exc)
        else:
            out[arch] = None
    return out


def hf_architectures_holding(config: ModelConfig) -> list[str]:
    """The Hugging Face architectures whose exporter accepts ``config`` (:data:`EXPORTERS` order)."""
    return [arch for arch, refusal in _export_refusals(config).items() if refusal is None]


def _what_holds_it(config: ModelConfig, refused: str) -> str:
    """The end of a refused export's message: the architectures that hold the model, or
    (none does) what each family of its kind (dense or mixture of experts) lacks."""
    refusals = _export_refusals(config)
    holders = [a for a, why in refusals.items() if why is None and a != refused]
    if holders:
        names = " or ".join(repr(a) for a in holders)
        return f"the model fits {names} (epochal convert --hf-architecture {holders[0]})"
    moe = config.num_experts is not None
    others = [
        why.removeprefix("cannot export to ")
        for a, why in refusals.items()
        if why is not None and a != refused and (a in MOE_ARCHITECTURES) == moe and a != "gpt2"
    ]
    return "no Hugging Face architecture epochal exports holds this model" + (
        " (" + "; ".join(others) + ")" if others else ""
    )


def save_hf_checkpoint(
    config: ModelConfig,
    state: dict[str, torch.Tensor],
    folder: str | os.PathLike,
    *,
    architecture: Architecture | None = None,
    dtype: torch.dtype | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    tokenizer_file: str | os.PathLike | None = None,
    overwrite: bool = False,
    extra_files: dict[str, str | bytes] | None = None,
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` for a Hugging Face class.

    Args:
        config: our model config.
        state: our state dict (full tensors; e.g. ``GPTModel.state_dict()``).
        folder: the output folder (created; replaced only with ``overwrite``).
        architecture: a key of :data:`EXPORTERS`; default :func:`hf_architecture_for`.
        dtype: cast floating tensors to this dtype (default: keep each tensor's).
        bos_token_id, eos_token_id, pad_token_id: written to ``config.json`` (used by HF
            ``generate``; ``eos_token_id`` may be a list, as in Llama 3); encoders write
            ``bos_token_id``/``eos_token_id`` only when given.
        tokenizer_file: a ``tokenizer.json`` to ship with the weights, with a
            ``tokenizer_config.json`` and ``special_tokens_map.json`` naming the
            tokens of those ids (see :mod:`epochal.formats.hf.tokenizer`), so that
            ``AutoTokenizer`` agrees with ``config.json``.
        overwrite: replace an existing folder.
        extra_files: ``{name: text or bytes}`` written too, e.g. an ESM-2 tokenizer's
            ``vocab.txt`` (:meth:`~epochal.data.ESM2Tokenizer.hf_tokenizer_files`), a chat
            tokenizer's files and ``generation_config.json``.

    Returns:
        The folder.

    Raises:
        ConversionError: the model has no such Hugging Face architecture (e.g. a
            model of another type than ``architecture``), a token id outside
            ``[0, vocab_size)``, or ``tokenizer_file`` is unreadable or lacks one of the ids.
        FileExistsError: the folder exists and ``overwrite`` is false.
    """
    from safetensors.torch import save_file

    given = {"bos_token_id": bos_token_id, "eos_token_id": eos_token_id}
    for name, value in {**given, "pad_token_id": pad_token_id}.items():
        ids = value if isinstance(value, list) else [] if value is None else [value]
        if any(not 0 <= i < config.vocab_size for i in ids):
            raise ConversionError(
                f"{name}={value!r} is not an id of the model's {config.vocab_size}-id vocabulary "
                f"(epochal convert --{name.replace('_', '-')} sets it)"
            )
    tokenizer_files: dict[str, str] = {}
    if tokenizer_file is not None:
        tokenizer_files = hf_tokenizer_files(
            tokenizer_file,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            model_max_length=config.max_position_embeddings,
        )

    arch = architecture or hf_architecture_for(config)
    if arch not in EXPORTERS:
        raise ConversionError(f"architecture={arch!r} is not one of {sorted(EXPORTERS)}")
    write_config, write_state = EXPORTERS[arch]
    if config.type != "gpt" or arch not in GPT_ARCHITECTURES:
        expected = (
            hf_architecture_for(config) if config.type != "gpt" else "', '".join(GPT_ARCHITECTURES)
        )
        if arch != expected and not (expected == "t5" and arch == "mt5"):
            raise ConversionError(
                f"architecture={arch!r} does not fit model.type={config.type!r} "
                f"(transformer_block_type={config.transformer_block_type!r}); use '{expected}'"
            )
    try:
        hf_config = write_config(config)
    except ConversionError as exc:
        raise ConversionError(f"{exc}; {_what_holds_it(config, arch)}") from None
    state = complete_tied(config, state)
    check_shapes(state, config, "model state")
    out_dtype = dtype or state["tok_embeddings.weight"].dtype
    hf_config["dtype"] = str(out_dtype).removeprefix("torch.")
    hf_state = write_state(state, config)
    if config.type == "gpt" or bos_token_id is not None:
        hf_config["bos_token_id"] = bos_token_id
    if config.type == "gpt" or eos_token_id is not None:
        hf_config["eos_token_id"] = eos_token_id
    if pad_token_id is not None:
        hf_config["pad_token_id"] = pad_token_id
    tensors: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for name, tensor in hf_state.items():
        t = tensor.detach().to("cpu")
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        t = t.contiguous()
        key = (t.data_ptr(), t.nbytes)
        if key in seen:
            t = t.clone()  # safetensors refuses two names for the same memory
        seen.add((t.data_ptr(), t.nbytes))
        tensors[name] = t
    with atomic_directory(folder, overwrite=overwrite) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
        for name, text in {**tokenizer_files, **(extra_files or {})}.items():
            if isinstance(text, bytes):
                (tmp / name).write_bytes(text)
            else:
                (tmp / name).write_text(text, encoding="utf-8")
    return Path(folder)
