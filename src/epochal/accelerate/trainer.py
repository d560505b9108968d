"""``AccelerateTrainer``: epochal's parallel trainer fed by a prepared Accelerate script.

It is :class:`~epochal.train.parallel_trainer.ParallelTrainer` (layout, engine,
pipeline schedules, clipping, checkpoints: all unchanged) with four seams filled
from the script's objects:

- :meth:`build_model_parts`: the engine's parts, then the transformers model's
  weights copied in (each rank takes its shard), and on the ranks holding the
  last stage a forward hook that sets the logits of the padded vocabulary rows to
  ``-inf``: they never enter the softmax, so the loss is the transformers model's
  (:func:`mask_padded_vocab`);
- :meth:`build_optimizers`: the user's optimizer class and per-group options
  (learning rate, betas, eps, weight decay, ...) over epochal's trained parameters,
  each in the group its Hugging Face source was in (``frozen`` ones, built with
  ``requires_grad=False``, are in none); the schedule writes each group's
  learning rate and weight decay from its own values (``max_lr`` / ``start_wd``...);
- :meth:`build_train_step`: ``custom_train_step_class`` (with its kwargs) or the
  model type's step, with ``custom_get_batch_function`` / ``custom_loss_function``
  in place of its own; every pipeline stage reads the micro-batches (the script's
  loop hands every rank its batch anyway).

The script's loop calls :meth:`Trainer.train_step` and the engine's ``eval_loss``
(see :mod:`epochal.accelerate.engine`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from epochal.accelerate.prepare_model import HFSource
from epochal.model.init import canonical_name
from epochal.train.optim.optimizer import OptimizersContainer
from epochal.train.parallel_trainer import ParallelTrainer
from epochal.train.state.encoder_init import copy_full_state
from epochal.train.steps import TrainStep
from epochal.train.steps.gpt import GPTTrainStep

__all__ = ["AccelerateTrainer", "mask_padded_vocab"]


def _mask_logits(logits: torch.Tensor, vocab_size: int, padded: int, tp_rank: int) -> torch.Tensor:
    local = logits.shape[-1]
    start = 0 if local == padded else tp_rank * local
    if start + local <= vocab_size:
        return logits
    columns = torch.arange(start, start + local, device=logits.device) >= vocab_size
    return logits.masked_fill(columns, float("-inf"))


def mask_padded_vocab(part: nn.Module, vocab_size: int, padded: int, tp_rank: int) -> None:
    """Make ``part`` (a last pipeline stage) return ``-inf`` logits for ids ``>= vocab_size``.

    Works on whole logits ``[..., padded]`` and on this tensor-parallel rank's
    vocabulary slice ``[..., padded / tp]`` (vocabulary-parallel loss); a tuple output
    (BERT's binary head) has its first item masked.
    """

    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        if isinstance(output, tuple):
            return (_mask_logits(output[0], vocab_size, padded, tp_rank), *output[1:])
        return _mask_logits(output, vocab_size, padded, tp_rank)

    part.register_forward_hook(hook)


class AccelerateTrainer(ParallelTrainer):
    """:class:`ParallelTrainer` built from a prepared script (see the module docstring).

    Args:
        config: the run's configuration (:func:`~epochal.accelerate.run_config.build_train_config`).
        source: the converted transformers model.
        optimizer: the user's optimizer (its class and groups), or None (AdamW from the config).
        groups: epochal parameter name -> the user's group index (with ``optimizer``).
        frozen: epochal parameter names that are not trained (``requires_grad=False``).
        step_class / step_kwargs: ``custom_train_step_class`` and its kwargs, or None.
        get_batch / loss_func: ``custom_get_batch_function`` / ``custom_loss_function``.
        **kwargs: :class:`ParallelTrainer`'s (``data``, ``dist_info``, ``log``).
    """

    def __init__(
        self,
        config: Any,
        *,
        source: HFSource,
        optimizer: torch.optim.Optimizer | None = None,
        groups: dict[str, int] | None = None,
        frozen: frozenset[str] = frozenset(),
        step_class: type[TrainStep] | None = None,
        step_kwargs: dict[str, Any] | None = None,
        get_batch: Callable[..., Any] | None = None,
        loss_func: Callable[..., Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.source = source
        self.user_optimizer = optimizer
        self.groups = groups or {}
        self.frozen = frozen
        #: the micro-batches' ``position_ids`` go to the model (set by the engine)
        self.keep_position_ids = False
        self.step_class = step_class
        self.step_kwargs = dict(step_kwargs or {})
        self.custom_get_batch = get_batch
        self.custom_loss_func = loss_func
        super().__init__(config, **kwargs)
        # the script hands every rank its batch: every pipeline stage reads micro-batches
        self.train_step_handler.every_stage_reads_batches = True

    # ------------------------------------------------------------------ seams
    def build_train_step(self) -> TrainStep:
        """``custom_train_step_class(config, **kwargs)`` or the model type's step (custom parts set)."""
        if self.step_class is not None:
            step = self.step_class(self.config, **self.step_kwargs)
        else:
            step = super().build_train_step()
        if self.custom_get_batch is not None:
            step.get_batch = self.custom_get_batch  # type: ignore[method-assign]
        if self.custom_loss_func is not None:
            step.loss_func = self.custom_loss_func  # type: ignore[method-assign]
        elif type(step) is GPTTrainStep and self.custom_get_batch is None:
            # summed losses: the plan divides by num_items_in_batch when the script gives it
            step.calculate_per_token_loss = True
        return step

    def step_batch(self, micro_batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The trainer's, keeping the batch's ``position_ids`` (a causal model's own positions)."""
        out = super().step_batch(micro_batch)
        positions = micro_batch.get("position_ids")
        if self.keep_position_ids and isinstance(positions, torch.Tensor):
            out["position_ids"] = positions.to(self.device, non_blocking=True)
        return out

    def build_model_parts(self) -> list[nn.Module]:
        """The engine's parts with the transformers weights and the padded-vocabulary mask."""
        parts = super().build_model_parts()
        if self.source.state is not None:
            for part in parts:
                copy_full_state(part, self.source.state)
        engine = self.engine
        if engine.has_last_stage and self.model_config.head == "mlm":
            last = parts[engine.stage_ids.index(engine.dims.num_stages - 1)]
            cfg = self.model_config
            mask_padded_vocab(last, cfg.vocab_size, cfg.padded_vocab_size, engine.tp_rank)
        return parts

    def build_optimizers(self) -> OptimizersContainer:
        """The user's optimizer class and group options over epochal's parameters."""
        user = self.user_optimizer
        if user is None:
            return super().build_optimizers()
        template = [{k: v for k, v in g.items() if k != "params"} for g in user.param_groups]
        default_lr = float(user.defaults.get("lr", 0.0))
        default_wd = float(user.defaults.get("weight_decay", 0.0))
        constant_wd = self.config.scheduler.weight_decay_incr_style == "constant"
        known = inspect.signature(type(user).__init__).parameters
        accepted = {k: v for k, v in user.defaults.items() if k in known}

        def build(part: nn.Module) -> torch.optim.Optimizer:
            params: list[list[torch.Tensor]] = [[] for _ in template]
            seen: set[int] = set()
            for name, p in part.named_parameters():
                if not p.requires_grad or id(p) in seen:
                    continue
                seen.add(id(p))
                params[self.groups.get(canonical_name(name), 0)].append(p)
            groups = []
            for options, members in zip(template, params):
                group = {**options, "params": members}
                # the group's own peak: a learning rate written into the prepared
                # optimizer's group later lands here, saved and restored with the run
                group["max_lr"] = float(options.get("lr", default_lr))
                wd = float(options.get("weight_decay", default_wd))
                if constant_wd:
                    group["start_wd"] = group["end_wd"] = wd
                else:
                    group["wd_mult"] = 1.0 if wd > 0 else 0.0
                groups.append(group)
            return type(user)(groups, **accepted)

        return OptimizersContainer(self.model_parts, build)
