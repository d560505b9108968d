"""Per-epoch evidence of multi-epoch data: did the sample order and the masks change every epoch?

For a train dataset that knows its epoch length (``samples_per_epoch``, with
``sample_span(idx)`` and ``earlier_occurrences(idx, before)``, as
:class:`~epochal.data.datasets.bert_dataset.BERTDataset`), epoch ``k`` (0-based)
starts at global sample ``k * samples_per_epoch`` (Megatron shuffles the rows of
all epochs together, so an epoch is a count of samples). The trainer then

- adds ``"epoch": consumed_samples / samples_per_epoch`` to every train record;
- at the step whose global batch holds an epoch's first sample, writes one
  ``{"kind": "epoch", "epoch": k, "step": n, "first_sample": i, ...}`` record
  (:meth:`EpochRecorder.record`) read from the dataset itself: the sentence spans of
  the epoch's first micro-batch (samples ``i .. i + micro_batch_size - 1``, all
  data-parallel ranks together), a digest of that order (``order``), a digest of their
  masked positions (``masks``), and for each of those samples every earlier sample
  drawn from the same sentences, with how many of them had the same masked positions
  (``repeats`` / ``same_masks``; for T5 the same spans, i.e. the same encoder input) and
  how many chance predicts (``chance_same_masks``: the sum over those earlier samples
  of the probability that a draw of the same size coincides, e.g. ``1 / C(n, k)`` for
  ``k`` of ``n`` maskable tokens; see ``_chance_same``).

A dataset of clusters (ESM-2's, :class:`~epochal.train.inputs.esm.PaddedProteinSamples`)
also has ``sample_member(idx) -> (member id, cluster size)``; its span is the cluster
and its records add ``unit = "cluster"``, a digest of the members drawn (``members``)
and, over the earlier samples of the same multi-member clusters, how many drew the
same member (``member_repeats`` / ``same_members``).

Everything is a pure function of the dataset and the epoch number, so a resumed run
writes the same records; :func:`epoch_summary` reads them back from
``metrics.jsonl`` (a record repeated by a resume counts once) and says in one line
whether the order and the masks differed in every epoch.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import numpy as np

__all__ = ["EpochRecorder", "above_chance", "epoch_recorder", "epoch_summary"]


def _digest(value: Any) -> str:
    """First 16 hex digits of the SHA-256 of ``value`` as compact JSON."""
    text = json.dumps(value, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _masked_positions(sample: dict[str, Any]) -> list[int]:
    """What the masking chose: BERT's masked positions; T5's encoder input (the spans' sentinels)."""
    if "text_enc" in sample:  # T5: loss_mask covers the decoder, not the masked positions
        keep = np.asarray(sample["enc_mask"]).astype(bool)
        return np.asarray(sample["text_enc"])[keep].tolist()
    return np.flatnonzero(np.asarray(sample["loss_mask"])).tolist()


def _original_and_masked(
    sample: dict[str, Any], sentinels: frozenset[int]
) -> tuple[list[int], set[int]]:
    """The sample's tokens before masking, and the positions that were masked."""
    if "text_enc" in sample:  # T5: each sentinel in the encoder stands for its decoder span
        enc = _masked_positions(sample)
        dec = np.asarray(sample["text_dec"])[np.asarray(sample["dec_mask"]).astype(bool)]
        spans: list[list[int]] = []
        for t in dec.tolist()[1:]:  # after [BOS]: <s0> a .. <s1> b ..
            if t in sentinels:
                spans.append([])
            elif spans:
                spans[-1].append(t)
        original, masked, queue = [], set(), iter(spans)
        for t in enc:
            if t in sentinels:
                for u in next(queue, []):
                    masked.add(len(original))
                    original.append(u)
            else:
                original.append(t)
        return original, masked
    length = int(np.asarray(sample["padding_mask"]).sum())  # BERT: [CLS] a [SEP] (b [SEP])
    loss = np.asarray(sample["loss_mask"])[:length].astype(bool)
    tokens = sample["text"] if "text" in sample else sample["tokens"]  # Megatron's / ESM's key
    original = np.where(loss, np.asarray(sample["labels"])[:length], np.asarray(tokens)[:length])
    return original.tolist(), set(np.flatnonzero(loss).tolist())


def _chance_same(sample: dict[str, Any], dataset: Any) -> float:
    """Probability that an independent draw of the same size masks the same tokens.

    Counted in the dataset's masking units (whole words with ``do_full_word``, as
    :func:`~epochal.data.datasets.masked_lm._candidates` groups them; single tokens
    without a WordPiece vocabulary): ``k`` of ``n`` units masked, in ``s`` runs.
    BERT: uniform over ``k``-subsets, ``1 / C(n, k)``; T5 (spans): uniform over the
    placements of ``s`` separated runs, ``1 / (C(n - k + 1, s) * C(k - 1, s - 1))``.
    Approximations (n-gram lengths are not uniform), right in order of magnitude.
    """
    from epochal.data.datasets.masked_lm import _candidates

    sentinels = frozenset(int(t) for t in getattr(dataset, "sentinels", ()))
    original, masked = _original_and_masked(sample, sentinels)
    vocab = getattr(dataset, "vocab", None)
    if hasattr(vocab, "is_continuation") and hasattr(vocab, "cls"):
        full_word = bool(getattr(getattr(dataset, "masking", None), "do_full_word", True))
        units = _candidates(original, vocab, full_word)
    else:
        units = [[i] for i in range(len(original))]
    flags = [any(p in masked for p in unit) for unit in units]
    n, k = len(flags), sum(flags)
    runs = sum(1 for i, f in enumerate(flags) if f and (i == 0 or not flags[i - 1]))
    if n == 0 or k == 0:
        return 1.0
    if "text_enc" in sample:
        return 1.0 / (math.comb(n - k + 1, runs) * math.comb(k - 1, runs - 1))
    return 1.0 / math.comb(n, k)


def above_chance(matched: int, expected: float) -> bool:
    """Whether ``matched`` coincidences are clearly more than the ``expected`` by chance.

    A Poisson-style bound: more than ``expected + 3 * sqrt(expected) + 1``.
    """
    return matched > expected + 3 * math.sqrt(expected) + 1


class EpochRecorder:
    """Epoch arithmetic and epoch-start records for one train dataset.

    Args:
        dataset: the (global, not data-parallel-sliced) train dataset; needs
            ``samples_per_epoch``, ``sample_span`` and ``earlier_occurrences``.
        micro_batch_size: samples per micro-batch (the fingerprint covers one).

    Raises:
        ValueError: ``samples_per_epoch`` is not positive.
    """

    def __init__(self, dataset: Any, micro_batch_size: int) -> None:
        self.dataset = dataset
        self.samples_per_epoch = int(dataset.samples_per_epoch)
        if self.samples_per_epoch <= 0:
            raise ValueError(f"samples_per_epoch must be > 0, got {self.samples_per_epoch}")
        self.micro_batch_size = int(micro_batch_size)
        self.has_members = hasattr(dataset, "sample_member")

    def epochs(self, consumed_samples: int) -> float:
        """Epochs of data consumed after ``consumed_samples`` samples (e.g. 2.5)."""
        return consumed_samples / self.samples_per_epoch

    def starts_between(self, before: int, after: int) -> range:
        """Epochs ``k`` whose first sample ``k * samples_per_epoch`` is in ``[before, after)``."""
        per = self.samples_per_epoch
        return range(-(-before // per), -(-after // per))

    def record(self, epoch: int, step: int) -> dict[str, Any]:
        """The ``kind = "epoch"`` record of epoch ``epoch`` (0-based), started at step ``step``."""
        first = epoch * self.samples_per_epoch
        ids = range(first, min(first + self.micro_batch_size, len(self.dataset)))
        spans = [list(self.dataset.sample_span(i)) for i in ids]
        masks = [_masked_positions(self.dataset[i]) for i in ids]
        repeats = same = 0
        chance = 0.0
        members = [self.dataset.sample_member(i) for i in ids] if self.has_members else []
        member_repeats = same_members = 0
        for k, (i, mine) in enumerate(zip(ids, masks, strict=True)):
            for j in self.dataset.earlier_occurrences(i, first).tolist():
                earlier = self.dataset[j]
                repeats += 1
                same += _masked_positions(earlier) == mine
                chance += _chance_same(earlier, self.dataset)
                if members and members[k][1] > 1:  # a cluster with a choice of members
                    member_repeats += 1
                    same_members += self.dataset.sample_member(j)[0] == members[k][0]
        extra: dict[str, Any] = {}
        if members:
            extra = {
                "unit": getattr(self.dataset, "evidence_unit", "sentence run"),
                "members": _digest([m for m, _ in members]),
                "member_repeats": member_repeats,
                "same_members": same_members,
            }
        return {
            "kind": "epoch",
            "epoch": epoch,
            "step": step,
            "first_sample": first,
            "samples_per_epoch": self.samples_per_epoch,
            "spans": spans,
            "order": _digest(spans),
            "masks": _digest(masks),
            "repeats": repeats,
            "same_masks": same,
            "chance_same_masks": round(chance, 4),
            **extra,
        }


def epoch_recorder(dataset: Any, micro_batch_size: int) -> EpochRecorder | None:
    """An :class:`EpochRecorder` for ``dataset``, or None when it has no epoch length."""
    needed = ("samples_per_epoch", "sample_span", "earlier_occurrences")
    if not all(hasattr(dataset, name) for name in needed):
        return None
    return EpochRecorder(dataset, micro_batch_size)


def epoch_summary(records: list[dict[str, Any]]) -> str | None:
    """One line on the epochs of a run, from its ``metrics.jsonl`` records; None without any.

    Epochs trained come from the last train record's ``epoch``. The order differed
    in epoch ``k`` when its first micro-batch's spans differ from those of every
    earlier epoch start. Masks are reported as repeated when an epoch start's masks
    equal the previous one's, or when the repeated sentence runs drew the same masks
    clearly more often than chance predicts (:func:`above_chance`); short samples
    (a few maskable tokens) match by chance, and the line then says how often
    against how often chance would.
    """
    starts: dict[int, dict[str, Any]] = {}
    last_train = None
    for r in records:  # later segments (a resume) replace earlier records of the same epoch / step
        if r.get("kind") == "epoch":
            starts[int(r["epoch"])] = r
        elif r.get("kind") == "train" and "epoch" in r:
            if last_train is None or r["step"] >= last_train["step"]:
                last_train = r
    if last_train is None or not starts:
        return None
    ordered = [starts[k] for k in sorted(starts)]
    per = ordered[0]["samples_per_epoch"]
    head = f"{last_train['epoch']:.2f} epochs of {per:,} samples"
    checked = ordered[1:]
    if not checked:
        return f"{head}; no epoch boundary crossed, nothing to compare"
    same_order, identical, matched_in = [], [], []
    seen_orders = {ordered[0]["order"]}
    prev_masks = ordered[0]["masks"]
    repeats = matched = member_repeats = other_members = 0
    expected = 0.0
    same_members = []
    for r in checked:
        if r["order"] in seen_orders:
            same_order.append(r["epoch"] + 1)
        if r["masks"] == prev_masks:
            identical.append(r["epoch"] + 1)
        if r["same_masks"]:
            matched_in.append(r["epoch"] + 1)
        seen_orders.add(r["order"])
        prev_masks = r["masks"]
        repeats += r["repeats"]
        matched += r["same_masks"]
        expected += r.get("chance_same_masks", 0.0)  # older records: no estimate
        if r.get("member_repeats"):
            member_repeats += r["member_repeats"]
            other_members += r["member_repeats"] - r["same_members"]
            if r["same_members"] == r["member_repeats"]:
                same_members.append(r["epoch"] + 1)
    unit = ordered[-1].get("unit", "sentence run")
    where = (
        f"checked at {len(checked)} epoch start{'s' if len(checked) != 1 else ''}, "
        f"{repeats} repeated {unit}{'s' if repeats != 1 else ''} compared"
    )
    if "members" in ordered[-1] and not member_repeats:
        where += "; every repeated cluster has one member"
    elif "members" in ordered[-1]:  # clusters: which member each repeat drew
        where += (
            f"; {other_members} of {member_repeats} repeats of multi-member clusters "
            "drew another member"
        )
        if same_members:
            where += f", none in epoch(s) {same_members}"
    estimated = all("chance_same_masks" in r for r in checked)  # older records: none
    suspicious = above_chance(matched, expected) if estimated else matched > 0
    flagged = sorted(set(identical) | (set(matched_in) if suspicious else set()))
    if not same_order and not flagged:
        if not matched:
            return f"{head}; sample order and masks differed in every epoch ({where})"
        return (
            f"{head}; sample order differed in every epoch; masks matched in {matched} of "
            f"{repeats} repeated {unit}s, as chance predicts for samples this short "
            f"(about {expected:.1f} expected) ({where})"
        )
    parts = []
    if same_order:
        parts.append(f"sample order repeated in epoch(s) {same_order}")
    if flagged:
        parts.append(
            f"masks repeated in epoch(s) {flagged}: {matched} of {repeats} repeated {unit}s "
            "drew the same masks, "
            + (f"about {expected:.1f} expected by chance" if estimated else "no chance estimate")
            + (f"; identical to the previous epoch's in {identical}" if identical else "")
        )
    return f"{head}; {'; '.join(parts)} ({where})"
