"""GPTDataset: fixed-length token windows cut from documents, sample for sample as Megatron-Core.

``GPTDataset(indexed, document_ids, num_samples, seq_length, seed)`` exposes the
documents ``document_ids`` of ``indexed`` (any object with Megatron's
``IndexedDataset`` interface: ``sequence_lengths`` and ``get(idx, offset, length)``)
as ``len(dataset) >= num_samples`` samples of ``seq_length`` tokens. Sample ``i`` is
the same token window as Megatron-Core's ``GPTDataset`` with the same files, seed,
sequence length and options (see :mod:`epochal.data.datasets.gpt_indices` for the indices).

Each sample is a dict of torch tensors with Megatron's keys:

- ``tokens``: int64 ``[seq_length]``, the input ids;
- ``labels``: int64 ``[seq_length]``, the next-token targets;
- ``loss_mask``: float32 ``[seq_length]``, 0 on padding (and on EOD tokens with
  ``eod_mask_loss``), else 1;
- ``position_ids``: int64 ``[seq_length]``, restarting after each EOD with
  ``reset_position_ids``;
- ``attention_mask``: bool ``[1, seq_length, seq_length]``, ``True`` where attention
  is *blocked* (Megatron's convention), only with ``create_attention_mask=True``
  (Megatron's default is True; ours is False because most attention kernels build
  the causal mask themselves and a dense mask costs ``seq_length**2`` bytes per sample).

Padding (only in a kept partial last window, or for ``dataset[None]``) uses
``pad_token_id``, Megatron's ``-1`` sentinel when ``None``; padded positions get
token 0, label 0 and loss mask 0, exactly as Megatron-Core.

Multi-epoch training: a Megatron-style ``GPTDataset`` already spans all epochs
(``num_samples`` larger than one epoch): the document order is reshuffled every
epoch, so the windows themselves differ between epochs, and sample ``i`` is a pure
function of the files, the seed and the arguments. It also accepts an
:class:`~epochal.data.epoch_index.EpochIndex`, so that a one-epoch ``GPTDataset``
(``num_samples=None``) can sit directly under
:class:`~epochal.data.multi_epoch.MultiEpochDatasetResampler`: the resampler then
reshuffles the *order* of the windows every epoch, while
``dataset[EpochIndex(e, i)]`` is the same window for every epoch ``e`` (GPT packing
has no per-sample randomness; the epoch is ignored).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from epochal.data.datasets.gpt_indices import (
    build_gpt_indices,
    document_lengths_of,
    document_range,
    tokens_in_documents,
)
from epochal.data.datasets.index_cache import cached_arrays, pickle_arrays, unpickle_arrays
from epochal.data.epochs.epoch_index import EpochIndex

#: Megatron-Core's pad sentinel, guaranteed not to be a real token id.
PAD_SENTINEL = -1

SPLIT_NAMES = ("train", "valid", "test")


def _as_int(value: Any, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def _ltor_numpy(
    tokens: np.ndarray,
    eod_token_id: int | None,
    reset_position_ids: bool,
    reset_attention_mask: bool,
    eod_mask_loss: bool,
    create_attention_mask: bool,
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    s = tokens.shape[0]
    loss_mask = np.ones(s, dtype=np.float32)
    position_ids = np.arange(s, dtype=np.int64)
    attention_mask = None
    uses_eod = eod_token_id is not None and (
        eod_mask_loss or reset_position_ids or (reset_attention_mask and create_attention_mask)
    )
    is_eod = tokens == eod_token_id if uses_eod else None
    if eod_mask_loss and is_eod is not None:
        loss_mask[is_eod] = 0.0
    if reset_position_ids and is_eod is not None:
        # a segment starts after each EOD: position = t - (index of the last EOD before t) - 1
        starts = np.zeros(s, dtype=np.int64)
        starts[1:] = np.where(is_eod[:-1], position_ids[1:], 0)
        position_ids = position_ids - np.maximum.accumulate(starts)
    if create_attention_mask:
        blocked = np.triu(np.ones((s, s), dtype=bool), 1)
        if reset_attention_mask and is_eod is not None:
            segment = np.zeros(s, dtype=np.int64)
            np.cumsum(is_eod[:-1], out=segment[1:])
            blocked |= segment[:, None] != segment[None, :]
        attention_mask = blocked[None]
    return attention_mask, loss_mask, position_ids


def ltor_masks_and_position_ids(
    tokens: torch.Tensor,
    eod_token_id: int | None,
    reset_position_ids: bool,
    reset_attention_mask: bool,
    eod_mask_loss: bool,
    create_attention_mask: bool,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Left-to-right masks and positions, equal to Megatron-Core's ``_get_ltor_masks_and_position_ids``.

    Args:
        tokens: int64 ``[s]`` input ids.
        eod_token_id: the end-of-document id (needed by the three EOD options).
        reset_position_ids: positions restart at 0 after each EOD token.
        reset_attention_mask: a token attends only to tokens after the last EOD before it.
        eod_mask_loss: loss mask 0 on EOD tokens.
        create_attention_mask: build the ``[1, s, s]`` mask at all.

    Returns:
        ``(attention_mask, loss_mask, position_ids)``: bool ``[1, s, s]`` (``True`` =
        blocked) or ``None``; float32 ``[s]``; int64 ``[s]``.
    """
    attention_mask, loss_mask, position_ids = _ltor_numpy(
        tokens.numpy(),
        eod_token_id,
        reset_position_ids,
        reset_attention_mask,
        eod_mask_loss,
        create_attention_mask,
    )
    return (
        None if attention_mask is None else torch.from_numpy(attention_mask),
        torch.from_numpy(loss_mask),
        torch.from_numpy(position_ids),
    )


def _pad_may_be_a_token(indexed_dataset: Any, pad_token_id: int) -> bool:
    """Whether a real token can equal ``pad_token_id`` (not when the token dtype cannot hold it)."""
    dtype = getattr(indexed_dataset, "dtype", None)
    try:
        info = np.iinfo(dtype)
    except (TypeError, ValueError):
        return True
    return info.min <= pad_token_id <= info.max


class GPTDataset(Dataset):
    """Megatron-Core's GPTDataset over any indexed dataset (duck-typed).

    Args:
        indexed_dataset: object with ``sequence_lengths`` (int array ``[N]``) and
            ``get(idx, offset=0, length=None) -> np.ndarray``; optionally ``path_prefix``
            (used in messages).
        document_ids: the document (sequence) ids to expose, e.g. one split's range;
            ``None`` = all ``N``.
        num_samples: samples wanted; the dataset covers enough epochs of the documents
            and its length is at least this. ``None`` = exactly one epoch.
        seq_length: tokens per sample (>= 1).
        seed: seed of the document and sample shuffles (``0 <= seed < 2**32``).
        split: ``"train"``, ``"valid"`` or ``"test"``, used in file names and messages.
        add_extra_token_to_sequence: windows of ``seq_length + 1`` tokens, so tokens and
            labels are both ``seq_length`` long (Megatron's default). With ``False`` the
            last label is padding.
        drop_last_partial_sequence: drop a final window that the documents cannot fill;
            ``False`` keeps it, padded (Megatron does that only for validation with
            ``drop_last_partial_validation_sequence=False``).
        reset_position_ids / reset_attention_mask / eod_mask_loss: Megatron's EOD options;
            each needs ``eod_token_id``.
        create_attention_mask: also return ``attention_mask`` (see the module docstring).
        eod_token_id: end-of-document token id.
        pad_token_id: padding id; ``None`` or an id equal to ``eod_token_id`` becomes
            Megatron's ``-1`` sentinel (with a warning for the collision).
        cache_dir: where the three indices are cached (see
            :mod:`epochal.data.datasets.index_cache`); ``None`` builds them in memory.
        group: ``torch.distributed`` group whose rank 0 builds the cache.

    Attributes:
        document_index, sample_index, shuffle_index: the three indices.
        num_samples_requested: ``num_samples`` as given.
        num_epochs: epochs the indices span.
        cache_info: ``cache_hit``, ``hash`` and file ``paths`` of the index cache.

    Raises:
        TypeError / ValueError: an invalid argument (the message names it); documents
            that hold no tokens (the message names the split and the corpus size).
        IndexError: a document id out of range.
    """

    def __init__(
        self,
        indexed_dataset: Any,
        document_ids: np.ndarray | None,
        num_samples: int | None,
        seq_length: int,
        seed: int,
        *,
        split: str = "train",
        add_extra_token_to_sequence: bool = True,
        drop_last_partial_sequence: bool = True,
        reset_position_ids: bool = False,
        reset_attention_mask: bool = False,
        eod_mask_loss: bool = False,
        create_attention_mask: bool = False,
        eod_token_id: int | None = None,
        pad_token_id: int | None = None,
        cache_dir: str | os.PathLike | None = None,
        group: Any = None,
    ) -> None:
        _check_interface(indexed_dataset)
        if split not in SPLIT_NAMES:
            raise ValueError(f"split must be one of {SPLIT_NAMES}, got {split!r}")
        self.seq_length = _as_int(seq_length, "seq_length", 1)
        self.seed = _as_int(seed, "seed", 0, 2**32 - 1)
        if num_samples is not None:
            num_samples = _as_int(num_samples, "num_samples", 0)
        eod_token_id, pad_token_id = _checked_token_ids(
            eod_token_id,
            pad_token_id,
            reset_position_ids=reset_position_ids,
            reset_attention_mask=reset_attention_mask,
            eod_mask_loss=eod_mask_loss,
        )
        self.dataset = indexed_dataset
        self.name = os.fspath(
            getattr(indexed_dataset, "path_prefix", None) or type(indexed_dataset).__name__
        )
        self.split = split
        self.add_extra_token_to_sequence = bool(add_extra_token_to_sequence)
        self.drop_last_partial_sequence = bool(drop_last_partial_sequence)
        self.reset_position_ids = bool(reset_position_ids)
        self.reset_attention_mask = bool(reset_attention_mask)
        self.eod_mask_loss = bool(eod_mask_loss)
        self.create_attention_mask = bool(create_attention_mask)
        self.eod_token_id = eod_token_id
        self.pad_token_id = pad_token_id
        self.num_samples_requested = num_samples
        self._set_read_path()
        lengths = np.asarray(indexed_dataset.sequence_lengths)
        self.documents = _checked_documents(self.name, split, lengths, document_ids)
        tokens = tokens_in_documents(lengths, self.documents)
        self._check_holds_a_sample(tokens, lengths.shape[0])
        self._load_indices(lengths, tokens, cache_dir, group)

    def _set_read_path(self) -> None:
        """Choose how samples are read: ``read_pieces`` (epochal's IndexedDataset copies a
        window's documents in one call) or ``get`` calls; the constant masks of a sample
        without EOD options."""
        self._reads_pieces = callable(getattr(self.dataset, "read_pieces", None))
        self._pad_may_be_a_token = _pad_may_be_a_token(self.dataset, self.pad_token_id)
        self._plain_masks = None
        if not (
            self.reset_position_ids
            or self.reset_attention_mask
            or self.eod_mask_loss
            or self.create_attention_mask
        ):
            self._plain_masks = (
                np.ones(self.seq_length, dtype=np.float32),
                np.arange(self.seq_length, dtype=np.int64),
            )

    def _check_holds_a_sample(self, tokens: int, corpus: int) -> None:
        """Refuse a split without tokens, or (one epoch, last window dropped) with fewer
        than one sample's; the message names the split, the corpus and ``seq_length``."""
        if tokens <= 0:
            raise ValueError(
                f"the {self.split} split of {self.name} holds no tokens: its "
                f"{self.documents.size} of {corpus} documents are all empty"
            )
        extra = int(self.add_extra_token_to_sequence)
        if (
            self.drop_last_partial_sequence
            and self.num_samples_requested is None
            and tokens - extra < self.seq_length
        ):
            raise ValueError(
                f"the {self.split} split of {self.name} holds {tokens} tokens, fewer than one "
                f"sample of seq_length={self.seq_length} (+{extra}); use a smaller seq_length "
                "or more documents"
            )

    def _load_indices(self, lengths: np.ndarray, tokens: int, cache_dir: Any, group: Any) -> None:
        """Build the document, sample and shuffle indices, or map them from the cache
        (keyed by what determines them); sets ``num_epochs``, ``cache_info`` and the length."""
        documents, num_samples = self.documents, self.num_samples_requested

        def identity() -> dict[str, Any]:
            bounds = document_range(documents)
            return {
                "documents": documents if bounds is None else {"range": list(bounds)},
                "document_lengths": document_lengths_of(lengths, documents),
                "max_corpus_length": int(lengths.max()),
                "num_samples": num_samples,
                "seq_length": self.seq_length,
                "seed": self.seed,
                "add_extra_token_to_sequence": self.add_extra_token_to_sequence,
                "drop_last_partial_sequence": self.drop_last_partial_sequence,
            }

        def build() -> dict[str, np.ndarray]:
            document_index, sample_index, shuffle_index = build_gpt_indices(
                lengths,
                documents,
                num_samples,
                self.seq_length,
                self.seed,
                self.add_extra_token_to_sequence,
                self.drop_last_partial_sequence,
                num_tokens_per_epoch=tokens,
            )
            return {
                "document_index": document_index,
                "sample_index": sample_index,
                "shuffle_index": shuffle_index,
            }

        arrays, self.cache_info = cached_arrays(
            cache_dir,
            type(self).__name__,
            self.split,
            identity,
            ("document_index", "sample_index", "shuffle_index"),
            build,
            group=group,
            note={"dataset": self.name, "corpus_documents": lengths.shape[0]},
        )
        self.document_index = arrays["document_index"]
        self.sample_index = arrays["sample_index"]
        self.shuffle_index = arrays["shuffle_index"]
        self.num_epochs = int(self.document_index.shape[0] // documents.size)
        self._length = int(self.sample_index.shape[0] - 1)

    def __len__(self) -> int:
        """Number of samples (>= ``num_samples`` when that was given)."""
        return self._length

    def _index(self, idx: Any) -> int:
        if isinstance(idx, EpochIndex):
            idx = idx.idx
        if isinstance(idx, bool) or not isinstance(idx, int | np.integer):
            raise TypeError(
                f"GPTDataset index must be an int, EpochIndex or None, got {type(idx).__name__}"
            )
        i = int(idx)
        if i < 0:
            i += self._length
        if not 0 <= i < self._length:
            raise IndexError(
                f"sample {int(idx)} out of range for GPTDataset of length {self._length}"
            )
        return i

    def window(self, idx: int) -> tuple[np.ndarray, np.ndarray]:
        """Return the raw token window of sample ``idx`` and the ids of its documents.

        Returns:
            ``(tokens, document_ids)``: int64 ``[seq_length + extra]`` (padded with
            ``pad_token_id``) and int64 ``[documents in the window]``.
        """
        tokens, doc_ids, _ = self._window(self._index(idx))
        return tokens, doc_ids.astype(np.int64)

    def _window(self, i: int) -> tuple[np.ndarray, np.ndarray, bool]:
        """Tokens of sample ``i`` (checked index), its document ids and whether it is padded."""
        i = int(self.shuffle_index[i])
        (beg_doc, beg_off), (end_doc, end_off) = self.sample_index[i : i + 2].tolist()
        extra = int(self.add_extra_token_to_sequence)
        doc_ids = self.document_index[beg_doc : end_doc + 1]
        target = self.seq_length + extra
        tokens = np.empty(target, dtype=np.int64)
        if self._reads_pieces:  # one slice copy per document into the sample
            filled = self.dataset.read_pieces(doc_ids, beg_off, end_off + extra, tokens)
        else:
            filled = self._read_parts(doc_ids.tolist(), beg_off, end_off + extra, tokens, i)
        if filled < target:
            tokens[filled:] = self.pad_token_id
        return tokens, doc_ids, filled < target

    def _read_parts(
        self, doc_ids: list[int], beg_off: int, end_stop: int, out: np.ndarray, i: int
    ) -> int:
        """The window through ``get(idx, offset, length)`` calls (any indexed dataset)."""
        get = self.dataset.get
        if len(doc_ids) == 1:
            parts = [get(doc_ids[0], offset=beg_off, length=end_stop - beg_off)]
        else:
            parts = [get(doc_ids[0], offset=beg_off)]
            parts.extend(get(d) for d in doc_ids[1:-1])
            parts.append(get(doc_ids[-1], offset=0, length=end_stop))
        filled = sum(len(part) for part in parts)
        if filled > out.shape[0]:
            raise ValueError(
                f"window {i} of {self.name} reads {filled} tokens, more than {out.shape[0]}"
            )
        out[:filled] = np.concatenate(parts, dtype=np.int64, casting="unsafe")
        return filled

    def sample_identity(self, idx: int | EpochIndex) -> dict[str, Any]:
        """Which tokens sample ``idx`` is made of, without reading them (index arrays only).

        Returns:
            ``{"dataset": name, "epoch": e, "window": w, "documents": [[doc, start, end], ...]}``:
            the file name of the corpus (its prefix without the folder), the epoch of
            the documents the window starts in, the window's number before the shuffle,
            and for each document it spans the token range ``[start, end)`` read from it
            (the ``seq_length + 1`` tokens of ``tokens`` and ``labels`` together).

        Raises:
            IndexError / TypeError: as ``dataset[idx]``.
        """
        i = int(self.shuffle_index[self._index(idx)])
        (beg_doc, beg_off), (end_doc, end_off) = self.sample_index[i : i + 2].tolist()
        doc_ids = self.document_index[beg_doc : end_doc + 1].tolist()
        lengths = self.dataset.sequence_lengths
        spans = [[d, 0, int(lengths[d])] for d in doc_ids]
        spans[0][1] = beg_off
        spans[-1][2] = end_off + int(self.add_extra_token_to_sequence)
        return {
            "dataset": os.path.basename(self.name),
            "epoch": beg_doc // self.documents.size,
            "window": i,
            "documents": spans,
        }

    def __getitem__(self, idx: int | EpochIndex | None) -> dict[str, torch.Tensor]:
        """Return sample ``idx`` (``None``: a padding sample with an all-zero loss mask).

        Raises:
            IndexError: ``idx`` out of range.
            TypeError: ``idx`` is not an int, ``EpochIndex`` or ``None``.
        """
        text, _, padded = self._window(self._index(0 if idx is None else idx))
        pad = self.pad_token_id
        if self.add_extra_token_to_sequence:
            tokens = text[:-1]  # a view: text is this sample's own array
            labels = text[1:].copy()
        else:
            tokens = text
            labels = np.empty_like(text)
            labels[:-1] = text[1:]
            labels[-1] = pad
            padded = True
        if self._plain_masks is not None:  # no EOD option, no mask: copies of fixed arrays
            attention_mask = None
            loss_mask, position_ids = (a.copy() for a in self._plain_masks)
        else:
            attention_mask, loss_mask, position_ids = _ltor_numpy(
                tokens,
                self.eod_token_id,
                self.reset_position_ids,
                self.reset_attention_mask,
                self.eod_mask_loss,
                self.create_attention_mask,
            )
        # padding (and, as in Megatron, any real token equal to the pad id) is masked and zeroed
        if padded or self._pad_may_be_a_token:
            label_is_pad = labels == pad
            if label_is_pad.any():
                loss_mask[label_is_pad] = 0.0
                labels[label_is_pad] = 0
            tokens[tokens == pad] = 0
        if idx is None:
            loss_mask[:] = 0.0
        sample = {
            "tokens": torch.from_numpy(tokens),
            "labels": torch.from_numpy(labels),
            "loss_mask": torch.from_numpy(loss_mask),
            "position_ids": torch.from_numpy(position_ids),
        }
        if attention_mask is not None:
            sample["attention_mask"] = torch.from_numpy(attention_mask)
        return sample

    _INDICES = ("document_index", "sample_index", "shuffle_index")

    def __getstate__(self) -> dict[str, Any]:
        """Pickle cached indices as their file names (workers map the files again)."""
        return pickle_arrays(self.__dict__, self._INDICES)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(unpickle_arrays(state, self._INDICES))

    def __repr__(self) -> str:
        return (
            f"GPTDataset({self.name!r}, split={self.split}, samples={self._length}, "
            f"seq_length={self.seq_length}, epochs={self.num_epochs}, seed={self.seed})"
        )


def _check_interface(indexed_dataset: Any) -> None:
    """Raise TypeError unless ``indexed_dataset`` has ``sequence_lengths`` and ``get``."""
    if not hasattr(indexed_dataset, "sequence_lengths") or not callable(
        getattr(indexed_dataset, "get", None)
    ):
        raise TypeError(
            "indexed_dataset must have Megatron's IndexedDataset interface "
            f"(sequence_lengths and get(idx, offset, length)), got {type(indexed_dataset).__name__}"
        )


def _checked_token_ids(
    eod_token_id: Any, pad_token_id: Any, **eod_options: bool
) -> tuple[int | None, int]:
    """``(eod_token_id, pad_token_id)`` checked: each EOD option needs ``eod_token_id``; a
    missing pad id, or one equal to the EOD id (with a warning), is the -1 sentinel.

    Raises:
        ValueError: an EOD option without ``eod_token_id``, or an id that is not an int.
    """
    for flag_name, flag in eod_options.items():
        if flag and eod_token_id is None:
            raise ValueError(f"{flag_name}=True needs eod_token_id")
    if eod_token_id is not None:
        eod_token_id = _as_int(eod_token_id, "eod_token_id")
    if pad_token_id is None:
        return eod_token_id, PAD_SENTINEL
    pad_token_id = _as_int(pad_token_id, "pad_token_id")
    if pad_token_id == eod_token_id:
        warnings.warn(
            f"pad_token_id {pad_token_id} equals eod_token_id; using the -1 pad sentinel "
            "instead so that real EOD tokens are not masked (as Megatron-Core does)",
            stacklevel=3,
        )
        return eod_token_id, PAD_SENTINEL
    return eod_token_id, pad_token_id


def _checked_documents(
    name: str, split: str, lengths: np.ndarray, document_ids: np.ndarray | None
) -> np.ndarray:
    """The split's document ids (all ``N`` for None), checked against the corpus.

    Raises:
        ValueError: ``lengths`` or ``document_ids`` is not a 1-D integer array, or the split
            is empty (named with the corpus size).
        IndexError: a document id outside ``[0, N)``.
    """
    if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(
            f"{name}: sequence_lengths must be a 1-D integer array, got {lengths.dtype}{lengths.shape}"
        )
    corpus = lengths.shape[0]
    if document_ids is None:
        documents = np.arange(corpus, dtype=np.int32)
    else:
        documents = np.asarray(document_ids)
        if documents.ndim != 1 or not np.issubdtype(documents.dtype, np.integer):
            raise ValueError(
                f"document_ids must be a 1-D integer array, got {documents.dtype}{documents.shape}"
            )
        if documents.size and (int(documents.min()) < 0 or int(documents.max()) >= corpus):
            raise IndexError(
                f"document_ids must lie in [0, {corpus}) for {name}, got "
                f"[{int(documents.min())}, {int(documents.max())}]"
            )
    if documents.size == 0:
        raise ValueError(
            f"the {split} split of {name} is empty: 0 of its {corpus} documents are "
            "assigned to it (check the split string and the corpus size)"
        )
    return documents
