"""A stand-in for Hugging Face ``evaluate`` (offline): ``load`` gives GLUE's metrics.

``evaluate.load("glue", "mrpc")`` (and ``"accuracy"``, ``"f1"``) returns a metric with
``add_batch(predictions=, references=)`` and ``compute(...)`` giving accuracy and the
binary F1 of label 1, computed as scikit-learn does (F1 is 0 without a true positive).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Metric", "load"]


class Metric:
    """Accumulates predictions and references; ``compute`` returns the named scores."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.predictions: list[int] = []
        self.references: list[int] = []

    def add_batch(self, *, predictions: Any, references: Any) -> None:
        self.predictions += [int(p) for p in _flat(predictions)]
        self.references += [int(r) for r in _flat(references)]

    def compute(self, *, predictions: Any = None, references: Any = None) -> dict[str, float]:
        if predictions is not None:
            self.add_batch(predictions=predictions, references=references)
        pairs = list(zip(self.predictions, self.references, strict=True))
        self.predictions, self.references = [], []
        if not pairs:
            raise ValueError("evaluate stand-in: compute() with no predictions added")
        scores = {"accuracy": sum(p == r for p, r in pairs) / len(pairs)}
        tp = sum(p == 1 and r == 1 for p, r in pairs)
        fp = sum(p == 1 and r != 1 for p, r in pairs)
        fn = sum(p != 1 and r == 1 for p, r in pairs)
        scores["f1"] = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
        return {k: v for k, v in scores.items() if k in self.names}


def _flat(values: Any) -> list:
    if hasattr(values, "tolist"):
        values = values.tolist()
    return list(values)


def load(path: str, config_name: str | None = None, **kwargs: Any) -> Metric:
    """GLUE MRPC/QQP (accuracy and F1), ``accuracy`` or ``f1``; anything else is refused."""
    if path in ("glue", "nyu-mll/glue") and config_name in ("mrpc", "qqp"):
        return Metric(("accuracy", "f1"))
    if path == "glue" and config_name is not None:
        return Metric(("accuracy",))
    if path in ("accuracy", "f1"):
        return Metric((path,))
    raise ValueError(f"evaluate stand-in: no offline metric for load({path!r}, {config_name!r})")
