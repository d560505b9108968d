"""The rows of a supervised fine-tuning run (``sft.train_file``), from ``[sft]``.

:func:`~epochal.data.sft.build_sft_datasets` reads, splits, tokenizes and (with
``sft.packing``) packs the rows with the run's tokenizer (``sft.tokenizer``, else the
``checkpoint.init_from`` folder); samples are ``data.seq_length`` tokens with
GPTDataset's keys (a packed sample also its rows' ``position_ids`` and a bool
``attention_mask``, which the trainer passes to the model).

Train samples: ``MultiEpochDatasetResampler(IdentityMultiEpochDatasetWrapper(samples),
num_samples = train_iters * global_batch_size, seed = training.seed)``: reshuffled every
epoch, a pure function of the sample number (resumable exactly; the same order under
any data-parallel layout). :meth:`SFTTrainSamples.loss_tokens` counts the loss tokens
of any range of global samples without reading them, which the trainer uses to divide
a step's summed loss by its global batch's loss tokens. Validation: every validation
sample once, in order, the last global batch completed with unscored filler
(:mod:`epochal.train.inputs.eval_rows`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from epochal.data.epochs.multi_epoch import (
    IdentityMultiEpochDatasetWrapper,
    MultiEpochDatasetResampler,
)
from epochal.data.sft import (
    PackedSFTDataset,
    SFTDataError,
    SFTDataset,
    build_sft_datasets,
    load_chat_tokenizer,
)
from epochal.model.config import ConfigError
from epochal.train.config import TrainConfig
from epochal.train.inputs.eval_rows import WholeTableRows

__all__ = [
    "SFTTrainSamples",
    "build_sft_train_datasets",
    "chat_tokenizer_folder",
    "loss_tokens_per_sample",
    "sft_tokenizer",
]


def chat_tokenizer_folder(config: TrainConfig) -> str | None:
    """The Hugging Face tokenizer folder a fine-tuning run tokenized its rows with, or None.

    ``sft.tokenizer``, else ``checkpoint.init_from``, of a run with ``sft.train_file``
    (what :func:`sft_tokenizer` loads); None for other runs. The folder's chat template
    is the one ``epochal generate --chat`` applies and ``epochal convert --to hf``
    ships with the weights.
    """
    if not config.sft.enabled:
        return None
    return config.sft.tokenizer or config.checkpoint.init_from or None


def sft_tokenizer(config: TrainConfig) -> Any:
    """The run's ``transformers`` tokenizer: ``sft.tokenizer``, else ``checkpoint.init_from``.

    Raises:
        ConfigError: neither is set, or the folder has no loadable tokenizer (named).
    """
    s = config.sft
    option, folder = ("sft.tokenizer", s.tokenizer)
    if not folder:
        option, folder = ("checkpoint.init_from", config.checkpoint.init_from)
    if not folder:
        raise ConfigError(
            "sft.tokenizer",
            "fine-tuning rows need a Hugging Face tokenizer (with a chat template for "
            "messages rows): set sft.tokenizer to its folder, or checkpoint.init_from to "
            "a Hugging Face model folder that holds one",
        )
    if not Path(folder).is_dir():
        raise ConfigError(option, f"{folder} is not a folder (a Hugging Face tokenizer folder)")
    try:
        return load_chat_tokenizer(folder)
    except SFTDataError as exc:
        raise ConfigError(option, str(exc)) from None


def loss_tokens_per_sample(dataset: SFTDataset | PackedSFTDataset) -> np.ndarray:
    """int64 ``[len(dataset)]``: each sample's positions with a target (``loss_mask`` summed).

    A row's first token is never a target (nothing predicts it), so a row counts
    ``loss_mask[1:]``, as the samples' shifted ``loss_mask`` does.
    """
    per_row = [int(np.asarray(e.loss_mask[1:]).astype(bool).sum()) for e in dataset.examples]
    if isinstance(dataset, PackedSFTDataset):
        return np.asarray([sum(per_row[i] for i in b) for b in dataset.bins], dtype=np.int64)
    return np.asarray(per_row, dtype=np.int64)


class SFTTrainSamples(MultiEpochDatasetResampler):
    """The train samples (see the module docstring), with their loss tokens counted."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._counts = loss_tokens_per_sample(self.dataset.dataset)

    def loss_tokens(self, first: int, count: int) -> int:
        """Loss tokens (positions with a target) of global samples ``[first, first + count)``."""
        return int(
            sum(int(self._counts[self.epoch_index(g).idx]) for g in range(first, first + count))
        )


def build_sft_train_datasets(
    config: TrainConfig, *, log: Any = None, group: Any = None
) -> tuple[Any, Any | None, int, Any, str]:
    """Return ``(train, valid or None, vocab_size, tokenizer, description)`` of a fine-tuning run.

    ``vocab_size`` is ``len(tokenizer)`` (added tokens included).

    Raises:
        ConfigError: no tokenizer (``sft.tokenizer``), a missing ``sft.train_file`` /
            ``sft.valid_file``, or rows the data layer refuses (its message names the
            file and row).
    """
    del group
    s, t = config.sft, config.training
    for option in ("train_file", "valid_file"):
        path = getattr(s, option)
        if path and not Path(path).exists():
            raise ConfigError(f"sft.{option}", f"{path} does not exist")
    tokenizer = sft_tokenizer(config)
    try:
        built = build_sft_datasets(
            s.train_file,
            tokenizer,
            seq_length=config.data.seq_length,
            valid_file=s.valid_file or None,
            split=s.split or None,
            loss_on=s.loss_on,
            packing=s.packing,
            overlength=s.overlength,
            create_attention_mask=s.packing,
        )
    except (SFTDataError, ValueError) as exc:
        raise ConfigError("sft.train_file", str(exc)) from None
    samples = t.train_iters * t.global_batch_size
    train = SFTTrainSamples(
        IdentityMultiEpochDatasetWrapper(built.train), num_samples=samples, seed=t.seed
    )
    valid = None
    if built.valid is not None:
        valid = WholeTableRows(  # every sample evaluated once, whatever the layout
            MultiEpochDatasetResampler(
                IdentityMultiEpochDatasetWrapper(built.valid), num_epochs=1, shuffle=False
            ),
            t.global_batch_size,
        )
    summary = built.summary()
    if log is not None:
        for line in summary.splitlines():
            log(f"sft {line}")
    description = (
        f"fine-tuning rows of {s.train_file} ({'packed' if s.packing else 'one a sample'}, "
        f"loss on {s.loss_on}); {samples:,} train samples of {len(built.train):,}"
        + (f", {len(built.valid):,} validation samples" if built.valid is not None else "")
        + f", {config.data.seq_length} tokens each; "
        + summary.replace("\n", "; ")
    )
    return train, valid, len(tokenizer), tokenizer, description
