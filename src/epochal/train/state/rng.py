"""Capture and restore every random state, as tensors (safe to load with ``weights_only``).

The trainer draws randomness only from PyTorch's default generators (dropout);
the data pipeline draws none from global state. NumPy's and Python's global
generators are saved too, so user code (a custom loss hook, a callback) that
uses them also resumes exactly.

Layout of the state (all CPU tensors)::

    torch_cpu          uint8  [n]        torch.get_rng_state()
    torch_cuda_{i}     uint8  [n]        per visible CUDA device (absent without CUDA)
    numpy_keys         int64  [624]      MT19937 key
    numpy_meta         float64 [3]       pos, has_gauss, cached_gaussian
    python_state       int64  [626]      version followed by the 625-word state
    python_gauss       float64 [2]       has gauss_next, gauss_next
"""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["get_rng_state", "set_rng_state"]


def get_rng_state() -> dict[str, torch.Tensor]:
    """Return every global RNG state of this process as a flat dict of tensors."""
    state: dict[str, torch.Tensor] = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            state[f"torch_cuda_{i}"] = s
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # noqa: NPY002 - the global one
    assert kind == "MT19937"
    state["numpy_keys"] = torch.from_numpy(np.asarray(keys, dtype=np.int64))
    state["numpy_meta"] = torch.tensor([pos, has_gauss, cached], dtype=torch.float64)
    version, words, gauss = random.getstate()
    state["python_state"] = torch.tensor([version, *words], dtype=torch.int64)
    state["python_gauss"] = torch.tensor(
        [0.0 if gauss is None else 1.0, 0.0 if gauss is None else gauss], dtype=torch.float64
    )
    return state


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    """Restore the states produced by :func:`get_rng_state`.

    Raises:
        ValueError: a required key is missing or malformed.
    """
    for key in ("torch_cpu", "numpy_keys", "numpy_meta", "python_state", "python_gauss"):
        if key not in state:
            raise ValueError(f"RNG state is missing {key!r}")
    torch.set_rng_state(state["torch_cpu"].to(torch.uint8))
    cuda = sorted(k for k in state if k.startswith("torch_cuda_"))
    if cuda and torch.cuda.is_available():
        n = min(len(cuda), torch.cuda.device_count())
        for i in range(n):
            torch.cuda.set_rng_state(state[f"torch_cuda_{i}"].to(torch.uint8), device=i)
    keys = state["numpy_keys"].numpy().astype(np.uint32)
    pos, has_gauss, cached = state["numpy_meta"].tolist()
    np.random.set_state(("MT19937", keys, int(pos), int(has_gauss), float(cached)))  # noqa: NPY002
    words = state["python_state"].tolist()
    has, gauss = state["python_gauss"].tolist()
    random.setstate((int(words[0]), tuple(int(w) for w in words[1:]), gauss if has else None))


def seed_everything(seed: int) -> None:
    """Seed the global RNGs the training step may use (dropout; user hooks), as Megatron does.

    Only the trainer does this; datasets never touch global RNG state. A resume
    then overwrites these states with the checkpoint's.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - the global one, on purpose
    torch.manual_seed(seed)
