"""Megatron-LM tensor layouts: fused QKV, fused SwiGLU fc1, tensor-parallel shards, names.

Pure tensor functions used by :mod:`epochal.convert.megatron.legacy`.

Fused QKV (``linear_qkv`` / legacy ``query_key_value``; checkpoint_version >= 2):
rows are grouped by key/value group ``g`` (``G = num_query_groups`` groups,
``n = heads / G`` query heads per group, head size ``d``)::

    [ q(g=0, head 0) .. q(g=0, head n-1), k(g=0), v(g=0),  q(g=1, ...), k(g=1), v(g=1), ... ]

each block ``d`` rows, i.e. the tensor is ``[G, (n + 2) d, hidden]`` flattened.
With multi-head attention (``G = heads``) this is the per-head ``[q, k, v]``
order. A tensor-parallel rank holds ``G / TP`` consecutive groups, so sharding
is a plain split of the rows. Older legacy versions stored ``[3, heads, d]``
(version 0) and ``[heads, d, 3]`` (version 1.0); :func:`qkv_rows_to_v2` reorders them.

SwiGLU ``linear_fc1`` is ``[gate; up]`` (``w1`` rows, then ``w3`` rows) *per
tensor-parallel rank*: rank ``r`` holds ``[gate_r; up_r]``, so the full tensor is
not the concatenation of the shards (:func:`split_tp` / :func:`merge_tp` with
``kind="glu"``).

Sharding kinds (per Megatron's ColumnParallel/RowParallel/VocabParallel layers):
``"vocab"`` and ``"column"`` split dim 0, ``"glu"`` splits each half of dim 0,
``"row"`` splits dim 1 (a row-parallel bias is not split), ``"replicated"`` is
the same on every rank.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import torch

from epochal.formats.common import ConversionError

__all__ = [
    "interleaved_to_half_rotary",
    "megatron_model_type",
    "merge_tp",
    "pack_qkv",
    "qkv_rows_to_v2",
    "shard_kind",
    "split_tp",
    "to_local_names",
    "unpack_qkv",
]


def pack_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_groups: int, head_dim: int
) -> torch.Tensor:
    """Fuse separate q/k/v weights (or biases) into Megatron's grouped order.

    Args:
        q: ``[heads * d, ...]``; k, v: ``[G * d, ...]``.
        num_groups: ``G``.
        head_dim: ``d``.

    Returns:
        ``[(heads + 2 G) d, ...]`` in the order described in the module docstring.
    """
    rest = q.shape[1:]
    qg = q.reshape(num_groups, -1, *rest)
    kg = k.reshape(num_groups, head_dim, *rest)
    vg = v.reshape(num_groups, head_dim, *rest)
    return torch.cat([qg, kg, vg], dim=1).reshape(-1, *rest)


def unpack_qkv(
    fused: torch.Tensor, num_heads: int, num_groups: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`pack_qkv`: ``[(heads + 2 G) d, ...] -> (q, k, v)``.

    Raises:
        ConversionError: the row count does not match the head configuration.
    """
    per_group = num_heads // num_groups
    rows = (num_heads + 2 * num_groups) * head_dim
    if fused.shape[0] != rows:
        raise ConversionError(
            f"fused QKV has {fused.shape[0]} rows, expected (heads {num_heads} + 2 x groups "
            f"{num_groups}) x head_dim {head_dim} = {rows}"
        )
    rest = fused.shape[1:]
    g = fused.reshape(num_groups, (per_group + 2) * head_dim, *rest)
    q, k, v = torch.split(g, [per_group * head_dim, head_dim, head_dim], dim=1)
    return (
        q.reshape(num_heads * head_dim, *rest).contiguous(),
        k.reshape(num_groups * head_dim, *rest).contiguous(),
        v.reshape(num_groups * head_dim, *rest).contiguous(),
    )


def qkv_rows_to_v2(
    fused: torch.Tensor, version: float, num_heads: int, head_dim: int
) -> torch.Tensor:
    """Reorder a legacy (multi-head) fused QKV of ``checkpoint_version < 2`` to the version-2 order.

    Version 0 stored rows as ``[3, heads, d]``, version 1.0 as ``[heads, d, 3]``;
    version >= 2 (and Megatron-Core) use ``[heads, 3, d]``.
    """
    rest = fused.shape[1:]
    if version >= 2.0:
        return fused
    if fused.dim() < 1 or fused.shape[0] != 3 * num_heads * head_dim:
        raise ConversionError(
            f"checkpoint_version {version}: a fused QKV of {tuple(fused.shape)} does not hold "
            f"3 x {num_heads} heads x {head_dim} rows"
        )
    if version == 0:
        t = fused.reshape(3, num_heads, head_dim, *rest).transpose(0, 1)
    elif version == 1.0:
        t = fused.reshape(num_heads, head_dim, 3, *rest).transpose(1, 2)
    else:
        raise ConversionError(f"unknown checkpoint_version {version}")
    return t.reshape(-1, *rest).contiguous()


def interleaved_to_half_rotary(
    rows: torch.Tensor, num_heads: int, head_dim: int, rotary_dim: int
) -> torch.Tensor:
    """Permute q or k rows from interleaved RoPE pairs ``(2i, 2i+1)`` to the half-split layout.

    Megatron's ``--rotary-interleaved`` (and Meta's original Llama weights) rotate
    channel pairs ``(2i, 2i+1)``; epochal rotates ``(i, i + r/2)``. Reordering each
    head's first ``r`` rows as ``[0, 2, 4, ..., 1, 3, 5, ...]`` in both q and k gives
    the same attention scores. Rows past ``r`` (partial rotary) stay in place.

    Args:
        rows: ``[heads * d, ...]`` (weight or bias of q or k).
        num_heads: heads in ``rows``.
        head_dim: ``d``.
        rotary_dim: ``r`` (even).
    """
    perm = torch.cat(
        [
            torch.arange(0, rotary_dim, 2),
            torch.arange(1, rotary_dim, 2),
            torch.arange(rotary_dim, head_dim),
        ]
    )
    rest = rows.shape[1:]
    return rows.reshape(num_heads, head_dim, *rest)[:, perm].reshape(-1, *rest).contiguous()


# ----------------------------------------------------------------------------- sharding
_COLUMN = re.compile(r"(linear_qkv|linear_fc1)\.(weight|bias)$")
_ROW = re.compile(r"(linear_proj|linear_fc2)\.weight$")
_VOCAB = ("embedding.word_embeddings.weight", "output_layer.weight", "output_layer.bias")


def shard_kind(name: str, *, swiglu: bool) -> str:
    """Sharding kind of a Megatron-Core (local-spec) parameter name; see the module docstring."""
    if name in _VOCAB:
        return "vocab"
    m = _COLUMN.search(name)
    if m:
        return "glu" if swiglu and m.group(1) == "linear_fc1" else "column"
    if _ROW.search(name):
        return "row"
    return "replicated"


def split_tp(tensor: torch.Tensor, kind: str, tp: int) -> list[torch.Tensor]:
    """Split a full tensor into ``tp`` shards of the given kind.

    Raises:
        ConversionError: the dimension is not divisible by ``tp``.
    """
    if kind == "replicated" or tp == 1:
        return [tensor] * tp
    dim = 1 if kind == "row" else 0
    size = tensor.shape[dim]
    if size % (2 * tp if kind == "glu" else tp):
        raise ConversionError(
            f"dimension {dim} of size {size} is not divisible by tensor_parallel={tp}"
        )
    if kind == "glu":
        gate, up = tensor.chunk(2, dim=0)
        return [torch.cat([g, u], dim=0) for g, u in zip(gate.chunk(tp), up.chunk(tp))]
    return [t.contiguous() for t in tensor.chunk(tp, dim=dim)]


def merge_tp(shards: Sequence[torch.Tensor], kind: str, name: str = "") -> torch.Tensor:
    """Inverse of :func:`split_tp`.

    Raises:
        ConversionError: shards of different shapes, or replicated shards that differ
            between ranks.
    """
    if len(shards) == 1:
        return shards[0]
    for r, t in enumerate(shards[1:], start=1):  # Megatron's shards of a tensor are equal
        if not isinstance(t, torch.Tensor) or t.shape != shards[0].shape:
            raise ConversionError(
                f"{name}: tensor-parallel shards disagree: rank 0 has shape "
                f"{tuple(shards[0].shape)}, rank {r} has "
                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}"
            )
    if kind == "replicated":
        for r, t in enumerate(shards[1:], start=1):
            if t.shape != shards[0].shape or not torch.equal(t, shards[0]):
                raise ConversionError(
                    f"{name}: replicated tensor differs between tensor-parallel ranks 0 and {r}"
                )
        return shards[0]
    if kind == "glu":
        halves = [t.chunk(2, dim=0) for t in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(list(shards), dim=1 if kind == "row" else 0)


# ----------------------------------------------------------------------------- names
# Legacy (pre-Megatron-Core) and Transformer-Engine-spec names -> Megatron-Core local-spec names.
_LEGACY_LAYER = [
    (r"^(?:input_norm|input_layernorm)\.", "input_layernorm."),
    (r"^(?:self_attention|attention)\.query_key_value\.", "self_attention.linear_qkv."),
    (r"^(?:self_attention|attention)\.dense\.", "self_attention.linear_proj."),
    (r"^(?:post_attention_norm|post_attention_layernorm)\.", "pre_mlp_layernorm."),
    (r"^mlp\.dense_h_to_4h\.", "mlp.linear_fc1."),
    (r"^mlp\.dense_4h_to_h\.", "mlp.linear_fc2."),
]
_TE_LAYER = [
    (r"^self_attention\.linear_qkv\.layer_norm_(weight|bias)$", r"input_layernorm.\1"),
    (r"^mlp\.linear_fc1\.layer_norm_(weight|bias)$", r"pre_mlp_layernorm.\1"),
]
_LEGACY_GLOBAL = {
    "language_model.embedding.word_embeddings.weight": "embedding.word_embeddings.weight",
    "language_model.embedding.position_embeddings.weight": "embedding.position_embeddings.weight",
    "language_model.output_layer.weight": "output_layer.weight",
    "word_embeddings_for_head.weight": "output_layer.weight",
    # legacy BertModel (megatron/legacy/model/bert_model.py)
    "language_model.embedding.tokentype_embeddings.weight": "embedding.tokentype_embeddings.weight",
    "language_model.pooler.dense.weight": "pooler.dense.weight",
    "language_model.pooler.dense.bias": "pooler.dense.bias",
    "lm_head.bias": "output_layer.bias",
    "lm_head.layernorm.weight": "lm_head.layer_norm.weight",
    "lm_head.layernorm.bias": "lm_head.layer_norm.bias",
}
_LEGACY_LAYER_PREFIX = re.compile(r"^language_model\.(?:encoder|transformer)\.layers\.(\d+)\.(.*)$")
_LEGACY_FINAL = re.compile(
    r"^language_model\.(?:encoder|transformer)\.(?:final_norm|final_layernorm)\.(.*)$"
)
_MCORE_LAYER = re.compile(r"^(?:decoder|encoder)\.layers\.(\d+)\.(.*)$")
_MCORE_FINAL = re.compile(r"^(?:decoder|encoder)\.final_layernorm\.(.*)$")
# Megatron-Core BertModel's own modules (its transformer block is ``encoder``, GPT's ``decoder``).
_BERT_GLOBAL = (
    "embedding.tokentype_embeddings.",
    "lm_head.dense.",
    "lm_head.layer_norm.",
    "pooler.dense.",
    "binary_head.",
)
_BERT_MARKERS = re.compile(
    r"^(?:encoder\.|lm_head\.|pooler\.|binary_head\.|output_layer\.bias$"
    r"|(?:language_model\.)?embedding\.tokentype_embeddings\.|language_model\.pooler\.)"
)


def megatron_model_type(names: Iterable[str]) -> str:
    """``"bert"`` or ``"gpt"``: which Megatron model the tensor names of a checkpoint come from.

    Pass the names of every rank file: a BERT pipeline stage in the legacy
    (``language_model.*``) naming without token types shows its BERT modules
    (``lm_head``, ``binary_head``, ``pooler``) on the last stage only. A name that
    only ``BertModel`` has (``encoder.layers.*``, ``lm_head.*``, ``output_layer.bias``,
    token-type embeddings, ``pooler``, ``binary_head``) means BERT.
    """
    return "bert" if any(_BERT_MARKERS.match(n) for n in names) else "gpt"


def to_local_names(state: dict[str, object], source: str) -> dict[str, object]:
    """Rename one rank's flat state dict to Megatron-Core local-spec names.

    Accepts Megatron-Core names (local or Transformer-Engine spec) and the
    legacy ``language_model.*`` names (``encoder``/``transformer``,
    ``input_norm``/``input_layernorm``, ``query_key_value``, ``dense_h_to_4h``, ...),
    of ``GPTModel`` and ``BertModel``. A BERT's transformer block (``encoder.*``)
    gets GPT's ``decoder.*`` names, so one mapping serves both (tell them apart
    with :func:`megatron_model_type` first); BERT's own modules keep Megatron-Core's
    names (``lm_head.dense``, ``lm_head.layer_norm``, ``output_layer.bias``,
    ``pooler.dense``, ``binary_head``, ``embedding.tokentype_embeddings``).
    ``_extra_state`` entries (TE/FP8 metadata) and rotary ``inv_freq`` buffers are dropped.

    Raises:
        ConversionError: a name matches none of these schemes.
    """
    out: dict[str, object] = {}
    for name, value in state.items():
        if name.endswith(("_extra_state", "inv_freq")):  # TE/FP8 metadata, rotary buffers
            continue
        new = None
        if name in _LEGACY_GLOBAL:
            new = _LEGACY_GLOBAL[name]
        elif m := _LEGACY_LAYER_PREFIX.match(name):
            tail = m.group(2)
            for pattern, repl in _LEGACY_LAYER:
                tail = re.sub(pattern, repl, tail)
            new = f"decoder.layers.{m.group(1)}.{tail}"
        elif m := _LEGACY_FINAL.match(name):
            new = f"decoder.final_layernorm.{m.group(1)}"
        elif m := _MCORE_LAYER.match(name):
            tail = m.group(2)
            for pattern, repl in _TE_LAYER:
                tail = re.sub(pattern, repl, tail)
            new = f"decoder.layers.{m.group(1)}.{tail}"
        elif m := _MCORE_FINAL.match(name):
            new = f"decoder.final_layernorm.{m.group(1)}"
        elif name.startswith(("embedding.", "output_layer.", *_BERT_GLOBAL)):
            new = name
        if new is None:
            raise ConversionError(f"{source}: unrecognized Megatron tensor name {name!r}")
        if new in out:
            raise ConversionError(f"{source}: two tensors map to {new!r} (mixed naming schemes?)")
        out[new] = value
    return out
