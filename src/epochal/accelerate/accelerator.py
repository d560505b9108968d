"""``Accelerator``: Hugging Face Accelerate's front door over epochal's parallel trainer.

A script written for Accelerate's Megatron-LM integration runs with its imports
changed from ``accelerate`` to ``epochal.accelerate``::

    accelerator = Accelerator()
    model, optimizer, train_dl, eval_dl, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dl, eval_dl, lr_scheduler)
    for batch in train_dl:
        loss = model(**batch).loss        # one whole train step (Megatron's engine)
        accelerator.backward(loss)        # no-ops: the step is done
        optimizer.step(); lr_scheduler.step(); optimizer.zero_grad()
    accelerator.save_state("out")         # an exact epochal checkpoint

The accelerator is always in ``DistributedType.MEGATRON_LM`` mode (one process
without a launcher; under ``epochal launch`` / ``torchrun`` the layout of
``MegatronLMPlugin``), joins the process group when created (gloo on CPU, NCCL on
GPUs) and builds the epochal run in ``prepare`` (:mod:`epochal.accelerate.preparation`).

What it cannot do raises :class:`AcceleratorError` (or the named error of the
part involved) instead of doing nothing: ``gradient_accumulation_steps`` that
disagrees with ``num_micro_batches`` (:mod:`epochal.accelerate.accumulation`),
``split_batches=True`` (keyword or
``DataLoaderConfiguration``, whose other fields are honoured or refused the same
way: :mod:`epochal.accelerate.configuration`), DeepSpeed / FSDP plugins,
``torch.compile`` through ``dynamo_backend``, ``clip_grad_norm_`` with another
norm than ``MegatronLMPlugin.gradient_clipping`` under a plugin (without one it clips
the step to its ``max_norm``, as Accelerate: :mod:`epochal.accelerate.engine`),
``backward`` of a loss that has
gradients (an extra loss term would be ignored), ``skip_first_batches`` of
another position than the one the train loader resumes at by itself after
``load_state``, ``prepare_model`` and the other single-object prepares.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from epochal.accelerate import checkpointing, configuration, operations, refusals
from epochal.accelerate.accumulation import apply_gradient_accumulation
from epochal.accelerate.engine import MegatronEngine
from epochal.accelerate.plugin import ENV_PREFIX, MegatronLMPlugin, env_bool
from epochal.accelerate.preparation import Preparation, Prepared
from epochal.accelerate.schedulers import PreparedTorchScheduler
from epochal.accelerate.state import (
    AcceleratorError,
    AcceleratorState,
    DistributedType,
    mixed_precision_from,
)
from epochal.accelerate.trackers import Trackers, resolve_trackers
from epochal.parallel.config import ParallelConfig
from epochal.parallel.launch import init_distributed

__all__ = ["Accelerator", "AcceleratorError"]


_ACCEPTED_HANDLERS = ("DistributedDataParallelKwargs", "InitProcessGroupKwargs")
CLIPPING_ENV = ENV_PREFIX + "GRADIENT_CLIPPING"


def _timeout_minutes(handlers: list[Any]) -> float | None:
    for h in handlers:
        name = type(h).__name__
        if name not in _ACCEPTED_HANDLERS:
            raise AcceleratorError(
                f"kwargs_handlers: {name} has no epochal equivalent (accepted: {', '.join(_ACCEPTED_HANDLERS)})"
            )
        timeout = getattr(h, "timeout", None)
        if name == "InitProcessGroupKwargs" and isinstance(timeout, datetime.timedelta):
            return timeout.total_seconds() / 60
    return None


class Accelerator:
    """Accelerate's ``Accelerator`` for epochal (see the module docstring).

    Args:
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"`` (default ``$ACCELERATE_MIXED_PRECISION``).
        gradient_accumulation_steps: micro-batches per step (sets ``num_micro_batches``).
        cpu: run on the CPU (default ``$ACCELERATE_USE_CPU``, or no CUDA device).
        megatron_lm_plugin: the layout and options (default: from ``MEGATRON_LM_*``).
        log_with: trackers for :meth:`init_trackers` (``"tensorboard"``, ``"wandb"``, ``"all"``).
        project_dir: where trackers write (and ``save_state()`` without a folder saves).
        project_config: a ``ProjectConfiguration`` (ours or Accelerate's): ``project_dir``,
            ``logging_dir``, ``automatic_checkpoint_naming``, ``total_limit``, ``iteration``
            (:mod:`epochal.accelerate.configuration`).
        dataloader_config: a ``DataLoaderConfiguration`` (ours or Accelerate's), each
            field honoured or refused (:mod:`epochal.accelerate.configuration`).
        parallelism_config: accepted with every size 1, else refused naming the plugin field.
        kwargs_handlers: ``InitProcessGroupKwargs(timeout=...)`` (the process group's
            timeout) and ``DistributedDataParallelKwargs`` (no effect) are accepted.
        device_placement / rng_types / step_scheduler_with_optimizer:
            accepted (batches are always put on the device; loaders draw no global randomness).

    Raises:
        AcceleratorError: an option epochal cannot honour (named).
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool = False,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: Any = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        megatron_lm_plugin: MegatronLMPlugin | None = None,
        rng_types: Any = None,
        log_with: Any = None,
        project_dir: str | os.PathLike | None = None,
        project_config: Any = None,
        gradient_accumulation_plugin: Any = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[Any] | None = None,
        dynamo_backend: Any = None,
        parallelism_config: Any = None,
        **unsupported: Any,
    ) -> None:
        refusals.install()  # a refusal reaching the top prints as one line, not a traceback
        if unsupported:
            raise AcceleratorError(
                f"Accelerator options {sorted(unsupported)} have no epochal equivalent"
            )
        if split_batches:
            raise configuration.refuse_split_batches()
        self.dataloader_config = configuration.check_dataloader_config(dataloader_config)
        configuration.check_parallelism_config(parallelism_config)
        for name, plugin in (("deepspeed_plugin", deepspeed_plugin), ("fsdp_plugin", fsdp_plugin)):
            if plugin is not None:
                raise AcceleratorError(
                    f"{name}: epochal trains Megatron-style; shard the optimizer with "
                    "MegatronLMPlugin(use_distributed_optimizer=True)"
                )
        if str(getattr(dynamo_backend, "value", dynamo_backend) or "no").lower() != "no":
            raise AcceleratorError(
                f"dynamo_backend={dynamo_backend!r}: epochal does not compile here"
            )
        timeout = _timeout_minutes(list(kwargs_handlers or []))
        self.mixed_precision = mixed_precision_from(mixed_precision)
        use_cpu = cpu or env_bool("ACCELERATE_USE_CPU", False) or not torch.cuda.is_available()
        # Accelerate builds a Megatron-LM plugin only when one is given or the launcher
        # asks for it; without one a script's step is not clipped unless it calls
        # clip_grad_norm_ (the plugin's default clipping is 1.0)
        megatron = megatron_lm_plugin is not None or env_bool("ACCELERATE_USE_MEGATRON_LM", False)
        plugin = megatron_lm_plugin or MegatronLMPlugin(
            gradient_clipping=None if megatron or os.environ.get(CLIPPING_ENV) else 0.0
        )
        apply_gradient_accumulation(
            plugin, gradient_accumulation_steps, gradient_accumulation_plugin
        )
        self._dist = init_distributed(
            ParallelConfig(
                tensor_parallel=plugin.tp_degree,
                context_parallel=plugin.cp_degree,
                pipeline_parallel=plugin.pp_degree,
                timeout_minutes=timeout,
            ),
            "cpu" if use_cpu else "cuda",
        )
        self.state = AcceleratorState(
            num_processes=self._dist.world_size,
            process_index=self._dist.rank,
            local_process_index=self._dist.local_rank,
            device=self._dist.device,
            mixed_precision=self.mixed_precision,
            megatron_lm_plugin=plugin,
            backend=dist.get_backend() if dist.is_initialized() else None,
            megatron_lm=megatron,
        )
        world = self._dist.world_size
        self.project_configuration = configuration.check_project_config(
            project_config, project_dir, int(os.environ.get("LOCAL_WORLD_SIZE", world)), world
        )
        self.trackers = Trackers(
            resolve_trackers(log_with),
            None if self.logging_dir is None else str(self.logging_dir),
            self.is_main_process,
        )
        self._prepared = Prepared()
        self._custom: list[Any] = []
        self._tensorboard = None

    # ---------------------------------------------------------------- the state
    @property
    def project_dir(self) -> str | None:
        """``project_configuration.project_dir``."""
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        """``project_configuration.logging_dir`` (default: ``project_dir``)."""
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self) -> int:
        """The number of the next automatically named checkpoint."""
        return self.project_configuration.iteration

    @property
    def distributed_type(self) -> DistributedType:
        """Always ``DistributedType.MEGATRON_LM``."""
        return DistributedType.MEGATRON_LM

    @property
    def device(self) -> torch.device:
        """This process's device."""
        return self.state.device

    @property
    def num_processes(self) -> int:
        """The world size."""
        return self.state.num_processes

    @property
    def process_index(self) -> int:
        """Global rank."""
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        """Rank on this machine."""
        return self.state.local_process_index

    @property
    def is_main_process(self) -> bool:
        """Global rank 0."""
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        """Rank 0 of this machine."""
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        """The highest global rank."""
        return self.state.is_last_process

    @property
    def use_distributed(self) -> bool:
        """More than one process."""
        return self.state.use_distributed

    @property
    def sync_gradients(self) -> bool:
        """Always True: every ``model(**batch)`` is a whole optimizer step (its last micro-batch's)."""
        return True

    @property
    def gradient_accumulation_steps(self) -> int:
        """The micro-batches of one step (:mod:`epochal.accelerate.accumulation`)."""
        return int(self.state.megatron_lm_plugin.num_micro_batches or 1)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last train step skipped its update."""
        engine = self._prepared.engine
        return bool(engine is not None and engine.last_metrics.get("skipped", 0))

    # ------------------------------------------------------------------ prepare
    def prepare(self, *args: Any, device_placement: Any = None) -> Any:
        """Turn the script's model, optimizer, loaders and dummy scheduler into the epochal run.

        See :mod:`epochal.accelerate.preparation`; objects come back in the order given.
        """
        return Preparation(
            self._prepared,
            self.state,
            self._dist,
            self._on_step,
            self.dataloader_config,
            self.mixed_precision,
            self.project_dir,
        ).prepare(args)

    def _engine(self, model: Any = None) -> MegatronEngine:
        engine = self._prepared.engine
        if engine is None or (model is not None and model is not engine):
            raise AcceleratorError("prepare the model first (accelerator.prepare(model, ...))")
        return engine

    def _on_step(self, step: int, metrics: dict[str, Any]) -> None:
        plugin = self.state.megatron_lm_plugin
        if plugin.tensorboard_dir is None or not self.is_main_process:
            return
        if self._tensorboard is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(plugin.tensorboard_dir)
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._tensorboard.add_scalar(key, float(value), global_step=step)
        self._tensorboard.flush()

    # ------------------------------------------------------------- the step
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Nothing: ``model(**batch)`` ran the backward (its loss has no gradient).

        Raises:
            AcceleratorError: ``loss`` has a gradient (a loss computed outside the step,
                which a no-op would silently drop): compute it in a custom train step.
        """
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            raise AcceleratorError(
                "backward() got a loss with a gradient; the prepared model's step already ran "
                "its backward, so this loss would be ignored: compute it inside a custom train "
                "step (MegatronLMPlugin(custom_train_step_class=...))"
            )

    @contextlib.contextmanager
    def accumulate(self, *models: Any) -> Iterator[None]:
        """Nothing to accumulate: every step accumulates its micro-batches itself."""
        yield

    @contextlib.contextmanager
    def no_sync(self, model: Any = None) -> Iterator[None]:
        """Nothing to do (see :meth:`accumulate`)."""
        yield

    @contextlib.contextmanager
    def autocast(self, autocast_handler: Any = None) -> Iterator[None]:
        """Autocast to the mixed precision outside the prepared model (the model casts itself)."""
        dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
        if self.mixed_precision in dtypes:
            with torch.autocast(self.device.type, dtype=dtypes[self.mixed_precision]):
                yield
        else:
            yield

    def clip_grad_norm_(
        self, parameters: Any, max_norm: float, norm_type: float = 2
    ) -> torch.Tensor:
        """Clip the step's gradients to the global L2 norm ``max_norm``; returns the norm before.

        A plain loop (no Megatron-LM plugin: :attr:`AcceleratorState.megatron_lm`) clips
        the step ``model(**batch)`` computed to ``max_norm`` and applies its update, as
        ``torch.nn.utils.clip_grad_norm_`` then ``optimizer.step()`` would. Under a plugin
        the train step clipped itself (``MegatronLMPlugin.gradient_clipping``): the same
        ``max_norm`` returns that step's norm.

        Raises:
            AcceleratorError: another ``norm_type`` than 2, ``max_norm`` <= 0, another
                ``max_norm`` than the plugin's, or (a plain loop) no step waiting for
                its update (call it between ``backward`` and ``optimizer.step()``).
        """
        if float(norm_type) != 2.0 or not float(max_norm) > 0:
            raise AcceleratorError(
                f"clip_grad_norm_(max_norm={max_norm}, norm_type={norm_type}): epochal clips "
                "the global L2 norm (norm_type=2) to a max_norm > 0"
            )
        if self.state.megatron_lm:
            clip = self.state.megatron_lm_plugin.gradient_clipping
            if float(max_norm) != float(clip):
                raise AcceleratorError(
                    f"clip_grad_norm_(max_norm={max_norm}): the train step clips the global L2 "
                    f"norm to MegatronLMPlugin.gradient_clipping={clip}; set gradient_clipping "
                    "(megatron_lm_gradient_clipping in the YAML) instead"
                )
            return torch.tensor(float(self._engine().last_metrics.get("grad_norm", 0.0)))
        engine = self._engine()
        if not engine.update_pending:
            raise AcceleratorError(
                "clip_grad_norm_: no step is waiting for its update (optimizer.step() applied "
                "it already); call it after accelerator.backward(loss), before optimizer.step()"
            )
        metrics = engine.complete_step(float(max_norm))
        return torch.tensor(float(metrics["grad_norm"]))

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Refused: the step clips the global norm (``MegatronLMPlugin.gradient_clipping``)."""
        raise AcceleratorError(
            "clip_grad_value_: the train step clips the global L2 norm "
            "(MegatronLMPlugin.gradient_clipping); value clipping has no equivalent"
        )

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """``dataloader`` itself when it already starts at step ``num_batches`` of its epoch.

        After ``load_state`` the prepared train loader continues at the exact next
        sample by itself, so the script's ``skip_first_batches(loader, resume_step)``
        is checked and changes nothing.

        Raises:
            AcceleratorError: another loader, or another number of batches (named).
        """
        at = getattr(dataloader, "resume_step", None)
        if at is None or not any(dataloader is d for d in self._prepared.loaders):
            raise AcceleratorError("skip_first_batches: give a loader returned by prepare()")
        if int(num_batches) != at:
            raise AcceleratorError(
                f"skip_first_batches(dataloader, {num_batches}): the prepared loader starts at "
                f"step {at} of its epoch (after load_state it continues at the exact next "
                "sample by itself); iterate it without skipping"
            )
        return dataloader

    def _single(self, name: str) -> None:
        raise AcceleratorError(
            f"{name}: prepare the objects together with accelerator.prepare(model, optimizer, "
            "train_dataloader, eval_dataloader, lr_scheduler)"
        )

    def prepare_model(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        """Refused: use :meth:`prepare` (the loaders fix the micro-batch size)."""
        self._single("prepare_model")

    def prepare_optimizer(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Refused: use :meth:`prepare`."""
        self._single("prepare_optimizer")

    def prepare_scheduler(self, scheduler: Any) -> Any:
        """Refused: use :meth:`prepare`."""
        self._single("prepare_scheduler")

    def prepare_data_loader(self, data_loader: Any, *args: Any, **kwargs: Any) -> Any:
        """Refused: use :meth:`prepare`."""
        self._single("prepare_data_loader")

    # ---------------------------------------------------------- processes
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        """A barrier over all processes."""
        if dist.is_initialized() and self.num_processes > 1:
            dist.barrier()

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """The main process runs the block first, then the others."""
        if not self.is_main_process:
            self.wait_for_everyone()
        yield
        if self.is_main_process:
            self.wait_for_everyone()

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """The local main process runs the block first (every machine), then the others."""
        if not self.is_local_main_process:
            self.wait_for_everyone()
        yield
        if self.is_local_main_process:
            self.wait_for_everyone()

    def gather(self, tensor: Any) -> Any:
        """Every process's tensors concatenated along dim 0 (:func:`~epochal.accelerate.operations.gather`)."""
        return operations.gather(tensor, self.device)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """:meth:`gather` of each sample once (the loaders read no sample twice); objects by rank.

        Under tensor, context or pipeline parallelism a data-parallel replica's processes
        hold the same samples: only its first process (tensor and context rank 0, first
        stage) contributes, so the metrics see every sample once, as in one process.
        """
        if use_gather_object or not isinstance(input_data, (torch.Tensor, dict, list, tuple)):
            return operations.gather_object(input_data)
        engine = self._prepared.engine
        dims = None if engine is None else engine.trainer.dims
        if dims is None or dims.tp * dims.cp * dims.pp == 1:
            return self.gather(input_data)
        first = ("tp", "cp", "pp")
        ranks = [r for r in range(dims.world_size) if not any(dims.coords(r)[k] for k in first)]
        return operations.gather(input_data, self.device, ranks)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Sum / average tensors over processes (:func:`~epochal.accelerate.operations.reduce`)."""
        return operations.reduce(tensor, self.device, reduction, scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> Any:
        """Pad tensors along ``dim`` to the longest over processes."""
        return operations.pad_across_processes(tensor, self.device, dim, pad_index, pad_first)

    # ------------------------------------------------------------- the model
    def unwrap_model(
        self, model: Any, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> Any:
        """The user's transformers model holding the trained weights (a collective), or ``model``.

        Its ``save_pretrained(dir)`` writes a Hugging Face folder ``transformers`` loads.
        """
        if not isinstance(model, MegatronEngine):
            return model
        model.complete_step()
        return model.trainer.source.write_back(checkpointing.full_state(model.trainer))

    def get_state_dict(self, model: Any, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The model's full state dict with Hugging Face names (a collective)."""
        engine = self._engine(model if isinstance(model, MegatronEngine) else None)
        engine.complete_step()
        return engine.trainer.source.hf_state(checkpointing.full_state(engine.trainer))

    def save_model(
        self,
        model: Any,
        save_directory: str | os.PathLike,
        safe_serialization: bool = True,
        **kwargs: Any,
    ) -> None:
        """Write the model as a Hugging Face folder on the main process (a collective)."""
        unwrapped = self.unwrap_model(model)
        if self.is_main_process:
            unwrapped.save_pretrained(save_directory, safe_serialization=safe_serialization)
        self.wait_for_everyone()

    def save(self, obj: Any, f: str | os.PathLike, safe_serialization: bool = False) -> None:
        """Save ``obj`` on the main process (``torch.save``, or safetensors for a dict of tensors)."""
        if not self.is_main_process:
            return
        if safe_serialization:
            from safetensors.torch import save_file

            save_file(
                {k: v.contiguous() for k, v in obj.items()}, str(f), metadata={"format": "pt"}
            )
        else:
            torch.save(obj, f)

    # --------------------------------------------------------- checkpoints
    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and restore ``objects`` (with ``state_dict`` / ``load_state_dict``) with the run.

        Raises:
            AcceleratorError: an object without those methods.
        """
        for obj in objects:
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise AcceleratorError(
                    f"register_for_checkpointing: {type(obj).__name__} has no state_dict / load_state_dict"
                )
            self._custom.append(obj)

    def _torch_scheduler(self) -> Any:
        scheduler = self._prepared.scheduler
        return scheduler if isinstance(scheduler, PreparedTorchScheduler) else None

    def _state_dir(self, given: str | os.PathLike | None, what: str) -> Path:
        if given is not None:
            return Path(given)
        if self.project_dir is None:
            raise AcceleratorError(f"{what}: give a folder (or Accelerator(project_dir=...))")
        return Path(self.project_dir) / "checkpoints"

    def save_state(self, output_dir: str | os.PathLike | None = None, **kwargs: Any) -> str:
        """Save the whole run into ``output_dir`` (:func:`~epochal.accelerate.checkpointing.save_state`).

        With ``ProjectConfiguration(automatic_checkpoint_naming=True)`` the folder is
        ``project_dir/checkpoints/checkpoint_<iteration>`` (``output_dir`` is ignored, as
        in Accelerate) and ``total_limit`` prunes the oldest afterwards
        (:func:`~epochal.accelerate.configuration.prune_checkpoints`).

        Returns:
            The folder written, as a string.
        """
        project = self.project_configuration
        automatic = project.automatic_checkpoint_naming
        directory = (
            configuration.automatic_folder(project)
            if automatic
            else self._state_dir(output_dir, "save_state")
        )
        self.wait_for_everyone()  # every process checked the folder before any writes it
        engine = self._engine()
        engine.complete_step()
        checkpointing.save_state(engine.trainer, directory, self._custom, self._torch_scheduler())
        if automatic and self.is_main_process:
            configuration.prune_checkpoints(directory.parent, project.total_limit, directory)
        self.wait_for_everyone()
        project.iteration += 1
        return str(directory)

    def load_state(self, input_dir: str | os.PathLike | None = None, **kwargs: Any) -> None:
        """Restore the run from ``input_dir`` (:func:`~epochal.accelerate.checkpointing.load_state`)."""
        engine = self._engine()
        project = self.project_configuration
        if input_dir is None and project.automatic_checkpoint_naming:
            input_dir = configuration.newest_folder(self._state_dir(None, "load_state"))
        checkpointing.load_state(
            engine.trainer,
            self._state_dir(input_dir, "load_state"),
            self._custom,
            self._torch_scheduler(),
        )
        engine.weights_pending = False
        engine.discard_step()
        configuration.continue_numbering(project)

    # ------------------------------------------------------------ trackers
    def init_trackers(
        self,
        project_name: str,
        config: dict[str, Any] | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Open the trackers of ``log_with`` on the main process (:mod:`epochal.accelerate.trackers`)."""
        self.trackers.init(project_name, config, init_kwargs)

    def log(
        self,
        values: dict[str, Any],
        step: int | None = None,
        log_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Log ``values`` at ``step`` to the open trackers."""
        self.trackers.log(values, step)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The open tracker ``name`` (a ``SummaryWriter`` or a W&B run)."""
        return self.trackers.get(name)

    def end_training(self) -> None:
        """Complete a waiting step; close the trackers (and the plugin's TensorBoard writer);
        wait for every process."""
        if self._prepared.engine is not None:
            self._prepared.engine.complete_step()
        self.trackers.finish()
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        self.wait_for_everyone()

    def free_memory(self, *objects: Any) -> tuple[Any, ...]:
        """Forget everything prepared (a new ``prepare`` starts over); returns Nones for ``objects``."""
        self._prepared = Prepared()
        self._custom = []
        return tuple(None for _ in objects)

    clear = free_memory
