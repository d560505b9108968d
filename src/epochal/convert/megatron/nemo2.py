"""Read NeMo 2 checkpoints (NeMo 2 / Megatron-Bridge / BioNeMo) without NeMo installed.

A NeMo 2 checkpoint is a folder::

    weights/     Megatron-Core's torch_dist format (metadata.json, .metadata, *.distcp,
                 common.pt); the model's tensors are stored under ``module.``
                 (``module.decoder.layers.self_attention.linear_qkv.weight``, layers
                 stacked), next to the optimizer state (not read)
    context/     model.yaml: the model's configuration as plain YAML (Hydra style:
                 ``_target_: ...LlamaModel`` with ``config:`` holding Megatron-Core
                 ``TransformerConfig`` fields); io.json: the same as a serialized
                 NeMo program (fiddle); tokenizer artifacts

The weights are read with :func:`~epochal.convert.megatron.torch_dist.read_torch_dist`
(prefix ``module.``) and mapped as Megatron-Core tensors (GPT/Llama as ``GPTModel``,
BERT and BioNeMo's ESM-2 as ``BertModel``).

The configuration is read from ``context/model.yaml`` with ``yaml.safe_load`` only, or,
without model.yaml (NeMo 2.0), from ``context/io.json`` walked as JSON data: Fiddle's
serialization (``root`` / ``objects``; ``Config`` nodes become mappings with their class
name in ``_target_``, functions their dotted name). Nothing is imported, executed or
unpickled. A context we will not read that way (neither file, one holding Python object
tags, a JSON that is not Fiddle's graph) is refused with a
:class:`~epochal.formats.common.ConversionError` that names the file; the
configuration then comes from ``--model-config FILE`` (JSON or YAML, the same
Megatron-Core field names: ``num_layers``, ``hidden_size``, ``num_attention_heads``,
``num_query_groups``, ``ffn_hidden_size``, ``normalization``, ``layernorm_epsilon``,
``gated_linear_unit``, ``position_embedding_type``, ``rotary_base``, ...), which also
completes or overrides a model.yaml.

NeMo leaves fields at their *class defaults* out of model.yaml (e.g. a recipe's
``Llama3Config8B`` with no arguments). What the tensors show is taken from them
(layer count, hidden and FFN sizes, gated MLP, biases, LayerNorm vs RMSNorm, learned
positions, tied head); ``num_attention_heads`` must be stated; other missing fields
(``layernorm_epsilon``; with rotary positions ``rotary_base``, ``rotary_percent``) take
Megatron-Core's defaults and are named in a warning.

ESM-2 (a model or config ``_target_`` naming ``esm``, e.g. BioNeMo's ``ESM2Model``):
``model.type="esm"`` with ``token_dropout`` from the config (default true, as in
BioNeMo) and ESM-2's alphabet ids (``mask_token_id`` 32, ``pad_token_id`` 1) unless
the configuration states them.
"""

from __future__ import annotations

import re
import warnings
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from epochal.convert.megatron.checkpoint import checkpoint_from_megatron_tensors
from epochal.convert.megatron.torch_dist import is_torch_dist, read_torch_dist
from epochal.formats.bounded_parse import Budget, ConfigFileError, load_json_file, load_yaml_file
from epochal.formats.checked_config import MEGATRON_SCHEMA, check_fields
from epochal.formats.common import ConversionError

__all__ = ["is_nemo2", "load_nemo2_checkpoint", "nemo2_model_fields"]

#: the prefix NeMo 2's ``MegatronParallel`` gives the model's tensors in ``weights/``.
MODEL_PREFIX = "module."
#: ESM-2's alphabet (fair-esm / Hugging Face ``facebook/esm2_*``, used by BioNeMo).
ESM2_MASK_TOKEN_ID = 32
ESM2_PAD_TOKEN_ID = 1
#: fields Megatron-Core defaults when model.yaml omits them (warned about).
_DEFAULTED = {
    "layernorm_epsilon": 1e-5,
    "rotary_base": 10000,
    "rotary_percent": 1.0,
}
_SILU = ("silu", "swish")
#: node visits allowed while walking io.json (a real NeMo context takes a few thousand).
FIDDLE_MAX_NODES = 200_000


def is_nemo2(path: str | Path) -> bool:
    """True for a NeMo 2 checkpoint folder: ``weights/`` in torch_dist format and ``context/``."""
    path = Path(path)
    return (path / "context").is_dir() and is_torch_dist(path / "weights")


def _read_mapping(path: Path, what: str) -> dict[str, Any]:
    """A YAML/JSON file as a plain mapping, read with ``yaml.safe_load`` (never constructs
    objects) within :mod:`~epochal.formats.bounded_parse`'s size, depth and alias limits."""
    import yaml

    try:
        doc = load_yaml_file(path, what)
    except yaml.YAMLError as exc:
        reason = str(exc).splitlines()[0]
        raise ConversionError(
            f"{path}: refused to read the {what}: it is not plain YAML/JSON data ({reason}); "
            "files holding Python objects are never constructed or unpickled here. Pass the "
            "model configuration with --model-config FILE (Megatron-Core field names)"
        ) from exc
    except ConfigFileError as exc:
        raise ConversionError(str(exc)) from exc
    if not isinstance(doc, dict):
        raise ConversionError(f"{path}: the {what} is not a mapping")
    return doc


_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _yaml_numbers(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with numbers YAML 1.1 reads as strings (``1e-5``: no dot) as floats."""
    return {
        k: float(v) if isinstance(v, str) and _NUMBER.match(v.strip()) else v
        for k, v in fields.items()
    }


def _plain(value: Any) -> Any:
    """A value without Hydra keys; ``{_target_: torch.nn.functional.silu, _call_: false}``
    -> ``"torch.nn.functional.silu"`` (as io.json's function references read)."""
    if isinstance(value, dict):
        target = value.get("_target_")
        if isinstance(target, str) and value.get("_call_") is False:
            return target
        return {k: _plain(v) for k, v in value.items() if not str(k).startswith("_")}
    return value


_PATH_ELEMENT = re.compile(r"^(?:Attr\(name=|Key\(key=|Index\(index=)'?(.*?)'?\)$")


class _FiddleGraph:
    """Fiddle's JSON serialization (NeMo's ``io.json``) walked as data: nothing is imported.

    ``ref`` nodes are followed into ``objects``; ``leaf`` nodes give their value;
    ``pyref`` nodes (a class or function) give ``"module.name"``; a ``Config`` /
    ``Partial`` gives a mapping of its arguments with its class in ``_target_``; lists,
    tuples and dicts give plain containers.
    """

    def __init__(self, data: Mapping[str, Any], path: Path) -> None:
        self.objects = data.get("objects") or {}
        self.path = path
        self.depth = 0
        #: every node visited counts (a reference followed again counts again)
        self.budget = Budget(str(path), max_nodes=FIDDLE_MAX_NODES)

    def refuse(self, why: str) -> ConversionError:
        return ConversionError(
            f"{self.path}: refused to read the NeMo context: {why}; pass the model "
            "configuration with --model-config FILE (Megatron-Core field names)"
        )

    def value(self, node: Any) -> Any:
        try:
            self.budget.visit(self.depth)
        except ConfigFileError as exc:
            raise self.refuse(str(exc).split(": ", 1)[1]) from None
        if isinstance(node, list):
            return [self.value(x) for x in node]
        if not isinstance(node, Mapping):
            return node
        kind = node.get("type")
        if kind == "leaf":
            return node.get("value")
        if kind == "pyref":
            return f"{node.get('module')}.{node.get('name')}"
        if kind == "ref":
            key = node.get("key")
            if key not in self.objects:
                raise self.refuse(f"it refers to a missing object {key!r}")
            self.depth += 1
            try:
                return self.value(self.objects[key])
            finally:
                self.depth -= 1
        if not isinstance(kind, Mapping):
            raise self.refuse(f"it holds a node of unknown type {kind!r}")
        type_name = str(self.value(kind))
        items = []
        for item in node.get("items") or []:
            m = _PATH_ELEMENT.match(str(item[0])) if isinstance(item, list) and item else None
            if m is not None:
                items.append((m.group(1), self.value(item[1])))
        if type_name in ("builtins.list", "builtins.tuple"):
            return [v for _, v in items]
        out = dict(items)
        if type_name.endswith((".Config", ".Partial")):  # a Buildable: its class is metadata
            meta = self.value(node.get("metadata"))
            target = meta.get("fn_or_cls") if isinstance(meta, Mapping) else None
            out["_target_"] = target if isinstance(target, str) else ""
        return out


def _io_json_model(path: Path) -> dict[str, Any]:
    """The ``model`` node of NeMo's ``io.json`` (a ``TrainerContext``) as plain data."""
    try:
        data = load_json_file(path, "NeMo context", mapping=False)
    except ConfigFileError as exc:
        raise ConversionError(str(exc)) from exc
    graph = _FiddleGraph(data if isinstance(data, Mapping) else {}, path)
    if not isinstance(data, Mapping) or "root" not in data:
        raise graph.refuse("it is not Fiddle's JSON serialization (no 'root')")
    try:
        root = graph.value(data["root"])
    except (TypeError, AttributeError, KeyError, IndexError) as exc:  # not Fiddle's node shapes
        raise graph.refuse(f"malformed Fiddle graph ({type(exc).__name__}: {exc})") from exc
    model = root.get("model") if isinstance(root, Mapping) else None
    if not isinstance(model, Mapping) or not isinstance(model.get("config"), Mapping):
        raise graph.refuse("it has no model.config")
    return dict(model)


def nemo2_model_fields(
    folder: str | Path, model_config: str | Path | None = None
) -> tuple[dict[str, Any], str]:
    """The model's configuration fields of a NeMo 2 checkpoint, and the model's ``_target_``.

    Args:
        folder: the checkpoint (with ``context/``).
        model_config: a JSON/YAML file of fields that completes or overrides
            ``context/model.yaml`` (required when the context is refused).

    Returns:
        ``({field: value}, target)``: Megatron-Core ``TransformerConfig`` names, Hydra
        keys dropped (functions such as activations as their dotted name), ``target`` the model and
        config ``_target_`` strings joined (``""`` when unknown).

    Raises:
        ConversionError: the context is refused (named) and no ``model_config`` is given,
            or a file is not a mapping.
    """
    context = Path(folder) / "context"
    yaml_path, json_path = context / "model.yaml", context / "io.json"
    found = next((p for p in (yaml_path, json_path) if p.is_file()), None)
    if found is None and model_config is None:
        present = sorted(p.name for p in context.iterdir()) if context.is_dir() else []
        raise ConversionError(
            f"{context}: neither model.yaml nor io.json (found {present}); the configuration "
            "could only come from pickled objects, which are never unpickled here. Pass the "
            "model configuration with --model-config FILE (Megatron-Core field names)"
        )
    doc: dict[str, Any] = {}
    if found is not None:
        try:
            if found == yaml_path:
                doc = _read_mapping(yaml_path, "NeMo model context")
            else:
                doc = _io_json_model(json_path)
        except ConversionError:
            if model_config is None:
                raise  # otherwise the refused context is replaced by --model-config
    config = doc.get("config", doc)
    if not isinstance(config, dict):
        raise ConversionError(f"{found}: 'config' is not a mapping")
    target = " ".join(
        t for t in (doc.get("_target_"), config.get("_target_")) if isinstance(t, str)
    )
    fields = {k: v for k, v in _plain(config).items() if v is not None}
    if found is not None:
        check_fields(_yaml_numbers(fields), MEGATRON_SCHEMA, str(found))
    if model_config is not None:
        extra = _yaml_numbers(_plain(_read_mapping(Path(model_config), "--model-config file")))
        check_fields(extra, MEGATRON_SCHEMA, str(model_config))
        fields.update(extra)
    return _yaml_numbers(fields), target


def _args_from_fields(
    fields: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], source: str
) -> Namespace:
    """A Megatron-LM ``args`` namespace from NeMo fields, completed from the tensors' shapes."""
    names = list(tensors)
    layer = re.compile(r"^(?:decoder|encoder)\.layers\.(\d+)\.")
    layers = {int(m.group(1)) for n in names if (m := layer.match(n))}
    emb = tensors.get("embedding.word_embeddings.weight")
    if emb is None:
        raise ConversionError(f"{source}: no embedding.word_embeddings.weight in the weights")

    def first(suffix: str) -> torch.Tensor | None:
        return next((tensors[n] for n in names if layer.match(n) and n.endswith(suffix)), None)

    fc1, fc2 = first(".mlp.linear_fc1.weight"), first(".mlp.linear_fc2.weight")
    if fc1 is None or fc2 is None:
        raise ConversionError(f"{source}: no MLP weights (mlp.linear_fc1/fc2) in the weights")
    ffn = int(fc2.shape[1])
    layer_norm_bias = any(
        n.endswith(("input_layernorm.bias", "linear_qkv.layer_norm_bias")) for n in names
    )
    shown = {
        "num_layers": len(layers),
        "hidden_size": int(emb.shape[1]),
        "ffn_hidden_size": ffn,
        "gated_linear_unit": int(fc1.shape[0]) == 2 * ffn,
        "add_bias_linear": any(n.endswith("self_attention.linear_proj.bias") for n in names),
        "normalization": "LayerNorm" if layer_norm_bias else "RMSNorm",
        "position_embedding_type": (
            "learned_absolute" if "embedding.position_embeddings.weight" in tensors else "rope"
        ),
    }
    for name, value in shown.items():
        said = fields.get(name)
        if said == "LayerNorm1P":  # LayerNorm with zero-centred weights (weight + 1)
            said = "LayerNorm"
        if said is not None and said != value:
            raise ConversionError(
                f"{source}: the configuration says {name}={said!r}, the weights show {value!r}"
            )
    if fields.get("num_attention_heads") is None:
        raise ConversionError(
            f"{source}: the configuration does not state num_attention_heads (NeMo leaves a "
            "config class's defaults out of model.yaml); pass it with --model-config FILE"
        )
    rotary = shown["position_embedding_type"] == "rope"
    assumed = sorted(
        k for k in _DEFAULTED if fields.get(k) is None and (rotary or not k.startswith("rotary"))
    )
    if assumed:
        warnings.warn(
            f"{source}: the configuration does not state {', '.join(assumed)}; assumed "
            f"Megatron-Core's defaults ({', '.join(f'{k}={_DEFAULTED[k]}' for k in assumed)}). "
            "If the model's NeMo config class differs, pass them with --model-config FILE",
            stacklevel=3,
        )
    get = {**_DEFAULTED, **{k: v for k, v in fields.items() if v is not None}}.get
    heads = int(fields["num_attention_heads"])
    groups = get("num_query_groups")
    gated = shown["gated_linear_unit"]
    # unstated: a gated MLP is SwiGLU (NeMo's Llama-family configs), else Megatron's GELU
    activation = str(get("activation_func", "silu" if gated else "gelu")).rsplit(".", 1)[-1]
    if gated and activation not in _SILU:
        raise ConversionError(
            f"{source}: a gated MLP with activation {activation!r} is not supported "
            "(SwiGLU, i.e. silu, is)"
        )
    if get("num_moe_experts"):
        raise ConversionError(
            f"{source}: mixture-of-experts models (num_moe_experts) are not supported"
        )
    share = get("share_embeddings_and_output_weights")
    untied = "output_layer.weight" in tensors
    if share is not None and bool(share) == untied:
        raise ConversionError(
            f"{source}: share_embeddings_and_output_weights={share!r}, but the weights "
            f"{'have' if untied else 'have no'} output_layer.weight"
        )
    seq = get("seq_length", get("max_position_embeddings"))
    if seq is None and shown["position_embedding_type"] == "learned_absolute":
        seq = int(tensors["embedding.position_embeddings.weight"].shape[0])
    return Namespace(
        num_layers=shown["num_layers"],
        hidden_size=shown["hidden_size"],
        ffn_hidden_size=ffn,
        num_attention_heads=heads,
        group_query_attention=groups is not None and int(groups) != heads,
        num_query_groups=int(groups) if groups is not None else heads,
        kv_channels=get("kv_channels"),
        swiglu=gated,
        openai_gelu=activation in ("openai_gelu", "gelu_tanh", "fast_gelu"),
        # Megatron-Core's fused bias-GELU computes the tanh GELU (BioNeMo ESM-2's default)
        bias_activation_fusion=bool(get("bias_activation_fusion", False)) and not gated,
        add_bias_linear=shown["add_bias_linear"],
        add_qkv_bias=bool(get("add_qkv_bias", False)),
        normalization=shown["normalization"],
        apply_layernorm_1p=get("normalization") == "LayerNorm1P",
        norm_epsilon=float(get("layernorm_epsilon")),
        position_embedding_type=shown["position_embedding_type"],
        rotary_base=float(get("rotary_base")),
        rotary_percent=float(get("rotary_percent")),
        rotary_interleaved=bool(get("rotary_interleaved", False)),
        untie_embeddings_and_output_weights=untied,
        max_position_embeddings=int(seq) if seq is not None else 4096,
        vocab_size=get("vocab_size"),
        padded_vocab_size=int(emb.shape[0]),
        make_vocab_size_divisible_by=int(get("make_vocab_size_divisible_by", 128)),
        hidden_dropout=float(get("hidden_dropout", 0.1)),
        attention_dropout=float(get("attention_dropout", 0.1)),
        init_method_std=float(get("init_method_std", 0.02)),
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        bert_binary_head=get("bert_binary_head", get("add_binary_head")),
    )


def load_nemo2_checkpoint(
    folder: str | Path,
    *,
    model_config: str | Path | None = None,
    vocab_size: int | None = None,
    make_vocab_size_divisible_by: int | None = None,
    model_type: str | None = None,
) -> Any:
    """Read a NeMo 2 checkpoint folder into our config and names.

    Args:
        folder: the checkpoint (``weights/`` and ``context/``).
        model_config: a JSON/YAML file of Megatron-Core config fields that completes
            or overrides ``context/model.yaml`` (see the module docstring).
        vocab_size: the unpadded vocabulary (default: the config's ``vocab_size``, else
            every embedding row).
        make_vocab_size_divisible_by: our padding multiple (default: the config's, else 128).
        model_type: the expected ``"gpt"`` / ``"bert"`` (an ESM-2 reads as ``"bert"`` here).

    Returns:
        A :class:`~epochal.convert.megatron.checkpoint.MegatronCheckpoint` (``args`` built
        from the configuration; ``iteration`` None: NeMo records the step in the
        folder's name, not in the files).

    Raises:
        ConversionError: a refused context without ``model_config``, missing shards,
            unsupported layers, or a configuration the weights contradict (all named).
    """
    folder = Path(folder)
    fields, target = nemo2_model_fields(folder, model_config)
    if (
        fields.get("bert_type") == "huggingface"
        or fields.get("transformer_block_type") == "post_ln"
    ):
        raise ConversionError(
            f"{folder}: a post-LN BERT (NeMo's bert_type='huggingface') is not supported from "
            "NeMo; Megatron's pre-LN BERT is (convert the Hugging Face original instead)"
        )
    flat, _ = read_torch_dist(folder / "weights", key_prefix=MODEL_PREFIX)
    source = str(folder)
    args = _args_from_fields(fields, flat, source)
    esm = None
    if "esm" in target.lower() or fields.get("token_dropout") is not None:
        esm = {
            "token_dropout": bool(fields.get("token_dropout", True)),
            "mask_token_id": int(fields.get("mask_token_id", ESM2_MASK_TOKEN_ID)),
            "pad_token_id": int(fields.get("pad_token_id", ESM2_PAD_TOKEN_ID)),
        }
    return checkpoint_from_megatron_tensors(
        flat,
        args,
        iteration=None,
        vocab_size=vocab_size,
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        model_type=model_type,
        source=source,
        esm=esm,
        unknown_tp=True,
    )
