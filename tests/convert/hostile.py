"""Tiny checkpoints of every format, and ways to damage them (for the hardening and fuzz tests).

Everything is written by our own exporters from one tiny GPT (2 layers, hidden 32), so
no peer package is needed: Hugging Face folders (``save_hf_checkpoint``), Megatron legacy
and ``torch_dist`` folders (``save_megatron_checkpoint``), a NeMo 2 folder (the
``torch_dist`` tensors re-saved under ``module.`` with a ``context/model.yaml``) and an
epochal run (``save_epochal_checkpoint``).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import torch

from tests.convert.hf_models import gpt2_like, ours

NEMO_YAML = """\
_target_: nemo.collections.llm.gpt.model.base.GPTModel
config:
  _target_: nemo.collections.llm.gpt.model.base.GPTConfig
  num_layers: 2
  hidden_size: 32
  ffn_hidden_size: 128
  num_attention_heads: 4
  layernorm_epsilon: 1.0e-05
  activation_func:
    _call_: false
    _target_: megatron.core.fusions.fused_bias_gelu.bias_gelu_impl
  openai_gelu: true
  seq_length: 64
  vocab_size: 100
  make_vocab_size_divisible_by: 128
  share_embeddings_and_output_weights: true
"""


def tiny_model():
    """``(config, state)`` of a 2-layer GPT-2-like model (vocabulary 100, padded to 128)."""
    config = gpt2_like()
    return config, ours(config, seed=3).state_dict()


def hf_folder(path: Path, architecture: str = "gpt2") -> Path:
    """A Hugging Face folder (``config.json`` + ``model.safetensors``)."""
    from epochal.formats.hf.io import save_hf_checkpoint
    from tests.convert.hf_models import llama_like

    config = gpt2_like() if architecture == "gpt2" else llama_like()
    state = ours(config, seed=3).state_dict()
    return save_hf_checkpoint(config, state, path, architecture=architecture)


def megatron_folder(path: Path, *, tp: int = 1, pp: int = 1, fmt: str = "torch") -> Path:
    """A Megatron-LM save directory with ``iter_0000005`` (legacy files or ``torch_dist``)."""
    from epochal.convert.megatron.legacy import save_megatron_checkpoint

    config, state = tiny_model()
    save_megatron_checkpoint(
        config,
        state,
        path,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        iteration=5,
        ckpt_format=fmt,
        spec="local",
    )
    return path


def nemo_folder(path: Path, yaml_text: str = NEMO_YAML) -> Path:
    """A NeMo 2 folder: ``weights/`` (torch_dist under ``module.``) and ``context/model.yaml``."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint import save as dcp_save

    from epochal.convert.megatron.torch_dist import read_torch_dist, stack_layers

    dist = megatron_folder(path.parent / f"{path.name}-dist", fmt="torch_dist")
    flat, _ = read_torch_dist(dist / "iter_0000005")
    stacked = {f"module.{k}": v.contiguous() for k, v in stack_layers(flat).items()}
    weights = path / "weights"
    weights.mkdir(parents=True)
    dcp_save(stacked, storage_writer=FileSystemWriter(str(weights)), no_dist=True)
    (weights / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    (path / "context").mkdir()
    (path / "context" / "model.yaml").write_text(yaml_text)
    return path


def epochal_run(path: Path) -> Path:
    """A model-only epochal run directory (``checkpoints/step_0000000``)."""
    from epochal.train.state.epochal_ckpt import save_epochal_checkpoint

    config, state = tiny_model()
    save_epochal_checkpoint(config, state, path, source="test")
    return path


def rank_file(folder: Path, t: int = 0, p: int | None = None) -> Path:
    """The legacy ``model_optim_rng.pt`` of tensor rank ``t`` (pipeline rank ``p``)."""
    name = f"mp_rank_{t:02d}" if p is None else f"mp_rank_{t:02d}_{p:03d}"
    return folder / "iter_0000005" / name / "model_optim_rng.pt"


def edit_rank(path: Path, edit) -> None:
    """Rewrite a legacy rank file after ``edit(payload)`` (our own file: full unpickling)."""
    payload = torch.load(path, weights_only=False)
    edit(payload)
    torch.save(payload, path)


def edit_metadata(folder: Path, edit) -> None:
    """Rewrite a DCP folder's ``.metadata`` after ``edit(metadata)``."""
    path = folder / ".metadata"
    with open(path, "rb") as f:
        metadata = pickle.load(f)  # noqa: S301 - our own test file
    edit(metadata)
    with open(path, "wb") as f:
        pickle.dump(metadata, f)


def edit_json(path: Path, edit) -> None:
    """Rewrite a JSON file after ``edit(data)``."""
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def tensor_meta(metadata: Any, suffix: str) -> tuple[str, Any]:
    """The first ``(fqn, TensorStorageMetadata)`` whose name ends with ``suffix``."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    for fqn, meta in metadata.state_dict_metadata.items():
        if fqn.endswith(suffix) and isinstance(meta, TensorStorageMetadata):
            return fqn, meta
    raise KeyError(suffix)
