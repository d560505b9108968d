"""The trainer's evaluation-callback seams: callbacks on validation logits, and the logits themselves.

:class:`EvalCallbackSeams` is mixed into :class:`~epochal.train.trainer.Trainer` (and so
into the parallel trainer); it uses the trainer's ``eval_callbacks`` list and its
``evaluate(on_logits=...)``.
"""

from __future__ import annotations

import torch

from epochal.parallel.step_model import LogitsObserver, merge_observers

__all__ = ["EvalCallbackSeams"]


class EvalCallbackSeams:
    """Evaluation-callback methods of the trainer (see the module docstring)."""

    eval_callbacks: list[LogitsObserver]

    def add_eval_callback(self, fn: LogitsObserver) -> None:
        """Call ``fn(batch, logits)`` for every validation micro-batch (after ``training.eval_callback``).

        ``batch`` is the micro-batch on the device (``tokens``, ``labels``,
        ``loss_mask``, ...), ``logits`` its whole output logits ``[b, s, V]`` (padded
        vocabulary; T5: the decoder's), on the ranks holding the last pipeline
        stage. A ``{name: number}`` it returns is averaged over the micro-batches and
        data-parallel ranks and logged with the evaluation (``<name>`` in the ``"eval"`` records of
        ``metrics.jsonl``); None logs nothing.
        """
        self.eval_callbacks.append(fn)

    def eval_observer(self, extra: LogitsObserver | None = None) -> LogitsObserver | None:
        """The evaluation callbacks (and ``extra``) as one observer; None when there are none."""
        return merge_observers([*self.eval_callbacks, *([extra] if extra is not None else [])])

    @torch.no_grad()
    def evaluate_logits(self) -> list[torch.Tensor] | None:
        """Run an evaluation and return its logits (Accelerate's ``return_logits``).

        Returns:
            this rank's validation micro-batches' logits, one float32 CPU tensor
            ``[micro_batch_size, s, V]`` per micro-batch in order, on ranks holding
            the last pipeline stage (None on the others). Under data parallelism
            each rank has its own samples: ``torch.cat([gather_across_data_parallel_groups(x)
            for x in logits])`` puts them in the order of a single-process run.
            The evaluation's loss and logged values are kept as by :meth:`evaluate`.
        """
        kept: list[torch.Tensor] = []
        self.evaluate(on_logits=lambda batch, logits: kept.append(logits.float().cpu()))
        return kept if self.holds_last_stage() else None

    def holds_last_stage(self) -> bool:
        """Whether this rank computes the model's output (always, in one process)."""
        return True
