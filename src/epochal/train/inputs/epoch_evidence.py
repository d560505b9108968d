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
  (``repeats`` / ``same_masks``).

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
from typing import Any

import numpy as np

__all__ = ["EpochRecorder", "epoch_recorder", "epoch_summary"]


def _digest(value: Any) -> str:
    """First 16 hex digits of the SHA-256 of ``value`` as compact JSON."""
    text = json.dumps(value, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _masked_positions(sample: dict[str, Any]) -> list[int]:
    return np.flatnonzero(np.asarray(sample["loss_mask"])).tolist()


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
        members = [self.dataset.sample_member(i) for i in ids] if self.has_members else []
        member_repeats = same_members = 0
        for k, (i, mine) in enumerate(zip(ids, masks, strict=True)):
            for j in self.dataset.earlier_occurrences(i, first).tolist():
                repeats += 1
                same += _masked_positions(self.dataset[j]) == mine
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
    earlier epoch start; the masks differed when the masked positions differ from
    the previous epoch start's and from every earlier sample of the same sentences.
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
    same_order, same_masks = [], []
    seen_orders = {ordered[0]["order"]}
    prev_masks = ordered[0]["masks"]
    repeats = member_repeats = other_members = 0
    same_members = []
    for r in checked:
        if r["order"] in seen_orders:
            same_order.append(r["epoch"] + 1)
        if r["masks"] == prev_masks or r["same_masks"]:
            same_masks.append(r["epoch"] + 1)
        seen_orders.add(r["order"])
        prev_masks = r["masks"]
        repeats += r["repeats"]
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
    if not same_order and not same_masks:
        return f"{head}; sample order and masks differed in every epoch ({where})"
    parts = []
    if same_order:
        parts.append(f"sample order repeated in epoch(s) {same_order}")
    if same_masks:
        parts.append(f"masks repeated in epoch(s) {same_masks}")
    return f"{head}; {'; '.join(parts)} ({where})"
