"""One call from fine-tuning files to train / validation datasets: read, split, tokenize, pack.

:func:`build_sft_datasets` is what a fine-tuning run's ``[sft]`` options describe:
``train_file``, ``valid_file`` or ``split``, ``loss_on``, ``packing``, and what to do
with rows over the sequence length. Each part's rows are tokenized with
:func:`~epochal.data.sft.tokenize.tokenize_sft_rows` and become an
:class:`~epochal.data.sft.packing.SFTDataset` (one row a sample) or a
:class:`~epochal.data.sft.packing.PackedSFTDataset`; every row of a part is in exactly
one of its samples, so a validation pass over all samples evaluates every row once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from epochal.data.datasets.splits import split_document_ranges
from epochal.data.sft.packing import PackedSFTDataset, SFTDataset
from epochal.data.sft.rows import SFTDataError, SFTRow, read_sft_rows
from epochal.data.sft.tokenize import SFTReport, tokenize_sft_rows

__all__ = ["SFTDatasets", "build_sft_datasets"]


@dataclass(frozen=True)
class SFTDatasets:
    """The datasets of :func:`build_sft_datasets` and their tokenization reports.

    Attributes:
        train / valid / test: a dataset, or ``None`` for an absent part.
        reports: part name (``"train"``, ``"valid"``, ``"test"``) -> :class:`SFTReport`,
            for the parts present.
    """

    train: SFTDataset | PackedSFTDataset
    valid: SFTDataset | PackedSFTDataset | None
    test: SFTDataset | PackedSFTDataset | None
    reports: dict[str, SFTReport]

    def summary(self) -> str:
        """One line a part: its tokenization report, and its packing efficiency if packed."""
        lines = []
        for name in ("train", "valid", "test"):
            dataset = getattr(self, name)
            if dataset is None:
                continue
            line = f"{name}: {self.reports[name].summary()}"
            if isinstance(dataset, PackedSFTDataset):
                line += f"; {dataset.report.summary()}"
            lines.append(line)
        return "\n".join(lines)


def build_sft_datasets(
    train_file: str | os.PathLike,
    tokenizer: Any,
    *,
    seq_length: int,
    valid_file: str | os.PathLike | None = None,
    split: str | None = None,
    loss_on: str = "completion",
    packing: bool = False,
    overlength: str = "error",
    pad_token_id: int | None = None,
    create_attention_mask: bool = False,
) -> SFTDatasets:
    """Read, split, tokenize and (optionally) pack fine-tuning data.

    Args:
        train_file: rows for training (any file :func:`read_sft_rows` reads).
        tokenizer: a ``transformers`` tokenizer (see :func:`tokenize_sft_rows`).
        seq_length: the sample length ``S``; rows are limited to ``S`` tokens.
        valid_file: rows for validation, or ``None``.
        split: instead of ``valid_file``, a Megatron split string of ``train_file``'s
            rows (``"98,2"``: the last 2% validate; a third weight makes a test part).
        loss_on / overlength: as :func:`tokenize_sft_rows`.
        packing: pack rows (:class:`PackedSFTDataset`) instead of one row a sample.
        pad_token_id: padding id; default the tokenizer's pad token, else its EOS
            (TRL's choice).
        create_attention_mask: samples carry ``attention_mask`` ``[1, S, S]`` (for
            models without ``cu_seqlens`` attention; see :mod:`epochal.data.sft.packing`).

    Returns:
        :class:`SFTDatasets`.

    Raises:
        SFTDataError: both ``valid_file`` and ``split``, an empty part (no rows, or
            every row skipped), a tokenizer without pad and EOS token, and every error
            of :func:`read_sft_rows` / :func:`tokenize_sft_rows`.
        ValueError: an invalid ``split``, ``loss_on``, ``overlength`` or ``seq_length``.
    """
    if valid_file is not None and split is not None:
        raise SFTDataError(
            "set either a validation file or a split of the training file, not both "
            f"(valid_file={os.fspath(valid_file)!r}, split={split!r})"
        )
    if pad_token_id is None:
        pad_token_id = getattr(tokenizer, "pad_token_id", None)
        if pad_token_id is None:
            pad_token_id = getattr(tokenizer, "eos_token_id", None)
        if pad_token_id is None:
            raise SFTDataError(
                "the tokenizer has neither a pad nor an EOS token; pass pad_token_id"
            )
    rows = read_sft_rows(train_file)
    parts: dict[str, list[SFTRow] | None] = {"train": rows, "valid": None, "test": None}
    if split is not None:
        ranges = split_document_ranges(split, len(rows))
        for name, bounds in zip(("train", "valid", "test"), ranges):
            parts[name] = None if bounds is None else rows[bounds[0] : bounds[1]]
        if parts["train"] is None:
            raise SFTDataError(f"split {split!r} gives no rows to training; give it a weight")
    elif valid_file is not None:
        parts["valid"] = read_sft_rows(valid_file)
    datasets: dict[str, SFTDataset | PackedSFTDataset | None] = {}
    reports: dict[str, SFTReport] = {}
    kind = PackedSFTDataset if packing else SFTDataset
    for name in ("train", "valid", "test"):
        part = parts[name]
        if part is None:
            datasets[name] = None
            continue
        if not part:
            raise SFTDataError(
                f"{os.fspath(train_file)}: split {split!r} leaves no {name} rows of "
                f"{len(rows)}; give that part more weight or add rows"
            )
        tokenized = tokenize_sft_rows(
            part, tokenizer, max_length=seq_length, loss_on=loss_on, overlength=overlength
        )
        if not tokenized.examples:
            raise SFTDataError(
                f"{part[0].source}: no {name} row is left ({tokenized.report.summary()})"
            )
        reports[name] = tokenized.report
        datasets[name] = kind(
            tokenized.examples,
            seq_length,
            pad_token_id=pad_token_id,
            create_attention_mask=create_attention_mask,
        )
    return SFTDatasets(datasets["train"], datasets["valid"], datasets["test"], reports)
