"""The rows of a supervised fine-tuning run (``sft.train_file``), from ``[sft]``.

:func:`~epochal.data.sft.build_sft_datasets` reads, splits, tokenizes and (with
``sft.packing``) packs the rows with the run's tokenizer (``sft.tokenizer``, else the
``checkpoint.init_from`` folder), once per file into ``<data.cache_dir>/sft-rows``
(:mod:`epochal.data.sft.row_cache`); samples are ``data.seq_length`` tokens with
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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from epochal._text import plural
from epochal.data.epochs.multi_epoch import (
    IdentityMultiEpochDatasetWrapper,
    MultiEpochDatasetResampler,
)
from epochal.data.sft import (
    PackedSFTDataset,
    SFTDataError,
    SFTDataset,
    build_sft_datasets,
    check_rows_path,
    load_chat_tokenizer,
)
from epochal.model.config import ConfigError
from epochal.train.config import TrainConfig
from epochal.train.inputs.corpus import default_cache_dir
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
    per_row = dataset.example_loss_tokens()
    if isinstance(dataset, PackedSFTDataset):
        return np.asarray([int(per_row[b].sum()) for b in dataset.bins], dtype=np.int64)
    return per_row


@dataclass
class SFTTrainSamples(MultiEpochDatasetResampler):
    """The train samples (see the module docstring), with their loss tokens counted.

    Attributes:
        rows_file: the ``sft.train_file`` the samples come from (named when a resume
            would read other rows than its checkpoint's run).
    """

    rows_file: str = ""
    #: the identity format (recorded with the checkpoint's sample digests): rows and tokens
    identity_kind: str = "sft rows+tokens"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._counts = loss_tokens_per_sample(self.dataset.dataset)

    def loss_tokens(self, first: int, count: int) -> int:
        """Loss tokens (positions with a target) of global samples ``[first, first + count)``."""
        return int(
            sum(int(self._counts[self.epoch_index(g).idx]) for g in range(first, first + count))
        )

    def refuse_changed_samples(self, differences: str) -> None:
        """Refuse to resume on other rows than the checkpoint's (called by the resume check).

        A fine-tuning sample's identity is its rows' numbers and a digest of their
        tokens, and its order depends only on the seed and the number of samples of
        an epoch, so differing digests mean the rows behind ``sft.train_file`` (or the
        tokenizer, or an option that changes the tokens) changed since the checkpoint.

        Raises:
            ConfigError: always (``sft.train_file``, naming the file and the steps).
        """
        raise ConfigError(
            "sft.train_file",
            f"{self.rows_file}: these rows are not the rows the checkpointed run trained on "
            f"({differences}); resuming would train on other samples. Put the file (and "
            "the tokenizer) back as they were, or start a new run (another run_dir) with "
            "checkpoint.init_from set to the checkpoint to fine-tune its weights on the new rows",
        )


def _option(exc: SFTDataError, config: TrainConfig) -> str:
    """The option whose file an error is about: ``sft.valid_file`` or ``sft.train_file``."""
    valid = config.sft.valid_file
    if valid and exc.source is not None and Path(exc.source) == Path(valid):
        return "sft.valid_file"
    return "sft.train_file"


def _describe(config: TrainConfig, samples: int, built: Any) -> str:
    """One line: the file, packing and loss, the train / validation samples and their length."""
    s = config.sft
    text = (
        f"fine-tuning rows of {s.train_file} ({'packed' if s.packing else 'one a sample'}, "
        f"loss on {s.loss_on}): {plural(samples, 'train sample', fmt=',')} from "
        + plural(len(built.train), "packed sample" if s.packing else "row", fmt=",")
    )
    if built.valid is not None:
        text += f", {plural(len(built.valid), 'validation sample', fmt=',')}"
    return text + f", {plural(config.data.seq_length, 'token')} each"


def build_sft_train_datasets(
    config: TrainConfig, *, log: Any = None, group: Any = None
) -> tuple[Any, Any | None, int, Any, str]:
    """Return ``(train, valid or None, vocab_size, tokenizer, description)`` of a fine-tuning run.

    The rows are tokenized once into ``<data.cache_dir>/sft-rows`` (rank 0 of
    ``group``; the other ranks wait and map the store), see
    :mod:`epochal.data.sft.row_cache`. ``vocab_size`` is ``len(tokenizer)`` (added
    tokens included). ``log`` gets each part's tokenization report (``sft train:
    ...``); the description is one line.

    Raises:
        ConfigError: no tokenizer (``sft.tokenizer``), a missing ``sft.train_file`` /
            ``sft.valid_file``, or rows the data layer refuses (its message names the
            file and row; the option is the file's).
    """
    s, t, d = config.sft, config.training, config.data
    for option in ("train_file", "valid_file"):
        path = getattr(s, option)
        if path and not Path(path).exists():
            raise ConfigError(f"sft.{option}", f"{path} does not exist")
        if path:
            try:
                check_rows_path(path)
            except SFTDataError as exc:
                raise ConfigError(f"sft.{option}", str(exc)) from None
    tokenizer = sft_tokenizer(config)
    cache = Path(d.cache_dir) if d.cache_dir else default_cache_dir()
    try:
        built = build_sft_datasets(
            s.train_file,
            tokenizer,
            seq_length=d.seq_length,
            valid_file=s.valid_file or None,
            split=s.split or None,
            loss_on=s.loss_on,
            packing=s.packing,
            overlength=s.overlength,
            create_attention_mask=s.packing,
            cache_dir=cache / "sft-rows",
            group=group,
            log=log,
        )
    except SFTDataError as exc:
        raise ConfigError(_option(exc, config), str(exc)) from None
    except ValueError as exc:
        raise ConfigError("sft.train_file", str(exc)) from None
    samples = t.train_iters * t.global_batch_size
    train = SFTTrainSamples(
        IdentityMultiEpochDatasetWrapper(built.train),
        num_samples=samples,
        seed=t.seed,
        rows_file=str(s.train_file),
    )
    valid = None
    if built.valid is not None:
        valid = WholeTableRows(  # every sample evaluated once, whatever the layout
            MultiEpochDatasetResampler(
                IdentityMultiEpochDatasetWrapper(built.valid), num_epochs=1, shuffle=False
            ),
            t.global_batch_size,
        )
    if log is not None:
        for line in built.summary().splitlines():
            log(f"sft {line}")
    return train, valid, len(tokenizer), tokenizer, _describe(config, samples, built)
