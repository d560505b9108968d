"""Exact (or toleranced) comparison of dataset samples: nested tensors, arrays, scalars, containers."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["assert_dict_tensors_approx_equal", "assert_samples_equal"]


def assert_samples_equal(
    actual: Any, expected: Any, *, rtol: float = 0.0, atol: float = 0.0
) -> None:
    """Assert that two samples are equal, recursing into containers.

    Handles ``torch.Tensor`` (dtype, shape and values), ``np.ndarray`` (dtype, shape and
    values), Python and numpy scalars, ``str``/``bytes``/``None``, dicts (same keys),
    lists and tuples (same type and length, including named tuples) and dataclass
    instances. Floating values are compared exactly by default (NaN equals NaN); give
    ``rtol``/``atol`` to allow ``|a - b| <= atol + rtol * |b|``.

    Args:
        actual: the sample obtained.
        expected: the reference sample.
        rtol: relative tolerance for floating values.
        atol: absolute tolerance for floating values.

    Raises:
        AssertionError: the samples differ; the message gives the path of the first
            difference, e.g. ``sample['labels']: ...``.
    """
    _compare(actual, expected, "sample", rtol, atol)


def assert_dict_tensors_approx_equal(actual: Any, expected: Any) -> None:
    """BioNeMo-compatible approximate comparison (float tolerances of ``torch.testing.assert_close``).

    Raises:
        AssertionError: the samples differ beyond ``rtol=1.3e-6, atol=1e-5``.
    """
    _compare(actual, expected, "sample", 1.3e-6, 1e-5)


def _fail(path: str, message: str) -> None:
    raise AssertionError(f"{path}: {message}")


def _compare(a: Any, b: Any, path: str, rtol: float, atol: float) -> None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            _fail(path, f"type differs: {type(a).__name__} vs {type(b).__name__}")
        if a.dtype != b.dtype or a.shape != b.shape:
            _fail(path, f"tensor {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}")
        try:
            torch.testing.assert_close(
                a.detach().cpu(), b.detach().cpu(), rtol=rtol, atol=atol, equal_nan=True
            )
        except AssertionError as err:
            _fail(path, str(err))
        return
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            _fail(path, f"type differs: {type(a).__name__} vs {type(b).__name__}")
        if a.dtype != b.dtype or a.shape != b.shape:
            _fail(path, f"array {a.dtype}{a.shape} vs {b.dtype}{b.shape}")
        if np.issubdtype(a.dtype, np.inexact):
            close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
            if not close.all():
                where = tuple(int(i) for i in np.argwhere(~close)[0])
                _fail(
                    path,
                    f"{int((~close).sum())} of {a.size} values differ, first at {where}: "
                    f"{a[where]!r} vs {b[where]!r}",
                )
        elif not np.array_equal(a, b):
            _fail(path, "array values differ")
        return
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)):
            _fail(path, f"type differs: {type(a).__name__} vs {type(b).__name__}")
        if set(a) != set(b):
            _fail(path, f"keys differ: {sorted(map(repr, a))} vs {sorted(map(repr, b))}")
        for key in a:
            _compare(a[key], b[key], f"{path}[{key!r}]", rtol, atol)
        return
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if type(a) is not type(b):
            _fail(path, f"type differs: {type(a).__name__} vs {type(b).__name__}")
        if len(a) != len(b):
            _fail(path, f"length differs: {len(a)} vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _compare(x, y, f"{path}[{i}]", rtol, atol)
        return
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        if type(a) is not type(b):
            _fail(path, f"type differs: {type(a).__name__} vs {type(b).__name__}")
        for f in dataclasses.fields(a):
            _compare(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}", rtol, atol)
        return
    if isinstance(a, numbers.Number) and isinstance(b, numbers.Number):
        if isinstance(a, bool | np.bool_) != isinstance(b, bool | np.bool_):
            _fail(path, f"type differs: {type(a).__name__} vs {type(b).__name__}")
        if isinstance(a, numbers.Real) and isinstance(b, numbers.Real):
            fa, fb = float(a), float(b)
            if (math.isnan(fa) and math.isnan(fb)) or a == b:
                return
            if math.isfinite(fa) and math.isfinite(fb) and abs(fa - fb) <= atol + rtol * abs(fb):
                return
            _fail(path, f"{a!r} vs {b!r}")
        if a != b:
            _fail(path, f"{a!r} vs {b!r}")
        return
    if type(a) is not type(b):
        _fail(path, f"type differs: {type(a).__name__} vs {type(b).__name__}")
    if a != b:
        _fail(path, f"{a!r} vs {b!r}")
