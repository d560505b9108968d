"""Checks made before a run starts: the device's kernels, backend and memory.

- :func:`check_device_options` (before any data is read or any file written):
  ``training.attention_backend`` has a kernel for this run on its device, and
  ``parallel.backend = "nccl"`` only with CUDA (:mod:`.kernels`);
- :func:`~epochal.train.run_checks.state_memory.check_state_memory` (before the model
  is allocated): weights, gradients and AdamW state and one step's activations
  (:mod:`.activation_memory`) fit the device's free memory (:mod:`.state_memory`;
  ``training.memory_check = false`` skips it).

``epochal train`` runs them before it launches processes or prepares data
(:func:`check_before_run`; the memory with the configured ``model.vocab_size``, or
a one-id placeholder when the tokenizer decides it), with an explicit
``data.tokenizer_type`` checked against the data's tokenizer record; the trainer
runs them again with the resolved model, so a run built from Python is checked too.
"""

from __future__ import annotations

from typing import Any

import torch

from epochal.model.config import ModelConfig
from epochal.train.run_checks.kernels import check_attention_backend, check_process_group_backend
from epochal.train.run_checks.state_memory import check_state_memory

__all__ = ["check_before_run", "check_device_options", "check_state_memory", "preflight_model"]


def preflight_model(config: Any) -> ModelConfig:
    """The model of ``config`` as far as it is known before the data (vocabulary: the
    configured ``model.vocab_size``, else a placeholder of 1 id)."""
    from epochal.train.config import model_config_from_section, position_length

    return model_config_from_section(
        config.model, vocab_size=config.model.vocab_size or 1, seq_length=position_length(config)
    )


def check_device_options(config: Any, device: torch.device) -> None:
    """The process-group backend, then the attention kernel, for ``device``.

    Raises:
        ConfigError: naming ``parallel.backend`` or ``training.attention_backend``.
    """
    check_process_group_backend(config, device)
    check_attention_backend(config, preflight_model(config), device)


def check_before_run(config: Any, *, device_options: bool = True) -> None:
    """What ``epochal train`` checks before it launches or prepares anything.

    The device's options and kernels (unless ``device_options`` is False: the caller
    checked them already), the training state's memory (the vocabulary as far as the
    configuration says), and an explicit ``data.tokenizer_type`` against the data's
    tokenizer record.

    Raises:
        ConfigError: naming the option to change.
    """
    from epochal.train.device import resolve_device
    from epochal.train.inputs.recorded_tokenizer import recorded_tokenizers

    device = resolve_device(config.training.device)
    if device_options:
        check_device_options(config, device)
    check_state_memory(config, preflight_model(config), device)
    if config.data.tokenizer_type and recorded_tokenizers(config.data):
        from epochal.train.inputs.corpus import tokenizer_from_config

        tokenizer_from_config(config.data)  # refuses another tokenizer than the recorded one
