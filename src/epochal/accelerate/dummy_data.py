"""``MegatronLMDummyDataLoader``: Megatron's indexed GPT datasets through epochal's builders.

As in Accelerate's guide::

    megatron_dataloader = MegatronLMDummyDataLoader(
        data_path=["corpus_text_document"], splits_string="949,50,1", seq_length=1024,
        micro_batch_size=4)
    model, optimizer, lr_scheduler, train_dataloader, eval_dataloader, _ = accelerator.prepare(
        model, optimizer, lr_scheduler, megatron_dataloader, megatron_dataloader, megatron_dataloader)
    while completed_steps < args.max_train_steps:
        batch = next(train_dataloader) if train_dataloader is not None else {}
        outputs = model(**batch)

Its arguments are Megatron's data arguments (:data:`DATA_ARGS`, each mapped to epochal's
``[data]`` option); the three occurrences in ``prepare`` become the train, validation
and test iterators (:class:`StepIterator`), each ``next()`` this rank's share of one
step (``micro_batch_size x num_micro_batches`` samples of epochal's GPT keys:
``tokens``, ``labels``, ``loss_mask``, ...). Datasets are sized as Megatron sizes
them: ``train_iters x global batch`` training samples (``train_iters`` from the
scheduler or the plugin) and ``eval_iters x global batch`` validation samples
(``MegatronLMPlugin.eval_iters``); every rank reads its own data-parallel slice, so
no rank gets ``None``. The train iterator's ``consumed_samples`` is saved by
``save_state`` and restored by ``load_state`` (Accelerate's backend restarts at 0).
For causal language models only (epochal's GPT datasets).

``blend_schedule=[{"step": S, "weights": [...]}, ...]`` (and
``blend_schedule_interpolation``) give a weighted ``data_path`` blend weights that change
over training, as ``data.blend_schedule`` does for ``epochal train``. ``save_state``
keeps only the position, so a resume continues exactly with the same schedule; a
changed schedule at a resume is for ``epochal train``, whose checkpoints record it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from epochal.accelerate.prepare_data import concat_micro_batches, send_to_device

__all__ = ["DATA_ARGS", "DummyDataError", "MegatronLMDummyDataLoader", "StepIterator"]

#: Megatron data argument -> epochal ``[data]`` option
DATA_ARGS = {
    "data_path": "data_path",
    "train_data_path": "train_data_path",
    "valid_data_path": "valid_data_path",
    "test_data_path": "test_data_path",
    "splits_string": "split",
    "split": "split",
    "seq_length": "seq_length",
    "mock_data": "mock",
    "tokenizer_type": "tokenizer_type",
    "tokenizer_model": "tokenizer_model",
    "vocab_file": "vocab_file",
    "merge_file": "merge_file",
    "reset_position_ids": "reset_position_ids",
    "reset_attention_mask": "reset_attention_mask",
    "eod_mask_loss": "eod_mask_loss",
    "num_workers": "num_workers",
    "data_cache_path": "cache_dir",
    # epochal's own: blend weights that change over training (no Megatron argument)
    "blend_schedule": "blend_schedule",
    "blend_schedule_interpolation": "blend_schedule_interpolation",
}


class DummyDataError(ValueError):
    """A ``MegatronLMDummyDataLoader`` argument epochal cannot use (named)."""


class MegatronLMDummyDataLoader:
    """Megatron's data arguments, turned into loaders by ``prepare`` (see the module docstring).

    Args:
        **dataset_kwargs: Megatron's data arguments (:data:`DATA_ARGS`) and
            ``micro_batch_size`` (required).

    Raises:
        DummyDataError: an argument without an epochal equivalent, or no ``micro_batch_size``.
    """

    def __init__(self, **dataset_kwargs: Any) -> None:
        unknown = sorted(
            k for k in dataset_kwargs if k not in DATA_ARGS and k != "micro_batch_size"
        )
        if unknown:
            raise DummyDataError(
                f"MegatronLMDummyDataLoader: {unknown} have no epochal equivalent "
                f"(supported: micro_batch_size, {', '.join(DATA_ARGS)})"
            )
        if not isinstance(dataset_kwargs.get("micro_batch_size"), int):
            raise DummyDataError("MegatronLMDummyDataLoader needs micro_batch_size (an integer)")
        self.dataset_args = dict(dataset_kwargs)

    @property
    def micro_batch_size(self) -> int:
        """Samples per micro-batch and data-parallel rank."""
        return int(self.dataset_args["micro_batch_size"])

    def data_options(self) -> dict[str, Any]:
        """epochal's ``[data]`` options (keyword arguments of ``DataConfig``)."""
        out: dict[str, Any] = {"corpus": ""}
        for key, value in self.dataset_args.items():
            if key == "micro_batch_size":
                continue
            option = DATA_ARGS[key]
            if option.endswith("data_path") and isinstance(value, str):
                value = [value]
            out[option] = value
        return out


class StepIterator:
    """``next()`` gives this rank's step batch from a loader of micro-batches; resumable.

    Args:
        loader: an epochal ``WrappedDataLoader`` (micro-batches of this data-parallel rank).
        num_microbatches: micro-batches per step.
        device: where batches are put.
    """

    def __init__(self, loader: Any, num_microbatches: int, device: torch.device) -> None:
        self.loader = loader
        self.num_microbatches = num_microbatches
        self.device = device
        self.mode = loader.mode
        self._stream: Iterator[Mapping[str, Any]] | None = None

    def __iter__(self) -> StepIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        parts = [self._micro_batch() for _ in range(self.num_microbatches)]
        return send_to_device(concat_micro_batches(parts), self.device)

    def _micro_batch(self) -> Mapping[str, Any]:
        if self._stream is None:
            self._stream = self.loader.stream()
        try:
            return next(self._stream)
        except StopIteration:
            if self.mode == "train":
                raise
            self._stream = (
                self.loader.stream()
            )  # evaluation data starts over, as Megatron cycles it
            return next(self._stream)

    def __len__(self) -> int:
        return len(self.loader) // self.num_microbatches

    @property
    def dataset(self) -> Any:
        """The underlying dataset."""
        return self.loader.dataset

    @property
    def consumed_samples(self) -> int:
        """Samples of all data-parallel ranks delivered so far (the train iterator's position)."""
        return self.loader.consumed_samples

    def state_dict(self) -> dict[str, Any]:
        """The loader's state (``consumed_samples``)."""
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at the state's position (the next ``next()`` starts a new stream there)."""
        self.loader.load_state_dict(state)
        self._stream = None
