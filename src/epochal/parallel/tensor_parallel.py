"""Tensor and sequence parallelism for the model family (GPT, BERT/ESM, T5) with DTensor plans.

Megatron-LM's layout, expressed with ``torch.distributed.tensor.parallel`` styles
on the 1-D tensor-parallel mesh (``mesh["tp"]``):

====================================  ==========================  ======================================
module                                 without sequence parallel   with sequence parallel
====================================  ==========================  ======================================
``tok_embeddings`` (vocab-parallel)    rows sharded, all-reduce    rows sharded, reduce-scatter (seq)
``pos_embeddings`` (learned)           replicated                  replicated, looked up for the local
                                                                   sequence slice
``attention_norm``/``ffn_norm``/       replicated (plain)          ``SequenceParallel`` (DTensor,
``norm``                                                           sequence-sharded activations)
``attention.wq``                       column-parallel             all-gather (seq) + column-parallel
``attention.wk``/``wv``                column-parallel, or         same
                                       replicated (see below)
``attention.q_layernorm``/             replicated weight, each     same
``k_layernorm`` (QK-norm)              rank's heads; gradient
                                       summed over the group
``attention.wo``                       row-parallel, all-reduce    row-parallel, reduce-scatter (seq)
``mlp.fc1``/``w1``/``w3``              column-parallel             all-gather (seq) + column-parallel
``mlp.fc2``/``w2``                     row-parallel, all-reduce    row-parallel, reduce-scatter (seq)
``output``                             column-parallel (vocab)     all-gather (seq) + column-parallel
====================================  ==========================  ======================================

Dropout (embedding and residual) runs on whatever the residual stream is: the
full sequence without sequence parallelism, this rank's sequence slice with it.
Under sequence parallelism a later pipeline stage therefore receives the slice
``[b, s / tp, hidden]``; a pre-hook gives it the positions of the whole sequence
(RoPE rotates the gathered ``s`` tokens), unless ``position_ids`` are passed.

Attention variants: with ``num_query_groups % tp == 0`` (MHA, and GQA with
enough groups) the key/value projections are column-parallel like the queries.
When the groups divide ``tp`` instead (multi-query attention, or GQA with fewer
groups than ranks; Megatron-LM refuses this case) the key/value projections are
*replicated*: every rank holds the whole ``wk``/``wv`` (``Replicate`` DTensors),
computes all groups and keeps the one its query heads use (query head ``i``
uses group ``i // (heads / groups)``, and each rank's heads fall in exactly one
group). Their gradients are made correct by declaring the kept output's
gradient ``Partial`` (each rank back-propagates only its heads' share), so
DTensor sums the shares over the tensor-parallel group, as Megatron does for
sequence-parallel norm weights. ALiBi slopes are sliced to the local heads.

QK-norm (``qk_layernorm``): the ``[head_dim]`` norm weights are ``Replicate``
DTensors and each rank's query/key heads enter as a shard of the head dimension
(torch's ``SequenceParallel`` style on dimension 2 of ``[b, s, heads, head_dim]``),
so every rank normalizes its own heads and DTensor sums the weight gradients over
the tensor-parallel group. With replicated key/value projections, ranks that share
a group each normalize the same keys and contribute their own heads' share of the
gradient, which the same sum completes. A sliding window needs nothing here: it
masks keys along the sequence, which tensor parallelism does not split inside attention.

Output head: with ``loss_parallel`` the logits stay sharded over the vocabulary
(``[b, s, V/tp]`` local tensors) for
:func:`epochal.parallel.loss.vocab_parallel_cross_entropy`; without it they are
gathered (``[b, s, V]``, identical on every rank). Tied embeddings: the input
embedding and the output head shard the same ``[V, h]`` matrix the same way
(rows), so the parameter stays one (re-tied after the plan).

The model's outputs (the logits, and BERT's and ESM-2's outputs) leave as this rank's
local tensors that are not views (:func:`local_output`): ``DTensor.to_local`` returns
a view of the shard, and FSDP2 (data parallelism over the tensor-parallel model)
registers its pre-backward hook on the root module's output, a hook that an in-place
op on a view would drop.

Dropout: heads (and, with sequence parallelism, whole blocks and the embedding
output) draw their masks from a per-rank stream, replicated activations from the
stream shared by the group (:mod:`epochal.parallel.rng`, Megatron's RNG tracker).

T5 (:func:`_t5_top_plan`): the same block plan for the encoder blocks, plus the
decoder blocks' ``cross_attention`` sharded by heads like the self-attention
(queries from the decoder, keys/values from the encoder output, gathered over the
sequence first under sequence parallelism); the relative bias tables stay
replicated and each rank uses its heads' columns.

Requirements (checked by :meth:`epochal.parallel.dims.ParallelDims.validate`):
``tp`` divides the heads, the MLP width and the padded vocabulary; with
sequence parallelism it divides the sequence length.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

from epochal.model.config import ModelConfig
from epochal.model.layers.moe import MoEMLP
from epochal.parallel.rng import apply_dropout_rng_regions
from epochal.parallel.tensor_parallel_moe import finish_moe_tensor_parallel, moe_mlp_plan

__all__ = ["apply_tensor_parallel", "kv_heads_replicated", "local_output", "share_relative_bias"]


class _NotAView(torch.autograd.Function):
    """Identity whose output is a new tensor on the same storage, not a view of the input."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        return tensor.detach()  # shares storage and version counter; ``_base`` is None

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        return grad


def local_output(tensor: DTensor) -> torch.Tensor:
    """This rank's shard of ``tensor`` as a plain tensor that is not a view (no copy).

    ``DTensor.to_local()`` returns a view of the local shard. FSDP2 registers its
    pre-backward hook on a wrapped module's outputs and warns when one is a view,
    because an in-place op on a view replaces the node that holds the hook (and
    the backward then skips the parameters' all-gather). The result here shares
    the shard's storage and version counter, so it costs nothing, and the gradient
    flows back through ``to_local``'s own backward.

    Args:
        tensor: a DTensor of any shape.

    Returns:
        The local shard (``tensor.to_local()``'s shape, dtype and values).
    """
    return _NotAView.apply(tensor.to_local())


class _OutputHead(ColwiseParallel):
    """Column-parallel output head whose local logits are not a view (:func:`local_output`)."""

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):  # noqa: ANN001, ANN205, ARG004 - torch's signature
        if outputs.placements != output_layouts:  # gathered logits: needed at once by the loss
            outputs = outputs.redistribute(placements=output_layouts)
        return local_output(outputs) if use_local_output else outputs


def kv_heads_replicated(config: ModelConfig, tp: int) -> bool:
    """True if the key/value projections are replicated (the groups do not split over ``tp``)."""
    return config.num_kv_heads % tp != 0


class _ReplicatedParameterStyle(ParallelStyle):
    """A style whose module keeps whole (``Replicate``) parameters on every rank."""

    def _replicate_parameters(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        for p_name, param in list(module.named_parameters(recurse=False)):
            replicated = distribute_tensor(
                param, mesh, [Replicate()], src_data_rank=self.src_data_rank
            )
            module.register_parameter(p_name, nn.Parameter(replicated))


class ReplicatedGroupProjection(_ReplicatedParameterStyle):
    """A replicated ``nn.Linear`` whose output keeps only this rank's key/value group.

    Weights and biases become ``Replicate`` DTensors. The input is taken as
    replicated (a plain tensor or a DTensor). The output (a local tensor)
    holds the ``group_width`` columns ``[g * width, (g + 1) * width)`` where
    ``g = tp_rank * groups // tp``; its gradient is declared ``Partial`` so that
    the weight, bias and input gradients are summed over the group.

    Args:
        num_groups: key/value groups of the full projection (divides ``tp``).
        head_dim: width of one group's output (channels).
    """

    def __init__(self, num_groups: int, head_dim: int) -> None:
        super().__init__()
        self.num_groups = num_groups
        self.head_dim = head_dim

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        tp = device_mesh.size()
        group = device_mesh.get_local_rank() * self.num_groups // tp
        width = self.head_dim

        def input_fn(mod: nn.Module, inputs: tuple[Any, ...], mesh: DeviceMesh) -> tuple[Any, ...]:
            x = inputs[0]
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
            elif x.placements != (Replicate(),):
                x = x.redistribute(mesh, [Replicate()])
            return (x, *inputs[1:])

        def output_fn(mod: nn.Module, output: DTensor, mesh: DeviceMesh) -> torch.Tensor:
            local = output.to_local(grad_placements=[Partial()])
            return local[..., group * width : (group + 1) * width]

        return distribute_module(
            module, device_mesh, self._replicate_parameters, input_fn, output_fn
        )


class SequenceShardedPositionEmbedding(_ReplicatedParameterStyle):
    """A replicated ``nn.Embedding`` of positions looked up for this rank's sequence slice.

    Used for learned absolute positions under sequence parallelism: the
    ``position_ids`` ``[b or 1, s]`` (the same on every rank) are sharded on the
    sequence dimension, so the output is the local ``[b or 1, s / tp, h]``
    slice that is added to the sequence-sharded token embeddings. The weight
    gradient is summed over the tensor-parallel ranks by DTensor.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def input_fn(mod: nn.Module, inputs: tuple[Any, ...], mesh: DeviceMesh) -> tuple[Any, ...]:
            ids = DTensor.from_local(inputs[0], mesh, [Replicate()], run_check=False)
            return (ids.redistribute(mesh, [Shard(1)]), *inputs[1:])

        def output_fn(mod: nn.Module, output: DTensor, mesh: DeviceMesh) -> torch.Tensor:
            return output.to_local()

        return distribute_module(
            module, device_mesh, self._replicate_parameters, input_fn, output_fn
        )


def _full_sequence_positions(tp: int) -> Any:
    """Forward pre-hook of a later pipeline stage under sequence parallelism.

    Such a stage receives this rank's sequence slice ``[b, s / tp, hidden]`` of the
    residual stream, so the model's default positions (``0 .. s/tp - 1``) would be
    wrong for RoPE, whose attention runs on the gathered ``s`` tokens. When the
    caller passes no ``position_ids``, supply ``0 .. s - 1`` (``[1, s]``).
    """

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if kwargs.get("position_ids") is None and (len(args) < 2 or args[1] is None):
            x = args[0] if args else kwargs["tokens"]
            kwargs["position_ids"] = torch.arange(x.shape[1] * tp, device=x.device).unsqueeze(0)
        return args, kwargs

    return hook


def _block_plan(
    config: ModelConfig, tp: int, sequence_parallel: bool, *, cross: bool = False
) -> dict[str, ParallelStyle]:
    seq = Shard(1)
    row_out = seq if sequence_parallel else Replicate()
    plan: dict[str, ParallelStyle] = {}
    if sequence_parallel:
        # Post-LN blocks feed the norms' outputs into the residual stream, which is local.
        local = config.transformer_block_type == "post_ln"
        plan["attention_norm"] = SequenceParallel(use_local_output=local)
        plan["ffn_norm"] = SequenceParallel(use_local_output=local)
        plan["attention"] = PrepareModuleInput(
            input_layouts=(seq, None, None), desired_input_layouts=(Replicate(), None, None)
        )
        plan["mlp"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
    plan["attention.wq"] = ColwiseParallel()
    if kv_heads_replicated(config, tp):
        plan["attention.wk"] = ReplicatedGroupProjection(config.num_kv_heads, config.head_dim)
        plan["attention.wv"] = ReplicatedGroupProjection(config.num_kv_heads, config.head_dim)
    else:
        plan["attention.wk"] = ColwiseParallel()
        plan["attention.wv"] = ColwiseParallel()
    if config.qk_layernorm:
        # each rank normalizes its own heads ([b, s, heads/tp, head_dim], "sharded" on dim 2)
        # with the whole [head_dim] weight; its gradient is summed over the group
        plan["attention.q_layernorm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        plan["attention.k_layernorm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
    plan["attention.wo"] = RowwiseParallel(output_layouts=row_out)
    if cross:  # a decoder block's cross-attention (T5): sharded by heads like the self-attention
        if sequence_parallel:
            plan["cross_attention_norm"] = SequenceParallel()
            # queries from the decoder's slice, keys/values from the whole encoder output
            plan["cross_attention"] = PrepareModuleInput(
                input_layouts=(seq, None, None),
                desired_input_layouts=(Replicate(), None, None),
                input_kwarg_layouts={"context": seq},
                desired_input_kwarg_layouts={"context": Replicate()},
            )
        for name in ("wq", "wk", "wv"):
            plan[f"cross_attention.{name}"] = plan[f"attention.{name}"]
        plan["cross_attention.wo"] = RowwiseParallel(output_layouts=row_out)
    if config.activation in ("swiglu", "gated_gelu"):
        plan["mlp.w1"] = ColwiseParallel()
        plan["mlp.w3"] = ColwiseParallel()
        plan["mlp.w2"] = RowwiseParallel(output_layouts=row_out)
    else:
        plan["mlp.fc1"] = ColwiseParallel()
        plan["mlp.fc2"] = RowwiseParallel(output_layouts=row_out)
    return plan


def _gpt_top_plan(
    model: nn.Module, sequence_parallel: bool, loss_parallel: bool
) -> dict[str, ParallelStyle]:
    """The modules outside the blocks: embeddings, final norm, output head (GPT's table above)."""
    seq = Shard(1)
    top: dict[str, ParallelStyle] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=seq if sequence_parallel else Replicate()
        )
    if model.pos_embeddings is not None and sequence_parallel:
        top["pos_embeddings"] = SequenceShardedPositionEmbedding()
    if model.norm is not None and sequence_parallel:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = _OutputHead(
            input_layouts=seq if sequence_parallel else Replicate(),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=True,
        )
    if sequence_parallel and getattr(model, "head", None) is not None:
        # a classifier head (replicated) reads its pooled position / every position whole
        top["head"] = PrepareModuleInput(
            input_layouts=(seq, None),
            desired_input_layouts=(Replicate(), None),
            use_local_output=True,
        )
    return top


def _bert_top_plan(
    model: nn.Module, sequence_parallel: bool, loss_parallel: bool
) -> dict[str, ParallelStyle]:
    """GPT's plan plus BERT's own modules (Megatron's layout for them).

    - ``tokentype_embeddings``: replicated; under sequence parallelism looked up
      for this rank's sequence slice (like learned positions);
    - ``embedding_norm`` (post-LN), ``lm_head.dense`` / ``lm_head.norm``: replicated;
      ``SequenceParallel`` under sequence parallelism (per-token, gradients summed);
    - ``output`` returns a DTensor so that ``lm_head.bias`` (sharded like the
      vocabulary, :func:`_shard_lm_head_bias`) adds shard to shard; the model's
      outputs are turned back into local tensors by a forward hook;
    - ``pooler`` / ``binary_head``: replicated; under sequence parallelism the
      pooler's input is gathered first (it reads the first token);
    - a fine-tuning ``head`` (:mod:`epochal.model.heads`): replicated (every rank
      computes the same predictions); under sequence parallelism its input is
      gathered first (it averages or convolves over the whole sequence).
    """
    seq = Shard(1)
    top = _gpt_top_plan(model, sequence_parallel, loss_parallel)
    if model.output is not None:
        top["output"] = ColwiseParallel(
            input_layouts=seq if sequence_parallel else Replicate(),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=False,
        )
    if not sequence_parallel:
        return top
    if model.tokentype_embeddings is not None:
        top["tokentype_embeddings"] = SequenceShardedPositionEmbedding()
    if model.embedding_norm is not None:
        top["embedding_norm"] = SequenceParallel(use_local_output=True)
    if model.lm_head is not None:
        top["lm_head.dense"] = SequenceParallel()
        top["lm_head.norm"] = SequenceParallel()
    if model.pooler is not None:
        top["pooler"] = PrepareModuleInput(
            input_layouts=(seq,), desired_input_layouts=(Replicate(),), use_local_output=True
        )
    if getattr(model, "head", None) is not None:
        top["head"] = PrepareModuleInput(
            input_layouts=(seq, None),
            desired_input_layouts=(Replicate(), None),
            use_local_output=True,
        )
    return top


def _restore_trainable(model: nn.Module, tp_mesh: DeviceMesh, loss_parallel: bool) -> None:
    """Re-freeze what the model freezes (the plan's new parameters default to trainable)."""
    model.apply_trainable()


def _shard_lm_head_bias(model: nn.Module, tp_mesh: DeviceMesh, loss_parallel: bool) -> None:
    """``lm_head.bias`` ``[V]`` as a DTensor placed like the logits' vocabulary dimension."""
    if getattr(model, "lm_head", None) is None:
        return
    placement = Shard(0) if loss_parallel else Replicate()
    bias = distribute_tensor(model.lm_head.bias.data, tp_mesh, [placement])
    model.lm_head.register_parameter("bias", nn.Parameter(bias))
    model.register_forward_hook(_local_outputs)


def _local_outputs(module: nn.Module, args: Any, output: Any) -> Any:
    """Forward hook: DTensor outputs (or tuple items) -> this rank's local tensors (not views)."""
    if isinstance(output, tuple):
        return tuple(local_output(o) if isinstance(o, DTensor) else o for o in output)
    return local_output(output) if isinstance(output, DTensor) else output


def _t5_top_plan(
    model: nn.Module, sequence_parallel: bool, loss_parallel: bool
) -> dict[str, ParallelStyle]:
    """T5's modules outside the blocks (GPT's layout, for both stacks).

    - ``tok_embeddings``: vocabulary-parallel (rows), shared by the encoder and the
      decoder; all-reduced, or reduce-scattered over the sequence with sequence
      parallelism (then ``pos_embeddings`` is looked up for the local slice);
    - ``encoder_norm`` / ``decoder_norm``: replicated, ``SequenceParallel`` under
      sequence parallelism; the encoder output then stays sequence-sharded and each
      cross-attention gathers it (its keys and values need every encoder position);
    - ``output`` (and its bias): column-parallel over the vocabulary, tied to the
      embedding rows like GPT's head;
    - the relative bias tables: see :func:`share_relative_bias`.
    """
    seq = Shard(1)
    top: dict[str, ParallelStyle] = {
        "tok_embeddings": RowwiseParallel(
            input_layouts=Replicate(), output_layouts=seq if sequence_parallel else Replicate()
        ),
        "output": _OutputHead(
            input_layouts=seq if sequence_parallel else Replicate(),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=True,
        ),
    }
    if sequence_parallel:
        if model.pos_embeddings is not None:
            top["pos_embeddings"] = SequenceShardedPositionEmbedding()
        top["encoder_norm"] = SequenceParallel()
        top["decoder_norm"] = SequenceParallel()
    return top


def share_relative_bias(model: nn.Module, tp_mesh: DeviceMesh, loss_parallel: bool) -> None:
    """T5's relative bias tables ``[buckets, heads]``: replicated, each rank uses its heads.

    The tables are small, so every rank keeps them whole (plain tensors) and computes
    the bias of all heads once per forward; each self-attention takes its slice
    (``Attention.bias_heads``). A rank's gradient then covers only its own heads'
    columns, so a gradient hook sums it over the tensor-parallel group (each
    micro-batch's contribution, before accumulation) — Megatron scatters the bias
    to the ranks and all-reduces the same way.
    """
    tp = tp_mesh.size()
    per_rank = model.config.num_attention_heads // tp
    first = tp_mesh.get_local_rank() * per_rank
    heads = slice(first, first + per_rank)
    group = tp_mesh.get_group()
    for block in model.layers.values():
        block.attention.bias_heads = heads
    for table in (model.encoder_relative_bias, model.decoder_relative_bias):
        if table is None:
            continue

        def sum_over_tp(grad: torch.Tensor) -> torch.Tensor:
            grad = grad.clone()
            torch.distributed.all_reduce(grad, group=group)
            return grad

        table.weight.register_hook(sum_over_tp)


#: model type -> the plan of its modules outside the transformer blocks.
TOP_PLANS: dict[str, Callable[[nn.Module, bool, bool], dict[str, ParallelStyle]]] = {
    "gpt": _gpt_top_plan,
    "bert": _bert_top_plan,
    "esm": _bert_top_plan,
    "t5": _t5_top_plan,
}
#: model type -> steps run after its top plan (``fn(model, tp_mesh, loss_parallel)``).
TOP_PLAN_FINISH: dict[str, tuple[Callable[[nn.Module, DeviceMesh, bool], None], ...]] = {
    "bert": (_shard_lm_head_bias, _restore_trainable),
    "esm": (_shard_lm_head_bias, _restore_trainable),
    "t5": (share_relative_bias,),
}


def parallelize_keeping_ties(
    model: nn.Module, tp_mesh: DeviceMesh, plan: dict[str, ParallelStyle]
) -> None:
    """``parallelize_module`` that keeps a tied output head one parameter with the embedding."""
    tied = (
        model.config.tie_embeddings
        and model.tok_embeddings is not None
        and model.output is not None
        and model.output.weight is model.tok_embeddings.weight
    )
    parallelize_module(model, tp_mesh, plan)
    if tied:
        model.output.weight = model.tok_embeddings.weight


def full_sequence_positions(tp: int) -> Any:
    """The forward pre-hook that gives a later pipeline stage under SP the whole sequence's positions."""
    return _full_sequence_positions(tp)


def apply_tensor_parallel(
    model: nn.Module,
    tp_mesh: DeviceMesh,
    *,
    sequence_parallel: bool = False,
    loss_parallel: bool = True,
) -> nn.Module:
    """Shard ``model`` (a :class:`~epochal.model.GPTModel` or a pipeline stage of one) in place.

    Call it on a materialized, initialized model (every rank with the same
    values: parameters are scattered from tensor-parallel rank 0).

    Args:
        model: the model or stage (``tok_embeddings``/``norm``/``output`` may be None).
        tp_mesh: the 1-D tensor-parallel mesh.
        sequence_parallel: shard activations on the sequence dimension between
            the tensor-parallel regions (see the module docstring).
        loss_parallel: leave the logits sharded over the vocabulary (``[b, s, V/tp]``)
            instead of gathering them (``[b, s, V]``).

    Returns:
        ``model`` (modified in place).
    """
    tp = tp_mesh.size()
    if tp == 1:
        return model
    config: ModelConfig = model.config
    top = TOP_PLANS[config.type](model, sequence_parallel, loss_parallel)
    parallelize_keeping_ties(model, tp_mesh, top)
    for finish in TOP_PLAN_FINISH.get(config.type, ()):
        finish(model, tp_mesh, loss_parallel)
    if sequence_parallel and model.tok_embeddings is None:
        model.register_forward_pre_hook(_full_sequence_positions(tp), with_kwargs=True)
    plan = _block_plan(config, tp, sequence_parallel)
    cross_plan = _block_plan(config, tp, sequence_parallel, cross=True)
    attention_plan = {k: v for k, v in plan.items() if k != "mlp" and not k.startswith("mlp.")}
    heads_per_rank = config.num_attention_heads // tp
    first_head = tp_mesh.get_local_rank() * heads_per_rank
    for block in model.layers.values():
        has_cross = getattr(block, "cross_attention", None) is not None
        is_moe = isinstance(getattr(block, "mlp", None), MoEMLP)
        if is_moe:  # the MLP's own plan, over the experts this block holds
            block_plan = {
                **attention_plan,
                **moe_mlp_plan(
                    config, sequence_parallel, [n for n, _ in block.mlp.experts.named_children()]
                ),
            }
        else:
            block_plan = cross_plan if has_cross else plan
        parallelize_module(block, tp_mesh, block_plan)
        if is_moe:
            finish_moe_tensor_parallel(block, tp_mesh)
        attention = block.attention
        if attention.use_alibi:
            attention.alibi_heads = slice(first_head, first_head + heads_per_rank)
            attention.init_buffers()
    apply_dropout_rng_regions(model, tp_mesh.get_local_rank(), sequence_parallel=sequence_parallel)
    return model
