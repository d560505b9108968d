"""A run's evaluator: when it evaluates, the callbacks on validation logits, the last values.

:class:`Evaluator` is held by the trainer (``trainer.evaluator``). The forward
passes over the validation data depend on the layout (one process, or the parallel
engine's schedules), so the trainer hands it that pass as a function
(:data:`ValidationPass`); the evaluator merges the evaluation callbacks into the
observer the pass calls, and turns what the pass returns into the evaluation's loss
and logged values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from epochal.parallel.logged import reduce_logged
from epochal.parallel.step_model import LogitsObserver, merge_observers

__all__ = ["Evaluator", "ValidationPass"]

#: ``run(observer) -> (mean loss or None, logged values per micro-batch or group)``, or
#: None when there is nothing to evaluate (no validation data, ``training.eval_iters=0``);
#: ``observer(micro_batch, logits)`` is called on every validation micro-batch's logits
ValidationPass = Callable[
    [LogitsObserver | None], tuple[float | None, list[dict[str, float]]] | None
]


class Evaluator:
    """Runs a run's evaluations (see the module docstring).

    Args:
        run_pass: the layout's forward passes over the validation data (:data:`ValidationPass`).
        training: the ``[training]`` section (read when asked: ``eval_interval``, evaluate
            every this many steps, 0: never on an interval; ``eval_iters``, 0: never).
        callbacks: the first evaluation callbacks (``training.eval_callback``).
    """

    def __init__(
        self,
        run_pass: ValidationPass,
        *,
        training: Any,
        callbacks: Sequence[LogitsObserver] = (),
    ) -> None:
        self.run_pass = run_pass
        self.training = training
        self.callbacks: list[LogitsObserver] = list(callbacks)
        #: the last evaluation's logged values (with the callbacks' and the step's summary)
        self.last_logged: dict[str, float] = {}

    def add_callback(self, fn: LogitsObserver) -> None:
        """Call ``fn(batch, logits)`` for every validation micro-batch (after the earlier ones).

        ``batch`` is the micro-batch on the device (``tokens``, ``labels``,
        ``loss_mask``, ...), ``logits`` its whole output logits ``[b, s, V]`` (padded
        vocabulary; T5: the decoder's), on the ranks holding the last pipeline
        stage. A ``{name: number}`` it returns is averaged over the micro-batches and
        data-parallel ranks and logged with the evaluation (``<name>`` in the ``"eval"``
        records of ``metrics.jsonl``); None logs nothing.
        """
        self.callbacks.append(fn)

    def observer(self, extra: LogitsObserver | None = None) -> LogitsObserver | None:
        """The evaluation callbacks (and ``extra``) as one observer; None when there are none."""
        return merge_observers([*self.callbacks, *([extra] if extra is not None else [])])

    def due(self, step: int, last: bool) -> bool:
        """Whether to evaluate after ``step``: every ``training.eval_interval`` steps, and
        after the last one when ``training.eval_iters > 0``."""
        ei = self.training.eval_interval
        return bool((ei and step % ei == 0) or (last and self.training.eval_iters > 0))

    def evaluate(self, train_step: Any, on_logits: LogitsObserver | None = None) -> float | None:
        """One evaluation: the validation loss (None without validation data).

        Args:
            train_step: the run's :class:`~epochal.train.steps.TrainStep` (its
                ``eval_summary`` adds to the logged values; its ``evaluation_loss``
                may replace the mean loss).
            on_logits: one more observer of this evaluation's logits (after the callbacks).

        The logged values, averaged over the micro-batches, are left in :attr:`last_logged`.
        """
        ran = self.run_pass(self.observer(on_logits))
        if ran is None:
            return None
        mean, logged = ran
        self.last_logged = train_step.eval_summary(reduce_logged(logged))
        return train_step.evaluation_loss(mean, self.last_logged) if mean is not None else None
