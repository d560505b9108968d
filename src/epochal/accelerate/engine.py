"""``MegatronEngine``: what ``prepare`` returns for the model (Accelerate's name).

In training mode ``model(**batch)`` runs one whole train step, as Accelerate's
Megatron-LM engine does: the batch (this data-parallel rank's share of the
global batch, as the prepared loader yields it) is split into micro-batches
(:class:`~epochal.accelerate.batches.BatchAdapter`), then forward, backward over
every micro-batch, gradient reduction, clipping, the optimizer and the
learning-rate schedule run (:meth:`~epochal.train.trainer.Trainer.train_step`).
The returned output's ``.loss`` is the step's loss averaged over the micro-batches
and data-parallel ranks (the same on every rank); ``accelerator.backward``,
``optimizer.step``, ``optimizer.zero_grad`` and ``lr_scheduler.step`` then do
nothing.

In evaluation mode (``model.eval()``) it returns the batch's evaluation loss,
averaged the same way, and with ``MegatronLMPlugin.return_logits`` the logits
``[rows, s, vocab]`` of this rank's samples (the transformers vocabulary, on ranks
holding the last pipeline stage; None on the others).

Outputs are transformers' output classes (``CausalLMOutputWithCrossAttentions``,
``MaskedLMOutput``, ``Seq2SeqLMOutput``): ``outputs.loss``, ``outputs["loss"]`` and
``outputs[0]`` all work.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from epochal.accelerate.batches import BatchAdapter
from epochal.accelerate.trainer import AccelerateTrainer

__all__ = ["EngineError", "MegatronEngine"]

_OUTPUTS = {
    "causal": "CausalLMOutputWithCrossAttentions",
    "megatron": "CausalLMOutputWithCrossAttentions",
    "masked": "MaskedLMOutput",
    "seq2seq": "Seq2SeqLMOutput",
}


class EngineError(RuntimeError):
    """The prepared model cannot run what was asked (the message says why)."""


def _output(family: str, **values: Any) -> Any:
    from transformers import modeling_outputs

    return getattr(modeling_outputs, _OUTPUTS[family])(**values)


class MegatronEngine(nn.Module):
    """The prepared model (see the module docstring).

    Args:
        trainer: the trainer holding the parallel model, optimizer and schedule.
        adapter: turns transformers batches into the step's micro-batches.
        return_logits: evaluation outputs carry the logits.
        on_step: called with the step's metrics after every train step (trackers).
    """

    def __init__(
        self,
        trainer: AccelerateTrainer,
        adapter: BatchAdapter,
        *,
        return_logits: bool = False,
        on_step: Any = None,
    ) -> None:
        super().__init__()
        self.module = nn.ModuleList(trainer.model_parts)
        self.trainer = trainer
        self.adapter = adapter
        self.return_logits = return_logits
        self.on_step = on_step
        #: the last train step's metrics: loss, grad_norm, lr, skipped and the step's logged values
        self.last_metrics: dict[str, Any] = {}
        #: the model has no weights yet (``init_empty_weights``): ``load_state`` must come first
        self.weights_pending = trainer.source.state is None
        #: ``other_megatron_args["vocab_file"]``: its ``<|endoftext|>`` ends ``megatron_generate``
        self.vocab_file: str | None = None

    @property
    def config(self) -> Any:
        """The transformers configuration of the prepared model."""
        return self.trainer.source.hf_config

    @property
    def iteration(self) -> int:
        """Optimizer steps taken (restored by ``load_state``)."""
        return self.trainer.step

    def forward(self, **batch: Any) -> Any:
        """One train step (training mode) or one evaluation batch (evaluation mode)."""
        if self.weights_pending:
            raise EngineError(
                "the model was built without weights (init_empty_weights): call "
                "accelerator.load_state(...) before running it"
            )
        if self.training:
            return self._train_step(batch)
        return self._eval_step(batch)

    def _train_step(self, batch: dict[str, Any]) -> Any:
        trainer = self.trainer
        micro_batches = self.adapter.split(batch)
        metrics = trainer.train_step(iter(micro_batches))
        trainer.step += 1
        samples = trainer.config.training.global_batch_size
        trainer.tokens_seen += samples * trainer.config.data.seq_length
        self.last_metrics = metrics
        if self.on_step is not None:
            self.on_step(trainer.step, metrics)
        loss = torch.tensor(float(metrics["loss"]), device=trainer.device)
        return _output(self.adapter.family, loss=loss)

    @torch.no_grad()
    def _eval_step(self, batch: dict[str, Any]) -> Any:
        trainer = self.trainer
        micro_batches = [trainer.step_batch(mb) for mb in self.adapter.split(batch)]
        kept: list[torch.Tensor] = []
        vocab = trainer.model_config.vocab_size

        def keep(mb: dict[str, torch.Tensor], logits: torch.Tensor) -> None:
            kept.append(logits[..., :vocab])

        loss = trainer.engine.eval_loss(
            micro_batches,
            num_microbatches=len(micro_batches),
            step=trainer.train_step_handler,
            on_logits=keep if self.return_logits else None,
        )
        trainer.engine.reduce_logged()  # every rank takes part in the logged values' reduction
        logits = None
        if self.return_logits and kept:
            length = self._length(batch)
            logits = torch.cat([x[:, :length] for x in kept])
        return _output(self.adapter.family, loss=loss.float(), logits=logits)

    def _length(self, batch: dict[str, Any]) -> int:
        if self.adapter.family == "megatron":
            return int(batch["tokens"].shape[1])
        if self.adapter.family == "seq2seq":
            labels = batch.get("decoder_input_ids", batch.get("labels"))
            return int(labels.shape[1])
        return int(batch["input_ids"].shape[1])

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: use :meth:`megatron_generate` or ``accelerator.unwrap_model(model).generate(...)``."""
        raise EngineError(
            "the prepared model trains; generate with model.megatron_generate(...) (as with "
            "Accelerate's Megatron-LM engine) or accelerator.unwrap_model(model).generate(...)"
        )

    def megatron_generate(self, inputs: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Accelerate's ``megatron_generate`` (:mod:`epochal.accelerate.generation`; a collective)."""
        from epochal.accelerate.generation import megatron_generate

        if self.weights_pending:
            raise EngineError(
                "the model was built without weights (init_empty_weights): call "
                "accelerator.load_state(...) before generating"
            )
        return megatron_generate(self, inputs, *args, **kwargs)
