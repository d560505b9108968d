"""Detect use of the process-global random generators inside a block of code.

Under Megatron's model parallelism every rank must build the same sample, yet the
global generators (``torch``'s default generator, ``np.random``'s legacy
``RandomState``, Python's ``random``) are seeded and advanced differently per rank
(Megatron itself reseeds them per tensor-parallel rank). A dataset that seeds or
draws from them returns rank-dependent data. :func:`detect_global_rng_use` catches
both kinds of use, with two complementary methods:

- the seeding functions (``torch.manual_seed``, ``torch.seed``,
  ``torch.cuda.manual_seed(_all)``, ``torch.cuda.seed(_all)``, ``np.random.seed``,
  ``random.seed``) are temporarily replaced by wrappers that record the call and
  then call the original;
- the global states are set to a fixed sentinel state before the block and compared
  after it, which catches every draw (``torch.rand*``/``randn*``/``randint``/
  ``randperm``/``multinomial``/``bernoulli``/``normal``/in-place ``Tensor.*_`` random
  ops without ``generator=``, ``np.random.*`` module functions, ``random.*`` module
  functions) and seeding through an alias the patch cannot see
  (``from torch import manual_seed``). The CUDA generators are compared when CUDA
  is initialized.

The original functions and the caller's generator states are restored on exit,
also when the block raises. The patch is process-wide: do not run other threads
that use these functions meanwhile.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

__all__ = ["SENTINEL_SEED", "detect_global_rng_use", "preserve_global_rng"]

SENTINEL_SEED = 0x5EED_E90C
"""Seed (32-bit) of the sentinel global state installed for the duration of the check."""


def _seeding_targets() -> list[tuple[Any, str, str]]:
    targets: list[tuple[Any, str, str]] = []
    for module, prefix in (
        (torch, "torch"),
        (torch.random, "torch.random"),
        (torch.cuda, "torch.cuda"),
        (torch.cuda.random, "torch.cuda.random"),
    ):
        for name in ("manual_seed", "seed", "manual_seed_all", "seed_all"):
            if hasattr(module, name):
                targets.append((module, name, f"{prefix}.{name}"))
    targets.append((np.random, "seed", "np.random.seed"))
    targets.append((np.random.mtrand, "seed", "np.random.mtrand.seed"))
    targets.append((random, "seed", "random.seed"))
    return targets


def _cuda_active() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _save_states() -> dict[str, Any]:
    states: dict[str, Any] = {
        "random": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002 - the global state is what we guard
        "torch": torch.get_rng_state(),
    }
    if _cuda_active():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _restore_states(states: dict[str, Any]) -> None:
    random.setstate(states["random"])
    np.random.set_state(states["numpy"])  # noqa: NPY002
    torch.set_rng_state(states["torch"])
    if "cuda" in states and _cuda_active():
        torch.cuda.set_rng_state_all(states["cuda"])


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.set_state(np.random.RandomState(seed).get_state())  # noqa: NPY002
    torch.default_generator.manual_seed(seed)
    if _cuda_active():
        for i in range(torch.cuda.device_count()):
            torch.cuda.default_generators[i].manual_seed(seed)


def _numpy_states_equal(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and tuple(a[2:]) == tuple(b[2:])


def _state_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    changes = []
    if before["random"] != after["random"]:
        changes.append("drew from or reseeded Python's global `random` generator (random.*)")
    if not _numpy_states_equal(before["numpy"], after["numpy"]):
        changes.append("drew from or reseeded numpy's global generator (np.random.* functions)")
    if not torch.equal(before["torch"], after["torch"]):
        changes.append(
            "drew from or reseeded torch's default CPU generator "
            "(torch.rand/randn/randint/randperm/... without generator=)"
        )
    if "cuda" in before and "cuda" in after:
        if any(not torch.equal(x, y) for x, y in zip(before["cuda"], after["cuda"])):
            changes.append("drew from or reseeded a global CUDA generator")
    return changes


def _recording(original: Callable, label: str, findings: list[str], depth: list[int]) -> Callable:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if depth[0] == 0:  # torch.manual_seed calls torch.cuda.manual_seed_all: report once
            shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
            findings.append(f"called {label}({shown})")
        depth[0] += 1
        try:
            return original(*args, **kwargs)
        finally:
            depth[0] -= 1

    return wrapper


@contextmanager
def preserve_global_rng() -> Iterator[None]:
    """Restore the global generator states (Python, numpy, torch CPU and CUDA) on exit."""
    saved = _save_states()
    try:
        yield
    finally:
        _restore_states(saved)


@contextmanager
def detect_global_rng_use(sentinel_seed: int = SENTINEL_SEED) -> Iterator[list[str]]:
    """Record every use of a global random generator inside the ``with`` block.

    Example::

        with detect_global_rng_use() as findings:
            dataset[0]
        assert not findings, findings

    Args:
        sentinel_seed: seed in ``[0, 2**32)`` of the fixed global state installed during the block.

    Yields:
        A list that, after the block, holds one human-readable line per finding
        (empty when the block used no global generator).
    """
    saved = _save_states()
    findings: list[str] = []
    patched: list[tuple[Any, str, Any]] = []
    depth = [0]
    try:
        _seed_all(sentinel_seed)
        reference = _save_states()
        for module, name, label in _seeding_targets():
            original = getattr(module, name)
            patched.append((module, name, original))
            setattr(module, name, _recording(original, label, findings, depth))
        yield findings
        findings.extend(_state_changes(reference, _save_states()))
    finally:
        for module, name, original in reversed(patched):
            setattr(module, name, original)
        _restore_states(saved)
