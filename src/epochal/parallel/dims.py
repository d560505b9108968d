"""``ParallelDims``: the sizes of each parallel dimension, their validation and the device mesh.

Rank layout (Megatron-LM's default order ``tp-cp-dp-pp``: tensor-parallel ranks are
adjacent, then context-parallel ranks, pipeline stages are farthest apart)::

    global_rank = pp_rank * (dp * cp * tp) + dp_rank * (cp * tp) + cp_rank * tp + tp_rank

The device mesh has shape ``(pp, dp, cp, tp)`` and the dimension names
``("pp", "dp", "cp", "tp")``; ``mesh["tp"]`` is this rank's tensor-parallel group,
``mesh["cp"]`` its context-parallel group, ``mesh["dp"]`` its data-parallel group,
``mesh["pp"]`` its pipeline group. Dimensions of size 1 are kept, so code never
needs to special-case them. With ``cp = 1`` the layout is the one of earlier
versions (``pp * (dp * tp) + dp * tp + tp``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from epochal.model.config import ConfigError, ModelConfig
from epochal.parallel.config import ParallelConfig

__all__ = ["MESH_DIM_NAMES", "ParallelDims"]

MESH_DIM_NAMES = ("pp", "dp", "cp", "tp")


def _err(option: str, message: str) -> ConfigError:
    return ConfigError(option, message)


@dataclass(frozen=True)
class ParallelDims:
    """Sizes of the parallel dimensions of one job.

    Attributes:
        tp: tensor-parallel size.
        pp: pipeline-parallel size (stages = ranks along the pipeline).
        dp: data-parallel size.
        vpp: virtual pipeline chunks per pipeline rank (interleaved schedule).
        cp: context-parallel size (each sequence split over ``cp`` ranks).
        ep: expert-parallel size, carved from the data-parallel ranks (divides ``dp``):
            data-parallel rank ``d`` is expert-parallel rank ``d % ep`` of
            expert-data-parallel rank ``d // ep`` (Megatron's order: the ranks of
            one expert-parallel group are adjacent).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1

    @classmethod
    def from_config(cls, config: ParallelConfig, world_size: int) -> ParallelDims:
        """Derive the data-parallel size from ``world_size``.

        Raises:
            ConfigError: ``world_size`` is not a multiple of
                ``tensor_parallel * context_parallel * pipeline_parallel``, or
                ``data_parallel`` is set and differs from the derived size.
        """
        mp = config.model_parallel_size
        names = "tensor_parallel * pipeline_parallel"
        sizes = f"{config.tensor_parallel} * {config.pipeline_parallel}"
        if config.context_parallel > 1:
            names = "tensor_parallel * context_parallel * pipeline_parallel"
            sizes = (
                f"{config.tensor_parallel} * {config.context_parallel} * {config.pipeline_parallel}"
            )
        if world_size < 1 or world_size % mp:
            raise _err(
                "parallel.tensor_parallel",
                f"{names} = {sizes} = {mp} must divide the world size {world_size}",
            )
        dp = world_size // mp
        if config.data_parallel is not None and config.data_parallel != dp:
            raise _err(
                "parallel.data_parallel",
                f"is {config.data_parallel} but world size {world_size} / ({names} = {mp}) "
                f"gives {dp}; leave it unset to derive it",
            )
        if dp % config.expert_parallel:
            raise _err(
                "parallel.expert_parallel",
                f"must divide the data-parallel size {dp} (expert-parallel ranks are carved "
                f"from the data-parallel ranks), got {config.expert_parallel}; set "
                "parallel.data_parallel (or the world size) to a multiple of it",
            )
        return cls(
            tp=config.tensor_parallel,
            pp=config.pipeline_parallel,
            dp=dp,
            vpp=config.virtual_pipeline,
            cp=config.context_parallel,
            ep=config.expert_parallel,
        )

    @property
    def world_size(self) -> int:
        """``tp * cp * pp * dp``."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def num_stages(self) -> int:
        """Total pipeline stages (``pp * vpp`` model chunks)."""
        return self.pp * self.vpp

    def coords(self, rank: int) -> dict[str, int]:
        """``{"pp": ..., "dp": ..., "cp": ..., "tp": ...}`` of global ``rank`` (the layout in the module docstring)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside [0, {self.world_size})")
        return {
            "pp": rank // (self.dp * self.cp * self.tp),
            "dp": (rank // (self.cp * self.tp)) % self.dp,
            "cp": (rank // self.tp) % self.cp,
            "tp": rank % self.tp,
        }

    # ---------------------------------------------------------------- validation
    def validate(
        self,
        model: ModelConfig,
        *,
        micro_batch_size: int,
        global_batch_size: int,
        seq_length: int,
        config: ParallelConfig | None = None,
        check_vocab: bool = True,
        decoder_seq_length: int | None = None,
    ) -> None:
        """Check the layout against the model and the batch sizes.

        ``decoder_seq_length`` (an encoder-decoder's decoder length) must divide by
        the tensor-parallel size too under sequence parallelism.
        ``check_vocab=False`` skips the one check that needs the real vocabulary size
        (the tokenizer's, known only once the data is built), so that a trainer can
        check everything else before a long data build.

        Raises:
            ConfigError: naming the option that has to change, e.g.
                ``parallel.tensor_parallel`` when it does not divide the heads.
        """
        tp, pp = self.tp, self.pp
        if model.num_attention_heads % tp:
            raise _err(
                "parallel.tensor_parallel",
                f"must divide model.num_attention_heads={model.num_attention_heads}, got {tp}",
            )
        groups = model.num_kv_heads
        if groups % tp and tp % groups:
            raise _err(
                "parallel.tensor_parallel",
                f"and model.num_query_groups={groups} must divide one another (groups sharded "
                f"when tp divides them, replicated when they divide tp), got tensor_parallel={tp}",
            )
        if model.ffn_size % tp:
            raise _err(
                "parallel.tensor_parallel", f"must divide the MLP width {model.ffn_size}, got {tp}"
            )
        if check_vocab and model.padded_vocab_size % tp:
            raise _err(
                "parallel.tensor_parallel",
                f"must divide the padded vocabulary {model.padded_vocab_size} "
                f"(model.make_vocab_size_divisible_by={model.make_vocab_size_divisible_by}), got {tp}",
            )
        if tp > 1 and getattr(model, "moe_grouped_gemm", False):
            raise _err(
                "model.moe_grouped_gemm",
                "stacks each expert's whole weights; under tensor parallelism the experts are "
                "sharded and run one by one: set moe_grouped_gemm=false",
            )
        if self.ep > 1:
            from epochal.parallel.expert_parallel import check_expert_parallel  # local: a leaf

            check_expert_parallel(self, model)
        if self.cp > 1:
            from epochal.parallel.context_parallel import check_context_parallel  # local: a leaf

            check_context_parallel(
                self,
                model,
                seq_length=seq_length,
                config=config,
                decoder_seq_length=decoder_seq_length,
            )
        if config is not None and config.sequence_parallel and seq_length % tp:
            raise _err(
                "parallel.sequence_parallel",
                f"needs data.seq_length={seq_length} divisible by tensor_parallel={tp}",
            )
        if (
            config is not None
            and config.sequence_parallel
            and decoder_seq_length is not None
            and decoder_seq_length % tp
        ):
            raise _err(
                "parallel.sequence_parallel",
                f"needs data.seq_length_decoder={decoder_seq_length} divisible by "
                f"tensor_parallel={tp}",
            )
        first = config.decoder_first_pipeline_num_layers if config is not None else None
        last = config.decoder_last_pipeline_num_layers if config is not None else None
        from epochal.parallel.pipeline import stage_layer_counts  # local: avoids an import cycle

        stage_layer_counts(model.num_layers, pp, self.vpp, first=first, last=last)
        per_step = micro_batch_size * self.dp
        if global_batch_size % per_step:
            raise _err(
                "training.global_batch_size",
                f"must be a multiple of micro_batch_size * data_parallel = {micro_batch_size} * {self.dp} "
                f"= {per_step}, got {global_batch_size}",
            )
        n_mb = global_batch_size // per_step
        schedule = config.pipeline_schedule if config is not None else "1f1b"
        if pp > 1 and schedule == "1f1b" and n_mb < pp:
            raise _err(
                "training.global_batch_size",
                f"gives {n_mb} micro-batches per data-parallel rank, fewer than the {pp} pipeline stages "
                "the 1f1b schedule needs; raise it or use parallel.pipeline_schedule='gpipe'",
            )
        if pp > 1 and schedule == "interleaved_1f1b":
            rounds = max(1, n_mb // pp)
            if n_mb % rounds:
                raise _err(
                    "training.global_batch_size",
                    f"gives {n_mb} micro-batches per data-parallel rank; the interleaved schedule needs "
                    f"a multiple of {rounds} (max(1, micro-batches // pipeline_parallel))",
                )

    # --------------------------------------------------------------------- mesh
    def build_mesh(self, device_type: str = "cpu") -> DeviceMesh:
        """Create the ``(pp, dp, cp, tp)`` device mesh over the default process group.

        Args:
            device_type: ``"cpu"`` (gloo) or ``"cuda"``.

        Raises:
            RuntimeError: the default process group is missing or its size is not
                ``world_size``.
        """
        if not torch.distributed.is_initialized():
            raise RuntimeError("build_mesh needs an initialized default process group (torchrun)")
        ws = torch.distributed.get_world_size()
        if ws != self.world_size:
            raise RuntimeError(
                f"process group has {ws} ranks but the layout {self} needs {self.world_size}"
            )
        return init_device_mesh(
            device_type, (self.pp, self.dp, self.cp, self.tp), mesh_dim_names=MESH_DIM_NAMES
        )

    def __str__(self) -> str:
        vpp = f"(x{self.vpp} virtual)" if self.vpp > 1 else ""
        cp = f" x CP{self.cp}" if self.cp > 1 else ""
        ep = f" (EP{self.ep})" if self.ep > 1 else ""
        return f"TP{self.tp}{cp} x PP{self.pp}{vpp} x DP{self.dp}{ep}"
