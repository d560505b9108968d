"""Fine-tuning examples as fixed-length training samples: padded one a row, or packed.

Both datasets give the keys :class:`~epochal.data.GPTDataset` gives, for sequence
length ``S``: ``tokens`` int64 ``[S]``, ``labels`` int64 ``[S]`` (the next token),
``loss_mask`` float32 ``[S]`` (1 where ``labels`` is a training target: the row's
``loss_mask`` shifted by one, see :func:`~epochal.data.sft.loss.shift_labels`) and
``position_ids`` int64 ``[S]``, restarting at 0 where each of the sample's sequences
starts (its rows, then the padding, if any, as one more), and with
``create_attention_mask=True`` GPTDataset's ``attention_mask`` bool ``[1, S, S]``
(True = masked out: a later position, or another sequence). Targets never cross a
row's end: a row's last position has none. All samples have the same shapes, so any
collate function stacks them; :func:`cu_seqlens_from_positions` gives the sequences'
boundaries.

- :class:`SFTDataset`: one example a sample, padded with ``pad_token_id`` (loss 0).
- :class:`PackedSFTDataset`: examples packed into samples of ``S`` tokens by
  best-fit decreasing (:func:`best_fit_bins`, TRL's ``packing_strategy="bfd"``), with
  positions restarting at 0 for each row; a model that confines attention to each
  row (``cu_seqlens``, the THD path of :mod:`epochal.data.loading.packing`) computes
  the loss of the unpacked rows on fewer padded tokens. :class:`PackingReport` gives
  the packing efficiency.

:func:`collate_packed` turns a list of samples into one THD micro-batch (``[1, b*S]``
per-token tensors and their ``cu_seqlens``), the layout
:func:`~epochal.data.loading.packing.pack_padded_batch` gives BERT and ESM batches.
Everything is a pure function of the examples and ``S``: the same in every process.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from epochal._text import plural
from epochal.data.sft.token_store import TokenizedRows, row_digest
from epochal.data.sft.tokenize import SFTExample

__all__ = [
    "PackedSFTDataset",
    "PackingReport",
    "SFTDataset",
    "best_fit_bins",
    "collate_packed",
    "cu_seqlens_from_positions",
]


def best_fit_bins(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Group items into bins of at most ``capacity`` by best-fit decreasing.

    Items are placed longest first (ties in index order), each into the open bin
    with the least room that still fits it (ties: the bin that got that room first),
    else into a new bin: TRL's ``bfd`` packing, bin for bin. (TRL packs each
    ``datasets.map`` batch of 1,000 rows on its own, so for larger sets its bins
    differ and are usually more; epochal packs all rows together.)

    Args:
        lengths: each item's size, ``1 <= length <= capacity``.
        capacity: the bin size (the sequence length).

    Returns:
        The bins in the order they were opened, each the item indices in the order
        they were placed; every index appears exactly once.

    Raises:
        ValueError: ``capacity < 1``, or an item longer than ``capacity`` or empty
            (named by its index).
    """
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    sizes = [int(n) for n in lengths]
    for index, size in enumerate(sizes):
        if not 1 <= size <= capacity:
            raise ValueError(f"item {index} has length {size}; packing needs 1..{capacity}")
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    bins: list[list[int]] = []
    room: list[int] = []  # per bin
    by_room: dict[int, deque[int]] = defaultdict(deque)  # room -> bins, first opened first
    rooms: list[int] = []  # sorted rooms that some open bin has (> 0)
    for item in order:
        size = sizes[item]
        at = bisect.bisect_left(rooms, size)
        if at < len(rooms):
            space = rooms[at]
            b = by_room[space].popleft()
            if not by_room[space]:
                del rooms[at]
        else:
            b = len(bins)
            bins.append([])
            room.append(capacity)
        bins[b].append(item)
        room[b] -= size
        if room[b] > 0:
            if not by_room[room[b]]:
                bisect.insort(rooms, room[b])
            by_room[room[b]].append(b)
    return bins


@dataclass(frozen=True)
class PackingReport:
    """How full the samples are.

    Attributes:
        rows: examples packed.
        samples: samples of ``seq_length`` tokens they fill.
        seq_length: the sample length ``S``.
        tokens: real tokens (the examples' lengths summed).
    """

    rows: int
    samples: int
    seq_length: int
    tokens: int

    @property
    def efficiency(self) -> float:
        """Real tokens / tokens computed (``samples * seq_length``), in [0, 1]."""
        return self.tokens / max(self.samples * self.seq_length, 1)

    @property
    def padded_efficiency(self) -> float:
        """The same for one example a sample (:class:`SFTDataset`)."""
        return self.tokens / max(self.rows * self.seq_length, 1)

    def summary(self) -> str:
        """One line, e.g. ``"1,000 rows in 310 samples of 2,048 tokens: 96.1% real ..."``."""
        return (
            f"{plural(self.rows, 'row', fmt=',')} in {plural(self.samples, 'sample', fmt=',')} "
            f"of {self.seq_length:,} tokens: "
            f"{100 * self.efficiency:.1f}% real tokens "
            f"({100 * self.padded_efficiency:.1f}% one row a sample)"
        )


def _lengths(examples: Sequence[SFTExample]) -> np.ndarray:
    """int64 ``[n]``: each example's tokens (from a store's index, without reading tokens)."""
    if isinstance(examples, TokenizedRows):
        return examples.lengths.astype(np.int64)
    return np.asarray([len(e) for e in examples], dtype=np.int64)


def _check(examples: Sequence[SFTExample], lengths: np.ndarray, seq_length: int) -> None:
    if seq_length < 2:
        raise ValueError(f"seq_length must be >= 2, got {seq_length}")
    bad = np.flatnonzero((lengths < 1) | (lengths > seq_length))
    if bad.size:
        example = examples[int(bad[0])]
        raise ValueError(
            f"{example.source} row {example.index}: {len(example)} tokens do not fit "
            f"seq_length {seq_length} (tokenize with max_length={seq_length})"
        )


def cu_seqlens_from_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """Where the sequences of packed positions start and end.

    Args:
        position_ids: int ``[T]`` (or ``[1, T]``), restarting at 0 for each sequence.

    Returns:
        int32 ``[n + 1]``: ``0, l_0, l_0 + l_1, ..., T`` for the ``n`` sequences.

    Raises:
        ValueError: ``position_ids`` is not one row, or does not start at 0.
    """
    positions = (
        position_ids.reshape(-1)
        if position_ids.dim() == 2 and position_ids.shape[0] == 1
        else position_ids
    )
    if positions.dim() != 1 or positions.numel() == 0 or int(positions[0]) != 0:
        raise ValueError(
            f"position_ids must be one row starting at 0, got shape {tuple(position_ids.shape)}"
        )
    starts = torch.nonzero(positions == 0).reshape(-1)
    end = torch.tensor([positions.numel()], dtype=starts.dtype)
    return torch.cat([starts, end]).to(torch.int32)


def _fill(
    examples: Sequence[SFTExample], seq_length: int, pad_token_id: int, attention_mask: bool
) -> dict[str, torch.Tensor]:
    """One sample holding ``examples`` back to back, then padding."""
    tokens = np.full(seq_length, pad_token_id, dtype=np.int64)
    labels = np.full(seq_length, pad_token_id, dtype=np.int64)
    loss_mask = np.zeros(seq_length, dtype=np.float32)
    position_ids = np.zeros(seq_length, dtype=np.int64)
    segment = np.zeros(seq_length, dtype=np.int64)
    at = 0
    for number, example in enumerate(examples):
        n = len(example)
        ids = example.input_ids
        tokens[at : at + n] = ids
        labels[at : at + n - 1] = ids[1:]
        loss_mask[at : at + n - 1] = example.loss_mask[1:]
        position_ids[at : at + n] = np.arange(n)
        segment[at : at + n] = number
        at += n
    if at < seq_length:
        position_ids[at:] = np.arange(seq_length - at)
        segment[at:] = len(examples)
    sample = {
        "tokens": torch.from_numpy(tokens),
        "labels": torch.from_numpy(labels),
        "loss_mask": torch.from_numpy(loss_mask),
        "position_ids": torch.from_numpy(position_ids),
    }
    if attention_mask:
        blocked = np.triu(np.ones((seq_length, seq_length), dtype=bool), 1)
        blocked |= segment[:, None] != segment[None, :]
        sample["attention_mask"] = torch.from_numpy(blocked[None])
    return sample


class _RowSamples(torch.utils.data.Dataset):
    """What both datasets share: the examples, their loss tokens and digests, sample identities."""

    examples: Sequence[SFTExample]

    def _setup(
        self,
        examples: Sequence[SFTExample],
        seq_length: int,
        pad_token_id: int,
        create_attention_mask: bool,
    ) -> np.ndarray:
        lengths = _lengths(examples)
        _check(examples, lengths, seq_length)
        self.examples = examples if isinstance(examples, TokenizedRows) else list(examples)
        self.seq_length = seq_length
        self.pad_token_id = pad_token_id
        self.create_attention_mask = create_attention_mask
        self._digests: np.ndarray | None = None
        return lengths

    def _members(self, idx: int) -> list[int]:
        raise NotImplementedError

    def example_loss_tokens(self) -> np.ndarray:
        """int64 ``[len(examples)]``: each example's training targets (``loss_mask[1:].sum()``)."""
        if isinstance(self.examples, TokenizedRows):
            return self.examples.loss_tokens.astype(np.int64)
        return np.asarray([e.num_loss_tokens for e in self.examples], dtype=np.int64)

    def _example_digests(self) -> np.ndarray:
        if self._digests is None:
            if isinstance(self.examples, TokenizedRows):
                self._digests = np.asarray(self.examples.digests, dtype="<i8")
            else:
                self._digests = np.asarray(
                    [row_digest(e.input_ids, e.loss_mask) for e in self.examples], dtype="<i8"
                )
        return self._digests

    def _row_of(self, i: int) -> int:
        if isinstance(self.examples, TokenizedRows):
            return int(self.examples.row_indices[i])
        return self.examples[i].index

    def sample_identity(self, idx: int) -> dict[str, Any]:
        """Which rows sample ``idx`` holds and a digest of their tokens, without building it.

        Returns:
            ``{"rows": "r0 r1 ...", "tokens": hex}``: the rows' 0-based numbers in their
            file, in sample order, and 16 hex digits of a hash of their ids and loss
            masks (:func:`~epochal.data.sft.token_store.row_digest` of each), so the same
            row numbers with other contents have another identity.

        Raises:
            IndexError: ``idx`` out of range.
        """
        members = self._members(int(idx))
        digests = self._example_digests()[members]
        tokens = hashlib.blake2b(digests.astype("<i8").tobytes(), digest_size=8).hexdigest()
        return {"rows": " ".join(str(self._row_of(i)) for i in members), "tokens": tokens}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_digests"] = None  # recomputed (or mapped) where needed
        return state


class SFTDataset(_RowSamples):
    """One example a sample, right-padded to ``seq_length`` (see the module docstring).

    Args:
        examples: tokenized rows (a list of examples, an
            :class:`~epochal.data.sft.tokenize.SFTTokenized`, or the mapped
            :class:`~epochal.data.sft.token_store.TokenizedRows` of a file).
        seq_length: ``S``; every example must fit (``1 <= len <= S``).
        pad_token_id: the id of padding tokens and of the labels without target.
        create_attention_mask: add ``attention_mask`` ``[1, S, S]`` (True = masked).

    Raises:
        ValueError: ``seq_length < 2`` or an example longer than it (named).
    """

    def __init__(
        self,
        examples: Sequence[SFTExample],
        seq_length: int,
        *,
        pad_token_id: int = 0,
        create_attention_mask: bool = False,
    ) -> None:
        self._setup(examples, seq_length, pad_token_id, create_attention_mask)

    def __len__(self) -> int:
        return len(self.examples)

    def _members(self, idx: int) -> list[int]:
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} out of range for {len(self)} samples")
        return [idx]

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        """Sample ``idx``: the keys of the module docstring, ``[S]`` each."""
        return _fill(
            [self.examples[idx]], self.seq_length, self.pad_token_id, self.create_attention_mask
        )


class PackedSFTDataset(_RowSamples):
    """Examples packed into samples of ``seq_length`` tokens by :func:`best_fit_bins`.

    Args / Raises: as :class:`SFTDataset`.

    Attributes:
        bins: each sample's example indices, in packing order.
        report: the :class:`PackingReport`.
    """

    def __init__(
        self,
        examples: Sequence[SFTExample],
        seq_length: int,
        *,
        pad_token_id: int = 0,
        create_attention_mask: bool = False,
    ) -> None:
        lengths = self._setup(examples, seq_length, pad_token_id, create_attention_mask)
        self.bins = best_fit_bins(lengths.tolist(), seq_length)
        self.report = PackingReport(
            rows=len(self.examples),
            samples=len(self.bins),
            seq_length=seq_length,
            tokens=int(lengths.sum()),
        )

    def __len__(self) -> int:
        return len(self.bins)

    def _members(self, idx: int) -> list[int]:
        return self.bins[idx]

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        """Packed sample ``idx``: the keys of the module docstring."""
        rows = [self.examples[i] for i in self.bins[idx]]
        return _fill(rows, self.seq_length, self.pad_token_id, self.create_attention_mask)


def collate_packed(samples: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Samples of :class:`SFTDataset` / :class:`PackedSFTDataset` as one THD micro-batch.

    Args:
        samples: ``b`` samples of the same length ``S`` (an ``attention_mask`` is dropped:
            ``cu_seqlens`` says the same).

    Returns:
        ``tokens``, ``labels``, ``loss_mask``, ``position_ids`` ``[1, b*S]`` (samples
        back to back) and ``cu_seqlens`` int32 ``[N + 1]`` over all their sequences.

    Raises:
        ValueError: no samples, or samples of different lengths.
    """
    if not samples:
        raise ValueError("collate_packed needs at least one sample")
    length = samples[0]["tokens"].shape[0]
    if any(s["tokens"].shape[0] != length for s in samples):
        raise ValueError("collate_packed needs samples of one length")
    out = {
        key: torch.cat([s[key] for s in samples])[None]
        for key in ("tokens", "labels", "loss_mask", "position_ids")
    }
    out["cu_seqlens"] = cu_seqlens_from_positions(out["position_ids"][0])
    return out
