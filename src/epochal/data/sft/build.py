"""One call from fine-tuning files to train / validation datasets: read, split, tokenize, pack.

:func:`build_sft_datasets` is what a fine-tuning run's ``[sft]`` options describe:
``train_file``, ``valid_file`` or ``split``, ``loss_on``, ``packing``, and what to do
with rows over the sequence length. Each part's rows are tokenized with
:func:`~epochal.data.sft.tokenize.tokenize_sft_rows`' rules (once, into a cached
token store: :mod:`epochal.data.sft.row_cache`) and become an
:class:`~epochal.data.sft.packing.SFTDataset` (one row a sample) or a
:class:`~epochal.data.sft.packing.PackedSFTDataset`; every row of a part is in exactly
one of its samples, so a validation pass over all samples evaluates every row once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from epochal.data.datasets.splits import split_document_ranges
from epochal.data.sft.packing import PackedSFTDataset, SFTDataset
from epochal.data.sft.row_cache import tokenized_rows
from epochal.data.sft.rows import SFTDataError
from epochal.data.sft.token_store import TokenizedRows
from epochal.data.sft.tokenize import SFTReport

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
    cache_dir: str | os.PathLike | None = None,
    group: Any = None,
    log: Callable[[str], None] | None = None,
) -> SFTDatasets:
    """Read, split, tokenize and (optionally) pack fine-tuning data.

    Each file is tokenized once, one row at a time, into a token store
    (:func:`~epochal.data.sft.row_cache.tokenized_rows`: Megatron ``.bin``/``.idx``
    files of the ids and loss masks) that the datasets map; ``cache_dir`` keeps the
    stores for the next run and every rank of ``group`` (rank 0 builds, the others
    wait and map). The samples are those of
    :func:`~epochal.data.sft.tokenize.tokenize_sft_rows` with or without a cache.

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
        cache_dir: where token stores are kept (``None``: built for this call only).
        group: the ``torch.distributed`` group whose rank 0 tokenizes (default: the
            default group, when initialized).
        log: ``log(str)`` for a line when a file is tokenized or found cached.

    Returns:
        :class:`SFTDatasets`.

    Raises:
        SFTDataError: both ``valid_file`` and ``split``, an empty part (no rows, or
            every row skipped), a tokenizer without pad and EOS token, and every error
            of :func:`read_sft_rows` / :func:`tokenize_sft_rows`; ``source`` is the
            file at fault.
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
    if split is not None:
        split_document_ranges(split, 1)  # an invalid split string, before any tokenizing
    options = dict(
        max_length=seq_length,
        loss_on=loss_on,
        overlength=overlength,
        cache_dir=cache_dir,
        group=group,
        log=log,
    )
    rows = tokenized_rows(train_file, tokenizer, **options)
    parts: dict[str, TokenizedRows | None] = {"train": rows, "valid": None, "test": None}
    if split is not None:
        ranges = split_document_ranges(split, rows.num_rows)
        for name, bounds in zip(("train", "valid", "test"), ranges):
            parts[name] = None if bounds is None else rows.part(bounds[0], bounds[1])
        if parts["train"] is None:
            raise SFTDataError(
                f"split {split!r} gives no rows to training; give it a weight",
                source=rows.source,
            )
    elif valid_file is not None:
        parts["valid"] = tokenized_rows(valid_file, tokenizer, **options)
    datasets: dict[str, SFTDataset | PackedSFTDataset | None] = {}
    reports: dict[str, SFTReport] = {}
    kind = PackedSFTDataset if packing else SFTDataset
    for name in ("train", "valid", "test"):
        part = parts[name]
        if part is None:
            datasets[name] = None
            continue
        if not part.num_rows:
            raise SFTDataError(
                f"{part.source}: split {split!r} leaves no {name} rows of "
                f"{rows.num_rows}; give that part more weight or add rows",
                source=part.source,
            )
        report = part.report()
        if not len(part):
            raise SFTDataError(
                f"{part.source}: no {name} row is left ({report.summary()})", source=part.source
            )
        reports[name] = report
        datasets[name] = kind(
            part,
            seq_length,
            pad_token_id=pad_token_id,
            create_attention_mask=create_attention_mask,
        )
    return SFTDatasets(datasets["train"], datasets["valid"], datasets["test"], reports)
