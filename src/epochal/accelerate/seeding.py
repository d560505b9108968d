"""``set_seed`` and ``init_empty_weights`` (Accelerate's helpers, written for epochal).

``set_seed(seed)`` seeds Python's, NumPy's and PyTorch's global generators (every
CUDA device too); ``prepare`` then takes the training seed (dropout streams,
shuffling, collator randomness) from PyTorch's (``torch.initial_seed()``, global
rank 0's), so a script that seeds before building its model trains the same way
every time.

``init_empty_weights()`` builds a model's parameters on the meta device (no
memory, no initialization), as Accelerate's does; buffers stay real unless
``include_buffers=True``. ``prepare`` then takes only the configuration, and the
weights must come from ``accelerator.load_state``.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

__all__ = ["init_empty_weights", "set_seed"]


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed every global generator with ``seed`` (+ the process's rank if ``device_specific``).

    Args:
        seed: an integer in ``[0, 2**32)``.
        device_specific: add the global rank (``$RANK``) so processes draw differently.
        deterministic: also ask PyTorch for deterministic algorithms.

    Raises:
        ValueError: a seed outside ``[0, 2**32)``.
    """
    if device_specific:
        seed += int(os.environ.get("RANK", "0"))
    if not 0 <= int(seed) < 2**32:
        raise ValueError(f"set_seed: seed must be in [0, 2**32), got {seed}")
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - the global one, on purpose
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool = False) -> Iterator[None]:
    """Build modules with parameters (and with ``include_buffers``, buffers) on the meta device."""
    if include_buffers:
        with torch.device("meta"):
            yield
        return
    original = nn.Module.register_parameter

    def register_parameter(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None:
            module._parameters[name] = nn.Parameter(
                param.detach().to("meta"), requires_grad=param.requires_grad
            )

    nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]
