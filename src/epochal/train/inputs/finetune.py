"""The labelled data of a fine-tuning run (``model.head`` != ``"mlm"``), from ``[finetune]``.

``finetune.train_file`` (and ``valid_file``, or ``split`` of the train file) are read by
:mod:`epochal.data.datasets.labelled` with ``finetune.sequence_column`` /
``label_column``; the task is ``model.head``. Tokenizer: ESM-2's alphabet
(``model.type = "esm"``; ``data.vocab_file`` for another ESM vocabulary) or
``data.tokenizer_type`` / ``data.vocab_file`` (BERT; an ``init_from`` Hugging Face
folder's ``vocab.txt`` by default). Classification labels: the sorted classes of the
training rows, written to ``<run_dir>/label_vocab.json`` (a resumed run must find
the same classes); ``model.num_labels`` must equal their number.

Train samples: ``MultiEpochDatasetResampler(IdentityMultiEpochDatasetWrapper(rows),
num_samples = train_iters * global_batch_size, seed = training.seed)``: reshuffled
every epoch, a pure function of the sample number (resumable exactly). Validation:
the validation rows once, in order, every evaluation over all of them (whatever
``training.eval_iters``; 0 turns evaluation off), the last global batch completed
with unscored filler (:mod:`epochal.train.inputs.eval_rows`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from epochal._atomic import atomic_write
from epochal.data.datasets.labelled import (
    LabelledSequenceDataset,
    LabelledTable,
    LabelVocab,
    read_labelled_table,
)
from epochal.data.epochs.multi_epoch import (
    IdentityMultiEpochDatasetWrapper,
    MultiEpochDatasetResampler,
)
from epochal.data.epochs.permutation import permute
from epochal.model.config import ConfigError
from epochal.train.config import TrainConfig
from epochal.train.inputs.eval_rows import WholeTableRows

__all__ = [
    "LABEL_VOCAB_FILE",
    "build_finetune_datasets",
    "finetune_tokenizer",
    "label_vocab_file",
    "read_vocab",
]

LABEL_VOCAB_FILE = "label_vocab.json"


def finetune_tokenizer(config: TrainConfig) -> Any:
    """The tokenizer of the run's sequences (see the module docstring).

    Raises:
        ConfigError: the tokenizer cannot be built (names the option).
    """
    d = config.data
    if config.model.type == "esm":
        from epochal.data.indexed.tokenizer_esm import ESM2Tokenizer

        try:
            return ESM2Tokenizer(d.vocab_file or None)
        except (OSError, ValueError) as exc:
            raise ConfigError("data.vocab_file", str(exc)) from None
    from epochal.train.inputs.corpus import tokenizer_from_config

    init = Path(config.checkpoint.init_from) if config.checkpoint.init_from else None
    if not d.vocab_file and init is not None and (init / "vocab.txt").is_file():
        from dataclasses import replace

        d = replace(d, vocab_file=str(init / "vocab.txt"), tokenizer_type=_bert_tokenizer(init))
    return tokenizer_from_config(d)


def _bert_tokenizer(folder: Path) -> str:
    import json

    try:
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return "BertWordPieceLowerCase"
    return "BertWordPieceLowerCase" if cfg.get("do_lower_case", True) else "BertWordPieceCase"


def _read(config: TrainConfig, option: str, path: str) -> LabelledTable:
    f = config.finetune
    try:
        regression = config.model.head == "sequence_regression"
        return read_labelled_table(
            path,
            config.model.head,
            f.sequence_column,
            f.label_column,
            num_labels=config.model.num_labels if regression else None,
        )
    except FileNotFoundError as exc:
        raise ConfigError(f"finetune.{option}", str(exc)) from None


def _subset(table: LabelledTable, rows: list[int]) -> LabelledTable:
    assert table.labels is not None
    return LabelledTable(
        table.path,
        [table.sequences[i] for i in rows],
        [table.labels[i] for i in rows],
        [table.ids[i] for i in rows],
    )


def read_vocab(run_dir: str | Path) -> LabelVocab | None:
    """The classes a run was trained with (``label_vocab.json``), or None."""
    path = Path(run_dir) / LABEL_VOCAB_FILE
    return LabelVocab.load(path) if path.is_file() else None


def label_vocab_file(
    checkpoint: str | Path, step_folder: Path | None = None, run_dir: str | None = None
) -> Path | None:
    """The ``label_vocab.json`` that goes with a checkpoint, or None.

    Looked for next to the checkpoint itself first: in the folder given, its step
    folder and that folder's run directory (``<run>/checkpoints/step_N``); then in the
    run directory the checkpoint's configuration recorded, only when that is an
    absolute path (a relative one would be resolved against the current directory,
    which may hold another run).

    Args:
        checkpoint: the path a command was given (run, checkpoints or step folder,
            a Hugging Face folder).
        step_folder: the step folder read, if any.
        run_dir: ``run_dir`` from the checkpoint's saved configuration, if any.
    """
    folders = [Path(checkpoint)]
    if step_folder is not None:
        folders.append(step_folder)
        if step_folder.parent.name == "checkpoints":
            folders.append(step_folder.parent.parent)
    if run_dir and Path(run_dir).is_absolute():
        folders.append(Path(run_dir))
    for folder in folders:
        if (folder / LABEL_VOCAB_FILE).is_file():
            return folder / LABEL_VOCAB_FILE
    return None


def build_finetune_datasets(
    config: TrainConfig, *, log: Any = None, group: Any = None
) -> tuple[Any, Any | None, int, Any, str]:
    """Return ``(train, valid or None, vocab_size, tokenizer, description)`` of a fine-tuning run.

    Raises:
        ConfigError: no ``finetune.train_file``, a missing file, ``model.num_labels``
            that differs from the training classes, or classes that differ from the
            run's saved ``label_vocab.json``.
        LabelledDataError: a table that cannot be used (file and row named).
    """
    del log, group
    f, t, task = config.finetune, config.training, config.model.head
    if not f.train_file:
        raise ConfigError("finetune.train_file", f"model.head={task!r} needs a labelled table")
    table = _read(config, "train_file", f.train_file)
    valid_table = _read(config, "valid_file", f.valid_file) if f.valid_file else None
    fractions = f.split_fractions()
    if fractions is not None:
        n = len(table.sequences)
        order = [permute(i, n, t.seed) for i in range(n)]
        n_valid = round(n * fractions[1])
        valid_table = _subset(table, sorted(order[:n_valid])) if n_valid else None
        table = _subset(table, sorted(order[n_valid:]))
        if not table.sequences:
            raise ConfigError("finetune.split", f"leaves no training rows of {f.train_file}")
    vocab = None
    if task != "sequence_regression":
        vocab = LabelVocab.from_table(table, task)
        if len(vocab) != config.model.num_labels:
            raise ConfigError(
                "model.num_labels",
                f"must equal the {len(vocab)} classes of {f.train_file} ({vocab.labels}), "
                f"got {config.model.num_labels}",
            )
        saved = read_vocab(config.run_dir)
        if saved is not None and saved.labels != vocab.labels:
            raise ConfigError(
                "finetune.train_file",
                f"has the classes {vocab.labels}, but {config.run_dir}/{LABEL_VOCAB_FILE} "
                f"(this run's) has {saved.labels}; use another run_dir",
            )
        if saved is None:
            Path(config.run_dir).mkdir(parents=True, exist_ok=True)
            atomic_write(Path(config.run_dir) / LABEL_VOCAB_FILE, vocab.to_json())
    tokenizer = finetune_tokenizer(config)

    def rows(tab: LabelledTable) -> LabelledSequenceDataset:
        return LabelledSequenceDataset(
            tab.sequences,
            tab.labels,
            tokenizer,
            task=task,
            seq_length=config.data.seq_length,
            vocab=vocab,
            num_labels=config.model.num_labels,
            ids=tab.ids,
        )

    samples = t.train_iters * t.global_batch_size
    train = MultiEpochDatasetResampler(
        IdentityMultiEpochDatasetWrapper(rows(table)), num_samples=samples, seed=t.seed
    )
    valid = None
    if valid_table is not None:
        valid = WholeTableRows(  # every row evaluated once, whatever the layout
            MultiEpochDatasetResampler(
                IdentityMultiEpochDatasetWrapper(rows(valid_table)), num_epochs=1, shuffle=False
            ),
            t.global_batch_size,
        )
    description = (
        f"{task} on {f.train_file} ({len(table.sequences):,} rows"
        + (f", {len(vocab)} classes {vocab.labels}" if vocab is not None else "")
        + f"); {samples:,} train samples"
        + (f", {len(valid_table.sequences):,} validation rows" if valid_table is not None else "")
        + f", {config.data.seq_length} tokens each"
    )
    return train, valid, tokenizer.vocab_size, tokenizer, description
