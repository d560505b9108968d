"""Does a resumed run read the samples its checkpoint's run read? Sample digests in checkpoints.

Saving a checkpoint after step ``n`` adds to its ``trainer_state.json`` the sample
digests (:mod:`epochal.train.inputs.sample_identity`) of step ``n`` and of step
``n + 1``, the next one to train (when the train data holds it), with their global
sample ranges::

    "sample_digests": [{"step": 3, "first_sample": 32, "samples": 16, "digest": "..."},
                       {"step": 4, "first_sample": 48, "samples": 16, "digest": "..."}]

Resuming recomputes both from this run's data for the same sample numbers and
compares (:func:`resume_sample_check`); the run summary says in one line
``sample digests match the checkpoint`` or warns. Step ``n`` is checked as well as
step ``n + 1`` because a run that reached its last step often has no step ``n + 1`` in
its train data (a resampled dataset holds exactly ``train_iters * global_batch_size``
samples), and a resume that extends it builds a larger one.

Why they can differ although the run-defining options (``data.*``, ``training.seed``,
batch sizes) cannot change on resume: the files behind the same data path were
rewritten or a corpus was prepared anew (another tokenizer, another Python's standard
library), or a new ``training.train_iters`` made a GPT/BERT/T5 dataset index more
epochs (Megatron's index shuffles all its samples together, so the order of the
earlier samples changes too). Fine-tuning rows are named by their rows' numbers and a
digest of their tokens, and their order does not depend on the run's length, so for
them differing digests can only mean other rows: that resume is refused, naming
``sft.train_file`` (their dataset's ``refuse_changed_samples``).
"""

from __future__ import annotations

from typing import Any

from epochal.train.inputs.sample_identity import has_identities, identity_digest, sample_identities

__all__ = ["checkpoint_digests", "resume_sample_check"]

KEY = "sample_digests"


def _entry(dataset: Any, step: int, first: int, stop: int) -> dict[str, Any]:
    digest = identity_digest(sample_identities(dataset, first, stop))
    entry = {"step": step, "first_sample": first, "samples": stop - first, "digest": digest}
    kind = getattr(dataset, "identity_kind", None)
    return entry if kind is None else {**entry, "identity": kind}


def checkpoint_digests(dataset: Any, calculator: Any, step: int, consumed: int) -> dict[str, Any]:
    """``{"sample_digests": [...]}`` for a checkpoint of step ``step`` (``{}`` if there is nothing).

    Args:
        dataset: the (global) train dataset.
        calculator: the run's micro-batch calculator (ramp-up aware step sizes).
        step: the last step trained (0: none).
        consumed: the global samples consumed after it.
    """
    if not has_identities(dataset):
        return {}
    entries = []
    first = calculator.consumed_samples_after(step - 1) if step > 0 else consumed
    if step > 0 and calculator.consumed_samples_after(1, first) == consumed:
        entries.append(_entry(dataset, step, first, consumed))
    stop = calculator.consumed_samples_after(1, consumed)
    if stop <= len(dataset):
        entries.append(_entry(dataset, step + 1, consumed, stop))
    return {KEY: entries} if entries else {}


def _steps(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"


def resume_sample_check(saved: dict[str, Any], dataset: Any) -> str | None:
    """One line on whether ``dataset`` names the samples the checkpoint recorded.

    Args:
        saved: the checkpoint's ``trainer_state.json``.
        dataset: this run's (global) train dataset.

    Returns:
        ``"sample digests match the checkpoint (...)"``, a line starting with
        ``"warning: "`` when they differ or cannot be compared, or None when the
        checkpoint recorded none (older checkpoints) or the data names no samples.

    Raises:
        Whatever ``dataset.refuse_changed_samples(differences)`` raises when the
        digests differ and the dataset has that method: data whose order does not
        depend on the run's length (fine-tuning rows), so that differing digests mean
        the data itself changed, refuses the resume instead of warning. Such data
        also names its identity format (``dataset.identity_kind``, recorded with each
        digest); digests recorded in another format are not compared.
    """
    recorded = saved.get(KEY)
    if not isinstance(recorded, list) or not recorded or not has_identities(dataset):
        return None
    kind = getattr(dataset, "identity_kind", None)
    if kind is not None and any(
        isinstance(e, dict) and e.get("identity") != kind for e in recorded
    ):
        return (
            f"warning: sample digests not compared: the checkpoint names its samples another "
            f"way than this run ({kind!r}; saved by an earlier epochal)"
        )
    matched, differ, beyond = [], [], []
    try:
        for entry in recorded:
            step, first, n = int(entry["step"]), int(entry["first_sample"]), int(entry["samples"])
            if first < 0 or n < 1 or first + n > len(dataset):
                beyond.append(step)
                continue
            now = _entry(dataset, step, first, first + n)["digest"]
            (matched if now == entry["digest"] else differ).append((step, entry["digest"], now))
    except (KeyError, TypeError, ValueError) as exc:
        return (
            f"warning: sample digests not compared: the checkpoint's {KEY} is malformed ({exc!r})"
        )
    if differ:
        shown = "; ".join(f"step {s}: recorded {old}, now {new}" for s, old, new in differ)
        refuse = getattr(dataset, "refuse_changed_samples", None)
        if callable(refuse):  # data whose differing digests can only mean other rows
            refuse(f"sample digests differ: {shown}")
        return (
            f"warning: sample digests differ from the checkpoint ({shown}): this run does not "
            "read the samples the checkpointed run read. The data behind the data options "
            "changed since it was saved (files rewritten or prepared anew, another data path "
            "or seed), or a new training.train_iters made the dataset index more epochs, "
            "which reshuffles its samples"
        )
    if not matched:
        return (
            f"warning: sample digests not compared: the checkpoint's {_steps(beyond)} lie beyond "
            f"this run's {len(dataset):,} train samples"
        )
    return f"sample digests match the checkpoint ({_steps([s for s, _, _ in matched])})"
