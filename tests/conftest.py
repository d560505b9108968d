"""Shared pytest configuration."""

import os

import pytest
import torch

# Two cores: keep each process from oversubscribing them.
torch.set_num_threads(min(2, torch.get_num_threads()))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def cuda_only():
    """Skip the test cleanly when no CUDA device is present."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
