"""Megatron-Core's GPT *sample index*, built with numpy in cache-sized blocks.

Row ``k`` of the sample index is ``(position in the document index, token offset in
that document)`` where window ``k`` starts (window ``k`` begins at global token
``k * seq_length`` of the shuffled documents laid end to end). Megatron-Core computes it
with a compiled loop over the documents (helpers.cpp ``build_sample_idx``); here the
same rows come from a few vectorized passes over blocks of ``2**16`` documents, so that
every intermediate array stays in the CPU cache:

1. gather the block's document lengths (``numpy.take``; from a ``uint16`` copy of the
   length table when every length fits, which halves the memory the random reads touch);
2. ``e = c + cumsum(lengths)``, where the bias ``c`` carries the previous blocks' tokens;
3. ``q = e // seq_length`` (a shift for powers of two): ``q`` grows by one at every
   window start, so the documents holding window starts are where ``q`` changes
   (``flatnonzero``), repeated when one document holds several;
4. the offsets are ``k * seq_length - start`` of each such document, read from ``e``.

The block arithmetic runs in int32 whenever a block's token count fits, else int64.
The result equals ``helpers.build_sample_idx`` row for row (``tests/data`` checks it
against Megatron-Core and a port of its loop).
"""

from __future__ import annotations

import numpy as np

#: Documents per block: every block array (a few of them, 4 or 8 bytes per document)
#: stays in the L2 cache.
BLOCK = 1 << 16
_INT32_MAX = int(np.iinfo(np.int32).max)


def sample_index_dtype(document_index_size: int, max_document_length: int) -> type[np.integer]:
    """Return the integer dtype Megatron-Core picks for the sample index (int32 when it fits)."""
    if max(document_index_size, max_document_length) <= _INT32_MAX:
        return np.int32
    return np.int64


def count_samples(
    total_tokens: int,
    seq_length: int,
    drop_last_partial_sequence: bool,
    add_extra_token_to_sequence: bool,
) -> int:
    """Number of windows in ``total_tokens`` tokens, with Megatron's float32 rounding.

    When the last partial window is kept, helpers.cpp computes
    ``ceil(float(tokens - extra) / seq_length)`` in *single* precision; that
    rounding is reproduced here because it decides the sample count.
    """
    usable = total_tokens - int(add_extra_token_to_sequence)
    if drop_last_partial_sequence:
        return usable // seq_length
    return int(np.ceil(np.float32(usable) / np.float32(seq_length)))


def length_table(sequence_lengths: np.ndarray) -> tuple[np.ndarray, int]:
    """Return the lengths as the narrowest table that the gathers can read, and the maximum.

    Returns:
        ``(table, max_length)``: ``uint16 [N]`` when every length is in ``[0, 65535]``
        (half the bytes for the random reads), else the lengths themselves.
    """
    lengths = np.asarray(sequence_lengths)
    if lengths.size == 0:
        return lengths, 0
    high = int(lengths.max())
    if high <= np.iinfo(np.uint16).max and lengths.dtype.itemsize > 2 and int(lengths.min()) >= 0:
        return lengths.astype(np.uint16), high
    return lengths, high


class _Multiples:
    """``(r + 2) * seq_length - extra`` for ``r = 0, 1, ...`` (int64), grown on demand."""

    def __init__(self, seq_length: int, extra: int) -> None:
        self.seq_length, self.extra = seq_length, extra
        self.values = np.empty(0, dtype=np.int64)

    def first(self, count: int) -> np.ndarray:
        if self.values.shape[0] < count:
            size = max(count, 2 * self.values.shape[0], 1024)
            self.values = np.arange(2, size + 2, dtype=np.int64)
            self.values *= self.seq_length
            self.values -= self.extra
        return self.values[:count]


def sample_rows(
    out: np.ndarray,
    seq_length: int,
    extra: int,
    *,
    table: np.ndarray | None = None,
    document_index: np.ndarray | None = None,
    document_lengths: np.ndarray | None = None,
    max_length: int,
    block: int | None = None,
) -> int:
    """Fill rows ``1..`` of ``out`` with the window starts that the documents cover.

    The documents are given either as ``document_index`` (ids into ``table``, every id
    in range) or as their lengths in order, ``document_lengths``. Row ``k`` is
    ``(j, k * seq_length - start_j)`` for the first document ``j`` whose end is at least
    ``k * seq_length + extra`` (the one holding the window's last shared token). Rows are
    filled until ``out`` is full or the documents run out.

    Args:
        out: ``[rows, 2]`` int32 or int64 array; row 0 is written as ``(0, 0)``.
        seq_length: tokens per sample (>= 1).
        extra: 1 when windows hold ``seq_length + 1`` tokens, else 0.
        table: document lengths by id (with ``document_index``).
        document_index: int ``[D]`` document ids, each in ``[0, len(table))``.
        document_lengths: int ``[D]`` lengths in document-index order (instead of the two above).
        max_length: an upper bound of every length (sizes the block arithmetic).
        block: documents per block (default :data:`BLOCK`).

    Returns:
        The number of rows filled after row 0 (``rows - 1`` unless the documents ran out).
    """
    out[0] = 0
    count = out.shape[0] - 1
    if document_lengths is not None:
        num_docs = document_lengths.shape[0]
        source_dtype = np.dtype(np.int64)
    else:
        num_docs = document_index.shape[0]
        source_dtype = table.dtype
    if count == 0 or num_docs == 0:
        return 0
    s = seq_length
    block = BLOCK if block is None else block
    # int32 arithmetic while a block's tokens plus the bias (at most 2 * s - 1) fit
    fit = (_INT32_MAX - 2 * s) // max(max_length, 1)
    if fit >= min(block, 1024):
        work, size = np.int32, min(block, fit)
    else:
        work, size = np.int64, block
    if np.iinfo(source_dtype).max < 2 * s:
        source_dtype = np.dtype(work)
    size = min(size, num_docs)
    lengths = np.empty(size + 1, dtype=source_dtype)  # [c, lengths of the block]
    ends = np.empty(size + 1, dtype=work)
    windows = np.empty(size + 1, dtype=work)
    changed = np.empty(size, dtype=bool)
    ids = np.empty(size, dtype=np.intp) if document_lengths is None else None
    multiples = _Multiples(s, extra)
    shift = s.bit_length() - 1 if s & (s - 1) == 0 else -1
    k = 1  # next row to fill
    base = 0  # global token position where the block starts
    for b0 in range(0, num_docs, size):
        n = min(size, num_docs - b0)
        if document_lengths is None:
            np.copyto(ids[:n], document_index[b0 : b0 + n], casting="unsafe")
            np.take(table, ids[:n], out=lengths[1 : n + 1], mode="clip")  # ids checked by callers
        else:
            np.copyto(lengths[1 : n + 1], document_lengths[b0 : b0 + n], casting="unsafe")
        # Row k's window ends in the first document with end >= k * s + extra, i.e. with
        # relative end >= t = k * s + extra - base, where 1 <= t <= s + extra. With the bias
        # c = 2 * s - t, e[j] = c + (start of block document j) and q = e // s counts, minus
        # one, the rows of the documents before j (q[0] is 1, or 0 only at t = s + 1).
        t = k * s + extra - base
        bias = 2 * s - t
        lengths[0] = bias
        e = ends[: n + 1]
        np.cumsum(lengths[: n + 1], dtype=work, out=e)
        q = windows[: n + 1]
        if shift >= 0:
            np.right_shift(e, shift, out=q)
        else:
            np.floor_divide(e, s, out=q)
        if q[0] == 0:  # the very first window (t = s + 1): count rows from 1
            np.maximum(q, 1, out=q)
        rows = int(q[n]) - 1
        if rows:
            starts = np.flatnonzero(np.not_equal(q[1:], q[:-1], out=changed[:n]))
            if starts.shape[0] != rows:  # some documents hold several window starts
                starts = np.repeat(starts, q[starts + 1] - q[starts])
            rows = min(rows, count - k + 1)
            starts = starts[:rows]
            # (contiguous arithmetic, then one same-dtype copy into each strided column: numpy's
            # casting loops into a strided output are several times slower)
            column = starts.astype(out.dtype)
            column += b0
            out[k : k + rows, 0] = column
            # offset of row k + r: (k + r) * s - (base + start_j) = (r + 2) * s - extra - e[j]
            offsets = multiples.first(rows) - e[starts]
            out[k : k + rows, 1] = offsets.astype(out.dtype, copy=False)
            k += rows
            if k > count:
                break
        base += int(e[n]) - bias
    return k - 1


def build_sample_index(
    sequence_lengths: np.ndarray,
    document_index: np.ndarray,
    seq_length: int,
    num_epochs: int,
    num_tokens_per_epoch: int,
    drop_last_partial_sequence: bool = True,
    add_extra_token_to_sequence: bool = True,
    document_lengths: np.ndarray | None = None,
    *,
    table: tuple[np.ndarray, int] | None = None,
) -> np.ndarray:
    """Build the sample index equal to Megatron-Core's ``helpers.build_sample_idx``.

    Window ``k`` starts at global token position ``p = k * seq_length`` of the
    concatenated documents ``document_index[0], document_index[1], ...``. Its row is
    ``(j, p - start(j))`` where ``j`` is the document holding the window's last token
    ``p + extra - 1`` (zero-length documents are skipped). A window that runs past
    the last document (only when the partial last window is kept) ends at
    ``(last, length(last) - extra)``, as in the C++ loop.

    Args:
        sequence_lengths: int array ``[corpus documents]``, tokens per document.
        document_index: int array ``[D]`` of document ids (e.g. from
            :func:`~epochal.data.datasets.gpt_indices.build_document_index`).
        seq_length: tokens per sample.
        num_epochs: epochs in ``document_index``.
        num_tokens_per_epoch: tokens per epoch.
        drop_last_partial_sequence: drop (True) or keep (False, padded) a last partial window.
        add_extra_token_to_sequence: windows hold ``seq_length + 1`` tokens.
        document_lengths: ``sequence_lengths[document_index]`` when already known.
        table: :func:`length_table` of ``sequence_lengths`` when the caller has it (and
            has checked that every id of ``document_index`` is in range).

    Returns:
        ``[num_samples + 1, 2]`` array, int32 unless the sizes need int64.

    Raises:
        IndexError: a document id outside ``[0, len(sequence_lengths))``.
    """
    extra = int(add_extra_token_to_sequence)
    total_tokens = num_epochs * num_tokens_per_epoch
    num_samples = count_samples(total_tokens, seq_length, drop_last_partial_sequence, bool(extra))
    document_index = np.asarray(document_index)
    if table is None:
        lengths = np.asarray(sequence_lengths)
        if document_lengths is None and document_index.size:
            low, high = int(document_index.min()), int(document_index.max())
            if low < 0 or high >= lengths.shape[0]:
                raise IndexError(
                    f"document_index holds ids in [{low}, {high}], outside [0, {lengths.shape[0]})"
                )
        table = length_table(lengths)
    lengths_by_id, max_length = table
    num_docs = document_index.shape[0] if document_lengths is None else len(document_lengths)
    out = np.empty((num_samples + 1, 2), dtype=sample_index_dtype(num_docs, max_length))
    if document_lengths is not None:
        document_lengths = np.asarray(document_lengths)
        max_length = max(max_length, int(document_lengths.max()) if num_docs else 0)
        covered = sample_rows(
            out, seq_length, extra, document_lengths=document_lengths, max_length=max_length
        )
    else:
        covered = sample_rows(
            out,
            seq_length,
            extra,
            table=lengths_by_id,
            document_index=document_index,
            max_length=max_length,
        )
    if covered < num_samples:  # kept partial window(s) running past the last document
        if num_docs == 0:
            raise ValueError("the document index is empty: no sample can be built")
        last_id = int(document_index[-1]) if document_lengths is None else None
        last = int(lengths_by_id[last_id]) if last_id is not None else int(document_lengths[-1])
        out[covered + 1 :, 0] = num_docs - 1
        out[covered + 1 :, 1] = last - extra
    return out
