"""The ``[sft]`` section: supervised fine-tuning of a GPT on chat or prompt-completion rows."""

from __future__ import annotations

import math
from dataclasses import dataclass

from epochal._checks import require

__all__ = ["SFTConfig"]

_LOSS_ON = ("completion", "all")
_OVERLENGTH = ("error", "skip", "truncate")


@dataclass(kw_only=True)
class SFTConfig:
    """The ``[sft]`` section (used when ``sft.train_file`` is set; ``model.type = "gpt"``).

    The GPT then trains on these rows instead of a pretraining corpus
    (:mod:`epochal.train.inputs.sft`, :mod:`epochal.data.sft`), through the same
    samplers and loaders: every row a sample (padded to ``data.seq_length``), or
    rows packed into samples of ``data.seq_length`` tokens. A step's loss is the sum
    of the cross-entropy over the loss tokens of its global batch divided by their
    number (``transformers``' ``num_items_in_batch``; Megatron-Core's
    ``calculate_per_token_loss``), whatever the split over micro-batches and
    data-parallel ranks; the validation loss is the token mean over every loss token
    of the validation rows, each row evaluated once.

    Attributes:
        train_file: the training rows: JSONL, Parquet or a ``datasets``
            ``save_to_disk`` folder, with ``messages`` (a list of ``{role, content}``,
            roles system / user / assistant) or ``prompt`` and ``completion`` (TRL's
            dataset formats). Setting it makes the run a fine-tuning run; it replaces a
            preset's data source.
        valid_file: the validation rows (same formats); every row is evaluated once
            per evaluation, whatever ``training.eval_iters`` (0 turns evaluation off).
        split: instead of ``valid_file``: Megatron's split string of ``train_file``'s
            rows in file order, e.g. ``"95,5"`` (the last 5% validate); ``""`` = no
            validation.
        loss_on: ``"completion"`` (the completion of prompt-completion rows, the
            assistant turns of ``messages`` rows, marked by the chat template's
            ``{% generation %}`` markers) or ``"all"`` (every token).
        packing: pack rows into samples of ``data.seq_length`` tokens (best-fit
            decreasing), attention confined to each row and positions restarting at
            each row (a bool attention mask per sample), so the loss is that of the
            unpacked rows on fewer padded tokens; the packing efficiency is reported.
        overlength: rows longer than ``data.seq_length`` tokens: ``"error"`` (refused,
            naming the file and row), ``"skip"`` (left out and counted) or
            ``"truncate"`` (cut and counted).
        tokenizer: a Hugging Face tokenizer or model folder (``tokenizer.json`` /
            ``tokenizer_config.json`` with the chat template); ``""``:
            ``checkpoint.init_from`` (a Hugging Face folder holds its tokenizer).
    """

    train_file: str = ""
    valid_file: str = ""
    split: str = ""
    loss_on: str = "completion"
    packing: bool = False
    overlength: str = "error"
    tokenizer: str = ""

    def __post_init__(self) -> None:
        require(
            self.loss_on in _LOSS_ON,
            "loss_on",
            f"must be one of {', '.join(map(repr, _LOSS_ON))}, got {self.loss_on!r}",
        )
        require(
            self.overlength in _OVERLENGTH,
            "overlength",
            f"must be one of {', '.join(map(repr, _OVERLENGTH))}, got {self.overlength!r}",
        )
        if self.split:
            try:
                weights = [float(w) for w in self.split.replace("/", ",").split(",")]
            except ValueError:
                weights = []
            require(
                1 <= len(weights) <= 3
                and all(math.isfinite(w) and w >= 0 for w in weights)
                and sum(weights) > 0,
                "split",
                "must be 1-3 comma-separated weights >= 0 'train,valid[,test]' like "
                f"'95,5', got {self.split!r}",
            )
            require(
                not self.valid_file,
                "split",
                "and sft.valid_file are exclusive (a split of train_file, or a valid file)",
            )
        if not self.train_file:
            for name in ("valid_file", "split", "tokenizer"):
                require(
                    not getattr(self, name),
                    name,
                    "needs sft.train_file (the rows to fine-tune on)",
                )
            require(not self.packing, "packing", "needs sft.train_file (the rows to pack)")

    @property
    def enabled(self) -> bool:
        """Whether the run fine-tunes on ``train_file``."""
        return bool(self.train_file)
