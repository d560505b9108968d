"""Run metrics: a JSONL file (every step), TensorBoard (when installed), a tqdm progress bar.

``<run_dir>/metrics.jsonl`` has one JSON object per line, with a ``kind``:

- ``{"kind": "segment", "segment": k, "start_step": s, "resumed_from": path|None, "time": t}``:
  a process started (segment 0) or resumed (segment k > 0) training at step ``s``;
- ``{"kind": "train", "segment": k, "step": n, "loss": ..., "lr": ..., "grad_norm": ...,
  "consumed_samples": ..., "tokens": ..., "tokens_per_s": ..., "step_time_s": ...}``
  after optimizer step ``n`` (1-based; ``loss`` is the global-batch loss, Megatron's
  definition, as a Python float, exactly reproducible), and ``"sample_digest"``: 16 hex
  digits naming the step's global batch of samples (:mod:`epochal.train.observe.data_records`);
- ``{"kind": "eval", "segment": k, "step": n, "loss": ..., "ppl": ...}`` (``ppl``:
  the train step's perplexity: ``exp(loss)`` for GPT and T5, ``exp`` of the masked-LM
  loss alone for BERT / ESM, none for a fine-tuning head), then the step's values;
- for multi-epoch data (BERT), train records also hold ``"epoch"`` (epochs consumed,
  a float) and every epoch start has a ``{"kind": "epoch", ...}`` record written just
  before its step's (:mod:`epochal.train.inputs.epoch_evidence`).

The file is only appended to; after a crash and a resume the steps between the
last checkpoint and the crash appear twice, under two segments, which is what
``epochal plot`` overlays. :func:`read_metrics` skips a torn last line.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["MetricsLogger", "perplexity", "read_metrics"]

#: Logged evaluation values the printed line leaves out: the loss or the perplexity again.
_REPEATS_LOSS = frozenset({"lm loss", "ce loss", "mse loss", "mlm ppl", "lm ppl"})
#: per-block mixture-of-experts records: in metrics.jsonl, not on the evaluation line
_PER_LAYER = ("tokens_per_expert/", "load_balancing_loss/")


def perplexity(loss: float) -> float:
    """``exp(loss)`` of a mean cross-entropy in nats/token (``inf`` where it would overflow)."""
    return math.exp(loss) if loss < 700 else float("inf")


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All complete records of a ``metrics.jsonl`` (a torn or corrupt line is skipped).

    Raises:
        FileNotFoundError: the file does not exist (the message names it).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"metrics file {p} does not exist")
    return list(_records(p))


def _records(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "kind" in rec:
                yield rec


class MetricsLogger:
    """Writes the metrics of one training process.

    Args:
        run_dir: the run directory (``metrics.jsonl`` and ``tensorboard/`` go there).
        total_steps: the run's last step (for the progress bar and its ETA).
        start_step: the step training starts after (0, or the resumed step).
        resumed_from: the checkpoint folder resumed from, if any.
        progress: show a tqdm bar.
        tensorboard: write TensorBoard events if ``torch.utils.tensorboard`` works.
        log_interval: refresh the bar / TensorBoard every this many steps.
        enabled: False on ranks that must not write (all methods become no-ops).
        verbose: print messages (evaluation results, ...) to stdout.
        wandb: an open W&B sink (:func:`epochal.train.observe.wandb_logger.open_wandb`) that
            gets every train and evaluation record, or None.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        total_steps: int,
        start_step: int = 0,
        resumed_from: str | None = None,
        progress: bool = True,
        tensorboard: bool = True,
        log_interval: int = 10,
        enabled: bool = True,
        verbose: bool = True,
        wandb: Any = None,
    ) -> None:
        self.enabled = enabled
        self._wandb = wandb if enabled else None
        self.verbose = verbose
        self.log_interval = log_interval
        self.path = Path(run_dir) / "metrics.jsonl"
        self.segment = 0
        self._tb = None
        self._bar = None
        self._pending = 0
        self._starved: set[str] = set()  # experts already reported as starving
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            self.segment = 1 + max(
                (r.get("segment", 0) for r in read_metrics(self.path)), default=-1
            )
            self._terminate_torn_line()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._write(
            {
                "kind": "segment",
                "start_step": start_step,
                "resumed_from": resumed_from,
                "time": time.time(),
            }
        )
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(
                    log_dir=str(Path(run_dir) / "tensorboard"), purge_step=start_step + 1
                )
            except Exception:  # noqa: BLE001 - TensorBoard is optional
                self._tb = None
        if progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total_steps,
                initial=start_step,
                unit="step",
                dynamic_ncols=True,
                desc="train",
                leave=True,
            )

    def _terminate_torn_line(self) -> None:
        with open(self.path, "rb+") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")

    def _write(self, record: dict[str, Any]) -> None:
        record = {"kind": record.pop("kind"), "segment": self.segment, **record}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log_train(self, step: int, metrics: dict[str, Any]) -> None:
        """Record optimizer step ``step`` (``metrics`` must hold ``loss``; floats/ints only)."""
        if not self.enabled:
            return
        self._write({"kind": "train", "step": step, **metrics})
        self._warn_starving(step, metrics)
        if self._wandb is not None:
            self._wandb.log({f"train/{k}": v for k, v in metrics.items()}, step)
        self._pending += 1
        if step % self.log_interval == 0:
            if self._tb is not None:
                for key, value in metrics.items():
                    if isinstance(value, int | float) and math.isfinite(value):
                        self._tb.add_scalar(f"train/{key}", value, step)
            if self._bar is not None:
                self._bar.set_postfix(
                    loss=f"{metrics['loss']:.4f}",
                    tok_s=f"{metrics.get('tokens_per_s', 0.0):,.0f}",
                    lr=f"{metrics.get('lr', 0.0):.2e}",
                    refresh=False,
                )
        if self._bar is not None and (
            step % self.log_interval == 0 or self._pending >= self.log_interval
        ):
            self._bar.update(self._pending)
            self._pending = 0

    def log_record(self, record: dict[str, Any]) -> None:
        """Append another kind of record (``record["kind"]`` names it; JSON values only)."""
        if not self.enabled:
            return
        self._write(dict(record))

    def log_eval(
        self,
        step: int,
        loss: float,
        extra: dict[str, float] | None = None,
        *,
        ppl: float | None | str = "exp",
    ) -> None:
        """Record a validation loss after step ``step`` and its perplexity.

        Args:
            step: the step evaluated after.
            loss: the validation loss.
            extra: further values by name (the train step's, e.g. ``"mlm accuracy"``).
            ppl: the perplexity; ``"exp"`` (default) = ``exp(loss)``; None = none (a
                loss that is no token cross-entropy, e.g. a fine-tuning head's: no
                ``"ppl"`` field is written).
        """
        if not self.enabled:
            return
        if ppl == "exp":
            ppl = perplexity(loss)
        extra = dict(extra or {})
        values = {"loss": loss, **({"ppl": ppl} if ppl is not None else {}), **extra}
        self._write({"kind": "eval", "step": step, **values})
        if self._wandb is not None:
            self._wandb.log({f"eval/{k}": v for k, v in values.items()}, step)
        if self._tb is not None:
            for key, value in values.items():
                if math.isfinite(value):
                    self._tb.add_scalar(f"eval/{key}", value, step)
        shown = "".join(
            f", {k} {v:.4g}"
            for k, v in extra.items()
            if k not in _REPEATS_LOSS and not k.startswith(_PER_LAYER)
        )
        shown = (f", perplexity {ppl:.2f}" if ppl is not None else "") + shown
        self.write_line(f"step {step}: validation loss {loss:.4f}{shown}")

    def _warn_starving(self, step: int, metrics: dict[str, Any]) -> None:
        """A line, once per expert, when a mixture-of-experts expert received no token in a step."""
        starved = [
            k
            for k, v in metrics.items()
            if k.startswith("tokens_per_expert/") and v == 0 and k not in self._starved
        ]
        if starved:
            self._starved.update(starved)
            names = ", ".join(k.removeprefix("tokens_per_expert/") for k in starved)
            self.write_line(
                f"step {step}: warning: {names} received no tokens (starving experts; "
                "model.moe_aux_loss_coeff weighs the balance loss that spreads them, "
                "model.moe_router_bias_update_rate the balancing bias's step where enabled)"
            )

    def write_line(self, text: str) -> None:
        """Print a line without breaking the progress bar."""
        if not (self.enabled and self.verbose):
            return
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        """Flush and close everything (idempotent)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._pending)
            self._pending = 0
            self._bar.close()
            self._bar = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if not self._file.closed:
            self._file.close()
