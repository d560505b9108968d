"""A blend whose mix follows a :class:`~epochal.data.datasets.blend_schedule.BlendSchedule`.

:class:`ScheduledBlendedDataset` is a list of **revisions**, each covering the global
samples from its ``first_sample`` up to the next revision's:

- revision 0 of a constant schedule is Megatron-Core's greedy blend
  (:class:`~epochal.data.datasets.blended_dataset.BlendedDataset`'s indices, sample
  for sample), so a constant schedule reads exactly what a weighted ``data_path`` reads;
- any other revision is a lazy :class:`~epochal.data.datasets.blend_schedule.BlendSelector`
  started at ``first_sample`` that continues each source's count from ``base``, the
  samples the source served before it (the ledger at that point).

A fresh run has one revision. Resuming (:meth:`ScheduledBlendedDataset.resume`) reads
the checkpoint's revisions (:meth:`~ScheduledBlendedDataset.blend_state`): the same
schedule keeps them as they are, so the resumed run reads what the uninterrupted one
reads, on any number of processes; a schedule that changes only samples at or after
the resume point (the *future*) adds a revision there whose ``base`` is the ledger,
so every source continues where it stopped (nothing re-read or skipped); a schedule
that changes any earlier sample's shares (the *past*) is refused, naming the step.

Source ``s``'s ``j``-th sample is always ``datasets[s][j]``: each source is read in its
own (shuffled) order, without repeats until its epoch ends.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from epochal.data.datasets.blend_schedule import BlendSchedule, BlendSelector
from epochal.data.datasets.blended_dataset import (
    BlendedDataset,
    build_blending_indices,
    normalize_weights,
)
from epochal.data.epochs.epoch_index import EpochIndex

__all__ = [
    "BlendScheduleChangeError",
    "ScheduledBlendedDataset",
    "blend_ledger",
    "find_blend",
    "schedule_source_sizes",
]


class BlendScheduleChangeError(ValueError):
    """A resumed run's schedule changes samples its checkpoint already read."""


def _depth(k: int) -> int:
    return max(1, math.ceil(math.log2(k))) if k > 1 else 0


def schedule_source_sizes(schedule: BlendSchedule, size: int, surplus: float = 0.0) -> list[int]:
    """Samples to build per source so a run of ``size`` samples never runs one dry.

    (Sources built by the GPT builder grow by whole epochs instead, see
    :mod:`~epochal.data.datasets.source_epochs`.) The target ``T_s(size)`` rounded up, plus the selector's worst error (``depth``
    samples, doubled for a schedule changed at a resume), plus ``surplus`` as
    Megatron's ``mid_level_dataset_surplus``.
    """
    margin = 2 * _depth(schedule.sources) + 1
    return [
        int(math.ceil((math.ceil(t) + margin) * (1 + surplus))) for t in schedule.targets(int(size))
    ]


def _name(dataset: Any) -> str:
    return str(getattr(dataset, "name", None) or type(dataset).__name__)


class ScheduledBlendedDataset(Dataset):
    """``size`` samples of ``datasets`` mixed by ``schedule`` (see the module docstring).

    Args:
        datasets: the sources (each ``len``/``[]``, samples are dicts).
        schedule: the shares over global sample numbers, one per source.
        size: samples of the blend (a constant schedule: Megatron's size,
            ``sum(ceil(size * w))``, as :class:`BlendedDataset`).
        weights: with a constant schedule, the weights exactly as written (Megatron
            normalizes them in float64); default the schedule's first point.
        split / cache_dir / group: as :class:`BlendedDataset` (the Megatron revision's cache).
        past_weights: the weights a run without a schedule blended by (a weighted
            ``data_path``): a checkpoint without blend state resumed by this dataset
            had read Megatron's blend of these.

    Raises:
        ValueError: mismatched lengths, or a source too small for the schedule (named).
    """

    def __init__(
        self,
        datasets: Sequence[Any],
        schedule: BlendSchedule,
        size: int,
        *,
        weights: Sequence[float] | None = None,
        split: str = "train",
        cache_dir: Any = None,
        group: Any = None,
        past_weights: Sequence[float] | None = None,
    ) -> None:
        self.datasets = list(datasets)
        if len(self.datasets) != schedule.sources:
            raise ValueError(
                f"the blend schedule has {schedule.sources} weights per point but there are "
                f"{len(self.datasets)} sources"
            )
        self.schedule = schedule
        self.split = split
        self.past_weights = list(past_weights) if past_weights is not None else None
        self.k = len(self.datasets)
        self._megatron: BlendedDataset | None = None
        if schedule.is_constant():
            w = list(weights) if weights is not None else [float(x) for x in schedule.shares[0]]
            keep = [i for i, x in enumerate(w) if x > 0]
            # Megatron's blend over the sources with weight (a zero weight never wins)
            self._megatron = BlendedDataset(
                [self.datasets[i] for i in keep],
                [w[i] for i in keep],
                size,
                split=split,
                cache_dir=cache_dir,
                group=group,
            )
            self._megatron_ids = np.asarray(keep, dtype=np.int16)
            self.size = len(self._megatron)
            self._revisions: list[dict[str, Any]] = [
                {"first_sample": 0, "base": [0] * self.k, "megatron": w}
            ]
        else:
            self.size = int(size)
            self._revisions = [{"first_sample": 0, "base": [0] * self.k, "schedule": schedule}]
        self._setup()
        self._check_sizes()

    # ------------------------------------------------------------- revisions
    def _setup(self) -> None:
        """Selectors and Megatron indices of every revision (rebuilt after unpickling)."""
        self._firsts = [r["first_sample"] for r in self._revisions]
        self._selectors: list[Any] = []
        for j, rev in enumerate(self._revisions):
            if "schedule" in rev:
                self._selectors.append(BlendSelector(rev["schedule"], rev["first_sample"]))
                continue
            end = self._firsts[j + 1] if j + 1 < len(self._revisions) else None
            if end is None and self._megatron is not None:
                ids = self._megatron_ids[self._megatron.dataset_index]
                self._selectors.append((ids, self._megatron.dataset_sample_index))
            else:
                w = rev["megatron"]
                keep = [i for i, x in enumerate(w) if x > 0]
                shares = normalize_weights([w[i] for i in keep])
                index, sample = build_blending_indices(shares, int(end or 0))
                self._selectors.append((np.asarray(keep, dtype=np.int16)[index], sample))

    def _revision_of(self, n: int) -> int:
        return bisect.bisect_right(self._firsts, n) - 1

    def _check_sizes(self) -> None:
        """Grow sources that can (extra epochs) to what the blend reads; refuse the others."""
        needed = self.source_counts(self.size)
        for n_needed, dataset in zip(needed, self.datasets):
            if n_needed > len(dataset) and hasattr(dataset, "ensure"):
                dataset.ensure(n_needed)
        for s, (n_needed, dataset) in enumerate(zip(needed, self.datasets)):
            if n_needed > len(dataset):
                raise ValueError(
                    f"the {self.split} blend schedule needs {n_needed} samples from source {s} "
                    f"({_name(dataset)}) but it has only {len(dataset)}; build it with more samples"
                )

    def __len__(self) -> int:
        return self.size

    def _locate(self, idx: int | EpochIndex) -> tuple[int, int]:
        if isinstance(idx, EpochIndex):
            idx = idx.idx
        if isinstance(idx, bool) or not isinstance(idx, int | np.integer):
            raise TypeError(
                f"ScheduledBlendedDataset index must be an int, got {type(idx).__name__}"
            )
        n = int(idx) + (self.size if int(idx) < 0 else 0)
        if not 0 <= n < self.size:
            raise IndexError(f"sample {int(idx)} out of range for a blend of {self.size}")
        j = self._revision_of(n)
        rev, sel = self._revisions[j], self._selectors[j]
        if isinstance(sel, BlendSelector):
            source, count = sel.locate(n)
            return source, rev["base"][source] + count
        return int(sel[0][n]), int(sel[1][n])

    def __getitem__(self, idx: int | EpochIndex) -> dict[str, Any]:
        """``{"dataset_id": s, **datasets[s][j]}`` for blend sample ``idx``."""
        s, j = self._locate(idx)
        return {"dataset_id": s, **self.datasets[s][j]}

    def sample_identity(self, idx: int | EpochIndex) -> dict[str, Any]:
        """``{"corpus": s, **identity}`` as :meth:`BlendedDataset.sample_identity`."""
        s, j = self._locate(idx)
        inner = getattr(self.datasets[s], "sample_identity", None)
        return {"corpus": s, **(inner(j) if inner is not None else {"index": j})}

    def source_counts(self, n: int, start: int = 0) -> list[int]:
        """Samples each source serves among global samples ``start .. n - 1``.

        Costs ``O(n - start)`` where both ends lie in one revision built as Megatron's
        index (a step's ledger does not recount the run so far), ``O(depth * log #points)``
        with a lazy selector.
        """
        n, start = max(0, int(n)), max(0, int(start))
        if start < n:
            j = self._revision_of(n - 1)
            sel = self._selectors[j]
            if not isinstance(sel, BlendSelector) and start >= self._firsts[j]:
                return np.bincount(sel[0][start:n], minlength=self.k).tolist()
        return [a - b for a, b in zip(self._counts(n), self._counts(start))]

    def _counts(self, n: int) -> list[int]:
        n = max(0, int(n))
        if n == 0:
            return [0] * self.k
        j = self._revision_of(n - 1)
        rev, sel = self._revisions[j], self._selectors[j]
        if isinstance(sel, BlendSelector):
            local = sel.counts(n)
        else:
            local = np.bincount(sel[0][:n], minlength=self.k).tolist()
        return [b + c for b, c in zip(rev["base"], local)]

    # ----------------------------------------------------------------- state
    def blend_state(self) -> dict[str, Any]:
        """JSON for the checkpoint: the sources and every revision (see the module docstring)."""
        revisions = []
        for rev in self._revisions:
            entry: dict[str, Any] = {"first_sample": rev["first_sample"], "base": rev["base"]}
            if "schedule" in rev:
                entry["schedule"] = rev["schedule"].to_json()
            else:
                entry["megatron_weights"] = [float(w) for w in rev["megatron"]]
            revisions.append(entry)
        return {"sources": [_name(d) for d in self.datasets], "revisions": revisions}

    def resume(
        self,
        saved: dict[str, Any] | None,
        consumed: int,
        step_of: Callable[[int], int] | None = None,
    ) -> str | None:
        """Continue a checkpoint's blend at global sample ``consumed``.

        Args:
            saved: the checkpoint's :meth:`blend_state`, or None for a checkpoint of a
                run without a schedule (then ``past_weights`` were its blend).
            consumed: the global samples the checkpointed run consumed.
            step_of: maps a global sample number to the (1-based) step that reads it,
                for messages.

        Returns:
            A line saying the schedule changed from step ..., or None when it did not.

        Raises:
            BlendScheduleChangeError: the schedule changes the shares of a sample
                before ``consumed`` (the message names the first such step).
            ValueError: a malformed state, or another number of sources.
        """
        consumed = int(consumed)
        if saved is None:
            if self.past_weights is None:
                raise BlendScheduleChangeError(
                    "data.blend_schedule cannot continue this checkpoint: its run blended "
                    "data.data_path without weights (in proportion to the corpora's sizes); "
                    "resume without a schedule, or start the run with one"
                )
            past = [{"first_sample": 0, "base": [0] * self.k, "megatron": self.past_weights}]
        else:
            if len(saved.get("sources", [])) != self.k:
                raise ValueError(
                    f"the checkpoint's blend has {len(saved.get('sources', []))} sources, "
                    f"this run's has {self.k}"
                )
            past = []
            for entry in saved["revisions"]:
                rev: dict[str, Any] = {
                    "first_sample": int(entry["first_sample"]),
                    "base": [int(b) for b in entry["base"]],
                }
                if "schedule" in entry:
                    rev["schedule"] = BlendSchedule.from_json(entry["schedule"])
                else:
                    rev["megatron"] = [float(w) for w in entry["megatron_weights"]]
                past.append(rev)
        # the shares in force up to `consumed`: the checkpoint's last revision reaching it
        last = past[-1]
        old = last.get("schedule") or BlendSchedule([(0, last["megatron"])], "step")
        cut = max(consumed, last["first_sample"])
        first = old.first_difference(self.schedule, consumed)
        if first is not None:
            where = f"step {step_of(first)}" if step_of else f"global sample {first}"
            raise BlendScheduleChangeError(
                f"data.blend_schedule changes the past: the weights at {where} differ from the "
                f"checkpoint's, which this run already trained on (resumed after global sample "
                f"{consumed}); keep the schedule as it was up to there and change only later "
                "points (a ramp that spans the resume point needs a point at the resume step)"
            )
        note = None
        if old.first_difference(self.schedule, 1 << 62) is None:
            self._revisions = past  # the same blend: every revision continues as it was
        else:
            new = {"first_sample": cut, "base": [0] * self.k, "schedule": self.schedule}
            self._revisions = [r for r in past if r["first_sample"] < cut] + [new]
            self._megatron = None  # a Megatron revision 0 now ends at `cut`
            self._setup()
            new["base"] = self._counts(cut)  # the ledger: where every source stopped
            where = f"step {step_of(cut)}" if step_of else f"global sample {cut}"
            note = (
                f"data.blend_schedule changed from {where} on; every source continues "
                "where it stopped"
            )
        if len(self._revisions) > 1 or "megatron" not in self._revisions[0]:
            self._megatron = None
        self._setup()
        self._check_sizes()
        return note

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        # selectors are rebuilt (their caches do not pickle); Megatron indices travel as they are
        state["_selectors"] = [
            None if isinstance(sel, BlendSelector) else sel for sel in self._selectors
        ]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._selectors = [
            BlendSelector(rev["schedule"], rev["first_sample"]) if sel is None else sel
            for rev, sel in zip(self._revisions, self._selectors)
        ]

    def __repr__(self) -> str:
        return (
            f"ScheduledBlendedDataset(split={self.split}, datasets={self.k}, samples={self.size}, "
            f"revisions={len(self._revisions)})"
        )


def find_blend(dataset: Any) -> Any:
    """The blended dataset a train dataset is or wraps (through ``.dataset``), or None."""
    for _ in range(8):
        if isinstance(dataset, ScheduledBlendedDataset | BlendedDataset):
            return dataset
        dataset = getattr(dataset, "dataset", None)
        if dataset is None:
            return None
    return None


def blend_ledger(dataset: Any, n: int) -> list[dict[str, Any]]:
    """Per source of a blend after ``n`` global samples: samples served, epoch, next sample.

    ``epoch`` counts the source's epochs (its samples per epoch: its length over its
    ``num_epochs``); ``next_sample`` is the number (in the source's own order) of the
    next sample it serves.
    """
    counts = dataset.source_counts(n)
    out = []
    for s, (count, source) in enumerate(zip(counts, dataset.datasets)):
        count = int(count)
        if hasattr(source, "epoch_of"):
            epoch = source.epoch_of(count)
        else:
            epochs = int(getattr(source, "num_epochs", 1) or 1)
            epoch = count // max(1, len(source) // epochs)
        entry = {"source": s, "name": _name(source), "samples": count, "epoch": epoch}
        entry["next_sample"] = count
        identity = getattr(source, "sample_identity", None)
        if identity is not None and count < len(source):
            entry["next"] = identity(count)  # where the next one starts (documents, offsets)
        out.append(entry)
    return out
