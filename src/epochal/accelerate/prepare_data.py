"""The prepared data loaders: Megatron's sampler over the user's dataset, ``consumed_samples`` as state.

``accelerator.prepare(train_dataloader, eval_dataloader)`` keeps each loader's
dataset, ``collate_fn`` and worker options and replaces its batching:

- the user's ``batch_size`` is the **micro-batch size** ``m`` (Accelerate: the
  smallest batch size of the prepared loaders, or the largest with
  ``is_train_batch_min=False``); a step's **global batch** is ``G = m x
  num_micro_batches x data-parallel size``;
- every item is this data-parallel rank's share of one step: ``num_micro_batches``
  micro-batches concatenated (``[m * num_micro_batches, ...]``), what ``model(**batch)``
  trains on, as Accelerate's Megatron backend yields them;
- positions: sample number ``p`` of the run (over all ranks) lies in epoch ``e = p //
  E`` where ``E`` is the dataset length rounded down to whole global batches (the
  rest of an epoch is dropped, like ``drop_last``); within the epoch, position ``p %
  E`` reads dataset index ``permute(p % E, len(dataset), seed(e))`` when the user's
  loader shuffled (a fresh O(1) permutation each epoch,
  :func:`epochal.data.permute`) and ``p % E`` otherwise. Rank ``r``'s micro-batch is
  slice ``r`` of each block of ``m x dp`` positions
  (:class:`~epochal.data.MegatronPretrainingSampler`), so a layout with another
  data-parallel size but the same global batch reads the same micro-batches;
- randomness of the ``collate_fn`` (e.g. ``DataCollatorForLanguageModeling``'s
  masking) is drawn under a generator seeded by the micro-batch's first position,
  so the same micro-batch gets the same masks on any layout, worker count or
  resume; the global random states are left as they were;
- state: ``{"consumed_samples": p, "mode": "train"}`` (``state_dict`` /
  ``load_state_dict``), ``p`` being the position after the last batch the train
  loader yielded. Every ``iter()`` of the train loader starts an epoch at its first
  sample, as PyTorch's and Accelerate's loaders do: a pass that ran to its end is
  followed by the next epoch; a pass left early (a ``break``, or
  ``next(iter(loader))`` before the loop) is followed by the same epoch again from
  its first sample, in the same order (Accelerate's loaders advance their epoch
  only at the end of a pass, too). The one exception is resumption: the first
  pass after ``load_state`` (or after ``MegatronLMPlugin(consumed_samples=...)``)
  starts at exactly ``consumed_samples``, i.e. yields the steps the interrupted run
  had not trained yet, with no ``skip_first_batches``. ``len(loader)`` is the number
  of steps of a whole epoch. Evaluation loaders (every prepared loader but the
  first) start from their beginning on every pass.

Micro-batches of one step are collated separately; tensors whose second dimension
differs between them (padding collators) are right-padded to the longest with
the key's neutral value (``labels``: -100, ``*attention_mask``: 0, ids: 0, ...)
before they are concatenated.

Errors (:class:`DataLoaderError`): an ``IterableDataset``, a custom sampler or
batch sampler (the Megatron sampler would silently replace it), a sampler with
replacement, a dataset smaller than one global batch.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from epochal.data.epochs.permutation import permute_array
from epochal.data.loading.samplers import MegatronPretrainingSampler

__all__ = ["DataLoaderError", "PreparedDataLoader", "concat_micro_batches", "send_to_device"]

#: right-padding value of a key whose micro-batches differ in length
PAD_VALUES: dict[str, int] = {
    "labels": -100,
    "attention_mask": 0,
    "decoder_attention_mask": 0,
    "input_ids": 0,
    "decoder_input_ids": 0,
    "token_type_ids": 0,
    "special_tokens_mask": 1,
    "position_ids": 0,
}


class DataLoaderError(ValueError):
    """A data loader that cannot be prepared (the message says why and what to change)."""


def send_to_device(value: Any, device: torch.device, non_blocking: bool = True) -> Any:
    """``value`` with every tensor inside (dicts, lists, tuples) moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=non_blocking)
    if isinstance(value, Mapping):
        return type(value)({k: send_to_device(v, device, non_blocking) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return type(value)(send_to_device(v, device, non_blocking) for v in value)
    return value


def _pad_dim1(tensor: torch.Tensor, length: int, value: int, key: str) -> torch.Tensor:
    if tensor.dim() < 2 or tensor.shape[1] == length:
        return tensor
    pad = tensor.new_full((tensor.shape[0], length - tensor.shape[1], *tensor.shape[2:]), value)
    return torch.cat([tensor, pad], dim=1)


def _same_kind(like: Mapping[str, Any], data: dict[str, Any]) -> Any:
    """``data`` as the collate_fn's mapping type (transformers' ``BatchEncoding`` keeps ``.to``)."""
    kind = type(like)
    if kind is dict:
        return data
    try:
        return kind(data)
    except (TypeError, ValueError):  # a mapping type not built from a dict: a plain dict
        return data


def concat_micro_batches(parts: list[Mapping[str, Any]]) -> Any:
    """One batch from collated micro-batches: tensors padded on dim 1 and concatenated on dim 0.

    The batch is of the collate_fn's mapping type where it can be built from a dict
    (a ``BatchEncoding`` from ``tokenizer.pad`` stays one, so ``batch.to(device)``
    works as with Accelerate's loaders), else a ``dict``.

    Raises:
        DataLoaderError: a key missing in some micro-batch, or lengths that differ for
            a key without a known padding value.
    """
    if len(parts) == 1:
        return _same_kind(parts[0], dict(parts[0]))
    out: dict[str, Any] = {}
    for key in parts[0]:
        values = [p.get(key) for p in parts]
        if any(v is None for v in values):
            raise DataLoaderError(f"the collate_fn gave key {key!r} to some micro-batches only")
        if isinstance(values[0], torch.Tensor):
            longest = max(v.shape[1] if v.dim() >= 2 else 0 for v in values)
            if any(v.dim() >= 2 and v.shape[1] != longest for v in values):
                if key not in PAD_VALUES:
                    raise DataLoaderError(
                        f"the micro-batches of one step differ in the length of {key!r} and "
                        f"epochal does not know its padding value (known: {sorted(PAD_VALUES)}); "
                        "pad your samples to one length"
                    )
                values = [_pad_dim1(v, longest, PAD_VALUES[key], key) for v in values]
            out[key] = torch.cat(values, dim=0)
        elif isinstance(values[0], list):
            out[key] = [x for v in values for x in v]
        else:
            out[key] = values[0]
    return _same_kind(parts[0], out)


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Run under global RNGs seeded by ``seed``; restore the previous states afterwards."""
    py_state, np_state = random.getstate(), np.random.get_state()  # noqa: NPY002
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)  # noqa: NPY002
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)  # noqa: NPY002


class _PositionedDataset(torch.utils.data.Dataset):
    """``dataset`` read by run position: item ``p`` is ``(p, dataset[index of p])``."""

    def __init__(self, dataset: Any, per_epoch: int, shuffle: bool, seed: int) -> None:
        self.dataset = dataset
        self.length = len(dataset)
        self.per_epoch = per_epoch
        self.shuffle = shuffle
        self.seed = seed

    def index(self, position: int) -> int:
        """The dataset index read at run position ``position``."""
        epoch, within = divmod(int(position), self.per_epoch)
        if not self.shuffle:
            return within
        seed = (self.seed * 1_000_003 + epoch) % 2**64
        return int(permute_array(np.asarray([within]), self.length, seed)[0])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, position: int) -> tuple[int, Any]:
        return position, self.dataset[self.index(position)]


class _SeededCollate:
    """The user's ``collate_fn`` under RNGs seeded by the micro-batch's first position."""

    def __init__(self, collate_fn: Any, seed: int) -> None:
        self.collate_fn = collate_fn
        self.seed = seed

    def __call__(self, items: list[tuple[int, Any]]) -> Any:
        first = items[0][0]
        with _seeded((self.seed * 0x9E3779B1 + first) % 2**63):
            return self.collate_fn([sample for _, sample in items])


class _MicroBatchPositions:
    """This rank's micro-batches (lists of run positions) from ``start`` to the end of its epoch."""

    def __init__(self, loader: PreparedDataLoader, start: int) -> None:
        self.loader = loader
        self.start = start

    def __iter__(self) -> Iterator[list[int]]:
        lo = self.loader
        epoch, offset = divmod(self.start, lo.samples_per_epoch)
        sampler = MegatronPretrainingSampler(
            total_samples=lo.samples_per_epoch,
            consumed_samples=offset,
            micro_batch_size=lo.micro_batch_size,
            data_parallel_rank=lo.dp_rank,
            data_parallel_size=lo.dp_size,
            drop_last=True,
            global_batch_size=lo.global_batch_size,
        )
        base = epoch * lo.samples_per_epoch
        for within in sampler:
            yield [base + int(i) for i in within]

    def __len__(self) -> int:
        lo = self.loader
        left = lo.samples_per_epoch - self.start % lo.samples_per_epoch
        return left // lo.global_batch_size * lo.num_microbatches


class PreparedDataLoader:
    """A user's ``DataLoader`` under Megatron's sampler (see the module docstring).

    Args:
        source: the user's ``torch.utils.data.DataLoader``.
        micro_batch_size: samples per micro-batch per data-parallel rank.
        num_microbatches: micro-batches per step and rank.
        dp_rank / dp_size: this data-parallel rank and the data-parallel size.
        seed: seed of the shuffle and of the ``collate_fn``'s randomness.
        train: the train loader (resumes at ``consumed_samples``) or an evaluation one.
        device: where batches are put.
        non_blocking: copy batches to the device with ``non_blocking``
            (``DataLoaderConfiguration.non_blocking``).
        consumed_samples: the train loader's start position.

    Raises:
        DataLoaderError: see the module docstring.
    """

    def __init__(
        self,
        source: DataLoader,
        *,
        micro_batch_size: int,
        num_microbatches: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
        train: bool,
        device: torch.device,
        consumed_samples: int = 0,
        non_blocking: bool = False,
    ) -> None:
        dataset = source.dataset
        if isinstance(dataset, IterableDataset):
            raise DataLoaderError(
                "prepare() needs a map-style dataset (with len() and indexing): Megatron's "
                f"sampler reads samples by position; got an IterableDataset ({type(dataset).__name__})"
            )
        sampler = source.sampler
        if not isinstance(sampler, (RandomSampler, SequentialSampler)):
            raise DataLoaderError(
                f"the DataLoader has a custom sampler ({type(sampler).__name__}); Megatron's "
                "sampler would replace it: pass shuffle=True or shuffle=False instead"
            )
        if isinstance(sampler, RandomSampler) and (
            sampler.replacement or sampler.num_samples != len(dataset)
        ):
            raise DataLoaderError(
                "the DataLoader's RandomSampler draws with replacement or a num_samples of its "
                "own; Megatron's sampler reads every sample once per epoch"
            )
        if source.batch_sampler is not None and type(source.batch_sampler) is not BatchSampler:
            raise DataLoaderError(
                f"the DataLoader has a custom batch_sampler ({type(source.batch_sampler).__name__}); "
                "Megatron's sampler would replace it: pass batch_size instead"
            )
        self.dataset = dataset
        self.micro_batch_size = int(micro_batch_size)
        self.num_microbatches = int(num_microbatches)
        self.dp_rank, self.dp_size = int(dp_rank), int(dp_size)
        self.global_batch_size = self.micro_batch_size * self.num_microbatches * self.dp_size
        self.shuffle = isinstance(sampler, RandomSampler)
        self.mode = "train" if train else "validation"
        self.device = device
        self.non_blocking = bool(non_blocking)
        self.seed = int(seed)
        n = len(dataset)
        self.samples_per_epoch = n // self.global_batch_size * self.global_batch_size
        if self.samples_per_epoch == 0:
            raise DataLoaderError(
                f"the {self.mode} dataset has {n} samples, fewer than one global batch of "
                f"{self.global_batch_size} (micro-batch {self.micro_batch_size} x "
                f"{self.num_microbatches} micro-batches x data-parallel size {self.dp_size})"
            )
        #: samples of every epoch that fill no whole global batch (not read)
        self.dropped_per_epoch = n - self.samples_per_epoch
        self.collate_fn = source.collate_fn
        self._positions = _PositionedDataset(dataset, self.samples_per_epoch, self.shuffle, seed)
        self._options: dict[str, Any] = {
            "num_workers": source.num_workers,
            "pin_memory": source.pin_memory,
            "timeout": source.timeout,
            "worker_init_fn": source.worker_init_fn,
            "multiprocessing_context": source.multiprocessing_context,
        }
        if source.num_workers > 0:
            self._options["prefetch_factor"] = source.prefetch_factor
        self._consumed = int(consumed_samples) if train else 0
        #: where the next pass starts: the resume position once, then an epoch's first sample
        self._next_start = self._consumed

    # ------------------------------------------------------------------ shape
    @property
    def batch_size(self) -> int:
        """Samples per item on this rank: ``micro_batch_size * num_microbatches``."""
        return self.micro_batch_size * self.num_microbatches

    @property
    def total_batch_size(self) -> int:
        """Samples per step over all data-parallel ranks (the global batch)."""
        return self.global_batch_size

    @property
    def total_dataset_length(self) -> int:
        """Samples of the dataset."""
        return len(self.dataset)

    def __len__(self) -> int:
        """Steps of a whole epoch."""
        return self.samples_per_epoch // self.global_batch_size

    # ------------------------------------------------------------------ state
    @property
    def consumed_samples(self) -> int:
        """Samples delivered so far over all data-parallel ranks (train loader; 0 otherwise)."""
        return self._consumed

    @property
    def epoch(self) -> int:
        """The epoch the next step reads from."""
        return self._consumed // self.samples_per_epoch

    def state_dict(self) -> dict[str, Any]:
        """``{"consumed_samples": int, "mode": str}``."""
        return {"consumed_samples": self._consumed, "mode": self.mode}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at ``state["consumed_samples"]`` (train loader; evaluation loaders ignore it).

        Raises:
            DataLoaderError: unknown keys, another mode, or a negative position.
        """
        unknown = set(state) - {"consumed_samples", "mode"}
        if unknown:
            raise DataLoaderError(f"unknown keys in the loader state: {sorted(unknown)}")
        if state.get("mode", self.mode) != self.mode:
            raise DataLoaderError(
                f"the loader state is for mode {state['mode']!r}, this loader's is {self.mode!r}"
            )
        consumed = state.get("consumed_samples", 0)
        if isinstance(consumed, bool) or not isinstance(consumed, int) or consumed < 0:
            raise DataLoaderError(f"consumed_samples must be an integer >= 0, got {consumed!r}")
        if self.mode == "train":
            self._consumed = self._next_start = consumed

    @property
    def resume_step(self) -> int:
        """The step of its epoch at which the next pass starts (after ``load_state``: the restored one)."""
        return (self._next_start % self.samples_per_epoch) // self.global_batch_size

    def set_epoch(self, epoch: int) -> None:
        """Accepted for Accelerate's API; the epoch follows from ``consumed_samples``."""

    # --------------------------------------------------------------- reading
    def peek(self) -> dict[str, Any]:
        """The batch the next pass starts with; neither the position nor the next pass moves."""
        saved = self._consumed, self._next_start
        try:
            return next(iter(self))
        finally:
            self._consumed, self._next_start = saved

    def __iter__(self) -> Iterator[dict[str, Any]]:
        start = self._next_start if self.mode == "train" else 0
        if self.mode == "train" and start % self.global_batch_size:
            raise DataLoaderError(
                f"consumed_samples={start} is not a multiple of the global batch "
                f"{self.global_batch_size}: load a state saved with this global batch size"
            )
        if self.mode == "train":
            # left early, the next pass starts this epoch over (see the module docstring)
            self._next_start = start - start % self.samples_per_epoch
            self._consumed = start
        loader = DataLoader(
            self._positions,
            batch_sampler=_MicroBatchPositions(self, start),
            collate_fn=_SeededCollate(self.collate_fn, self.seed),
            generator=torch.Generator().manual_seed(self.seed),  # leaves the global RNG alone
            **self._options,
        )
        parts: list[Any] = []
        steps = 0
        for micro_batch in loader:
            if not isinstance(micro_batch, Mapping):
                raise DataLoaderError(
                    f"the collate_fn returned a {type(micro_batch).__name__}; model(**batch) "
                    "needs a dict of tensors (e.g. transformers' default_data_collator)"
                )
            parts.append(micro_batch)
            if len(parts) < self.num_microbatches:
                continue
            batch = concat_micro_batches(parts)
            parts = []
            steps += 1
            if self.mode == "train":
                self._consumed = start + steps * self.global_batch_size
            yield send_to_device(batch, self.device, self.non_blocking)
        if self.mode == "train":
            self._next_start = self._consumed  # a whole pass: the next epoch follows

    def __repr__(self) -> str:
        return (
            f"PreparedDataLoader(mode={self.mode!r}, micro_batch_size={self.micro_batch_size}, "
            f"num_microbatches={self.num_microbatches}, global_batch_size={self.global_batch_size}, "
            f"shuffle={self.shuffle}, consumed_samples={self._consumed})"
        )
