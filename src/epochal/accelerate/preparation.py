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
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader

from epochal.accelerate.batches import BatchAdapter
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
from epochal.accelerate.trainer import AccelerateTrainer
from epochal.accelerate.wrappers import AcceleratedOptimizer, AcceleratedScheduler
from epochal.data.loading.data_sampler import MegatronDataSampler
from epochal.model.config import ConfigError
from epochal.parallel.config import ParallelConfig
from epochal.parallel.dims import ParallelDims
from epochal.train.inputs.loaders import DataBundle

__all__ = ["PrepareError", "Prepared", "prepare_objects"]


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


def _dims(acc: Any) -> tuple[ParallelDims, int, int]:
    plugin = acc.state.megatron_lm_plugin
    cp = plugin.cp_degree
    config = ParallelConfig(
        tensor_parallel=plugin.tp_degree, context_parallel=cp, pipeline_parallel=plugin.pp_degree
    )
    try:
        dims = ParallelDims.from_config(config, acc.num_processes)
    except ValueError as exc:
        cp_text = f" x context_parallel_size={cp}" if cp > 1 else ""
        raise PluginError(
            f"{acc.num_processes} processes do not fit tp_degree={plugin.tp_degree}{cp_text} x "
            f"pp_degree={plugin.pp_degree}: {exc}"
        ) from None
    coords = dims.coords(acc.process_index)
    return dims, coords["dp"], dims.dp


def _micro_batch_size(loaders: list[DataLoader], plugin: Any) -> int:
    sizes = [dl.batch_size for dl in loaders]
    if any(s is None for s in sizes):
        raise PrepareError(
            "every DataLoader given to prepare() needs a batch_size (the micro-batch size)"
        )
    return min(sizes) if plugin.is_train_batch_min else max(sizes)


def _lengths(acc: Any, adapter_family: str, batch: dict[str, Any]) -> tuple[int, int | None]:
    plugin = acc.state.megatron_lm_plugin
    enc = plugin.encoder_seq_length or plugin.seq_length or int(batch["input_ids"].shape[1])
    dec = None
    if adapter_family == "seq2seq":
        labels = batch.get("decoder_input_ids", batch.get("labels"))
        dec = plugin.decoder_seq_length or int(labels.shape[1])
    return enc, dec


def _check_same_weights(acc: Any, model: torch.nn.Module) -> None:
    from epochal.accelerate.operations import gather

    if acc.num_processes == 1:
        return
    mine = weights_fingerprint(model).to(acc.device)
    every = gather(mine.reshape(1, -1), acc.device)
    if not all(torch.equal(row, every[0]) for row in every):
        raise ModelPrepareError(
            "the model's weights differ between processes: call set_seed(...) before building "
            "the model (or load pretrained weights) so that every process starts from the same ones"
        )


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


def prepare_objects(acc: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Prepare ``args`` for ``acc`` (see the module docstring); same order as given."""
    done: Prepared = acc._prepared
    plugin = acc.state.megatron_lm_plugin
    models = [a for a in args if isinstance(a, torch.nn.Module)]
    optimizers = [a for a in args if isinstance(a, torch.optim.Optimizer)]
    for obj in args:
        refusal = deepspeed_refusal(obj)
        if refusal is not None:
            raise PrepareError(refusal)
    dummy_schedulers = [a for a in args if isinstance(a, MegatronLMDummyScheduler)]
    torch_schedulers = [
        a for a in args if is_torch_scheduler(a) and not isinstance(a, MegatronLMDummyScheduler)
    ]
    schedulers = dummy_schedulers + torch_schedulers
    loaders = [a for a in args if isinstance(a, DataLoader)]
    dummies = [a for a in args if isinstance(a, MegatronLMDummyDataLoader)]
    for obj in torch_schedulers:
        if not optimizers or obj.optimizer is not optimizers[0]:
            raise PrepareError(
                f"the {type(obj).__name__} scheduler must be built on the optimizer prepared in "
                "the same prepare() call: prepare(model, optimizer, ..., lr_scheduler) together"
            )
    for kind, found in (("model", models), ("optimizer", optimizers), ("scheduler", schedulers)):
        if len(found) > 1 or (found and getattr(done, "engine" if kind == "model" else kind)):
            raise PrepareError(f"an epochal Accelerator trains one {kind}; got another")
    if (optimizers or schedulers) and not models and done.engine is None:
        raise PrepareError("prepare the optimizer and scheduler together with the model")
    if done.seed is None:
        from epochal.accelerate.operations import broadcast_object

        done.seed = int(broadcast_object(torch.initial_seed() % 2**32))
    _, dp_rank, dp_size = _dims(acc)
    if dummies:
        if loaders or done.loaders or not models:
            raise PrepareError(
                "prepare MegatronLMDummyDataLoader together with the model, without DataLoaders "
                "(it gives the train, validation and test loaders)"
            )
        done.micro_batch_size = dummies[0].micro_batch_size
        plugin.set_training_args(done.micro_batch_size, dp_size)
        plugin.megatron_dataset_flag = True
    if loaders and done.micro_batch_size is None:
        done.micro_batch_size = _micro_batch_size(loaders, plugin)
        plugin.set_training_args(done.micro_batch_size, dp_size)
    results: dict[int, Any] = {}
    loader_seed = acc.dataloader_config.data_seed  # DataLoaderConfiguration(data_seed=...)
    for dl in loaders:
        first = not done.loaders
        consumed = (plugin.consumed_samples or [0])[0] if first else 0
        prepared = PreparedDataLoader(
            dl,
            micro_batch_size=done.micro_batch_size,
            num_microbatches=plugin.num_micro_batches,
            dp_rank=dp_rank,
            dp_size=dp_size,
            seed=done.seed if loader_seed is None else loader_seed,
            train=first,
            device=acc.device,
            non_blocking=acc.dataloader_config.non_blocking,
            consumed_samples=consumed,
        )
        if prepared.dropped_per_epoch and acc.is_main_process:
            kind = "train" if first else "evaluation"
            print(
                f"epochal.accelerate: the {kind} loader reads {prepared.samples_per_epoch} of "
                f"{len(dl.dataset)} samples per pass (whole global batches of "
                f"{prepared.global_batch_size}); {prepared.dropped_per_epoch} are left out",
                flush=True,
            )
        if first and prepared.shuffle and acc.is_main_process:
            print(
                "epochal.accelerate: the train loader shuffles with Megatron's per-epoch "
                "permutation (the same order on any number of processes), not torch's "
                "RandomSampler: another order than Accelerate's, the same samples",
                flush=True,
            )
        done.loaders.append(prepared)
        results[id(dl)] = prepared
    iterators: list[Any] = []
    if models:
        if not done.loaders and not dummies:
            raise PrepareError(
                "prepare the model together with (or after) a DataLoader: its batch_size is "
                "the micro-batch size"
            )
        optimizer = optimizers[0] if optimizers else None
        scheduler = dummy_schedulers[0] if dummy_schedulers else None
        engine, iterators = _build_engine(
            acc, models[0], optimizer, scheduler, dp_rank, dp_size, dummies[0] if dummies else None
        )
        done.engine = engine
        results[id(models[0])] = engine
        if optimizer is not None:
            done.optimizer = results[id(optimizer)] = AcceleratedOptimizer(
                engine, optimizer, lr_scheduled=scheduler is not None
            )
        if scheduler is not None:
            done.scheduler = results[id(scheduler)] = AcceleratedScheduler(engine, scheduler)
        for user_scheduler in torch_schedulers:  # one: checked above
            done.scheduler = results[id(user_scheduler)] = PreparedTorchScheduler(
                engine, done.optimizer, user_scheduler, steps_per_update=dp_size
            )
    out = []
    for obj in args:  # the dummy loader's occurrences: train, validation, test
        out.append(
            iterators.pop(0)
            if any(obj is d for d in dummies) and iterators
            else results.get(id(obj), obj)
        )
    return out[0] if len(out) == 1 else tuple(out)


def _build_engine(
    acc: Any,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: MegatronLMDummyScheduler | None,
    dp_rank: int,
    dp_size: int,
    dummy: MegatronLMDummyDataLoader | None,
) -> tuple[MegatronEngine, list[Any]]:
    done: Prepared = acc._prepared
    plugin = acc.state.megatron_lm_plugin
    plugin.check()  # fields may have been set on accelerator.state.megatron_lm_plugin since
    tp = plugin.tp_degree
    source = convert_hf_model(
        model,
        make_vocab_size_divisible_by=math.lcm(128, tp),
        hidden_dropout=plugin.hidden_dropout
        if plugin.hidden_dropout is not None
        else plugin.other("hidden_dropout"),
        attention_dropout=plugin.attention_dropout
        if plugin.attention_dropout is not None
        else plugin.other("attention_dropout"),
    )
    if source.state is not None:
        _check_same_weights(acc, model)
    if optimizer is not None and not fresh_optimizer(optimizer):
        raise PrepareError(
            f"the {type(optimizer).__name__} optimizer already has state (it stepped or was "
            "loaded); prepare a fresh one and restore a run with accelerator.load_state"
        )
    roles = parameter_roles(source, optimizer)
    family = source.family
    if dummy is None:
        enc, dec = _lengths(acc, family, done.loaders[0].peek())
    else:
        if family != "causal":
            raise PrepareError(
                "MegatronLMDummyDataLoader builds Megatron's GPT datasets: it feeds causal "
                f"language models, not a {type(model).__name__}"
            )
        family, dec = "megatron", None
        enc = dummy.dataset_args.get("seq_length") or plugin.seq_length
        if not enc:
            raise PrepareError("MegatronLMDummyDataLoader needs seq_length")
    multiple = tp if plugin.parallel_options()["sequence_parallel"] else 1
    # context parallelism cuts each sequence into 2 x cp chunks: pad to a multiple of that
    multiple = math.lcm(multiple, 2 * plugin.cp_degree) if plugin.cp_degree > 1 else multiple
    pipelined = plugin.pp_degree > 1
    hf = source.hf_config
    adapter = BatchAdapter(
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
    rounded = -(-enc // multiple) * multiple
    shape = RunShape(
        micro_batch_size=done.micro_batch_size,
        data_parallel=dp_size,
        seq_length=rounded,
        decoder_seq_length=None if dec is None else -(-dec // multiple) * multiple,
        seed=int(plugin.other("seed", done.seed)),
        device=acc.device.type,
        mixed_precision=acc.mixed_precision,
        run_dir=str(acc.project_dir or "."),
        num_workers=int(plugin.other("dataloader_num_workers", 0)),
        data_options=dummy.data_options() if dummy is not None else {},
        eval_iters=plugin.eval_iters if dummy is not None else 0,
    )
    config = build_train_config(source.config, plugin, optimizer, scheduler, shape)
    bundle = (
        None
        if dummy is not None
        else DataBundle(
            train_loader=done.loaders[0],  # type: ignore[arg-type]
            valid_loader=done.loaders[1] if len(done.loaders) > 1 else None,  # type: ignore[arg-type]
            sampler=MegatronDataSampler(
                seq_len=rounded,
                micro_batch_size=done.micro_batch_size,
                global_batch_size=plugin.global_batch_size,
                data_parallel_rank=dp_rank,
                data_parallel_size=dp_size,
            ),
            vocab_size=source.vocab_size,
            description="prepared by epochal.accelerate",
        )
    )
    try:
        trainer = AccelerateTrainer(
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
            dist_info=acc._dist,
        )
    except ConfigError as exc:
        raise PluginError(f"{exc} ({_IN_ACCELERATE_TERMS})") from exc
    iterators: list[Any] = []
    if dummy is not None:  # the trainer built the data (Megatron's sizes); steps come from it
        n = plugin.num_micro_batches
        valid = trainer.data.valid_loader
        iterators = [
            StepIterator(trainer.data.train_loader, n, acc.device),
            None if valid is None else StepIterator(valid, n, acc.device),
            None,
        ]
        trainer.data.train_loader = iterators[0]  # its position is the run's data state
    engine = MegatronEngine(
        trainer,
        adapter,
        return_logits=plugin.return_logits,
        on_step=acc._on_step,
        deferred_update=not acc.state.megatron_lm,
    )
    engine.vocab_file = plugin.other("vocab_file")
    return engine, iterators
