"""The commands to try after a run, for the kind of model it trained.

``epochal train`` ends with them (:func:`next_commands`), so a first run shows
where to go: sample from a GPT or T5 (``epochal generate``; a model fine-tuned on
conversations is asked a question with ``--chat``, rendered by its chat template and
answered up to the end of its turn, as ``transformers``' chat pipeline does), fill masks of a BERT
or ESM-2 (``epochal fill-mask``), embed or predict with an encoder
(``epochal embed``), take the model to Hugging Face (``epochal convert``), plot the
loss (``epochal plot``), and train further (:func:`train_further_command`).

Training further means continuing the run, as Megatron-LM does when ``--train-iters``
is raised and ``--lr-decay-iters`` kept: the same weights, optimizer state and data
position, a larger ``training.train_iters``, and ``scheduler.lr_decay_iters`` pinned to
the run's decay length, so the learning rate goes on along the schedule it followed
(past the end of the decay it stays at ``optimizer.min_lr``) instead of being
recomputed over the new length (``lr_decay_iters`` defaults to ``train_iters``; the
recomputed decay would put the rate of a finished run back near its peak). A
``scheduler.lr_warmup_fraction`` is a fraction of that decay length, so the warmup
stays as it was too. The command names the run's own ``config.toml`` and
``run_dir``: ``scheduler.lr_decay_iters`` is part of a run's identity (another
schedule is another run), so the preset's command with it added would name a new
run directory instead of continuing this one.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

__all__ = ["next_commands", "train_further_command"]

#: A masked sentence per tokenizer family of :func:`next_commands`' fill-mask line.
_MASKED_TEXT = {
    "esm": "MKTAYIAKQR<mask>ISFVKSHFSRQLEERLGLIEVQ",
    "bert": "the cat sat on the [MASK] .",
}


def _prompt(config: Any) -> str:
    return "def main(" if config.data.corpus == "stdlib" else "The"


#: The ``--chat`` hint's question when the rows cannot be peeked at (not JSON lines).
_CHAT_PROMPT = "Hello"


def _chat_prompt(config: Any) -> str | None:
    """The question of the ``--chat`` hint, or None when the run did not learn conversations.

    A fine-tuning run's rows are conversations when they are ``messages`` or
    conversational prompt-completion rows (TRL's formats; plain prompt-completion
    strings are trained without the chat template). The first row of a ``.jsonl`` /
    ``.json`` lines file (``sft.valid_file``, else ``sft.train_file``) tells, and its
    first user message is the question; other formats are not read here: they get
    ``"Hello"`` when the run's tokenizer folder has a chat template.
    """
    if not config.sft.enabled:
        return None
    path = Path(config.sft.valid_file or config.sft.train_file)
    if path.suffix in (".jsonl", ".json") and path.is_file():
        return _first_question(path)
    folder = Path(config.sft.tokenizer or config.checkpoint.init_from or ".")
    try:
        has_template = (folder / "chat_template.jinja").is_file() or "chat_template" in json.loads(
            (folder / "tokenizer_config.json").read_text(encoding="utf-8")
        )
    except (OSError, ValueError, TypeError):
        return None
    return _CHAT_PROMPT if has_template else None


def _first_question(path: Path) -> str | None:
    """The first user message of a JSON-lines file's first row (None: not a conversation)."""
    try:
        with open(path, encoding="utf-8") as f:
            line = next((x for x in f if x.strip()), "")
        row = json.loads(line)
    except (OSError, ValueError, StopIteration):
        return _CHAT_PROMPT
    if not isinstance(row, dict):
        return _CHAT_PROMPT
    messages = row.get("messages", row.get("prompt"))
    if not isinstance(messages, list):
        return None  # plain prompt-completion strings: no chat template was applied
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str) and 0 < len(content) <= 200 and "\n" not in content:
                return content
    return _CHAT_PROMPT


def _new_tokens(config: Any) -> int:
    """40 tokens, or half of what the model's positions hold (the prompt takes the rest)."""
    from epochal.train.config.model import position_length

    if config.model.type == "t5":  # the decoder's positions
        positions = config.data.seq_length_decoder
    else:
        positions = config.model.max_position_embeddings or position_length(config)
    return max(1, min(40, positions // 2))


def _table(config: Any) -> str:
    """The labelled table a fine-tuned run can predict: its validation table, else its training one."""
    return config.finetune.valid_file or config.finetune.train_file


def train_further_command(config: Any, run_dir: str | Path, *, final_step: int) -> str:
    """The command that continues a finished run to twice its step, its LR schedule kept.

    Args:
        config: the run's ``TrainConfig`` (its resolved configuration is
            ``RUN/config.toml``).
        run_dir: where it trained.
        final_step: the step the run reached.

    Returns:
        ``epochal train --config RUN/config.toml --run_dir=RUN
        --training.train_iters=2*final_step --scheduler.lr_decay_iters=DECAY``, shell-quoted,
        where ``DECAY`` is the run's decay length (``scheduler.lr_decay_iters``, or its
        ``training.train_iters`` when unset). Run from the folder the run was started in
        (relative paths are the configuration's).
    """
    run = Path(run_dir)
    return (
        f"epochal train --config {shlex.quote(str(run / 'config.toml'))} "
        f"--run_dir={shlex.quote(str(run))} "
        f"--training.train_iters={max(2 * final_step, 1)} "
        f"--scheduler.lr_decay_iters={config.lr_decay_iters}"
    )


def next_commands(config: Any, run_dir: str | Path, *, final_step: int) -> list[str]:
    """Command lines worth trying after training ``config`` in ``run_dir``.

    Args:
        config: the run's ``TrainConfig``.
        run_dir: where it trained.
        final_step: the step the run reached; a finished run (``training.train_iters``
            reached) also gets the command to train further (:func:`train_further_command`).

    Returns:
        Shell-quoted command lines, most useful first (the last may be that hint).
    """
    run = shlex.quote(str(run_dir))
    m = config.model
    name = Path(run_dir).name or "model"
    cmds: list[str] = []
    if m.head != "mlm":  # a fine-tuned encoder: predictions of its head
        table = shlex.quote(_table(config))
        cmds.append(
            f"epochal embed --checkpoint {run} --input {table} --output predictions.parquet "
            "--predictions"
        )
    elif m.type in ("gpt", "t5"):
        # mock data has no tokenizer: prompts are token ids then
        prompt = (
            "--prompt-ids 1,2,3" if config.data.mock else f"--prompt {shlex.quote(_prompt(config))}"
        )
        question = _chat_prompt(config)
        if question is not None:  # a chat model: a user message, answered to its end of turn
            prompt = f"--chat --prompt {shlex.quote(question)}"
        cmds.append(
            f"epochal generate --checkpoint {run} {prompt} --max-new-tokens {_new_tokens(config)}"
        )
    else:  # BERT / ESM masked LM
        text = shlex.quote(_MASKED_TEXT["esm" if m.type == "esm" else "bert"])
        cmds.append(f"epochal fill-mask --checkpoint {run} --text {text} --top-k 5")
        proteins = config.data.protein_path
        if m.type == "esm" and proteins:
            cmds.append(
                f"epochal embed --checkpoint {run} --input {shlex.quote(proteins)} "
                "--output embeddings.safetensors"
            )
    cmds.append(f"epochal convert {run} {shlex.quote(f'hf/{name}')} --to hf")
    cmds.append(f"epochal plot {run}")
    if final_step >= config.training.train_iters:  # finished (a stopped run resumes as it is)
        further = train_further_command(config, run_dir, final_step=final_step)
        cmds.append(f"train further (learning-rate schedule kept): {further}")
    return cmds
