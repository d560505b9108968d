"""Micro-batch calculators: how many micro-batches a training step takes, from consumed samples.

Semantics follow Megatron-Core's ``megatron/core/num_microbatches_calculator.py``
(same formulas, same values for every input; peer-tested against it), with three
differences, each so that a wrong configuration fails at construction instead of
mid-run:

* no process-global calculator: build one object and pass it around;
* every invalid configuration raises :class:`MicroBatchConfigError` (a
  ``ValueError``) naming the option, instead of an ``assert``;
* with ramp-up, every intermediate global batch size must be divisible by
  ``micro_batch_size * data_parallel_size`` unless ``decrease_batch_size_if_needed``
  is set (Megatron only checks this when ``update(..., consistency_check=True)`` is
  called; NeMo calls it with ``False`` and then silently trains on fewer samples
  than it counts as consumed).

The calculators are pure functions of ``consumed_samples`` (``*_at`` methods and
:meth:`NumMicroBatchesCalculator.consumed_samples_after`), plus the stateful
Megatron interface (``update`` / ``get`` / ``get_current_global_batch_size`` ...)
so they can stand in for Megatron-Core's objects.

Units: batch sizes and ``consumed_samples`` are numbers of samples (not tokens);
``consumed_samples`` counts every sample of every data-parallel rank.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = [
    "ConstantNumMicroBatchesCalculator",
    "MicroBatchConfigError",
    "NumMicroBatchesCalculator",
    "RampupBatchsizeNumMicroBatchesCalculator",
    "build_num_microbatches_calculator",
]


class MicroBatchConfigError(ValueError):
    """An invalid batch-size configuration (the message names the option and the allowed values)."""


def check_int(
    value: Any, name: str, minimum: int, error: type[ValueError] = MicroBatchConfigError
) -> int:
    """Return ``value`` as an ``int >= minimum``, or raise ``error`` naming ``name``.

    Shared by the batch-size, sampler and data-sampler options: ``bool`` and
    non-integral values are refused like out-of-range ones.
    """
    if isinstance(value, bool):
        raise error(f"{name} must be an integer >= {minimum}, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise error(
            f"{name} must be an integer >= {minimum}, got {type(value).__name__} {value!r}"
        ) from None
    if value < minimum:
        raise error(f"{name} must be an integer >= {minimum}, got {value}")
    return value


class NumMicroBatchesCalculator(ABC):
    """Common interface of the calculators.

    Attributes:
        global_batch_size: the global batch size after any ramp-up (samples per step,
            all data-parallel ranks together).
        micro_batch_size: samples per micro-batch on one data-parallel rank.
        data_parallel_size: number of data-parallel ranks.
        decrease_batch_size_if_needed: if true, a global batch size that is not a
            multiple of ``micro_batch_size * data_parallel_size`` is rounded down (the
            "running" global batch size) instead of being an error.
    """

    global_batch_size: int
    micro_batch_size: int
    data_parallel_size: int
    decrease_batch_size_if_needed: bool

    def __init__(
        self,
        global_batch_size: int,
        micro_batch_size: int,
        data_parallel_size: int,
        decrease_batch_size_if_needed: bool = False,
    ) -> None:
        self.global_batch_size = check_int(global_batch_size, "global_batch_size", 1)
        self.micro_batch_size = check_int(micro_batch_size, "micro_batch_size", 1)
        self.data_parallel_size = check_int(data_parallel_size, "data_parallel_size", 1)
        self.decrease_batch_size_if_needed = bool(decrease_batch_size_if_needed)
        # Megatron-compatible mutable view (``update`` / ``get``), starting at 0 consumed samples.
        self._consumed_samples = 0

    # ------------------------------------------------------------------ pure API
    @property
    def micro_batch_times_data_parallel_size(self) -> int:
        """Samples in one micro-batch of every data-parallel rank together (a "micro-block")."""
        return self.micro_batch_size * self.data_parallel_size

    @abstractmethod
    def global_batch_size_at(self, consumed_samples: int) -> int:
        """The configured global batch size of the step that starts at ``consumed_samples``."""

    def in_rampup(self, consumed_samples: int) -> bool:
        """Whether the batch size may still change after ``consumed_samples`` (false once constant)."""
        return False

    def running_global_batch_size_at(self, consumed_samples: int) -> int:
        """The global batch size actually trained at ``consumed_samples``.

        Equal to :meth:`global_batch_size_at` unless ``decrease_batch_size_if_needed``
        rounded it down to a multiple of ``micro_batch_size * data_parallel_size``.
        This is the number of samples the step consumes.
        """
        gbs = self.global_batch_size_at(consumed_samples)
        block = self.micro_batch_times_data_parallel_size
        if gbs % block == 0:
            return gbs
        # Unreachable without decrease_batch_size_if_needed: constructors reject such configs.
        return (gbs // block) * block

    def num_microbatches_at(self, consumed_samples: int) -> int:
        """Micro-batches per data-parallel rank in the step that starts at ``consumed_samples``."""
        return (
            self.running_global_batch_size_at(consumed_samples)
            // self.micro_batch_times_data_parallel_size
        )

    def consumed_samples_after(self, steps: int, start: int = 0) -> int:
        """Consumed samples after ``steps`` more steps that begin at ``start`` consumed samples.

        Exact under ramp-up: every step adds the running global batch size of the
        position where it starts.

        Args:
            steps: number of optimizer steps, ``>= 0``.
            start: consumed samples before the first of those steps, ``>= 0``.

        Returns:
            ``start`` plus the samples of the ``steps`` steps.
        """
        steps = check_int(steps, "steps", 0)
        consumed = check_int(start, "start", 0)
        # Walk step by step while the batch size can still change (ramp-up lasts at most
        # rampup_samples / start_global_batch_size + 1 steps); then it is constant.
        while steps and self.in_rampup(consumed):
            consumed += self.running_global_batch_size_at(consumed)
            steps -= 1
        return consumed + steps * self.running_global_batch_size_at(consumed)

    def iter_global_batches(self, start: int = 0) -> Iterator[tuple[int, int]]:
        """Yield ``(first_sample, running_global_batch_size)`` of every step from ``start`` on.

        An endless generator; the first step starts at ``start``.
        """
        consumed = check_int(start, "start", 0)
        while True:
            size = self.running_global_batch_size_at(consumed)
            yield consumed, size
            consumed += size

    def complete_steps_within(self, start: int, end: int) -> tuple[int, int]:
        """Count the whole steps that fit between ``start`` and ``end`` consumed samples.

        Args:
            start: consumed samples where the first step begins.
            end: a limit (e.g. the number of samples in the dataset).

        Returns:
            ``(steps, consumed)``: the largest number of consecutive steps starting at
            ``start`` whose samples all lie before ``end``, and the consumed samples after
            them (``start`` if none fits).
        """
        consumed = check_int(start, "start", 0)
        end = check_int(end, "end", 0)
        steps = 0
        while self.in_rampup(consumed):
            size = self.running_global_batch_size_at(consumed)
            if consumed + size > end:
                return steps, consumed
            consumed += size
            steps += 1
        size = self.running_global_batch_size_at(consumed)
        more = max(0, (end - consumed) // size)
        return steps + more, consumed + more * size

    # ------------------------------------------------------- Megatron-compatible API
    def update(
        self, consumed_samples: int, consistency_check: bool = True, verbose: bool = False
    ) -> None:
        """Set the position used by :meth:`get` and friends (Megatron-Core's ``update``).

        ``consistency_check`` and ``verbose`` are accepted for compatibility; the
        consistency check is always done at construction.
        """
        self._consumed_samples = check_int(consumed_samples, "consumed_samples", 0)

    def get(self) -> int:
        """Number of micro-batches per data-parallel rank at the last :meth:`update` position."""
        return self.num_microbatches_at(self._consumed_samples)

    def get_current_global_batch_size(self) -> int:
        """Configured global batch size at the last :meth:`update` position."""
        return self.global_batch_size_at(self._consumed_samples)

    def get_current_running_global_batch_size(self) -> int:
        """Running (possibly rounded-down) global batch size at the last :meth:`update` position."""
        return self.running_global_batch_size_at(self._consumed_samples)

    def get_micro_batch_size(self) -> int:
        """The micro-batch size."""
        return self.micro_batch_size

    # Megatron-Core's public attributes (read-only here: they follow :meth:`update`)
    @property
    def num_micro_batches(self) -> int:
        """Megatron-Core's attribute: same as :meth:`get`."""
        return self.get()

    @property
    def current_global_batch_size(self) -> int:
        """Megatron-Core's attribute: same as :meth:`get_current_global_batch_size`."""
        return self.get_current_global_batch_size()

    @property
    def current_running_global_batch_size(self) -> int:
        """Megatron-Core's attribute: same as :meth:`get_current_running_global_batch_size`."""
        return self.get_current_running_global_batch_size()


class ConstantNumMicroBatchesCalculator(NumMicroBatchesCalculator):
    """A constant global batch size: ``global_batch_size // (micro_batch_size * data_parallel_size)``.

    Args:
        global_batch_size: samples per step, all data-parallel ranks together, ``>= 1``.
        micro_batch_size: samples per micro-batch per rank, ``>= 1``.
        data_parallel_size: number of data-parallel ranks, ``>= 1``.
        decrease_batch_size_if_needed: round ``global_batch_size`` down to a multiple of
            ``micro_batch_size * data_parallel_size`` instead of raising.

    Raises:
        MicroBatchConfigError: a non-positive size; ``global_batch_size`` not divisible by
            ``micro_batch_size * data_parallel_size`` (without
            ``decrease_batch_size_if_needed``); or fewer than one micro-batch per step.
    """

    def __init__(
        self,
        global_batch_size: int,
        micro_batch_size: int,
        data_parallel_size: int,
        decrease_batch_size_if_needed: bool = False,
    ) -> None:
        super().__init__(
            global_batch_size, micro_batch_size, data_parallel_size, decrease_batch_size_if_needed
        )
        block = self.micro_batch_times_data_parallel_size
        if self.global_batch_size % block and not self.decrease_batch_size_if_needed:
            raise MicroBatchConfigError(
                f"global_batch_size ({self.global_batch_size}) must be divisible by micro_batch_size "
                f"({self.micro_batch_size}) * data_parallel_size ({self.data_parallel_size}) = {block}"
                " (or set decrease_batch_size_if_needed=True)"
            )
        if self.global_batch_size < block:
            raise MicroBatchConfigError(
                f"global_batch_size ({self.global_batch_size}) must be at least micro_batch_size "
                f"({self.micro_batch_size}) * data_parallel_size ({self.data_parallel_size}) = {block}"
                " (at least one micro-batch per step)"
            )

    def global_batch_size_at(self, consumed_samples: int) -> int:
        """The constant global batch size (``consumed_samples`` is ignored)."""
        return self.global_batch_size

    def __repr__(self) -> str:
        return (
            f"ConstantNumMicroBatchesCalculator(global_batch_size={self.global_batch_size}, "
            f"micro_batch_size={self.micro_batch_size}, data_parallel_size={self.data_parallel_size}, "
            f"num_microbatches={self.num_microbatches_at(0)})"
        )


class RampupBatchsizeNumMicroBatchesCalculator(NumMicroBatchesCalculator):
    """Batch-size ramp-up: from ``start_global_batch_size`` to ``global_batch_size`` in equal increments.

    Megatron's formula: with ``n = (global_batch_size - start_global_batch_size) //
    batch_size_increment`` increments spread over ``rampup_samples`` samples, the global
    batch size at ``consumed_samples`` is ``global_batch_size`` once
    ``consumed_samples > rampup_samples``, otherwise ``start_global_batch_size +
    int(consumed_samples / (rampup_samples / n)) * batch_size_increment`` (floating-point
    division, exactly as Megatron-Core computes it). Where Megatron divides by zero
    (``n == 0`` or ``rampup_samples == 0``), the batch size is simply
    ``global_batch_size`` from the start.

    Args:
        global_batch_size: final global batch size, ``>= 1``.
        micro_batch_size: samples per micro-batch per rank, ``>= 1``.
        data_parallel_size: number of data-parallel ranks, ``>= 1``.
        start_global_batch_size: global batch size of the first step, ``1 <= start <=
            global_batch_size``.
        batch_size_increment: increase per ramp-up stage, ``>= 1``; must divide
            ``global_batch_size - start_global_batch_size``.
        rampup_samples: consumed samples over which the ramp-up happens, ``>= 0``.
        decrease_batch_size_if_needed: round every stage down to a multiple of
            ``micro_batch_size * data_parallel_size`` instead of raising.

    Raises:
        MicroBatchConfigError: any value out of range, an increment that does not divide
            the ramp, or (without ``decrease_batch_size_if_needed``) a stage that is not a
            multiple of ``micro_batch_size * data_parallel_size``.
    """

    def __init__(
        self,
        global_batch_size: int,
        micro_batch_size: int,
        data_parallel_size: int,
        start_global_batch_size: int,
        batch_size_increment: int,
        rampup_samples: int,
        decrease_batch_size_if_needed: bool = False,
    ) -> None:
        super().__init__(
            global_batch_size, micro_batch_size, data_parallel_size, decrease_batch_size_if_needed
        )
        self.start_global_batch_size = check_int(
            start_global_batch_size, "rampup_batch_size[0] (start)", 1
        )
        self.batch_size_increment = check_int(
            batch_size_increment, "rampup_batch_size[1] (increment)", 1
        )
        self.rampup_samples = check_int(rampup_samples, "rampup_batch_size[2] (ramp-up samples)", 0)
        diff = self.global_batch_size - self.start_global_batch_size
        if diff < 0:
            raise MicroBatchConfigError(
                f"rampup_batch_size[0] (start, {self.start_global_batch_size}) must be <= "
                f"global_batch_size ({self.global_batch_size})"
            )
        if diff % self.batch_size_increment:
            raise MicroBatchConfigError(
                f"global_batch_size - start ({self.global_batch_size} - {self.start_global_batch_size} = {diff})"
                f" must be divisible by rampup_batch_size[1] (increment, {self.batch_size_increment})"
            )
        self.num_increments = diff // self.batch_size_increment
        self._constant = self.num_increments == 0 or self.rampup_samples == 0
        self.rampup_samples_per_increment = (
            self.rampup_samples / self.num_increments if self.num_increments else float("inf")
        )
        block = self.micro_batch_times_data_parallel_size
        stages = [
            self.start_global_batch_size + k * self.batch_size_increment
            for k in range(self.num_increments + 1)
        ]
        if self._constant:
            stages = [self.global_batch_size]
        for stage in stages:
            if stage % block and not self.decrease_batch_size_if_needed:
                raise MicroBatchConfigError(
                    f"ramp-up global batch size {stage} (rampup_batch_size={self.rampup_batch_size}, "
                    f"global_batch_size={self.global_batch_size}) is not divisible by micro_batch_size "
                    f"({self.micro_batch_size}) * data_parallel_size ({self.data_parallel_size}) = {block};"
                    " choose start and increment as multiples of it (or set decrease_batch_size_if_needed=True)"
                )
            if stage < block:
                raise MicroBatchConfigError(
                    f"ramp-up global batch size {stage} is smaller than micro_batch_size "
                    f"({self.micro_batch_size}) * data_parallel_size ({self.data_parallel_size}) = {block}"
                    " (at least one micro-batch per step)"
                )

    @property
    def rampup_batch_size(self) -> list[int]:
        """``[start_global_batch_size, batch_size_increment, rampup_samples]`` as configured."""
        return [self.start_global_batch_size, self.batch_size_increment, self.rampup_samples]

    @property
    def ramup_samples(self) -> int:
        """Megatron-Core's spelling of :attr:`rampup_samples` (its attribute has the typo)."""
        return self.rampup_samples

    def global_batch_size_at(self, consumed_samples: int) -> int:
        """Megatron's ramp-up formula at ``consumed_samples`` (see the class docstring)."""
        if self._constant or consumed_samples > self.rampup_samples:
            return self.global_batch_size
        stage = int(consumed_samples / self.rampup_samples_per_increment)
        return min(
            self.start_global_batch_size + stage * self.batch_size_increment, self.global_batch_size
        )

    def in_rampup(self, consumed_samples: int) -> bool:
        """True while ``consumed_samples <= rampup_samples`` (the batch size may still grow)."""
        return not self._constant and consumed_samples <= self.rampup_samples

    def __repr__(self) -> str:
        return (
            f"RampupBatchsizeNumMicroBatchesCalculator(global_batch_size={self.global_batch_size}, "
            f"micro_batch_size={self.micro_batch_size}, data_parallel_size={self.data_parallel_size}, "
            f"rampup_batch_size={self.rampup_batch_size})"
        )


def build_num_microbatches_calculator(
    global_batch_size: int,
    micro_batch_size: int,
    data_parallel_size: int = 1,
    rampup_batch_size: Sequence[int] | None = None,
    decrease_batch_size_if_needed: bool = False,
) -> NumMicroBatchesCalculator:
    """Build the constant or ramp-up calculator (Megatron-Core's ``_build_num_microbatches_calculator``).

    Args:
        global_batch_size: final global batch size (samples per step, all ranks).
        micro_batch_size: samples per micro-batch per rank.
        data_parallel_size: number of data-parallel ranks.
        rampup_batch_size: ``None`` for a constant batch size, or ``[start, increment,
            rampup_samples]``.
        decrease_batch_size_if_needed: see :class:`NumMicroBatchesCalculator`.

    Returns:
        A :class:`ConstantNumMicroBatchesCalculator` or a
        :class:`RampupBatchsizeNumMicroBatchesCalculator`.

    Raises:
        MicroBatchConfigError: an invalid configuration, including a ``rampup_batch_size``
            that is not three integers.
    """
    if rampup_batch_size is None:
        return ConstantNumMicroBatchesCalculator(
            global_batch_size, micro_batch_size, data_parallel_size, decrease_batch_size_if_needed
        )
    if isinstance(rampup_batch_size, str | bytes) or len(rampup_batch_size) != 3:
        raise MicroBatchConfigError(
            "rampup_batch_size must be [start_global_batch_size, batch_size_increment, rampup_samples],"
            f" got {rampup_batch_size!r}"
        )
    start, increment, samples = rampup_batch_size
    return RampupBatchsizeNumMicroBatchesCalculator(
        global_batch_size,
        micro_batch_size,
        data_parallel_size,
        start,
        increment,
        samples,
        decrease_batch_size_if_needed,
    )
