"""``MegatronEngine``: what ``prepare`` returns for the model (Accelerate's name).

In training mode ``model(**batch)`` runs one whole train step, as Accelerate's
Megatron-LM engine does: the batch (this data-parallel rank's share of the
global batch, as the prepared loader yields it) is split into micro-batches
(:class:`~epochal.accelerate.batches.BatchAdapter`), then forward, backward over
every micro-batch, gradient reduction, clipping (``MegatronLMPlugin.gradient_clipping``),
the optimizer and the learning-rate schedule run
(:meth:`~epochal.train.trainer.Trainer.train_step`). The returned output's ``.loss``
is the step's loss averaged over the micro-batches and data-parallel ranks (the same
on every rank); ``accelerator.backward``, ``optimizer.step``, ``optimizer.zero_grad``
and ``lr_scheduler.step`` then do nothing.

A plain Accelerate script (an ``Accelerator`` without a Megatron-LM plugin: none
given and no ``ACCELERATE_USE_MEGATRON_LM=true`` from the launcher) clips only when
it asks to, as under Accelerate: ``model(**batch)`` then computes the gradients
(forward, backward, reduction) and the update waits for the script:
``accelerator.clip_grad_norm_(parameters, max_norm)`` clips that step to
``max_norm`` and applies it, otherwise ``optimizer.step()`` applies it unclipped
(:meth:`MegatronEngine.complete_step`). Whatever comes first of those, the next
``model(**batch)``, an evaluation batch, ``save_state``, ``unwrap_model`` or
``end_training`` completes a waiting step.

In evaluation mode (``model.eval()``) it returns the batch's evaluation loss,
averaged the same way, and with ``MegatronLMPlugin.return_logits`` the logits
``[rows, s, vocab]`` of this rank's samples (the transformers vocabulary, on ranks
holding the last pipeline stage; None on the others).

A classifier (``*ForSequenceClassification`` / ``*ForTokenClassification``,
:mod:`epochal.accelerate.heads`) trains the same way, with transformers' loss for
its ``problem_type`` (:mod:`epochal.train.steps.classifier`); its evaluation always
returns the logits (``[rows, num_labels]`` / ``[rows, s, num_labels]``, on every
rank: the last pipeline stage sends them to the others) and the loss when the batch
has ``labels`` (``None`` without). Training needs ``labels``.

Outputs are transformers' output classes (``CausalLMOutputWithCrossAttentions``,
``MaskedLMOutput``, ``Seq2SeqLMOutput``, ``SequenceClassifierOutput``,
``TokenClassifierOutput``): ``outputs.loss``, ``outputs["loss"]`` and
``outputs[0]`` all work (``return_dict=False``: the tuple).

The model keywords transformers takes beside the batch:

- ``num_items_in_batch`` (causal language models, whose transformers loss uses it):
  the loss is the sum of the token cross-entropies divided by it, as transformers
  defines it; it counts the targets of the whole step (every micro-batch and every
  data-parallel rank: the global batch), so the step's loss and gradient are the
  global batch's token sum over it, the same on every rank. The returned
  ``.loss`` is that loss divided by the number of processes, each process's share
  as under DDP, where each rank's transformers loss is its rows' token sum over
  ``num_items_in_batch``: their sum over processes
  (``accelerator.gather(loss).sum()``) is the step's loss, and a script that
  multiplies the loss by ``num_processes`` (as Accelerate's
  ``gradient_accumulation_for_autoregressive_models.py`` does) prints the same
  numbers on every layout. (The processes' shares are equal here, not each rank's
  own rows' sum.) Masked and
  sequence-to-sequence models refuse it (their transformers loss is the token mean),
  and so does a custom train step or loss (it decides its own normalisation).
- ``use_cache`` / ``output_attentions`` / ``output_hidden_states`` false or None:
  nothing to do; true is refused (the prepared model returns no cache, attention
  probabilities or hidden states: run ``accelerator.unwrap_model(model)`` for them).
- ``return_dict``: False gives the output as a tuple.

Any other keyword, and any batch key the model family does not take
(:mod:`epochal.accelerate.batches`), raises an error naming it: nothing is dropped.
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
    "sequence": "SequenceClassifierOutput",
    "token": "TokenClassifierOutput",
}

#: the classification families (:mod:`epochal.accelerate.heads`)
_CLASSIFIERS = ("sequence", "token")


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
        deferred_update: a plain Accelerate loop (no Megatron-LM plugin): the update
            waits for :meth:`complete_step` (see the module docstring).
    """

    def __init__(
        self,
        trainer: AccelerateTrainer,
        adapter: BatchAdapter,
        *,
        return_logits: bool = False,
        on_step: Any = None,
        deferred_update: bool = False,
    ) -> None:
        super().__init__()
        self.module = nn.ModuleList(trainer.model_parts)
        self.trainer = trainer
        self.adapter = adapter
        self.return_logits = return_logits
        self.on_step = on_step
        self.deferred_update = deferred_update
        #: the loss and logged values of a step whose gradients wait for their update
        self._pending: tuple[torch.Tensor, dict[str, Any]] | None = None
        #: the last train step's metrics: loss, grad_norm, lr, skipped and the step's logged values
        self.last_metrics: dict[str, Any] = {}
        #: the model has no weights yet (``init_empty_weights``): ``load_state`` must come first
        self.weights_pending = trainer.source.state is None
        #: ``other_megatron_args["vocab_file"]``: its ``<|endoftext|>`` ends ``megatron_generate``
        self.vocab_file: str | None = None
        # the batches' own positions reach the model (GPT datasets' arange ones do not)
        trainer.keep_position_ids = adapter.family == "causal"

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
        batch, num_items, as_tuple = self._keywords(batch)
        has_labels = isinstance(batch.get("labels"), torch.Tensor)
        if self.adapter.family in _CLASSIFIERS:
            if self.training and not has_labels:
                raise EngineError(
                    f"{type(self.trainer.source.model).__name__} in training mode needs labels "
                    "in the batch (model(**batch) runs the train step); call model.eval() to "
                    "get logits without labels"
                )
            if has_labels and self.adapter.family == "sequence":
                kind = self.adapter.decide_problem_type(batch["labels"])
                self.trainer.train_step_handler.problem_type = kind
        micro_batches = self.adapter.split(batch)
        if not self.training:
            self.complete_step()
        out = (
            self._train_step(micro_batches, num_items)
            if self.training
            else self._eval_step(batch, micro_batches, has_labels, num_items)
        )
        return out.to_tuple() if as_tuple else out

    def _keywords(self, batch: dict[str, Any]) -> tuple[dict[str, Any], float | None, bool]:
        """The batch without transformers' model keywords; ``num_items_in_batch``; ``return_dict=False``."""
        batch = dict(batch)
        for key in ("use_cache", "output_attentions", "output_hidden_states"):
            value = batch.pop(key, None)
            if value is not None and bool(value):
                what = {
                    "use_cache": "a key/value cache",
                    "output_attentions": "attention probabilities",
                    "output_hidden_states": "hidden states",
                }[key]
                raise EngineError(
                    f"model(..., {key}=True): the prepared model returns no {what}; leave "
                    f"{key} out (or False), and run accelerator.unwrap_model(model)(..., "
                    f"{key}=True) on the trained transformers model for them"
                )
        as_tuple = batch.pop("return_dict", None) is False
        num_items = batch.pop("num_items_in_batch", None)
        if num_items is None:
            return batch, None, as_tuple
        if isinstance(num_items, torch.Tensor):
            if num_items.numel() != 1:
                raise EngineError(
                    f"num_items_in_batch must be one number, got a tensor of shape "
                    f"{tuple(num_items.shape)}"
                )
            num_items = num_items.item()
        if isinstance(num_items, bool) or not isinstance(num_items, int | float) or num_items <= 0:
            raise EngineError(f"num_items_in_batch must be a positive count, got {num_items!r}")
        family = self.adapter.family
        if family not in ("causal", "megatron"):
            raise EngineError(
                f"num_items_in_batch: {type(self.trainer.source.model).__name__} trains on the "
                "mean loss of each batch here (epochal honours num_items_in_batch for causal "
                "language models only); leave it out"
            )
        trainer = self.trainer
        custom = (trainer.step_class, trainer.custom_loss_func, trainer.custom_get_batch)
        if any(c is not None for c in custom):
            raise EngineError(
                "num_items_in_batch with MegatronLMPlugin's custom_train_step_class / "
                "custom_loss_function / custom_get_batch_function: the custom loss decides its "
                "own normalisation; leave num_items_in_batch out (or divide by it in the "
                "custom loss)"
            )
        return batch, float(num_items), as_tuple

    @property
    def update_pending(self) -> bool:
        """Gradients of a train step wait for their update (a plain loop, see the module docstring)."""
        return self._pending is not None

    def complete_step(self, max_norm: float | None = None) -> dict[str, Any] | None:
        """Apply the waiting update: clip (to ``max_norm``, default the plugin's
        ``gradient_clipping``), step the optimizer and the schedule.

        Returns:
            The step's metrics (``loss``, ``grad_norm``: the norm before clipping,
            ``lr``, ``skipped``, the logged values), or None when nothing waits.
        """
        if self._pending is None:
            return None
        loss, logged = self._pending
        self._pending = None
        trainer = self.trainer
        metrics = {**trainer.optimizer_step(loss, max_norm), **logged}
        trainer.step += 1
        samples = trainer.config.training.global_batch_size
        trainer.tokens_seen += samples * trainer.config.data.seq_length
        self.last_metrics = metrics
        if self.on_step is not None:
            self.on_step(trainer.step, metrics)
        return metrics

    def discard_step(self) -> None:
        """Forget a waiting update (``load_state`` replaces the whole run)."""
        self._pending = None

    def _train_step(
        self, micro_batches: list[dict[str, torch.Tensor]], num_items: float | None
    ) -> Any:
        """One train step; with ``num_items`` (``num_items_in_batch``) the step plan makes the
        loss the global batch's token sum divided by it (:mod:`epochal.parallel.step_plan`)."""
        trainer = self.trainer
        self.complete_step()  # the previous step's, if the script did not step the optimizer
        self._pending = trainer.compute_gradients(iter(micro_batches), loss_tokens=num_items)
        loss = torch.tensor(float(self._pending[0].item()), device=trainer.device)
        if not self.deferred_update:
            self.complete_step()
        if num_items is not None:
            # num_items_in_batch: each process returns its share of the step's loss, so
            # the sum over processes is the loss (what transformers' loss gives under DDP)
            loss = loss / trainer.dims.world_size
        return _output(self.adapter.family, loss=loss)

    @torch.no_grad()
    def _eval_step(
        self,
        batch: dict[str, Any],
        split: list[dict[str, torch.Tensor]],
        has_labels: bool = True,
        num_items: float | None = None,
    ) -> Any:
        trainer = self.trainer
        micro_batches = [trainer.step_batch(mb) for mb in split]
        kept: list[torch.Tensor] = []
        classifier = self.adapter.family in _CLASSIFIERS
        vocab = None if classifier else trainer.model_config.vocab_size

        def keep(mb: dict[str, torch.Tensor], logits: torch.Tensor) -> None:
            kept.append(logits if vocab is None else logits[..., :vocab])

        loss = trainer.engine.eval_loss(
            micro_batches,
            num_microbatches=len(micro_batches),
            step=trainer.train_step_handler,
            on_logits=keep if self.return_logits or classifier else None,
            loss_tokens=num_items,
        )
        trainer.engine.reduce_logged()  # every rank takes part in the logged values' reduction
        logits = None
        if classifier:
            logits = self._classifier_logits(batch, kept)
        elif self.return_logits and kept:
            length = self._length(batch)
            logits = torch.cat([x[:, :length] for x in kept])
        return _output(
            self.adapter.family, loss=loss.float() if has_labels else None, logits=logits
        )

    def _classifier_logits(self, batch: dict[str, Any], kept: list[torch.Tensor]) -> torch.Tensor:
        """A classifier's logits of this rank's rows, on every pipeline stage (a collective).

        ``[rows, num_labels]`` (sequence) or ``[rows, s, num_labels]`` (token, the batch's
        length): the last stage computed them and sends them to the other stages, so the
        script's metrics run on every rank, as with transformers.
        """
        trainer = self.trainer
        engine = trainer.engine
        rows = int(batch["input_ids"].shape[0])
        n = int(trainer.model_config.num_labels)
        length = int(batch["input_ids"].shape[1])
        shape = (rows, n) if self.adapter.family == "sequence" else (rows, length, n)
        if kept:
            logits = torch.cat(kept).float()
            if logits.dim() == 3:
                logits = logits[:, :length]
            logits = logits.to(trainer.device).contiguous()
        else:
            logits = torch.empty(shape, dtype=torch.float32, device=trainer.device)
        if engine.dims.pp > 1:
            import torch.distributed as dist

            dist.broadcast(logits, group=engine.pp_group, group_src=engine.dims.pp - 1)
        return logits

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
        self.complete_step()
        return megatron_generate(self, inputs, *args, **kwargs)
