"""``MegatronLMPlugin``: the layout and training options of an Accelerate + Megatron-LM script.

The fields are Accelerate's (``accelerate.utils.MegatronLMPlugin``) that change
what epochal computes; unset fields take their value from the ``MEGATRON_LM_*``
environment variables that ``epochal launch`` (like ``accelerate launch``) sets
from the ``megatron_lm_config`` block of the YAML file, else Accelerate's
defaults (one process: ``tp_degree = pp_degree = num_micro_batches = 1``,
``gradient_clipping = 1.0``). An ``Accelerator`` given no plugin, without
``ACCELERATE_USE_MEGATRON_LM=true``, has no Megatron-LM plugin under Accelerate: its
default one here clips nothing (``gradient_clipping = 0`` unless
``MEGATRON_LM_GRADIENT_CLIPPING`` is set) and the script's ``clip_grad_norm_`` decides.

How each field maps onto epochal (``[parallel]`` / ``[optimizer]`` / ``[scheduler]``):

=====================================  ===================================================
``tp_degree`` / ``pp_degree``          ``parallel.tensor_parallel`` / ``pipeline_parallel`` (with
                                       fewer micro-batches than stages the GPipe schedule,
                                       else 1F1B; ``other_megatron_args["pipeline_schedule"]``
                                       chooses)
``num_micro_batches``                  micro-batches per step (global batch = micro-batch
                                       x micro-batches x data-parallel size)
``sequence_parallelism``               ``parallel.sequence_parallel`` (dropped when tp = 1)
``context_parallel_size`` (or          ``parallel.context_parallel`` (Megatron's
``other_megatron_args[                 ``--context-parallel-size``: each sequence cut into
"context_parallel_size"]``)            ``2 x cp`` chunks, see below)
``recompute_activations``              selective recompute (Megatron's
                                       ``--recompute-activations``)
``recompute_granularity/method/...``   ``parallel.recompute_*`` (used when
                                       ``recompute_activations`` is off and granularity
                                       is given explicitly)
``use_distributed_optimizer``          ``parallel.dp_sharding = "optimizer"``
``gradient_clipping``                  ``optimizer.clip_grad`` (0 = off)
``decoder_last_pipeline_num_layers``   ``parallel.decoder_last_pipeline_num_layers``
``num_layers_per_virtual_pipeline_     ``parallel.virtual_pipeline`` (interleaved 1F1B)
stage``
``lr_decay_style``, ``min_lr``,        the learning-rate schedule (Megatron's
``lr_warmup_*``, ``lr_decay_*``,       ``OptimizerParamScheduler``); ``*_samples`` are
``train_iters``, ``train_samples``,    divided by the global batch size
``*_weight_decay``,
``weight_decay_incr_style``
``seq_length`` / ``encoder_seq_length``  the sequence length batches are padded to under
/ ``decoder_seq_length``               pipeline parallelism (default: the first batch's)
``hidden_dropout`` /                   override the Hugging Face config's dropout (unset:
``attention_dropout``                  the model's own)
``return_logits``                      evaluation outputs carry ``.logits``
``custom_train_step_class/_kwargs``    the train step (a subclass of ``GPTTrainStep`` ...)
``custom_get_batch_function`` /        replace the default step's ``get_batch`` /
``custom_loss_function``               ``loss_func``
``consumed_samples``                   the train loader's start position
``tensorboard_dir``                    per-step ``lm loss``, learning rate and gradient
                                       norm as TensorBoard scalars
=====================================  ===================================================

Context parallelism: Accelerate passes ``context_parallel_size`` (the field, the
``MEGATRON_LM_CONTEXT_PARALLEL_SIZE`` variable that ``accelerate launch
--megatron_lm_context_parallel_size`` sets, or the ``other_megatron_args`` entry,
which wins as in Accelerate, whose ``other_megatron_args`` update Megatron's
arguments last) to Megatron as ``context_parallel_size``; here it becomes
``parallel.context_parallel``. The processes split as ``tp x cp x pp x dp``
(data-parallel size = processes / (tp x cp x pp)); every rank of a context-parallel
group reads the same batch (the prepared loader shards by data-parallel rank only),
the prepared model cuts each micro-batch's sequence into ``2 x cp`` chunks (rank
``r`` keeps chunks ``r`` and ``2cp-1-r``), batches are padded on the right to a
multiple of ``2 x cp`` (padding takes no loss), and the per-token losses are
gathered over the group, so ``model(**batch).loss`` is the whole batch's loss on
every rank, as Accelerate's Megatron loss function all-reduces it over the
context-parallel group. What context parallelism does not support (pipeline
parallelism, T5, classification heads, ...) is refused by
:func:`epochal.parallel.context_parallel.check_context_parallel` when the model is
prepared, naming the plugin field. Unset, the size is 1 (Accelerate 1.15 defaults
an unset ``context_parallel_size`` to 2, which Megatron refuses on one process;
epochal does not take a layout the script did not ask for).

Accepted and without effect on the numbers: ``is_train_batch_min`` (picks the
micro-batch size among the loaders' batch sizes, as Accelerate), ``eval_iters``,
``eval_interval``, ``set_all_logging_options`` (the script drives evaluation and
logging). Everything else Accelerate lets a user set either has no epochal
equivalent or would change results silently, so :meth:`MegatronLMPlugin.check`
refuses it with a :class:`PluginError` naming the field (e.g.
``expert_model_parallel_size > 1``, ``custom_model_provider_function``,
``no_wd_decay_cond``: the optimizer's own parameter groups decide weight decay).

Difference from Accelerate: the dummy scheduler's ``total_num_steps`` and
``warmup_num_steps`` count the user's per-device batches of the *unprepared*
loader (as the guide's scripts compute them) and become optimizer steps by
dividing by ``num_micro_batches * data-parallel size`` (Accelerate divides by the
data-parallel size only, so with several micro-batches its schedule runs that
many times too long); with one micro-batch both agree.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ENV_PREFIX",
    "MegatronLMDummyScheduler",
    "MegatronLMPlugin",
    "PluginError",
    "env_bool",
]

ENV_PREFIX = "MEGATRON_LM_"

_TRUE = ("1", "true", "yes", "y", "on", "t")
_FALSE = ("0", "false", "no", "n", "off", "f")


class PluginError(ValueError):
    """A ``MegatronLMPlugin`` field (or ``MEGATRON_LM_*`` variable) epochal cannot honour."""


def env_bool(name: str, default: bool) -> bool:
    """The boolean environment variable ``name`` (Accelerate's spellings), else ``default``.

    Raises:
        PluginError: a value that is neither true nor false.
    """
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise PluginError(f"environment variable {name}={raw!r} is not a boolean (true/false)")


def _env_number(name: str, kind: type, default: Any) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise PluginError(f"environment variable {name}={raw!r} is not a {kind.__name__}") from None


#: field -> (environment suffix, type, default) for the fields ``epochal launch`` sets.
_ENV_FIELDS: dict[str, tuple[str, type, Any]] = {
    "tp_degree": ("TP_DEGREE", int, 1),
    "pp_degree": ("PP_DEGREE", int, 1),
    "num_micro_batches": ("NUM_MICRO_BATCHES", int, 1),
    "gradient_clipping": ("GRADIENT_CLIPPING", float, 1.0),
    "sequence_parallelism": ("SEQUENCE_PARALLELISM", bool, False),
    "recompute_activations": ("RECOMPUTE_ACTIVATIONS", bool, False),
    "use_distributed_optimizer": ("USE_DISTRIBUTED_OPTIMIZER", bool, False),
    "recompute_granularity": ("RECOMPUTE_GRANULARITY", str, None),
    "recompute_method": ("RECOMPUTE_METHOD", str, None),
    "recompute_num_layers": ("RECOMPUTE_NUM_LAYERS", int, None),
    "decoder_last_pipeline_num_layers": ("DECODER_LAST_PIPELINE_NUM_LAYERS", int, None),
    "context_parallel_size": ("CONTEXT_PARALLEL_SIZE", int, 1),
}


def _where(name: str) -> str:
    """`` (environment variable X='v')`` when the field's ``MEGATRON_LM_*`` variable is set."""
    env = ENV_PREFIX + _ENV_FIELDS[name][0]
    raw = os.environ.get(env)
    return f" (environment variable {env}={raw!r})" if raw else ""


#: field -> (value that changes nothing, why another value is refused).
_REFUSED: dict[str, tuple[Any, str]] = {
    "expert_model_parallel_size": (
        1,
        "expert parallelism runs in `epochal train --parallel.expert_parallel=N` (GPT with "
        "model.num_experts), not yet behind this front end",
    ),
    "expert_tensor_parallel_size": (
        1,
        "epochal's experts have no tensor-parallel plan (expert parallelism runs in "
        "`epochal train --parallel.expert_parallel=N`)",
    ),
    "pipeline_model_parallel_split_rank": (
        None,
        "epochal splits no encoder-decoder pipeline (T5 trains with tensor and data parallelism)",
    ),
    "custom_model_provider_function": (
        None,
        "epochal builds the model from the transformers model given to prepare()",
    ),
    "custom_prepare_model_function": (
        None,
        "epochal builds the model from the transformers model given to prepare()",
    ),
    "no_wd_decay_cond": (None, "the optimizer's own parameter groups decide weight decay"),
    "scale_lr_cond": (None, "give those parameters their own optimizer group with its lr"),
    "lr_mult": (1.0, "give those parameters their own optimizer group with its lr"),
    "use_custom_fsdp": (False, "use use_distributed_optimizer (epochal's FSDP2 sharding)"),
    "no_load_optim": (False, "load_state always restores the optimizer (exact resumption)"),
    "no_save_optim": (False, "save_state always saves the optimizer (exact resumption)"),
    "eod_mask_loss": (False, "the loss is the transformers model's (its labels decide)"),
    "optimizer_cpu_offload": (False, "epochal keeps the optimizer on the training device"),
    "overlap_cpu_optimizer_d2h_h2d": (False, "epochal keeps the optimizer on the training device"),
    "use_precision_aware_optimizer": (False, "epochal keeps float32 optimizer state"),
    "calculate_per_token_loss": (
        False,
        "each micro-batch's loss is its token mean and the step averages them (Megatron's "
        "default); the transformers batch's labels decide which tokens count",
    ),
}

_ALLOWED_OTHER_ARGS = {
    "seed": "the seed of dropout and data order (default: the one given to set_seed)",
    "context_parallel_size": "Megatron's --context-parallel-size (parallel.context_parallel)",
    "hidden_dropout": "overrides the model's dropout",
    "attention_dropout": "overrides the model's attention dropout",
    "pipeline_schedule": "'gpipe', '1f1b' or 'interleaved_1f1b'",
    "loss_parallel": "vocabulary-parallel cross-entropy under tensor parallelism",
    "dataloader_num_workers": "worker processes of the prepared loaders",
    "vocab_file": "a GPT-2 vocab.json: its <|endoftext|> ends and starts megatron_generate's rows",
    "merge_file": "the GPT-2 merges.txt beside vocab_file (accepted; the model's ids are used)",
}

LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")


@dataclass
class MegatronLMPlugin:
    """Accelerate's ``MegatronLMPlugin`` for epochal (see the module docstring for each field)."""

    tp_degree: int | None = None
    pp_degree: int | None = None
    num_micro_batches: int | None = None
    gradient_clipping: float | None = None
    sequence_parallelism: bool | None = None
    recompute_activations: bool | None = None
    use_distributed_optimizer: bool | None = None
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    decoder_last_pipeline_num_layers: int | None = None
    num_layers_per_virtual_pipeline_stage: int | None = None
    pipeline_model_parallel_split_rank: int | None = None
    is_train_batch_min: bool = True
    train_iters: int | None = None
    train_samples: int | None = None
    weight_decay_incr_style: str = "constant"
    start_weight_decay: float | None = None
    end_weight_decay: float | None = None
    lr_decay_style: str = "linear"
    lr_decay_iters: int | None = None
    lr_decay_samples: int | None = None
    lr_warmup_iters: int | None = None
    lr_warmup_samples: int | None = None
    lr_warmup_fraction: float | None = None
    min_lr: float = 0.0
    consumed_samples: list[int] | None = None
    no_wd_decay_cond: Callable[..., bool] | None = None
    scale_lr_cond: Callable[..., bool] | None = None
    lr_mult: float = 1.0
    megatron_dataset_flag: bool = False
    seq_length: int | None = None
    encoder_seq_length: int | None = None
    decoder_seq_length: int | None = None
    tensorboard_dir: str | None = None
    set_all_logging_options: bool = False
    eval_iters: int = 100
    eval_interval: int = 1000
    return_logits: bool = False
    custom_train_step_class: Any = None
    custom_train_step_kwargs: dict[str, Any] | None = None
    custom_model_provider_function: Callable[..., Any] | None = None
    custom_prepare_model_function: Callable[..., Any] | None = None
    custom_megatron_datasets_provider_function: Callable[..., Any] | None = None
    custom_get_batch_function: Callable[..., Any] | None = None
    custom_loss_function: Callable[..., Any] | None = None
    other_megatron_args: dict[str, Any] | None = None
    attention_dropout: float | None = None
    hidden_dropout: float | None = None
    context_parallel_size: int | None = None
    expert_model_parallel_size: int | None = None
    expert_tensor_parallel_size: int | None = None
    use_custom_fsdp: bool | None = None
    no_load_optim: bool | None = None
    no_save_optim: bool | None = None
    eod_mask_loss: bool | None = None
    optimizer_cpu_offload: bool | None = None
    overlap_cpu_optimizer_d2h_h2d: bool | None = None
    use_precision_aware_optimizer: bool | None = None
    calculate_per_token_loss: bool | None = None
    #: set by ``prepare``: the micro-batch size, data-parallel size and global batch size.
    micro_batch_size: int | None = field(default=None, init=False)
    data_parallel_size: int | None = field(default=None, init=False)
    global_batch_size: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        for name, (suffix, kind, default) in _ENV_FIELDS.items():
            if getattr(self, name) is None:
                env = ENV_PREFIX + suffix
                value = env_bool(env, default) if kind is bool else _env_number(env, kind, default)
                setattr(self, name, value)
        if self.consumed_samples is not None:
            self.consumed_samples = list(self.consumed_samples) + [0] * (
                3 - len(self.consumed_samples)
            )
        self.check()

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        """Refuse what epochal cannot honour (see the module docstring).

        Raises:
            PluginError: naming the field and the allowed values.
        """
        for name in ("tp_degree", "pp_degree", "num_micro_batches", "context_parallel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PluginError(
                    f"MegatronLMPlugin.{name}{_where(name) if name in _ENV_FIELDS else ''} must "
                    f"be an integer >= 1, got {value!r}"
                )
        cp = self.other("context_parallel_size")
        if cp is not None and (not isinstance(cp, int) or isinstance(cp, bool) or cp < 1):
            raise PluginError(
                "MegatronLMPlugin.other_megatron_args['context_parallel_size'] must be an "
                f"integer >= 1, got {cp!r}"
            )
        if not math.isfinite(self.gradient_clipping) or self.gradient_clipping < 0:
            raise PluginError(
                f"MegatronLMPlugin.gradient_clipping{_where('gradient_clipping')} must be a finite "
                f"number >= 0 (0 = off), got {self.gradient_clipping}"
            )
        from epochal.parallel.config import RECOMPUTE_GRANULARITIES, RECOMPUTE_METHODS

        for name, allowed in (
            ("recompute_granularity", RECOMPUTE_GRANULARITIES),
            ("recompute_method", RECOMPUTE_METHODS),
        ):
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise PluginError(
                    f"MegatronLMPlugin.{name}{_where(name)} must be one of {', '.join(allowed)}, "
                    f"got {value!r}"
                )
        if self.lr_decay_style not in LR_DECAY_STYLES:
            raise PluginError(
                f"MegatronLMPlugin.lr_decay_style must be one of {LR_DECAY_STYLES}, got {self.lr_decay_style!r}"
            )
        if self.weight_decay_incr_style not in ("constant", "linear", "cosine"):
            raise PluginError(
                "MegatronLMPlugin.weight_decay_incr_style must be constant, linear or cosine, "
                f"got {self.weight_decay_incr_style!r}"
            )
        for name, (neutral, why) in _REFUSED.items():
            value = getattr(self, name)
            if value is not None and value != neutral:
                raise PluginError(f"MegatronLMPlugin.{name}={value!r} is not supported: {why}")
        if self.custom_megatron_datasets_provider_function is not None:
            raise PluginError(
                "MegatronLMPlugin.custom_megatron_datasets_provider_function is not supported: "
                "pass MegatronLMDummyDataLoader(data_path=...) or your own DataLoader to prepare()"
            )
        for key in self.other_megatron_args or {}:
            if key not in _ALLOWED_OTHER_ARGS:
                raise PluginError(
                    f"MegatronLMPlugin.other_megatron_args[{key!r}] has no epochal equivalent "
                    f"(supported: {', '.join(f'{k} ({v})' for k, v in _ALLOWED_OTHER_ARGS.items())})"
                )
        cls = self.custom_train_step_class
        if cls is not None:
            from epochal.train.steps import TrainStep

            if not (isinstance(cls, type) and issubclass(cls, TrainStep)):
                raise PluginError(
                    "MegatronLMPlugin.custom_train_step_class must subclass "
                    "epochal.accelerate.utils.GPTTrainStep / BertTrainStep / T5TrainStep, "
                    f"got {cls!r}"
                )

    def other(self, key: str, default: Any = None) -> Any:
        """The ``other_megatron_args`` entry ``key`` (or ``default``)."""
        return (self.other_megatron_args or {}).get(key, default)

    # ----------------------------------------------------------------- layout
    @property
    def cp_degree(self) -> int:
        """The context-parallel size: ``other_megatron_args["context_parallel_size"]``, else the field."""
        return int(self.other("context_parallel_size", self.context_parallel_size))

    def parallel_options(self) -> dict[str, Any]:
        """The ``[parallel]`` options of this plugin (keyword arguments of ``ParallelConfig``)."""
        out: dict[str, Any] = {
            "tensor_parallel": self.tp_degree,
            "context_parallel": self.cp_degree,
            "pipeline_parallel": self.pp_degree,
            "sequence_parallel": bool(self.sequence_parallelism) and self.tp_degree > 1,
            "dp_sharding": "optimizer" if self.use_distributed_optimizer else "none",
        }
        if self.recompute_activations:
            out["recompute_granularity"] = "selective"
        elif self.recompute_granularity not in (None, "none"):
            out["recompute_granularity"] = self.recompute_granularity
            if self.recompute_method is not None:
                out["recompute_method"] = self.recompute_method
            if self.recompute_num_layers is not None:
                out["recompute_num_layers"] = self.recompute_num_layers
        if self.decoder_last_pipeline_num_layers is not None:
            out["decoder_last_pipeline_num_layers"] = self.decoder_last_pipeline_num_layers
        if self.other("pipeline_schedule") is not None:
            out["pipeline_schedule"] = self.other("pipeline_schedule")
        elif self.pp_degree > self.num_micro_batches:
            # 1F1B needs a micro-batch per stage; GPipe computes the same with fewer
            out["pipeline_schedule"] = "gpipe"
        if self.other("loss_parallel") is not None:
            out["loss_parallel"] = bool(self.other("loss_parallel"))
        return out

    def virtual_pipeline(self, num_layers: int) -> int:
        """Model chunks per pipeline rank from ``num_layers_per_virtual_pipeline_stage``.

        Raises:
            PluginError: the layers do not divide into such chunks.
        """
        per = self.num_layers_per_virtual_pipeline_stage
        if per is None:
            return 1
        chunks, rest = divmod(num_layers, per * self.pp_degree)
        if per < 1 or rest or chunks < 1:
            raise PluginError(
                f"MegatronLMPlugin.num_layers_per_virtual_pipeline_stage={per} does not divide "
                f"the model's {num_layers} layers over pp_degree={self.pp_degree} stages"
            )
        return chunks

    def set_training_args(self, micro_batch_size: int, dp_degree: int) -> None:
        """Record the batch sizes (Accelerate's name; called by ``prepare``)."""
        self.micro_batch_size = micro_batch_size
        self.data_parallel_size = dp_degree
        self.global_batch_size = micro_batch_size * self.num_micro_batches * dp_degree

    def summary(self) -> Mapping[str, Any]:
        """The fields that are set (for logs and ``repr``)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) not in (None, False, {}, [])
        }


class MegatronLMDummyScheduler:
    """Accelerate's placeholder scheduler: ``prepare`` turns it into Megatron's LR/WD schedule.

    Args:
        optimizer: the optimizer given to ``prepare``.
        total_num_steps: the schedule's length in the user's per-device batches (see
            the module docstring); None = ``MegatronLMPlugin.train_iters`` /
            ``train_samples`` must be set.
        warmup_num_steps: warmup length, same unit.
        **kwargs: kept as ``self.kwargs`` (Accelerate ignores them too).
    """

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        **kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.kwargs = kwargs
