"""Which samples a step trains on: sample identities and their digest, per global batch.

Every train dataset epochal builds names its samples without reading them, through
``dataset.sample_identity(g)`` for global sample ``g`` (index arrays only: no token
data, no random draws), as a JSON-able dict:

- GPT (:class:`~epochal.data.datasets.gpt_dataset.GPTDataset`): ``{"dataset", "epoch",
  "window", "documents": [[doc, start, end], ...]}``, the token ranges the window reads;
- a blend (:class:`~epochal.data.datasets.blended_dataset.BlendedDataset`): ``{"corpus": k,
  ...}`` and the blended dataset's identity (``k`` = position in the blend);
- BERT / T5 (:class:`~epochal.data.datasets.bert_dataset.BERTDataset`): ``{"dataset",
  "index", "document", "sentences": [first, last]}``;
- ESM-2 (:class:`~epochal.train.inputs.esm.PaddedProteinSamples`): ``{"epoch", "cluster"}``
  (with the seed they decide the member drawn, its crop and masks);
- fine-tuning tables: ``{"epoch", "row"}`` (the table's 1-based data row).
- fine-tuning rows (:class:`~epochal.data.sft.packing.SFTDataset` and its packed
  form): ``{"epoch", "rows": "r0 r1 ...", "tokens"}``, the rows' 0-based numbers in
  their file and a digest of their token ids and loss masks (so other rows at the same
  numbers have another identity).

A dataset may also have ``sample_identities(start, stop)`` (the same, for a range at
once: the resamplers map the epochs of a range together) and ``sample_details(g)``:
more about a sample for listings, not digested because it costs more (ESM-2: the
member drawn, one seeded generator per sample).

Step ``n`` (1-based) trains the global samples ``[c(n - 1), c(n))``, ``c(k)`` being the
samples consumed after ``k`` steps (ramp-up aware); every data-parallel rank reads its
slice of that range, but every rank can name the whole range. The step's digest is the
first 16 hex digits of the SHA-256 of the identities in global order (compact JSON,
sorted keys): it describes the global batch, not how it was split, so it does not
depend on the data-parallel size, the micro-batch size or the number of accumulated
micro-batches, and it changes with the seed, the data files and anything else that
changes which samples a step reads. Cost: a few microseconds per sample, on the
logging rank only (``benchmarks/bench_sample_digest.py``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "StepSamples",
    "has_identities",
    "identity_digest",
    "sample_identities",
    "step_range",
    "step_samples",
]


def has_identities(dataset: Any) -> bool:
    """Whether ``dataset`` names its samples (has ``sample_identity``)."""
    return callable(getattr(dataset, "sample_identity", None))


def sample_identities(dataset: Any, start: int, stop: int) -> list[dict[str, Any]]:
    """The identities of global samples ``start .. stop - 1``, in order.

    Raises:
        TypeError: the dataset does not name its samples (see :func:`has_identities`).
        IndexError: the range leaves the dataset.
    """
    if not has_identities(dataset):
        raise TypeError(f"{type(dataset).__name__} does not name its samples (no sample_identity)")
    batch = getattr(dataset, "sample_identities", None)
    if batch is not None:
        return batch(start, stop)
    return [dataset.sample_identity(g) for g in range(start, stop)]


def identity_digest(identities: list[dict[str, Any]]) -> str:
    """First 16 hex digits of the SHA-256 of ``identities`` as compact JSON with sorted keys."""
    text = json.dumps(identities, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def step_range(calculator: Any, step: int) -> tuple[int, int]:
    """Global samples ``[first, stop)`` of step ``step`` (1-based) of a run started at sample 0.

    Args:
        calculator: the run's micro-batch calculator (``consumed_samples_after``).
        step: the optimizer step, ``>= 1``.

    Raises:
        ValueError: ``step < 1``.
    """
    if step < 1:
        raise ValueError(f"step must be >= 1, got {step}")
    first = calculator.consumed_samples_after(step - 1)
    return first, calculator.consumed_samples_after(1, first)


@dataclass
class StepSamples:
    """The samples of one step.

    Attributes:
        step: the optimizer step (1-based).
        first: the step's first global sample number.
        identities: one identity per sample, in global order.
        digest: :func:`identity_digest` of ``identities``.
    """

    step: int
    first: int
    identities: list[dict[str, Any]]
    digest: str


def step_samples(dataset: Any, calculator: Any, step: int) -> StepSamples:
    """The samples that step ``step`` reads from ``dataset`` (see the module docstring).

    Raises:
        TypeError: the dataset does not name its samples.
        IndexError: the step lies beyond the dataset (names the step and the sizes).
        ValueError: ``step < 1``.
    """
    first, stop = step_range(calculator, step)
    if stop > len(dataset):
        raise IndexError(
            f"step {step} reads samples {first}-{stop - 1}, beyond the {len(dataset):,} "
            "samples of the train data"
        )
    identities = sample_identities(dataset, first, stop)
    return StepSamples(step, first, identities, identity_digest(identities))
