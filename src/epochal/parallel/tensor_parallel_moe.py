"""Tensor (and sequence) parallelism of the mixture-of-experts MLP, Megatron-Core's layout.

Megatron-Core without expert parallelism (expert tensor parallel size = tensor
parallel size, the all-gather token dispatcher) on the tensor-parallel mesh:

==================================  ================================================
module (inside a block's ``mlp``)    layout
==================================  ================================================
the MoE layer's input               the whole sequence on every rank: replicated, or
                                    all-gathered over the sequence first (sequence
                                    parallelism), as the all-gather dispatcher does
``router``                          replicated: every rank routes every token, so the
                                    routing (and any token dropping) is the same on
                                    every rank
``experts.{e}.w1``/``w3``/``fc1``   column-parallel (each rank ``moe_ffn_hidden_size / tp``
                                    of the inner width)
``experts.{e}.w2``/``fc2``          row-parallel, output left a partial sum
``shared_expert.*``                 sharded like the experts (like the dense MLP)
``shared_expert_gate``              replicated
the MoE layer's output              one reduction of the summed (weighted routed +
                                    gated shared) partial outputs: all-reduce, or
                                    reduce-scatter over the sequence
==================================  ================================================

One reduction per layer, not one per expert: each rank's routed output is
``sum_j w[t, j] * y_r(x_t)`` where ``y_r`` is its row-parallel shard's partial
product, and the shared expert's ``sigmoid(gate(x)) * shared_r(x)`` is added; the
sum of these over the ranks is exactly the layer's output (the weights and the
gate are the same on every rank, so they distribute over the sum), with only the
order of the floating-point additions changed. The backward mirrors it: the
gradient of the layer's input (through the experts, the router and the gate) is
accumulated as a partial sum on each rank and summed once, by the all-reduce (or
reduce-scatter) of the layer's input; the router's and the gate's weight
gradients are partial sums (``Partial`` DTensor gradients) summed once per step
in rank order with the other replicated tensor-parallel weights
(:func:`epochal.parallel.ordered_reduce.finalize_partial_grads`). A row-parallel
bias (``add_bias_linear``) is a ``Replicate`` DTensor that DTensor adds to the partial
output as ``bias / tp`` on every rank, so the sum holds it once (exact for a power-of-two ``tp``).

Auxiliary losses: the balance and z-losses come from the replicated router, so
every rank computes the same values and records the same tokens per expert (the
records equal one process's). Their gradient, though, is the same on every rank
and would be counted once per rank by the sums above, so only tensor-parallel
rank 0 back-propagates it (the other ranks' layers get zero coefficients; their
records are unchanged, the coefficients only weight the gradient).

Requirements (:func:`epochal.parallel.model_support.check_model_layout`):
``tp`` divides ``moe_ffn_hidden_size`` (or ``ffn_hidden_size`` when unset) and
``moe_shared_expert_intermediate_size``.
"""

from __future__ import annotations

from collections.abc import Iterable
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
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.distributed.tensor.parallel.style import ParallelStyle

from epochal.model.config import ModelConfig
from epochal.model.layers.moe import MoEMLP

__all__ = ["moe_mlp_plan", "finish_moe_tensor_parallel"]


class _ReplicateWithPartialGrad(torch.autograd.Function):
    """A local tensor, the same on every rank, as a ``Replicate`` DTensor whose gradient stays partial.

    The backward hands back this rank's share of the input gradient without summing
    it over the group (the MoE layer's input sums all shares once). A ``Replicate``
    gradient (the same full value on every rank) is kept by rank 0 only.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mesh: DeviceMesh) -> DTensor:
        ctx.mesh = mesh
        return DTensor.from_local(x, mesh, [Replicate()], run_check=False)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> tuple[torch.Tensor, None]:
        if not isinstance(grad, DTensor):
            return grad, None
        local = grad.to_local()
        if grad.placements[0].is_partial():
            return local, None
        if ctx.mesh.get_local_rank() == 0:
            return local, None
        return torch.zeros_like(local), None


def _replicate_partial_grad(x: Any, mesh: DeviceMesh) -> DTensor:
    if isinstance(x, DTensor):
        return x
    return _ReplicateWithPartialGrad.apply(x, mesh)


class _ColwiseLocalInput(ColwiseParallel):
    """Column-parallel on the (replicated) local tokens; the input gradient is left partial."""

    def __init__(self) -> None:
        super().__init__(use_local_output=True)

    @staticmethod
    def _prepare_input_fn(
        input_layouts: Any, desired_input_layouts: Any, mod: nn.Module, inputs: tuple, mesh: Any
    ) -> tuple:
        return (_replicate_partial_grad(inputs[0], mesh), *inputs[1:])


class _RowwisePartialOutput(RowwiseParallel):
    """Row-parallel; the output is this rank's partial sum (a local tensor, no reduction).

    The bias (a ``Replicate`` DTensor) enters the partial output as ``bias / tp`` on
    every rank (DTensor's rule for adding a replicated tensor to a partial one).
    """

    def __init__(self) -> None:
        super().__init__(output_layouts=Partial(), use_local_output=True)

    @staticmethod
    def _prepare_output_fn(
        output_layouts: Any, use_local_output: bool, mod: nn.Module, outputs: DTensor, mesh: Any
    ) -> torch.Tensor:
        if not outputs.placements[0].is_partial():
            raise RuntimeError(
                f"a row-parallel expert gave {outputs.placements}, not a partial sum"
            )
        return outputs.to_local(grad_placements=[Replicate()])


class _ReplicatedPartialGrad(ParallelStyle):
    """A replicated ``nn.Linear`` (router, shared-expert gate) on the replicated local tokens.

    Its weight is a ``Replicate`` DTensor. The output's gradient is declared
    ``Partial``: each rank back-propagates the share that its partial expert outputs
    give (plus, on rank 0, the auxiliary losses'), so the weight gradient is summed
    over the group once and the input gradient joins the layer's partial input gradient.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def partition(name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
            for p_name, param in list(mod.named_parameters(recurse=False)):
                value = distribute_tensor(
                    param, mesh, [Replicate()], src_data_rank=self.src_data_rank
                )
                mod.register_parameter(p_name, nn.Parameter(value, param.requires_grad))

        def input_fn(mod: nn.Module, inputs: tuple, mesh: DeviceMesh) -> tuple:
            return (_replicate_partial_grad(inputs[0], mesh), *inputs[1:])

        def output_fn(mod: nn.Module, output: DTensor, mesh: DeviceMesh) -> torch.Tensor:
            return output.to_local(grad_placements=[Partial()])

        return distribute_module(module, device_mesh, partition, input_fn, output_fn)


class _MoELayerIO(ParallelStyle):
    """The MoE layer's input made whole and replicated, its partial output reduced once.

    Input: a local tensor (replicated, or this rank's sequence slice under sequence
    parallelism) or a DTensor; the layer sees the whole ``[b, s, h]`` as a local
    tensor whose gradient is a partial sum (all-reduced, or reduce-scattered back
    to the slices, in the backward). Output: the local partial sum, all-reduced (or
    reduce-scattered over the sequence) into a local tensor.
    """

    def __init__(self, sequence_parallel: bool) -> None:
        super().__init__()
        self.sequence_parallel = sequence_parallel

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        outer = [Shard(1)] if self.sequence_parallel else [Replicate()]

        def pre_hook(mod: nn.Module, inputs: tuple) -> tuple:
            x = inputs[0]
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, device_mesh, outer, run_check=False)
            if x.placements != (Replicate(),):
                x = x.redistribute(device_mesh, [Replicate()])
            return (x.to_local(grad_placements=[Partial()]), *inputs[1:])

        def hook(mod: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
            partial = DTensor.from_local(output, device_mesh, [Partial()], run_check=False)
            return partial.redistribute(device_mesh, outer).to_local()

        module.register_forward_pre_hook(pre_hook)
        module.register_forward_hook(hook)
        return module


def _mlp_plan(prefix: str, config: ModelConfig) -> dict[str, ParallelStyle]:
    if config.activation in ("swiglu", "gated_gelu"):
        return {
            f"{prefix}.w1": _ColwiseLocalInput(),
            f"{prefix}.w3": _ColwiseLocalInput(),
            f"{prefix}.w2": _RowwisePartialOutput(),
        }
    return {f"{prefix}.fc1": _ColwiseLocalInput(), f"{prefix}.fc2": _RowwisePartialOutput()}


def moe_mlp_plan(
    config: ModelConfig, sequence_parallel: bool, experts: Iterable[str]
) -> dict[str, ParallelStyle]:
    """The plan of an MoE block's ``mlp`` (keys relative to the block; see the module docstring).

    ``experts`` names the experts the block holds (``mlp.experts``' keys: all of
    them, or this rank's under expert parallelism).
    """
    plan: dict[str, ParallelStyle] = {
        "mlp": _MoELayerIO(sequence_parallel),
        "mlp.router": _ReplicatedPartialGrad(),
    }
    for e in experts:
        plan.update(_mlp_plan(f"mlp.experts.{e}", config))
    if config.moe_shared_expert_intermediate_size is not None:
        plan.update(_mlp_plan("mlp.shared_expert", config))
        if config.moe_shared_expert_gate:
            plan["mlp.shared_expert_gate"] = _ReplicatedPartialGrad()
    return plan


def finish_moe_tensor_parallel(block: nn.Module, tp_mesh: DeviceMesh) -> None:
    """After the plan: only tensor-parallel rank 0 back-propagates the auxiliary losses (see above)."""
    moe = block.mlp
    if not isinstance(moe, MoEMLP):
        return
    rank = tp_mesh.get_local_rank()
    if rank != 0:
        moe.aux_loss_coeff = 0.0
        moe.z_loss_coeff = 0.0
