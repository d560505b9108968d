"""``accelerator.prepare(...)``: sort the script's objects and build the epochal run from them.

Objects may come in any order and subset, in one call or several (Accelerate's
rule for Megatron-LM: the call that prepares the model needs the loaders, or
they were prepared before, since their batch size is the micro-batch size):

- ``torch.utils.data.DataLoader`` -> :class:`~epochal.accelerate.prepare_data.PreparedDataLoader`
  (the first one ever prepared is the train loader);
- a transformers model -> :class:`~epochal.accelerate.engine.MegatronEngine`;
- a ``torch.optim.Optimizer`` -> :class:`~epochal.accelerate.wrappers.AcceleratedOptimizer`;
- a :class:`~epochal.accelerate.plugin.MegatronLMDummyScheduler` ->
  :class:`~epochal.accelerate.wrappers.AcceleratedScheduler` (Megatron's schedule from
  the plugin); any PyTorch learning-rate scheduler of the optimizer prepared in the same
  call -> :class:`~epochal.accelerate.schedulers.PreparedTorchScheduler` (it drives the
  learning rate as in plain PyTorch);
- a :class:`~epochal.accelerate.dummy_data.MegatronLMDummyDataLoader` (given three
  times, as in the guide) -> the train, validation and test iterators of Megatron's
  indexed GPT datasets;
- anything else is returned unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader

from epochal.accelerate.batches import BatchAdapter
from epochal.accelerate.configuration import DataLoaderConfiguration
from epochal.accelerate.deepspeed import deepspeed_refusal
from epochal.accelerate.dummy_data import MegatronLMDummyDataLoader, StepIterator
from epochal.accelerate.engine import MegatronEngine
from epochal.accelerate.plugin import MegatronLMDummyScheduler, PluginError
from epochal.accelerate.prepare_data import PreparedDataLoader
from epochal.accelerate.prepare_model import (
    ModelPrepareError,
    convert_hf_model,
    fresh_optimizer,
    parameter_roles,
    weights_fingerprint,
)
from epochal.accelerate.run_config import RunShape, build_train_config
from epochal.accelerate.schedulers import PreparedTorchScheduler, is_torch_scheduler
from epochal.accelerate.state import AcceleratorState
from epochal.accelerate.trainer import AccelerateTrainer
from epochal.accelerate.wrappers import AcceleratedOptimizer, AcceleratedScheduler
from epochal.data.loading.data_sampler import MegatronDataSampler
from epochal.model.config import ConfigError
from epochal.parallel.config import ParallelConfig
from epochal.parallel.dims import ParallelDims
from epochal.parallel.launch import DistributedInfo
from epochal.train.config import TrainConfig
from epochal.train.inputs.loaders import DataBundle

__all__ = ["PrepareError", "Prepared", "Preparation"]


#: how the trainer's option names read in an Accelerate script
_IN_ACCELERATE_TERMS = (
    "in Accelerate's terms: parallel.tensor_parallel / pipeline_parallel / sequence_parallel = "
    "MegatronLMPlugin tp_degree / pp_degree / sequence_parallelism (megatron_lm_* in the YAML); "
    "parallel.context_parallel = MegatronLMPlugin context_parallel_size (or "
    "other_megatron_args['context_parallel_size']); "
    "training.micro_batch_size = the DataLoader's batch_size; training.global_batch_size = "
    "batch_size x num_micro_batches x data-parallel size; data.seq_length = the batches' length"
)


class PrepareError(ValueError):
    """Objects ``prepare`` cannot use (the message names the object and what to change)."""


@dataclass
class Prepared:
    """What an accelerator has prepared so far."""

    loaders: list[PreparedDataLoader] = field(default_factory=list)
    engine: MegatronEngine | None = None
    optimizer: AcceleratedOptimizer | None = None
    scheduler: AcceleratedScheduler | PreparedTorchScheduler | None = None
    seed: int | None = None
    micro_batch_size: int | None = None


def _micro_batch_size(loaders: list[DataLoader], plugin: Any) -> int:
    sizes = [dl.batch_size for dl in loaders]
    if any(s is None for s in sizes):
        raise PrepareError(
            "every DataLoader given to prepare() needs a batch_size (the micro-batch size)"
        )
    return min(sizes) if plugin.is_train_batch_min else max(sizes)


def _classifier_options(source: Any) -> dict[str, Any] | None:
    """The batch adapter's options of a classification model (None for a language model)."""
    if source.layout is None:
        return None
    hf = source.hf_config
    pad = getattr(hf, "pad_token_id", None)
    return {
        "pooling": source.layout.pooling,
        "causal": source.config.type == "gpt",
        "pad_token_id": None if pad is None else int(pad),
        "hf_config": hf,
    }


@dataclass
class _Sorted:
    """The objects of one ``prepare`` call, by kind (each list in the order given)."""

    models: list[torch.nn.Module]
    optimizers: list[torch.optim.Optimizer]
    dummy_schedulers: list[MegatronLMDummyScheduler]
    torch_schedulers: list[Any]
    loaders: list[DataLoader]
    dummies: list[MegatronLMDummyDataLoader]

    @property
    def schedulers(self) -> list[Any]:
        """The dummy schedulers, then the PyTorch ones."""
        return self.dummy_schedulers + self.torch_schedulers


class Preparation:
    """One ``prepare(...)`` call of an accelerator, given what it reads of the accelerator.

    Args:
        prepared: what the accelerator has prepared so far (filled in by :meth:`prepare`).
        state: the accelerator's state (its plugin, processes, device, ``megatron_lm``).
        dist_info: the process group's information, for the trainer.
        on_step: ``on_step(step, metrics)`` after each train step, for the engine.
        dataloader_config: the accelerator's ``DataLoaderConfiguration``.
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``.
        project_dir: where the run writes (None: the current folder).
    """

    def __init__(
        self,
        prepared: Prepared,
        state: AcceleratorState,
        dist_info: DistributedInfo,
        on_step: Callable[[int, dict[str, Any]], None],
        dataloader_config: DataLoaderConfiguration,
        mixed_precision: str,
        project_dir: str | None,
    ) -> None:
        self.done = prepared
        self.state = state
        self.plugin = state.megatron_lm_plugin
        self.dist_info = dist_info
        self.on_step = on_step
        self.dataloader_config = dataloader_config
        self.mixed_precision = mixed_precision
        self.project_dir = project_dir

    # ------------------------------------------------------------- prepare(...)
    def prepare(self, args: tuple[Any, ...]) -> Any:
        """Prepare ``args`` (see the module docstring).

        Args:
            args: the objects given to ``prepare``, in any order.

        Returns:
            The one prepared object, or a tuple of them in the order given.

        Raises:
            PrepareError: objects that cannot be used together (or a loader without a
                batch size); see :meth:`check_kinds` and :meth:`build_engine`.
            PluginError: the processes do not fit the plugin's layout, or the trainer
                refuses the run's options.
            ModelPrepareError: a model epochal cannot convert, or whose weights differ
                between processes.
        """
        objs = self.sort(args)
        self.check_kinds(objs)
        self.ensure_seed()
        dp_rank, dp_size = self.data_parallel()
        self.set_micro_batch_size(objs, dp_size)
        results: dict[int, Any] = {}
        for dl in objs.loaders:
            results[id(dl)] = self.prepare_loader(dl, dp_rank, dp_size)
        iterators: list[Any] = []
        if objs.models:
            iterators = self.prepare_model(objs, dp_rank, dp_size, results)
        out = []
        for obj in args:  # the dummy loader's occurrences: train, validation, test
            out.append(
                iterators.pop(0)
                if any(obj is d for d in objs.dummies) and iterators
                else results.get(id(obj), obj)
            )
        return out[0] if len(out) == 1 else tuple(out)

    @staticmethod
    def sort(args: tuple[Any, ...]) -> _Sorted:
        """Sort ``args`` by kind.

        Args:
            args: the objects given to ``prepare``.

        Returns:
            The models, optimizers, schedulers, DataLoaders and dummy loaders among them.

        Raises:
            PrepareError: a DeepSpeed object (epochal has no DeepSpeed).
        """
        models = [a for a in args if isinstance(a, torch.nn.Module)]
        optimizers = [a for a in args if isinstance(a, torch.optim.Optimizer)]
        for obj in args:
            refusal = deepspeed_refusal(obj)
            if refusal is not None:
                raise PrepareError(refusal)
        return _Sorted(
            models=models,
            optimizers=optimizers,
            dummy_schedulers=[a for a in args if isinstance(a, MegatronLMDummyScheduler)],
            torch_schedulers=[
                a
                for a in args
                if is_torch_scheduler(a) and not isinstance(a, MegatronLMDummyScheduler)
            ],
            loaders=[a for a in args if isinstance(a, DataLoader)],
            dummies=[a for a in args if isinstance(a, MegatronLMDummyDataLoader)],
        )

    def check_kinds(self, objs: _Sorted) -> None:
        """Check that ``objs`` can be prepared with what was prepared before.

        Args:
            objs: the objects of this call, by kind.

        Raises:
            PrepareError: a PyTorch scheduler of another optimizer than this call's, a
                second model, optimizer or scheduler, or an optimizer or scheduler
                without a model.
        """
        for obj in objs.torch_schedulers:
            if not objs.optimizers or obj.optimizer is not objs.optimizers[0]:
                raise PrepareError(
                    f"the {type(obj).__name__} scheduler must be built on the optimizer prepared in "
                    "the same prepare() call: prepare(model, optimizer, ..., lr_scheduler) together"
                )
        done = self.done
        kinds = (("model", objs.models), ("optimizer", objs.optimizers))
        for kind, found in (*kinds, ("scheduler", objs.schedulers)):
            if len(found) > 1 or (found and getattr(done, "engine" if kind == "model" else kind)):
                raise PrepareError(f"an epochal Accelerator trains one {kind}; got another")
        if (objs.optimizers or objs.schedulers) and not objs.models and done.engine is None:
            raise PrepareError("prepare the optimizer and scheduler together with the model")

    def ensure_seed(self) -> None:
        """Set the run's seed, once: process 0's ``torch.initial_seed()``."""
        if self.done.seed is None:
            from epochal.accelerate.operations import broadcast_object

            self.done.seed = int(broadcast_object(torch.initial_seed() % 2**32))

    def data_parallel(self) -> tuple[int, int]:
        """This process's data-parallel rank and the data-parallel size.

        Returns:
            ``(dp_rank, dp_size)`` of the plugin's layout over the processes.

        Raises:
            PluginError: the number of processes does not fit the layout.
        """
        plugin, state = self.plugin, self.state
        cp = plugin.cp_degree
        config = ParallelConfig(
            tensor_parallel=plugin.tp_degree,
            context_parallel=cp,
            pipeline_parallel=plugin.pp_degree,
        )
        try:
            dims = ParallelDims.from_config(config, state.num_processes)
        except ValueError as exc:
            cp_text = f" x context_parallel_size={cp}" if cp > 1 else ""
            raise PluginError(
                f"{state.num_processes} processes do not fit tp_degree={plugin.tp_degree}{cp_text} x "
                f"pp_degree={plugin.pp_degree}: {exc}"
            ) from None
        return dims.coords(state.process_index)["dp"], dims.dp

    def set_micro_batch_size(self, objs: _Sorted, dp_size: int) -> None:
        """Set the micro-batch size (once) and the plugin's training arguments from it.

        Args:
            objs: the objects of this call, by kind.
            dp_size: the data-parallel size.

        Raises:
            PrepareError: a dummy loader with DataLoaders or without the model, or a
                DataLoader without a batch size.
        """
        done, plugin = self.done, self.plugin
        if objs.dummies:
            if objs.loaders or done.loaders or not objs.models:
                raise PrepareError(
                    "prepare MegatronLMDummyDataLoader together with the model, without DataLoaders "
                    "(it gives the train, validation and test loaders)"
                )
            done.micro_batch_size = objs.dummies[0].micro_batch_size
            plugin.set_training_args(done.micro_batch_size, dp_size)
            plugin.megatron_dataset_flag = True
        if objs.loaders and done.micro_batch_size is None:
            done.micro_batch_size = _micro_batch_size(objs.loaders, plugin)
            plugin.set_training_args(done.micro_batch_size, dp_size)

    def prepare_loader(self, dl: DataLoader, dp_rank: int, dp_size: int) -> PreparedDataLoader:
        """Prepare one DataLoader (the first one ever prepared is the train loader).

        Args:
            dl: the script's loader.
            dp_rank: this process's data-parallel rank.
            dp_size: the data-parallel size.

        Returns:
            The prepared loader, also recorded in ``prepared.loaders``.
        """
        done, plugin, config = self.done, self.plugin, self.dataloader_config
        first = not done.loaders
        consumed = (plugin.consumed_samples or [0])[0] if first else 0
        loader_seed = config.data_seed  # DataLoaderConfiguration(data_seed=...)
        prepared = PreparedDataLoader(
            dl,
            micro_batch_size=done.micro_batch_size,
            num_microbatches=plugin.num_micro_batches,
            dp_rank=dp_rank,
            dp_size=dp_size,
            seed=done.seed if loader_seed is None else loader_seed,
            train=first,
            device=self.state.device,
            non_blocking=config.non_blocking,
            consumed_samples=consumed,
        )
        if self.state.is_main_process:
            self._report_loader(dl, prepared, first)
        done.loaders.append(prepared)
        return prepared

    @staticmethod
    def _report_loader(dl: DataLoader, prepared: PreparedDataLoader, first: bool) -> None:
        """Print the samples a loader leaves out, and the train loader's shuffling."""
        if prepared.dropped_per_epoch:
            kind = "train" if first else "evaluation"
            print(
                f"epochal.accelerate: the {kind} loader reads {prepared.samples_per_epoch} of "
                f"{len(dl.dataset)} samples per pass (whole global batches of "
                f"{prepared.global_batch_size}); {prepared.dropped_per_epoch} are left out",
                flush=True,
            )
        if first and prepared.shuffle:
            print(
                "epochal.accelerate: the train loader shuffles with Megatron's per-epoch "
                "permutation (the same order on any number of processes), not torch's "
                "RandomSampler: another order than Accelerate's, the same samples",
                flush=True,
            )

    def prepare_model(
        self, objs: _Sorted, dp_rank: int, dp_size: int, results: dict[int, Any]
    ) -> list[Any]:
        """Build the engine of this call's model, and wrap its optimizer and scheduler.

        Args:
            objs: the objects of this call, by kind (one model).
            dp_rank: this process's data-parallel rank.
            dp_size: the data-parallel size.
            results: prepared objects by ``id`` of the given ones (added to).

        Returns:
            The dummy loader's train, validation and test iterators (empty without one).

        Raises:
            PrepareError: no DataLoader prepared yet, or see :meth:`build_engine`.
        """
        done = self.done
        if not done.loaders and not objs.dummies:
            raise PrepareError(
                "prepare the model together with (or after) a DataLoader: its batch_size is "
                "the micro-batch size"
            )
        model = objs.models[0]
        optimizer = objs.optimizers[0] if objs.optimizers else None
        scheduler = objs.dummy_schedulers[0] if objs.dummy_schedulers else None
        dummy = objs.dummies[0] if objs.dummies else None
        engine, iterators = self.build_engine(model, optimizer, scheduler, dp_rank, dp_size, dummy)
        done.engine = results[id(model)] = engine
        if optimizer is not None:
            done.optimizer = results[id(optimizer)] = AcceleratedOptimizer(
                engine, optimizer, lr_scheduled=scheduler is not None
            )
        if scheduler is not None:
            done.scheduler = results[id(scheduler)] = AcceleratedScheduler(engine, scheduler)
        for user_scheduler in objs.torch_schedulers:  # one: checked in check_kinds
            done.scheduler = results[id(user_scheduler)] = PreparedTorchScheduler(
                engine, done.optimizer, user_scheduler, steps_per_update=dp_size
            )
        return iterators

    # ------------------------------------------------------------------ the engine
    def build_engine(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        scheduler: MegatronLMDummyScheduler | None,
        dp_rank: int,
        dp_size: int,
        dummy: MegatronLMDummyDataLoader | None,
    ) -> tuple[MegatronEngine, list[Any]]:
        """Build the epochal run of ``model`` and the engine that steps it.

        Args:
            model: the script's transformers model.
            optimizer: its optimizer (None: the plugin's).
            scheduler: the dummy scheduler (None: none, or a PyTorch one).
            dp_rank: this process's data-parallel rank.
            dp_size: the data-parallel size.
            dummy: the dummy loader (None: the prepared DataLoaders feed the run).

        Returns:
            The engine, and the dummy loader's train, validation and test iterators
            (empty without one).

        Raises:
            PrepareError: an optimizer with state, or a dummy loader that cannot feed the model.
            PluginError: plugin fields that do not check, or options the trainer refuses.
            ModelPrepareError: a model epochal cannot convert, or whose weights differ
                between processes.
        """
        self.plugin.check()  # fields may have been set on accelerator.state.megatron_lm_plugin since
        source = self.convert_model(model)
        if optimizer is not None and not fresh_optimizer(optimizer):
            raise PrepareError(
                f"the {type(optimizer).__name__} optimizer already has state (it stepped or was "
                "loaded); prepare a fresh one and restore a run with accelerator.load_state"
            )
        roles = parameter_roles(source, optimizer)
        family, enc, dec = self.sequence_lengths(source, model, dummy)
        multiple = self.length_multiple()
        adapter = self.batch_adapter(source, family, enc, dec, multiple)
        rounded = -(-enc // multiple) * multiple
        dec_rounded = None if dec is None else -(-dec // multiple) * multiple
        config = self.run_config(source, optimizer, scheduler, dummy, rounded, dec_rounded, dp_size)
        bundle = None if dummy is not None else self.data_bundle(source, rounded, dp_rank, dp_size)
        trainer = self.build_trainer(config, source, optimizer, roles, bundle)
        iterators = self.step_iterators(trainer) if dummy is not None else []
        return self.wire_engine(trainer, adapter), iterators

    def convert_model(self, model: torch.nn.Module) -> Any:
        """Convert ``model`` with the plugin's options.

        Args:
            model: the script's transformers model.

        Returns:
            The converted model (``convert_hf_model``'s source).

        Raises:
            ModelPrepareError: a model epochal cannot convert, or whose weights differ
                between processes.
        """
        plugin = self.plugin
        source = convert_hf_model(
            model,
            make_vocab_size_divisible_by=math.lcm(128, plugin.tp_degree),
            hidden_dropout=plugin.hidden_dropout
            if plugin.hidden_dropout is not None
            else plugin.other("hidden_dropout"),
            attention_dropout=plugin.attention_dropout
            if plugin.attention_dropout is not None
            else plugin.other("attention_dropout"),
        )
        if source.state is not None:
            self.check_same_weights(model)
        return source

    def check_same_weights(self, model: torch.nn.Module) -> None:
        """Check that every process has the same weights of ``model``.

        Raises:
            ModelPrepareError: they differ.
        """
        from epochal.accelerate.operations import gather

        if self.state.num_processes == 1:
            return
        device = self.state.device
        mine = weights_fingerprint(model).to(device)
        every = gather(mine.reshape(1, -1), device)
        if not all(torch.equal(row, every[0]) for row in every):
            raise ModelPrepareError(
                "the model's weights differ between processes: call set_seed(...) before building "
                "the model (or load pretrained weights) so that every process starts from the same ones"
            )

    def sequence_lengths(
        self, source: Any, model: torch.nn.Module, dummy: MegatronLMDummyDataLoader | None
    ) -> tuple[str, int, int | None]:
        """The batch family and the encoder and decoder lengths of the run.

        Args:
            source: the converted model.
            model: the script's model (named in errors).
            dummy: the dummy loader (None: the train loader's first batch gives the lengths).

        Returns:
            ``(family, encoder length, decoder length or None)``.

        Raises:
            PrepareError: a dummy loader with another model than a causal language model,
                or without ``seq_length``.
        """
        plugin = self.plugin
        if dummy is None:
            batch = self.done.loaders[0].peek()
            enc = plugin.encoder_seq_length or plugin.seq_length or int(batch["input_ids"].shape[1])
            dec = None
            if source.family == "seq2seq":
                labels = batch.get("decoder_input_ids", batch.get("labels"))
                dec = plugin.decoder_seq_length or int(labels.shape[1])
            return source.family, enc, dec
        if source.family != "causal":
            raise PrepareError(
                "MegatronLMDummyDataLoader builds Megatron's GPT datasets: it feeds causal "
                f"language models, not a {type(model).__name__}"
            )
        enc = dummy.dataset_args.get("seq_length") or plugin.seq_length
        if not enc:
            raise PrepareError("MegatronLMDummyDataLoader needs seq_length")
        return "megatron", enc, None

    def length_multiple(self) -> int:
        """What the sequence lengths are padded to a multiple of (sequence and context parallelism)."""
        plugin = self.plugin
        multiple = plugin.tp_degree if plugin.parallel_options()["sequence_parallel"] else 1
        # context parallelism cuts each sequence into 2 x cp chunks: pad to a multiple of that
        return math.lcm(multiple, 2 * plugin.cp_degree) if plugin.cp_degree > 1 else multiple

    def batch_adapter(
        self, source: Any, family: str, enc: int, dec: int | None, multiple: int
    ) -> BatchAdapter:
        """The adapter from the script's batches to the trainer's.

        Args:
            source: the converted model.
            family: the batch family (``sequence_lengths``'s).
            enc: the encoder length (fixed under pipeline parallelism).
            dec: the decoder length, or None.
            multiple: what lengths are padded to a multiple of.

        Returns:
            The batch adapter.
        """
        plugin = self.plugin
        pipelined = plugin.pp_degree > 1
        hf = source.hf_config
        return BatchAdapter(
            family,
            num_microbatches=plugin.num_micro_batches,
            uses_token_types=source.config.num_tokentypes > 0,
            fixed_length=enc if pipelined else None,
            fixed_decoder_length=dec if pipelined else None,
            multiple_of=multiple,
            decoder_start_token_id=int(getattr(hf, "decoder_start_token_id", None) or 0),
            pad_token_id=int(getattr(hf, "pad_token_id", None) or 0),
            classifier=_classifier_options(source),
        )

    def run_config(
        self,
        source: Any,
        optimizer: torch.optim.Optimizer | None,
        scheduler: MegatronLMDummyScheduler | None,
        dummy: MegatronLMDummyDataLoader | None,
        seq_len: int,
        decoder_seq_len: int | None,
        dp_size: int,
    ) -> TrainConfig:
        """The trainer's config of the run, from the plugin and the script's objects.

        Args:
            source: the converted model (its model config).
            optimizer: the script's optimizer, or None.
            scheduler: the dummy scheduler, or None.
            dummy: the dummy loader (its data options and the plugin's ``eval_iters``), or None.
            seq_len: the (rounded) sequence length.
            decoder_seq_len: the (rounded) decoder length, or None.
            dp_size: the data-parallel size.

        Returns:
            The train config (``build_train_config``'s).

        Raises:
            PluginError: plugin options that do not fit the run.
        """
        plugin = self.plugin
        shape = RunShape(
            micro_batch_size=self.done.micro_batch_size,
            data_parallel=dp_size,
            seq_length=seq_len,
            decoder_seq_length=decoder_seq_len,
            seed=int(plugin.other("seed", self.done.seed)),
            device=self.state.device.type,
            mixed_precision=self.mixed_precision,
            run_dir=str(self.project_dir or "."),
            num_workers=int(plugin.other("dataloader_num_workers", 0)),
            data_options=dummy.data_options() if dummy is not None else {},
            eval_iters=plugin.eval_iters if dummy is not None else 0,
        )
        return build_train_config(source.config, plugin, optimizer, scheduler, shape)

    def data_bundle(self, source: Any, seq_len: int, dp_rank: int, dp_size: int) -> DataBundle:
        """The trainer's data from the prepared DataLoaders (the first two: train, validation).

        Args:
            source: the converted model (its vocabulary size).
            seq_len: the run's (rounded) sequence length.
            dp_rank: this process's data-parallel rank.
            dp_size: the data-parallel size.

        Returns:
            The data bundle.
        """
        loaders = self.done.loaders
        return DataBundle(
            train_loader=loaders[0],  # type: ignore[arg-type]
            valid_loader=loaders[1] if len(loaders) > 1 else None,  # type: ignore[arg-type]
            sampler=MegatronDataSampler(
                seq_len=seq_len,
                micro_batch_size=self.done.micro_batch_size,
                global_batch_size=self.plugin.global_batch_size,
                data_parallel_rank=dp_rank,
                data_parallel_size=dp_size,
            ),
            vocab_size=source.vocab_size,
            description="prepared by epochal.accelerate",
        )

    def build_trainer(
        self,
        config: TrainConfig,
        source: Any,
        optimizer: torch.optim.Optimizer | None,
        roles: Any,
        bundle: DataBundle | None,
    ) -> AccelerateTrainer:
        """The trainer of the run.

        Args:
            config: the run's train config.
            source: the converted model.
            optimizer: the script's optimizer, or None.
            roles: the parameter groups and frozen parameters (``parameter_roles``'s).
            bundle: the data (None: the trainer builds Megatron's datasets).

        Returns:
            The trainer.

        Raises:
            PluginError: options the trainer refuses (named also in Accelerate's terms).
        """
        plugin = self.plugin
        try:
            return AccelerateTrainer(
                config,
                source=source,
                optimizer=optimizer,
                groups=roles.groups,
                frozen=roles.frozen,
                step_class=plugin.custom_train_step_class,
                step_kwargs=plugin.custom_train_step_kwargs,
                get_batch=plugin.custom_get_batch_function,
                loss_func=plugin.custom_loss_function,
                data=bundle,
                log=False,
                dist_info=self.dist_info,
            )
        except ConfigError as exc:
            raise PluginError(f"{exc} ({_IN_ACCELERATE_TERMS})") from exc

    def step_iterators(self, trainer: AccelerateTrainer) -> list[Any]:
        """The dummy loader's train, validation and test iterators, over the trainer's data.

        The trainer built the data (Megatron's sizes); its train loader becomes the train
        iterator, whose position is the run's data state.

        Args:
            trainer: the trainer of the run.

        Returns:
            ``[train, validation or None, None]``.
        """
        n = self.plugin.num_micro_batches
        device = self.state.device
        valid = trainer.data.valid_loader
        iterators = [
            StepIterator(trainer.data.train_loader, n, device),
            None if valid is None else StepIterator(valid, n, device),
            None,
        ]
        trainer.data.train_loader = iterators[0]
        return iterators

    def wire_engine(self, trainer: AccelerateTrainer, adapter: BatchAdapter) -> MegatronEngine:
        """The engine that steps ``trainer`` on the script's batches.

        Args:
            trainer: the trainer of the run.
            adapter: the batch adapter.

        Returns:
            The engine.
        """
        engine = MegatronEngine(
            trainer,
            adapter,
            return_logits=self.plugin.return_logits,
            on_step=self.on_step,
            deferred_update=not self.state.megatron_lm,
        )
        engine.vocab_file = self.plugin.other("vocab_file")
        return engine
