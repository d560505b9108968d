"""Token ids and counts given by users (lists, numpy arrays, torch tensors) as checked numpy arrays."""

from __future__ import annotations

from typing import Any

import numpy as np


def _torch_to_numpy(values: Any, what: str) -> np.ndarray:
    """A torch tensor's values as a numpy array (any device; dtypes numpy lacks are refused)."""
    tensor = values.detach().cpu()
    if tensor.dtype.is_floating_point and tensor.dtype.itemsize < 4:  # bfloat16 / float8: no numpy
        tensor = tensor.float()
    try:
        return tensor.numpy()
    except (TypeError, RuntimeError) as err:
        raise ValueError(
            f"{what}: token ids must be integers; a torch tensor of dtype {tensor.dtype} "
            f"cannot be read ({err})"
        ) from None


def _decimal(value: str | bytes, position: int, what: str) -> int:
    """A token id given as a decimal string, read as Megatron-Core's builder reads it (``int()``)."""
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{what}: token {position} is {value!r}, not a decimal integer") from None


def _as_token_array(values: Any, dtype: np.dtype, what: str) -> np.ndarray:
    """Convert token ids to a 1-D array of ``dtype``, refusing values that do not fit.

    Args:
        values: any integer sequence Megatron's builder takes: a torch tensor (any
            integer dtype, any device), a numpy array (any integer dtype), a list, tuple or
            ``range`` of ints (numpy or torch scalars included), or a scalar (one token).
            Integral floats are accepted; nested equal-length sequences are flattened.
            Token ids given as decimal strings (a list of ``str``/``bytes`` or a numpy
            string array) are read with Python's ``int()``, as Megatron-Core's builder
            (numpy's string-to-integer cast) does: ``" 3"``, ``"+5"``, ``"1_000"`` are
            ids; ``"1.5"``, ``"0x10"``, ``""`` are refused. A bare string is still
            refused (a text passed by mistake), where Megatron-Core would store an
            all-digit one as a single token.
        dtype: the builder's token dtype.
        what: the file, for messages.

    Raises:
        ValueError: a value that is not an integer (fractional float, string, ``None``,
            ragged nesting, ...), or does not fit ``dtype`` (Megatron wraps or truncates).
    """
    if hasattr(values, "detach") and hasattr(
        values, "cpu"
    ):  # torch tensor, without importing torch
        values = _torch_to_numpy(values, what)
    if isinstance(values, str | bytes | bytearray | dict | set | frozenset):
        raise ValueError(f"{what}: token ids must be integers, got a {type(values).__name__}")
    try:
        array = np.asarray(values)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"{what}: token ids must be a flat or rectangular integer sequence ({err})"
        ) from None
    if array.dtype.kind in "OUS":  # big Python ints, decimal strings, tensors of other dtypes, junk
        items = array.reshape(-1).tolist()
        items = [v.item() if hasattr(v, "item") and not isinstance(v, int) else v for v in items]
        items = [
            _decimal(v, i, what) if isinstance(v, str | bytes) else v for i, v in enumerate(items)
        ]
        for value in items:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(
                    f"{what}: token ids must be integers, got {type(value).__name__} {value!r}"
                )
        low, high = (min(items), max(items)) if items else (0, 0)
        if dtype.kind in "iu" and (low < np.iinfo(dtype).min or high > np.iinfo(dtype).max):
            info = np.iinfo(dtype)
            raise ValueError(
                f"{what}: token values {low}..{high} do not fit {dtype} ({info.min}..{info.max}); "
                "use a wider dtype"
            )
        array = np.asarray(items, dtype=dtype)
    if array.size == 0:
        return np.empty(0, dtype=dtype)
    array = array.reshape(-1)
    if array.dtype == dtype:
        return array
    if array.dtype.kind not in "iubf":
        raise ValueError(
            f"{what}: token ids must be integers, got values of dtype {array.dtype} ({array.dtype.kind!r})"
        )
    if dtype.kind in "iu":
        if array.dtype.kind == "f":
            if not np.all(np.isfinite(array)) or not np.all(array == np.floor(array)):
                raise ValueError(f"{what}: non-integer token values cannot be stored as {dtype}")
        if not np.can_cast(array.dtype, dtype, casting="safe"):
            info = np.iinfo(dtype)
            low, high = array.min(), array.max()
            if low < info.min or high > info.max:
                raise ValueError(
                    f"{what}: token values {low}..{high} do not fit {dtype} ({info.min}..{info.max}); "
                    "use a wider dtype"
                )
    return array.astype(dtype)


def _as_counts(values: Any, what: str) -> np.ndarray:
    """Sequence lengths or counts as a 1-D int64 array of non-negative integers.

    Raises:
        ValueError: a non-integer or negative value (``what`` names the argument).
    """
    if hasattr(values, "detach") and hasattr(values, "cpu"):
        values = _torch_to_numpy(values, what)
    try:
        array = np.asarray(values).reshape(-1)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{what} must be a flat sequence of integers ({err})") from None
    if array.size == 0:
        return np.empty(0, dtype=np.int64)
    if array.dtype.kind not in "iu" and not (
        array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.floor(array))
    ):
        raise ValueError(f"{what} must be integers, got {array.tolist()[:10]}")
    if (array < 0).any():
        raise ValueError(f"{what} must be non-negative, got {array.tolist()[:10]}")
    return array.astype(np.int64)
