"""``find_executable_batch_size``: Accelerate's retry-on-out-of-memory decorator.

As in Accelerate 1.15 (``accelerate.utils.memory``): the decorated function takes
the batch size as its first argument; when it raises an out-of-memory error
(CUDA / HIP / XPU / MPS / CPU allocator, or cuDNN's "not supported"), the device
cache is emptied and it is called again with the batch size times 0.9 (or what
``reduce_batch_size_fn()`` returns), until it runs or the batch size reaches 0
(``RuntimeError``). Any other error propagates at once, so on a machine with
memory to spare the function is called exactly once.
"""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["find_executable_batch_size", "release_memory", "should_reduce_batch_size"]

_OUT_OF_MEMORY = (
    " out of memory.",
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
)


def should_reduce_batch_size(exception: Exception) -> bool:
    """Whether ``exception`` is an out-of-memory (or cuDNN not-supported) error."""
    if isinstance(exception, RuntimeError) and len(exception.args) == 1:
        return any(text in str(exception.args[0]) for text in _OUT_OF_MEMORY)
    return False


def _clear_device_cache() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop ``objects`` and empty the device cache; returns Nones to assign back."""
    out = [None for _ in objects]
    _clear_device_cache()
    return out


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
) -> Any:
    """Call ``function(batch_size, *args)``, retrying with a smaller batch size on out-of-memory.

    Raises:
        TypeError: the batch size was passed in the call (the decorator passes it).
        RuntimeError: the batch size reached 0.
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    batch_size = starting_batch_size

    def reduce() -> int:
        if reduce_batch_size_fn is not None:
            return int(reduce_batch_size_fn())
        return int(batch_size * 0.9)

    @functools.wraps(function)
    def decorator(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        _clear_device_cache()
        params = list(inspect.signature(function).parameters)
        if len(params) < len(args) + 1:
            shown = ", ".join(f"{p}={v}" for p, v in zip(params[1:], args[1:]))
            raise TypeError(
                f"the batch size was passed into `{function.__name__}` as its first argument; "
                f"the decorator passes it: call `{function.__name__}({shown})`"
            )
        while True:
            if batch_size == 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as exc:
                if not should_reduce_batch_size(exc):
                    raise
                _clear_device_cache()
                batch_size = reduce()

    return decorator
