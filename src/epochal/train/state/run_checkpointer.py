"""A run's checkpointer: what a checkpoint saves, where a run resumes from, what is loaded.

:class:`RunCheckpointer` is held by the trainer (``trainer.checkpointer``). It is
given the objects a checkpoint holds (model parts, optimizers, schedule, data, fp16
loss scaler) and the folder store that writes them
(:class:`~epochal.train.state.checkpoint.Checkpointer`); the trainer's counters
travel as a :class:`Progress` (saved from it, returned by a load).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from epochal.data.datasets.scheduled_blend import (
    BlendScheduleChangeError,
    ScheduledBlendedDataset,
    blend_ledger,
    find_blend,
)
from epochal.model.config import ConfigError, ModelConfig
from epochal.train.config import TrainConfig, to_toml
from epochal.train.inputs.loaders import DataBundle
from epochal.train.state import weight_digest
from epochal.train.state.checkpoint import Checkpointer, CheckpointError
from epochal.train.state.encoder_init import is_hf_folder, load_encoder_weights
from epochal.train.state.errors import refuse_other_model
from epochal.train.state.model_state import ModelState
from epochal.train.state.resume_notes import resume_notes
from epochal.train.state.rng import get_rng_state, set_rng_state
from epochal.train.state.run_dir import check_resume_config
from epochal.train.state.sample_check import checkpoint_digests, resume_sample_check

__all__ = ["Progress", "RunCheckpointer", "check_model_config", "find_checkpoint"]


@dataclass
class Progress:
    """The trainer's counters a checkpoint keeps.

    Attributes:
        step: optimizer steps done.
        tokens_seen: training tokens of those steps (``samples * data.seq_length``).
        eval_history: ``(step, validation loss)`` of every evaluation so far.
    """

    step: int = 0
    tokens_seen: int = 0
    eval_history: list[tuple[int, float]] = field(default_factory=list)


def find_checkpoint(path: str | Path, option: str) -> Path:
    """The checkpoint ``path`` names: a step folder, a checkpoints folder or a run dir.

    With ``option="init_from"`` a Hugging Face model folder is one too.

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


def check_model_config(
    model_config: ModelConfig, folder: str | Path, saved: dict[str, Any]
) -> None:
    """Refuse a checkpoint of another model than ``model_config``.

    Args:
        model_config: the resolved model of this run.
        folder: the checkpoint (named in the message).
        saved: its ``trainer_state.json`` (``model_config``: the model it holds).

    Raises:
        CheckpointError: naming the model type found and the one configured, or
            every option whose value differs.
    """
    recorded = saved.get("model_config")
    if not isinstance(recorded, dict):
        return  # older checkpoints: DCP's shape check still refuses a wrong model
    found = recorded.get("type", "gpt")  # a GPT config is written without "type"
    if found != model_config.type:
        raise CheckpointError(
            f"{folder} holds a {found!r} model, but the config says "
            f"model.type={model_config.type!r}; use a checkpoint of a "
            f"{model_config.type!r} model (or convert it)"
        )
    ours = model_config.resolved_dict()
    try:  # derived options resolved on both sides: one model, two spellings, agree
        theirs = ModelConfig.from_dict(recorded).resolved_dict()
    except (ValueError, TypeError):  # a config this version cannot build: as written
        theirs = recorded
    refuse_other_model(folder, ours, theirs, prefix="model.")


class RunCheckpointer:
    """Saves a run's checkpoints, resumes from one, or initialises the weights from one.

    Args:
        store: the folder store checkpoints are written to and read from (``.store``;
            it may be swapped for a while with :meth:`using`).
        config: the resolved configuration (``checkpoint.*``, the batch and sequence
            sizes recorded, the saved ``config.toml``).
        model_config: the resolved model (recorded, and compared with a checkpoint's).
        model_parts: this rank's model parts.
        optimizer_state: the optimizers as a DCP ``Stateful`` (FQN-keyed state dicts).
        scheduler: the learning-rate / weight-decay schedule (``state_dict()``).
        data: the run's data (the train loader's position, the sampler, a blend).
        loss_scaler: the fp16 loss scaler, or None.
        log: print what a resume changes or finds (a blend schedule note, a sample
            check warning, the resume notes, the encoder initialisation).
        rank: this process's global rank (blend and encoder notes only on rank 0).
    """

    #: after a resume: whether the data names the samples the checkpoint recorded (a line)
    sample_check: str | None = None

    def __init__(
        self,
        store: Checkpointer,
        *,
        config: TrainConfig,
        model_config: ModelConfig,
        model_parts: Sequence[nn.Module],
        optimizer_state: Any,
        scheduler: Any,
        data: DataBundle,
        loss_scaler: Any = None,
        log: bool = True,
        rank: int = 0,
    ) -> None:
        self.store = store
        self.config = config
        self.model_config = model_config
        self.model_parts = list(model_parts)
        self.optimizer_state = optimizer_state
        self.scheduler = scheduler
        self.data = data
        self.loss_scaler = loss_scaler
        self.log = log
        self.rank = rank

    @contextlib.contextmanager
    def using(self, store: Checkpointer) -> Iterator[None]:
        """Save to and load from ``store`` inside the block (then the run's own store again)."""
        previous, self.store = self.store, store
        try:
            yield
        finally:
            self.store = previous

    # ------------------------------------------------------------------ saving
    def app_state(self) -> dict[str, Any]:
        """The DCP state: model parts and optimizers (``Stateful``)."""
        return {"model": ModelState(self.model_parts), "optimizer": self.optimizer_state}

    def trainer_state(self, progress: Progress) -> dict[str, Any]:
        """JSON bookkeeping saved with each checkpoint of a run at ``progress``."""
        return {
            "format": 1,
            "step": progress.step,
            "consumed_train_samples": self.data.train_loader.consumed_samples,
            "tokens_seen": progress.tokens_seen,
            "scheduler": self.scheduler.state_dict(),
            "data": self.data.train_loader.state_dict(),
            "global_batch_size": self.config.training.global_batch_size,
            "seq_length": self.config.data.seq_length,
            "eval_history": progress.eval_history,
            # The resolved model (vocab size included), so converters and
            # `epochal generate` rebuild it without re-deriving the data.
            "model_config": self.model_config.to_dict(),
            **(
                {"loss_scaler": self.loss_scaler.state_dict()}
                if self.loss_scaler is not None
                else {}
            ),
            **self._sample_digests(progress.step),
            **self._blend_state(),
            # the weights after the step, whatever the layout (`epochal replay` reads it)
            weight_digest.KEY: weight_digest.weight_digest(self.model_parts),
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

    def _sample_digests(self, step: int) -> dict[str, Any]:
        """The digests of the last and next steps' samples (:mod:`~epochal.train.state.sample_check`)."""
        loader = self.data.train_loader
        calculator = self.data.sampler.calculator
        return checkpoint_digests(loader.dataset, calculator, step, loader.consumed_samples)

    def due(self, step: int, last: bool) -> bool:
        """Whether to save after ``step``: every ``checkpoint.save_interval`` steps, and after
        the last one with ``checkpoint.save_final``."""
        c = self.config.checkpoint
        si = c.save_interval
        return bool((si and step % si == 0) or (last and c.save_final))

    def save(self, progress: Progress) -> Path:
        """Save the run at ``progress``; returns the step folder (see :class:`Checkpointer`)."""
        return self.store.save(
            progress.step,
            self.app_state(),
            trainer_state=self.trainer_state(progress),
            rng_state=get_rng_state(),
            config_toml=to_toml(self.config),
        )

    # ---------------------------------------------------------------- resuming
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
            if self.store.latest() is not None:
                raise ConfigError(
                    "checkpoint.resume",
                    f"is 'never' but {self.store.directory} already has checkpoints; "
                    "use another run_dir or resume='auto'",
                )
            return None
        if mode == "auto":
            return self.store.newest_intact()
        return find_checkpoint(mode, "resume")

    def resume(self, folder: Path) -> Progress | None:
        """Resume from ``folder``: check the configuration against the run's, load it
        (:meth:`load`), and print the notes (changed options, schedule, profile).

        Returns:
            The counters loaded (None for a model-only checkpoint: they start fresh).

        Raises:
            ConfigError: (``checkpoint.resume``) an option that defines the run differs.
            CheckpointError: see :meth:`load`.
        """
        changed = check_resume_config(folder, self.config, self.store)  # before loading
        progress = self.load(folder)
        notes = resume_notes(self.store.read_trainer_state(folder), self.config)
        if changed:
            notes.insert(0, f"resuming with changed options: {'; '.join(changed)}")
        for note in notes if self.log else []:
            print(note, flush=True)
        return progress

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

    def init_from(self, folder: str | Path) -> None:
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
        check_model_config(self.model_config, folder, self.store.read_trainer_state(folder))
        self.store.load_tensors(folder, {"model": self.app_state()["model"]})

    def load(self, folder: str | Path) -> Progress | None:
        """Restore everything from ``folder`` (model, optimizer, scheduler, data position, RNG).

        A model-only checkpoint (``"model_only": true``, as written by ``epochal
        convert``) only initializes the weights (see :meth:`init_from`).

        Returns:
            The counters the checkpoint recorded (None for a model-only checkpoint).

        Raises:
            CheckpointError: a damaged checkpoint, one of another model, or a
                malformed ``trainer_state.json``.
        """
        saved = self.store.read_trainer_state(folder)
        if saved.get("model_only"):
            self.init_from(folder)
            return None
        check_model_config(self.model_config, folder, saved)
        state, rng = self.store.load(folder, self.app_state())
        try:
            step = int(state["step"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.data.train_loader.load_state_dict(state["data"])
            tokens = int(state.get("tokens_seen", 0))
            history = [(int(s), float(v)) for s, v in state.get("eval_history", [])]
            progress = Progress(step, tokens, history)
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
        return progress
