"""The trainer's checkpoint seams: what is saved, where a run resumes from, what is loaded.

:class:`CheckpointSeams` is mixed into :class:`~epochal.train.trainer.Trainer` (and so
into the parallel trainer); it uses the trainer's ``model_parts``, ``optimizers``,
``scheduler``, ``data``, ``checkpointer``, ``loss_scaler``, ``model_config`` and ``step``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from epochal.data.datasets.scheduled_blend import (
    BlendScheduleChangeError,
    ScheduledBlendedDataset,
    blend_ledger,
    find_blend,
)
from epochal.model.config import ConfigError, ModelConfig
from epochal.train.config import to_toml
from epochal.train.state.checkpoint import Checkpointer, CheckpointError
from epochal.train.state.encoder_init import is_hf_folder, load_encoder_weights
from epochal.train.state.model_state import ModelState
from epochal.train.state.rng import get_rng_state, set_rng_state
from epochal.train.state.sample_check import checkpoint_digests, resume_sample_check

__all__ = ["CheckpointSeams"]


class CheckpointSeams:
    """Checkpoint methods of the trainer (see the module docstring)."""

    #: after a resume: whether the data names the samples the checkpoint recorded (a line)
    sample_check: str | None = None

    def app_state(self) -> dict[str, Any]:
        """The DCP state: model parts and optimizers (``Stateful``)."""
        return {"model": ModelState(self.model_parts), "optimizer": self.optimizers}

    def trainer_state(self) -> dict[str, Any]:
        """JSON bookkeeping saved with each checkpoint."""
        return {
            "format": 1,
            "step": self.step,
            "consumed_train_samples": self.data.train_loader.consumed_samples,
            "tokens_seen": self.tokens_seen,
            "scheduler": self.scheduler.state_dict(),
            "data": self.data.train_loader.state_dict(),
            "global_batch_size": self.config.training.global_batch_size,
            "seq_length": self.config.data.seq_length,
            "eval_history": self.eval_history,
            # The resolved model (vocab size included), so converters and
            # `epochal generate` rebuild it without re-deriving the data.
            "model_config": self.model_config.to_dict(),
            **(
                {"loss_scaler": self.loss_scaler.state_dict()}
                if self.loss_scaler is not None
                else {}
            ),
            **self._sample_digests(),
            **self._blend_state(),
        }

    def _blend_state(self) -> dict[str, Any]:
        """A blend's ledger (``"blend_ledger"``) and a scheduled blend's revisions (``"blend"``)."""
        loader = self.data.train_loader
        blend = find_blend(loader.dataset)
        if blend is None:
            return {}
        out: dict[str, Any] = {"blend_ledger": blend_ledger(blend, loader.consumed_samples)}
        if isinstance(blend, ScheduledBlendedDataset):
            out["blend"] = blend.blend_state()
        return out

    def resume_blend(self, saved: dict[str, Any]) -> int | None:
        """Continue the checkpoint's blend schedule (a changed future), or refuse a changed past.

        Returns:
            The global sample from which a changed schedule reads other samples, or None.

        Raises:
            ConfigError: (``data.blend_schedule``) the schedule changes a step the
                checkpoint already trained, or the run had a schedule and now has none.
        """
        loader = self.data.train_loader
        blend = find_blend(loader.dataset)
        recorded = saved.get("blend")
        if isinstance(blend, ScheduledBlendedDataset):
            from epochal.train.inputs.gpt import sample_to_step

            try:
                note = blend.resume(recorded, loader.consumed_samples, sample_to_step(self.config))
            except BlendScheduleChangeError as exc:
                raise ConfigError(
                    "data.blend_schedule", str(exc).removeprefix("data.blend_schedule ")
                ) from None
            if note is None:
                return None
            if self.log and self.rank == 0:
                print(note, flush=True)
            return loader.consumed_samples
        elif isinstance(recorded, dict) and any(
            "schedule" in r for r in recorded.get("revisions", [])
        ):
            raise ConfigError(
                "data.blend_schedule",
                "is not set, but the checkpoint's run followed one; keep its "
                "data.blend_schedule (changing only steps after the resume point)",
            )
        return None

    def _sample_digests(self) -> dict[str, Any]:
        """The digests of the last and next steps' samples (:mod:`~epochal.train.state.sample_check`)."""
        loader = self.data.train_loader
        calculator = self.data.sampler.calculator
        return checkpoint_digests(loader.dataset, calculator, self.step, loader.consumed_samples)

    def save_checkpoint(self) -> Path:
        """Save the current step (see :class:`~epochal.train.state.checkpoint.Checkpointer`)."""
        return self.checkpointer.save(
            self.step,
            self.app_state(),
            trainer_state=self.trainer_state(),
            rng_state=get_rng_state(),
            config_toml=to_toml(self.config),
        )

    def resume_folder(self) -> Path | None:
        """The checkpoint to resume from per ``checkpoint.resume``, or None to start fresh.

        ``"auto"`` takes the newest checkpoint whose checksums verify, skipping
        damaged ones with a warning (:meth:`Checkpointer.newest_intact`); an explicit
        path is verified when it is loaded, and a damaged one is an error.

        Raises:
            ConfigError: ``resume="never"`` with existing checkpoints, or a path that
                holds no checkpoint.
            CheckpointCorruptError: ``"auto"`` and every checkpoint is damaged.
        """
        mode = self.config.checkpoint.resume
        if mode == "never":
            if self.checkpointer.latest() is not None:
                raise ConfigError(
                    "checkpoint.resume",
                    f"is 'never' but {self.checkpointer.directory} already has checkpoints; "
                    "use another run_dir or resume='auto'",
                )
            return None
        if mode == "auto":
            return self.checkpointer.newest_intact()
        return self.find_checkpoint(mode, "resume")

    @staticmethod
    def find_checkpoint(path: str | Path, option: str) -> Path:
        """The checkpoint ``path`` names: a step folder, a checkpoints folder or a run dir.

        Raises:
            ConfigError: (naming ``checkpoint.<option>``) nothing there is a checkpoint.
        """
        path = Path(path)
        if (path / "trainer_state.json").is_file():
            return path
        if option == "init_from" and is_hf_folder(path):
            return path  # a Hugging Face encoder folder (load_encoder_weights)
        for candidate in (path, path / "checkpoints"):
            found = Checkpointer(candidate).latest() if candidate.is_dir() else None
            if found is not None:
                return found
        raise ConfigError(
            f"checkpoint.{option}",
            f"{path} is neither a checkpoint, a folder of checkpoints nor a run directory",
        )

    def check_model_config(self, folder: str | Path, saved: dict[str, Any]) -> None:
        """Refuse a checkpoint of another model (``trainer_state.json``'s ``model_config``).

        Raises:
            CheckpointError: naming every option whose value differs.
        """
        recorded = saved.get("model_config")
        if not isinstance(recorded, dict):
            return  # older checkpoints: DCP's shape check still refuses a wrong model
        found = recorded.get("type", "gpt")  # a GPT config is written without "type"
        if found != self.model_config.type:
            raise CheckpointError(
                f"{folder} holds a {found!r} model, but the config says "
                f"model.type={self.model_config.type!r}; use a checkpoint of a "
                f"{self.model_config.type!r} model (or convert it)"
            )
        ours = self.model_config.resolved_dict()
        try:  # derived options resolved on both sides: one model, two spellings, agree
            theirs = ModelConfig.from_dict(recorded).resolved_dict()
        except (ValueError, TypeError):  # a config this version cannot build: as written
            theirs = recorded
        diff = [
            f"model.{k}: checkpoint {theirs.get(k)!r} vs config {v!r}"
            for k, v in ours.items()
            if k in theirs and theirs[k] != v
        ]
        if diff:
            raise CheckpointError(f"{folder} holds another model: " + "; ".join(diff))

    def init_from_checkpoint(self, folder: str | Path) -> None:
        """Load only the model weights of ``folder``; optimizer, schedule, step and data start fresh.

        Megatron's ``--finetune``: used for ``checkpoint.init_from`` and for the
        model-only folders ``epochal convert --to epochal`` writes.

        A model with a fine-tuning head (``model.head``) loads the encoder of a
        pretrained run or Hugging Face folder instead, its head starting fresh
        (:func:`~epochal.train.state.encoder_init.load_encoder_weights`).

        Raises:
            CheckpointError: the folder is not a checkpoint of this model.
        """
        if self.model_config.head != "mlm" or is_hf_folder(folder):
            say = (lambda m: print(m, flush=True)) if self.log and self.rank == 0 else None
            load_encoder_weights(self.model_parts, self.model_config, folder, log=say)
            return
        self.check_model_config(folder, self.checkpointer.read_trainer_state(folder))
        self.checkpointer.load_tensors(folder, {"model": self.app_state()["model"]})

    def load_checkpoint(self, folder: str | Path) -> None:
        """Restore everything from ``folder`` (model, optimizer, scheduler, data position, RNG).

        A model-only checkpoint (``"model_only": true``, as written by ``epochal
        convert``) only initializes the weights (see :meth:`init_from_checkpoint`).
        """
        saved = self.checkpointer.read_trainer_state(folder)
        if saved.get("model_only"):
            self.init_from_checkpoint(folder)
            return
        self.check_model_config(folder, saved)
        state, rng = self.checkpointer.load(folder, self.app_state())
        try:
            self.step = int(state["step"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.data.train_loader.load_state_dict(state["data"])
            self.tokens_seen = int(state.get("tokens_seen", 0))
            self.eval_history = [(int(s), float(v)) for s, v in state.get("eval_history", [])]
            if self.loss_scaler is not None and "loss_scaler" in state:
                self.loss_scaler.load_state_dict(state["loss_scaler"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{folder}/trainer_state.json: malformed ({exc})") from exc
        set_rng_state(rng)
        changed_from = self.resume_blend(state)
        if changed_from is not None:  # the new schedule's samples are meant to differ
            state = {
                **state,
                "sample_digests": [
                    e
                    for e in state.get("sample_digests") or []
                    if int(e.get("first_sample", 0)) + int(e.get("samples", 0)) <= changed_from
                ],
            }
        self.sample_check = resume_sample_check(state, self.data.train_loader.dataset)
        if self.log and self.sample_check and self.sample_check.startswith("warning"):
            print(self.sample_check, flush=True)  # now, not only in the summary at the end
