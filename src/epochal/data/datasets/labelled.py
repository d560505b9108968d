"""Labelled protein tables for fine-tuning: CSV / TSV / parquet -> model samples.

Reading (:func:`read_labelled_table`): a table with a sequence column and a label
column (names configurable; BioNeMo's fine-tuning CSVs and aaanalysis' ``SEQ_*.tsv``
use ``sequence`` and ``label``). ``.csv`` is comma-separated, ``.tsv``/``.tab``/``.txt``
tab-separated (optionally gzipped), ``.parquet`` needs ``pyarrow``; the table reader
and the sequence rules are the pretraining inputs' (:mod:`epochal.data.proteins.tables`,
:mod:`epochal.data.proteins.sequences`): sequences are upper-cased and checked
against the protein alphabet, so training and ``epochal embed`` see the same residues.
Errors name the file and the row (1-based data rows, the header not counted):
a missing column, an empty sequence, a character outside the alphabet, a regression
label that is not a number (or has another count of values than ``model.num_labels``),
a per-residue label string whose length differs from its sequence.

Labels (:class:`LabelVocab`): classification classes are the distinct training
labels in sorted order (deterministic; saved with the run as ``label_vocab.json``).
A label the vocabulary lacks (a class training never saw, met in validation) becomes
``-2``: the step leaves it out of the loss and accuracy and reports its share as
``unseen labels`` instead of failing.

Samples (:class:`LabelledSequenceDataset`, a plain map-style dataset: wrap it in
``IdentityMultiEpochDatasetWrapper`` under ``MultiEpochDatasetResampler`` for
multi-epoch, resumable training; it draws no randomness at all):
``<cls> residues <eos>`` padded with ``<pad>`` to ``seq_length``; proteins longer than
``seq_length - 2`` residues are cut to their first residues (and per-residue labels
with them). Keys: ``tokens`` int64 ``[s]``, ``padding_mask`` int64 ``[s]`` (1 = real
token), ``residue_mask`` int64 ``[s]`` (1 = a residue), ``labels`` (float32
``[num_labels]`` for regression, int64 ``[]`` per sequence or ``[s]`` per residue,
-100 where nothing is predicted), ``loss_mask`` float ``[s]`` (residue positions).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from epochal.data.proteins.sequences import clean_sequence
from epochal.data.proteins.tables import TABLE_DELIMITERS, TableReader

__all__ = [
    "LabelVocab",
    "LabelledDataError",
    "LabelledSequenceDataset",
    "LabelledTable",
    "TASKS",
    "end_token",
    "read_labelled_table",
    "read_sequence_table",
    "regression_values",
]

#: What a label means: a value, a class per sequence, a class per residue.
TASKS = ("sequence_regression", "sequence_classification", "residue_classification")
IGNORE = -100
UNSEEN = -2


def end_token(tokenizer: Any) -> int:
    """The id closing a sequence: ``sep`` (BERT's ``[SEP]``; ESM-2's ``<eos>``), else ``eos``."""
    sep = getattr(tokenizer, "sep", None)
    return tokenizer.eos if sep is None else sep


class LabelledDataError(ValueError):
    """A labelled table that cannot be used (the message names the file and row)."""


@dataclass
class LabelledTable:
    """The rows of a labelled table, in file order.

    Attributes:
        path: the file read.
        sequences: one string per row.
        labels: one label string per row (None when the table was read without labels).
        ids: the row's id column value, or its 1-based row number.
    """

    path: Path
    sequences: list[str]
    labels: list[str] | None
    ids: list[str]


#: the suffixes of labelled tables (``.txt`` is tab-separated, as aaanalysis' tables).
LABELLED_TABLES: dict[str, str | None] = {**TABLE_DELIMITERS, ".txt": "\t"}


def read_sequence_table(
    path: str | os.PathLike,
    sequence_column: str = "sequence",
    label_column: str | None = None,
    id_column: str | None = None,
) -> LabelledTable:
    """Read sequences (and labels) of a CSV / TSV / parquet table, in file order.

    The table is read by :class:`~epochal.data.proteins.tables.TableReader` (encodings,
    trailing delimiters, size bounds) and every sequence is cleaned by the protein rules
    of :func:`~epochal.data.proteins.sequences.clean_sequence`, as pretraining inputs
    and ``epochal embed`` are: upper-cased, whitespace removed, characters outside the
    alphabet refused.

    Raises:
        FileNotFoundError: no such file.
        LabelledDataError: an unknown format, a file that is not UTF-8, a missing column
            (the columns found are listed), a row with too many or too few cells, an
            empty sequence / label, a sequence the protein rules refuse, a cell over the
            length limit (file and row named).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such table")
    table = TableReader(path, LabelledDataError, suffixes=LABELLED_TABLES)
    names = table.columns
    wanted = [c for c in (sequence_column, label_column, id_column) if c]
    for column in wanted:
        if column not in names:
            raise LabelledDataError(f"{path}: no column {column!r} (columns: {names})")
    sequences: list[str] = []
    labels: list[str] | None = [] if label_column else None
    ids: list[str] = []
    for n, values in table.rows(wanted):
        cells = dict(zip(wanted, values))
        seq = cells[sequence_column]
        if seq is None or not str(seq).strip():
            raise LabelledDataError(f"{path}: row {n}: empty sequence")
        sequences.append(clean_sequence(str(seq), f"{path}: row {n}", error=LabelledDataError))
        ids.append(str(cells[id_column]) if id_column else str(n))
        if labels is not None:
            label = cells[label_column]
            if label is None or str(label).strip() == "":
                raise LabelledDataError(f"{path}: row {n}: empty label in column {label_column!r}")
            labels.append(str(label).strip())
    if not sequences:
        raise LabelledDataError(f"{path}: no rows (a header without data)")
    return LabelledTable(path, sequences, labels, ids)


def regression_values(label: str) -> list[float]:
    """The numbers of a regression label: separated by spaces or commas (``"0.5 2"``, ``"0.5,2"``).

    Raises:
        ValueError: a part is not a number.
    """
    return [float(v) for v in label.replace(",", " ").split()]


def read_labelled_table(
    path: str | os.PathLike,
    task: str,
    sequence_column: str = "sequence",
    label_column: str = "label",
    *,
    num_labels: int | None = None,
) -> LabelledTable:
    """:func:`read_sequence_table` with labels checked for ``task`` (one of :data:`TASKS`).

    Args:
        num_labels: regression: the number of values every label must hold (None: any).

    Raises:
        LabelledDataError: besides the reading errors, a regression label that is not
            a number (or space-separated numbers), one with another number of values
            than ``num_labels`` (``"1,5"`` is two values: decimals take a point), or a
            per-residue label string whose length differs from its sequence's (file,
            row and both lengths named).
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    table = read_sequence_table(path, sequence_column, label_column)
    assert table.labels is not None
    for n, (seq, label) in enumerate(zip(table.sequences, table.labels), start=1):
        if task == "sequence_regression":
            try:
                values = regression_values(label)
            except ValueError:
                values = []
            if not values or not all(math.isfinite(v) for v in values):
                raise LabelledDataError(
                    f"{table.path}: row {n}: regression label {label!r} is not a finite number"
                )
            # the model trains on float32 targets: a value beyond its range becomes inf
            if not bool(torch.isfinite(torch.tensor(values, dtype=torch.float32)).all()):
                raise LabelledDataError(
                    f"{table.path}: row {n}: regression label {label!r} is beyond float32's "
                    f"range (|x| <= {torch.finfo(torch.float32).max:.4g})"
                )
            if num_labels is not None and len(values) != num_labels:
                raise LabelledDataError(
                    f"{table.path}: row {n}: regression label {label!r} holds {len(values)} "
                    f"values, model.num_labels={num_labels} (values are separated by spaces "
                    "or commas; write decimals with a point: 1.5)"
                )
        elif task == "residue_classification" and len(label) != len(seq):
            raise LabelledDataError(
                f"{table.path}: row {n}: {len(label)} per-residue labels for a sequence of "
                f"{len(seq)} residues (column {label_column!r} must have one character per residue)"
            )
    return table


class LabelVocab:
    """Class names <-> ids: the sorted distinct labels of the training data.

    Args:
        labels: the class names (sorted and de-duplicated here).
    """

    def __init__(self, labels: Sequence[str]) -> None:
        self.labels = sorted(set(labels))
        self.ids = {label: i for i, label in enumerate(self.labels)}

    @classmethod
    def from_table(cls, table: LabelledTable, task: str) -> LabelVocab:
        """The classes of a training table (per residue: every character of every label)."""
        assert table.labels is not None
        if task == "residue_classification":
            return cls([c for label in table.labels for c in label])
        return cls(table.labels)

    def __len__(self) -> int:
        return len(self.labels)

    def id(self, label: str) -> int:
        """The class id of ``label``, or ``-2`` (:data:`UNSEEN`) for a class the vocabulary lacks."""
        return self.ids.get(label, UNSEEN)

    def to_json(self) -> str:
        """``{"labels": [...]}`` (index = class id) as JSON text."""
        return json.dumps({"labels": self.labels}, indent=1) + "\n"

    def save(self, path: str | os.PathLike) -> None:
        """Write :meth:`to_json` to ``path``."""
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike) -> LabelVocab:
        """Read a file :meth:`save` wrote."""
        return cls(json.loads(Path(path).read_text())["labels"])


class LabelledSequenceDataset:
    """Tokenized, padded samples of labelled sequences (see the module docstring).

    Args:
        sequences: the sequences, in order.
        labels: their label strings (None: inference, no ``labels`` key).
        tokenizer: ``encode(str) -> ids`` with ``cls``, ``pad`` and ``sep`` ids (ESM-2's
            ``<eos>`` is its ``sep``; BERT's ``[SEP]``); ``eos`` without ``sep``.
        task: one of :data:`TASKS`.
        seq_length: tokens per sample (>= 3).
        vocab: the classes (classification tasks).
        num_labels: regression targets per sequence.
        ids: each sequence's row of its table (:attr:`LabelledTable.ids`), for
            :meth:`sample_identity`; default the 1-based positions.
    """

    def __init__(
        self,
        sequences: Sequence[str],
        labels: Sequence[str] | None,
        tokenizer: Any,
        *,
        task: str,
        seq_length: int,
        vocab: LabelVocab | None = None,
        num_labels: int = 1,
        ids: Sequence[str] | None = None,
    ) -> None:
        if seq_length < 3:
            raise ValueError(f"seq_length must be >= 3 (<cls>, a residue, <eos>), got {seq_length}")
        if task != "sequence_regression" and labels is not None and vocab is None:
            raise ValueError(f"task {task!r} needs a label vocabulary")
        self.sequences = list(sequences)
        self.labels = None if labels is None else list(labels)
        self.tokenizer = tokenizer
        self.task = task
        self.seq_length = seq_length
        self.vocab = vocab
        self.num_labels = num_labels
        self.cls = tokenizer.cls
        self.eos = end_token(tokenizer)
        self.pad = tokenizer.pad
        self.ids = [str(i) for i in range(1, len(self.sequences) + 1)] if ids is None else list(ids)
        if len(self.ids) != len(self.sequences):
            raise ValueError(f"got {len(self.ids)} ids for {len(self.sequences)} sequences")

    def __len__(self) -> int:
        return len(self.sequences)

    def sample_identity(self, idx: int) -> dict[str, Any]:
        """``{"row": r}``: the table row of sequence ``idx`` (its number when the id is one)."""
        row = self.ids[int(idx)]
        return {"row": int(row) if row.isdigit() else row}

    def residues(self, idx: int) -> list[int]:
        """The token ids of sequence ``idx`` without special tokens (not cut).

        Raises:
            LabelledDataError: per-residue labels and a sequence that does not tokenize
                to one token per character (e.g. a lower-case run, read as one ``<unk>``).
        """
        ids = self.tokenizer.encode(self.sequences[idx])
        if self.task == "residue_classification" and self.labels is not None:
            if len(ids) != len(self.labels[idx]):
                raise LabelledDataError(
                    f"sequence {idx + 1}: {len(ids)} tokens for {len(self.labels[idx])} per-residue "
                    "labels (write one upper-case residue letter per label)"
                )
        return ids

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        idx = int(idx)
        body = self.residues(idx)[: self.seq_length - 2]
        n, s = len(body), self.seq_length
        tokens = torch.full((s,), self.pad, dtype=torch.long)
        tokens[: n + 2] = torch.tensor([self.cls, *body, self.eos], dtype=torch.long)
        padding = torch.zeros(s, dtype=torch.long)
        padding[: n + 2] = 1
        residue = torch.zeros(s, dtype=torch.long)
        residue[1 : n + 1] = 1
        out = {"tokens": tokens, "padding_mask": padding, "residue_mask": residue}
        out["loss_mask"] = residue.float()
        if self.labels is not None:
            out["labels"] = self._label(idx, n)
        return out

    def _label(self, idx: int, n: int) -> torch.Tensor:
        label = self.labels[idx]
        if self.task == "sequence_regression":
            values = regression_values(label)
            if len(values) != self.num_labels:
                raise LabelledDataError(
                    f"sequence {idx + 1}: {len(values)} regression values, model.num_labels={self.num_labels}"
                )
            return torch.tensor(values, dtype=torch.float32)
        assert self.vocab is not None
        if self.task == "sequence_classification":
            return torch.tensor(self.vocab.id(label), dtype=torch.long)
        out = torch.full((self.seq_length,), IGNORE, dtype=torch.long)
        out[1 : n + 1] = torch.tensor([self.vocab.id(c) for c in label[:n]], dtype=torch.long)
        return out
