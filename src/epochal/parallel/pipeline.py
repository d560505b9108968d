"""Pipeline parallelism: split the GPT into stages, build the schedule, keep tied embeddings in sync.

Split (Megatron-LM's rules): the ``L`` transformer layers are divided over
``pp * vpp`` model chunks ("virtual stages"). Chunk ``v`` of pipeline rank ``p``
is stage ``v * pp + p`` and holds consecutive layers; stages are filled in order,
so with interleaving rank 0 holds layers ``[0, L/(pp*vpp))``, then
``[L/vpp, L/vpp + L/(pp*vpp))``, ... By default every chunk gets
``L / (pp * vpp)`` layers (``L`` must divide evenly).
``decoder_first_pipeline_num_layers`` / ``decoder_last_pipeline_num_layers`` set
the layers of the first / last pipeline rank (0 allowed: a rank with only the
embedding or only the head); the other ranks share the rest evenly, and each
rank's count must divide by ``vpp``.

The embeddings (``tok_embeddings``, ``pos_embeddings``) live on stage 0 and the
final norm and output head on the last stage (torchtitan's pattern: the
unused modules are set to ``None``; layer names stay global, ``layers.7`` is
``layers.7`` on whichever stage holds it, so checkpoints reshard).

Tied embeddings: stage 0's ``tok_embeddings.weight`` and the last stage's
``output.weight`` are two parameters with the same initial value (the model's
initialization draws both from the same stream). After every backward their
gradients are summed over the *embedding group* (the first and last pipeline
ranks with the same data/tensor-parallel coordinates), exactly Megatron's
``_allreduce_word_embedding_grads``, so both copies receive the full gradient
and stay equal under the (deterministic) optimizer.

Schedules (``torch.distributed.pipelining``): ``gpipe`` (``ScheduleGPipe``),
``1f1b`` (``Schedule1F1B``) and ``interleaved_1f1b`` (``ScheduleInterleaved1F1B``,
``vpp`` chunks per rank). The loss of each micro-batch is divided by the number
of micro-batches on the last stage (``scale_grads=False``), matching the
trainer's gradient accumulation.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from epochal.model.config import ConfigError

__all__ = [
    "EmbeddingGroup",
    "build_schedule",
    "split_stage_module",
    "stage_indices",
    "stage_layer_counts",
    "stage_layer_ranges",
]


def stage_layer_counts(
    num_layers: int, pp: int, vpp: int = 1, *, first: int | None = None, last: int | None = None
) -> list[int]:
    """Transformer layers of each virtual stage, in stage order (``len = pp * vpp``).

    Args:
        num_layers: total transformer layers ``L``.
        pp: pipeline-parallel size.
        vpp: model chunks per pipeline rank.
        first / last: layers on the first / last pipeline rank (Megatron's
            ``decoder_first/last_pipeline_num_layers``), or None.

    Raises:
        ConfigError: the layers do not split as asked (names the option).
    """
    if pp == 1:
        return [num_layers]
    # the option to blame when the split fails: the one the user set (last wins), else the model
    option = (
        "parallel.decoder_last_pipeline_num_layers"
        if last is not None
        else "parallel.decoder_first_pipeline_num_layers"
        if first is not None
        else "model.num_layers"
    )
    per_rank: list[int | None] = [None] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    fixed = sum(c for c in per_rank if c is not None)
    free = [i for i, c in enumerate(per_rank) if c is None]
    rest = num_layers - fixed
    if rest < 0 or (not free and rest != 0):
        raise ConfigError(
            option,
            f"the first/last pipeline ranks take {fixed} layers but the model has model.num_layers={num_layers}",
        )
    if free:
        unit = len(free) * vpp
        if rest % unit:
            raise ConfigError(
                option,
                f"{rest} layers cannot be split evenly over {len(free)} pipeline ranks x {vpp} virtual "
                f"stages (pipeline_parallel={pp}, virtual_pipeline={vpp}); model.num_layers={num_layers}",
            )
        for i in free:
            per_rank[i] = rest // len(free)
    counts: list[int] = []
    for _ in range(vpp):
        for p in range(pp):
            c = per_rank[p]
            assert c is not None
            if c % vpp:
                raise ConfigError(
                    "parallel.virtual_pipeline",
                    f"pipeline rank {p} has {c} layers, not divisible by virtual_pipeline={vpp}",
                )
            counts.append(c // vpp)
    for i, c in enumerate(counts[1:-1], start=1):
        if c == 0:
            raise ConfigError(
                option,
                f"leaves pipeline stage {i} (neither first nor last) without layers; model.num_layers={num_layers}",
            )
    return counts


def stage_layer_ranges(counts: Sequence[int]) -> list[range]:
    """Global layer indices of each stage from :func:`stage_layer_counts`."""
    out, start = [], 0
    for c in counts:
        out.append(range(start, start + c))
        start += c
    return out


def stage_indices(pp_rank: int, pp: int, vpp: int) -> list[int]:
    """Stages held by pipeline rank ``pp_rank`` (the looped placement: ``pp_rank + v * pp``)."""
    return [pp_rank + v * pp for v in range(vpp)]


def split_stage_module(
    model: nn.Module, layers: range, *, is_first: bool, is_last: bool
) -> nn.Module:
    """A deep copy of ``model`` reduced to one pipeline stage.

    Args:
        model: a :class:`~epochal.model.GPTModel` or :class:`~epochal.model.BertModel`
            (on any device, ``meta`` included).
        layers: the global layer indices the stage keeps.
        is_first: keep the embeddings (else set the model's ``FIRST_STAGE_MODULES`` to None).
        is_last: keep the final norm and the heads (else its ``LAST_STAGE_MODULES``).

    Returns:
        The stage module. Its ``forward`` takes token ids (first stage) or
        hidden states and returns hidden states or logits (last stage).
    """
    stage = copy.deepcopy(model)
    keep = {str(i) for i in layers}
    for name in list(stage.layers.keys()):
        if name not in keep:
            del stage.layers[name]
    dropped = (() if is_first else model.FIRST_STAGE_MODULES) + (
        () if is_last else model.LAST_STAGE_MODULES
    )
    for name in dropped:
        setattr(stage, name, None)
    return stage


def build_schedule(
    name: str,
    stages: list[Any],
    n_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
):
    """Create the pipeline schedule.

    Args:
        name: ``gpipe``, ``1f1b`` or ``interleaved_1f1b``.
        stages: this rank's stages (one, or ``vpp`` for the interleaved schedule).
        n_microbatches: micro-batches per step on this data-parallel rank.
        loss_fn: ``(output, target) -> loss`` of one micro-batch, already
            divided by the number of micro-batches (gradients are not rescaled).
    """
    # torch.distributed.pipelining imports TorchDynamo: loaded when a pipeline is built
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    if name == "interleaved_1f1b":
        return ScheduleInterleaved1F1B(
            stages, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=False
        )
    if len(stages) != 1:
        raise ValueError(f"schedule {name!r} takes one stage per rank, got {len(stages)}")
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}.get(name)
    if cls is None:
        raise ConfigError("parallel.pipeline_schedule", f"unknown schedule {name!r}")
    return cls(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=False)


class EmbeddingGroup:
    """Sums the gradients of the tied input/output embedding copies over the pipeline ends.

    Every rank must construct it (it creates one process group per
    data/tensor-parallel coordinate, a collective call); only ranks holding a
    copy then communicate.

    Args:
        mesh: the ``(pp, dp, cp, tp)`` mesh, pipeline first (None in a single process).
        enabled: tied embeddings and ``pp > 1``.
    """

    def __init__(self, mesh: DeviceMesh | None, enabled: bool) -> None:
        self.group: dist.ProcessGroup | None = None
        if not enabled or mesh is None:
            return
        ranks = mesh.mesh.reshape(mesh.mesh.shape[0], -1)  # [pp, every other coordinate]
        me = dist.get_rank()
        for column in range(ranks.shape[1]):
            members = sorted({int(ranks[0, column]), int(ranks[-1, column])})
            group = dist.new_group(members)
            if me in members:
                self.group = group

    def all_reduce_grads(self, params: Sequence[torch.Tensor]) -> None:
        """Sum the gradients of ``params`` (this rank's tied copies) over the embedding group."""
        if self.group is None:
            return
        for p in params:
            if p.grad is None:
                continue
            grad = p.grad
            local = grad._local_tensor if isinstance(grad, DTensor) else grad
            dist.all_reduce(local, group=self.group)
