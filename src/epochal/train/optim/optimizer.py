"""AdamW with Megatron-LM's parameter groups, and gradient clipping.

Megatron's default rule (``_get_param_groups`` with no custom condition): a
parameter gets no weight decay if its name ends in ``.bias`` or it is
one-dimensional (norm weights and biases); everything else, embeddings included,
is decayed. Groups carry ``wd_mult`` (1.0 / 0.0), which
:class:`~epochal.train.optim.lr_schedule.OptimizerParamScheduler` multiplies into the
scheduled weight decay, and a ``name`` for logs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from epochal.parallel.exact_norm import clip_grad_norm_exact

__all__ = [
    "CONFIG_GROUP_KEYS",
    "OptimizersContainer",
    "adamw_from_config",
    "build_adamw",
    "clip_grad_norm",
    "no_weight_decay",
    "head_lr_mult",
    "param_groups",
]


def no_weight_decay(name: str, param: torch.Tensor) -> bool:
    """Megatron's default: biases and 1-D parameters (norms) are not decayed."""
    return name.endswith(".bias") or param.dim() == 1


def head_lr_mult(config: Any) -> float | None:
    """``finetune.head_lr / optimizer.lr`` for a run with a fine-tuning head and a head LR, else None."""
    finetune = getattr(config, "finetune", None)
    if getattr(config.model, "head", "mlm") == "mlm" or finetune is None or not finetune.head_lr:
        return None
    if config.optimizer.lr == 0:
        from epochal.model.config import ConfigError

        raise ConfigError(
            "finetune.head_lr", "needs optimizer.lr > 0 (the head's rate is a multiple of it)"
        )
    return finetune.head_lr / config.optimizer.lr


def param_groups(model_parts: Iterable[nn.Module], head_lr_mult: float | None = None) -> list[dict]:
    """Split the trainable parameters of ``model_parts`` into decay / no-decay groups.

    With ``head_lr_mult`` the fine-tuning head's parameters (``head.*``) form two more
    groups, ``head_decay`` / ``head_no_decay``, whose ``lr_mult`` is that factor (the
    scheduler multiplies it into their learning rate).

    Tied parameters appear once (``named_parameters`` de-duplicates within a part;
    the same tensor in two parts is also kept once). Empty groups are kept so
    that every rank has the same group structure (as Megatron does).

    Returns:
        ``[{"name": "decay", "params": [...], "wd_mult": 1.0},
        {"name": "no_decay", "params": [...], "wd_mult": 0.0}]``.
    """
    decay: list[torch.Tensor] = []
    no_decay: list[torch.Tensor] = []
    head_decay: list[torch.Tensor] = []
    head_no_decay: list[torch.Tensor] = []
    seen: set[int] = set()
    for part in model_parts:
        for name, p in part.named_parameters():
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            head = head_lr_mult is not None and name.startswith("head.")
            if no_weight_decay(name, p):
                (head_no_decay if head else no_decay).append(p)
            else:
                (head_decay if head else decay).append(p)
    groups = [
        {"name": "decay", "params": decay, "wd_mult": 1.0},
        {"name": "no_decay", "params": no_decay, "wd_mult": 0.0},
    ]
    if head_lr_mult is not None:
        groups += [
            {"name": "head_decay", "params": head_decay, "wd_mult": 1.0, "lr_mult": head_lr_mult},
            {
                "name": "head_no_decay",
                "params": head_no_decay,
                "wd_mult": 0.0,
                "lr_mult": head_lr_mult,
            },
        ]
    return groups


def build_adamw(
    model_parts: Iterable[nn.Module],
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    fused: bool = False,
    head_lr_mult: float | None = None,
) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over Megatron's parameter groups (see :func:`param_groups`).

    The initial ``lr``/``weight_decay`` are overwritten by the scheduler at
    every step; they matter only if no scheduler is used. ``fused`` selects
    PyTorch's fused kernel (``training.fused_adamw``; None-like False = its default).
    """
    groups = param_groups(model_parts, head_lr_mult)
    for g in groups:
        g["weight_decay"] = weight_decay * g["wd_mult"]
    extra = {"fused": True} if fused else {}
    return torch.optim.AdamW(
        groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **extra
    )


def clip_grad_norm(
    parameters: Iterable[torch.Tensor], max_norm: float, exact: bool = False, pieces: int = 1
) -> torch.Tensor:
    """Clip gradients to a global L2 norm of ``max_norm`` (0 = only measure); return the norm.

    ``exact``: the norm of :func:`epochal.parallel.exact_norm.exact_grad_norm` (the
    same bits as under any parallel layout under the exact gradient synchronisation;
    ``pieces``: the canonical chunks of each gradient's last dimension).

    Returns:
        The total gradient norm before clipping (float32 scalar tensor); ``inf``
        or ``nan`` if a gradient is non-finite (then nothing is scaled).
    """
    params = [p for p in parameters if p.grad is not None]
    if exact:
        return clip_grad_norm_exact(params, max_norm, pieces=pieces)
    if not params:
        return torch.zeros(())
    total = torch.nn.utils.get_total_norm([p.grad for p in params])
    if max_norm > 0 and torch.isfinite(total):
        # what clip_grad_norm_ does, minus scaling by a non-finite norm (0 or nan)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


class OptimizersContainer:
    """One optimizer per model part, used as one (torchtitan's pattern).

    A pipeline stage may hold several model parts (virtual stages); each gets its
    own optimizer so that its state dict is keyed by that part's FQNs. The
    container exposes the union of ``param_groups`` (what the LR scheduler
    writes), ``step``/``zero_grad`` over all, and a DCP ``Stateful`` interface with
    *flattened*, FQN-keyed state (``state.<fqn>.exp_avg``,
    ``param_groups.<fqn>.lr``, ...), so checkpoints reshard across layouts.

    Args:
        model_parts: the model parts (one here; several under pipeline parallelism).
        build: ``build(part) -> torch.optim.Optimizer`` for one part.
    """

    def __init__(
        self, model_parts: Sequence[nn.Module], build: Callable[[nn.Module], torch.optim.Optimizer]
    ) -> None:
        self.model_parts = list(model_parts)
        self.optimizers = [build(part) for part in self.model_parts]

    @property
    def param_groups(self) -> list[dict]:
        """All parameter groups of all optimizers (mutable, as ``Optimizer.param_groups``)."""
        return [g for opt in self.optimizers for g in opt.param_groups]

    def parameters(self) -> list[torch.Tensor]:
        """Every parameter the optimizers update (each once)."""
        return [p for g in self.param_groups for p in g["params"]]

    def step(self) -> None:
        """Step every optimizer."""
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of every optimizer's parameters."""
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    _OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)

    def state_dict(self) -> dict[str, Any]:
        """Flattened FQN-keyed state of every optimizer, merged.

        The group options the configuration decides (:data:`CONFIG_GROUP_KEYS`) are
        left out: they are never taken from a checkpoint.
        """
        merged: dict[str, Any] = {}
        for part, opt in zip(self.model_parts, self.optimizers):
            merged.update(get_optimizer_state_dict(part, opt, options=self._OPTIONS))
        return {k: v for k, v in merged.items() if not _is_config_group_key(k)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a (merged, flattened) state dict into every optimizer.

        The per-parameter state (AdamW's moments and step) and the groups' other
        options come from ``state_dict``; :data:`CONFIG_GROUP_KEYS` keep this
        run's values, so a changed ``finetune.head_lr`` takes effect on resume, and
        a head learning rate can be turned on or off there (the head's parameters
        move between groups, their moments kept).
        """
        loaded = {k: v for k, v in state_dict.items() if not _is_config_group_key(k)}
        for part, opt in zip(self.model_parts, self.optimizers):
            current = get_optimizer_state_dict(part, opt, options=self._OPTIONS)
            ours = {k: v for k, v in current.items() if _is_config_group_key(k)}
            set_optimizer_state_dict(
                part, opt, optim_state_dict={**loaded, **ours}, options=self._OPTIONS
            )


#: Parameter-group options set from the configuration (:func:`param_groups`), not restored.
CONFIG_GROUP_KEYS = ("name", "wd_mult", "lr_mult")


def _is_config_group_key(key: str) -> bool:
    """Whether a flattened key is ``param_groups.<fqn>.<one of CONFIG_GROUP_KEYS>``."""
    return key.startswith("param_groups.") and key.rsplit(".", 1)[-1] in CONFIG_GROUP_KEYS


def adamw_from_config(model_parts: Sequence[nn.Module], config: Any) -> OptimizersContainer:
    """One AdamW per model part (:func:`build_adamw`) from a ``TrainConfig``.

    Uses ``optimizer.lr``, ``wd_start``, ``adam_beta1/2``, ``adam_eps``,
    ``training.fused_adamw`` and, for a fine-tuning head, ``finetune.head_lr``
    (:func:`head_lr_mult`).
    """
    o = config.optimizer
    return OptimizersContainer(
        model_parts,
        lambda part: build_adamw(
            [part],
            lr=o.lr,
            weight_decay=o.wd_start,
            betas=(o.adam_beta1, o.adam_beta2),
            eps=o.adam_eps,
            fused=config.training.fused_adamw,
            head_lr_mult=head_lr_mult(config),
        ),
    )
