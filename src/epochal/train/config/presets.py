"""Named configurations: ``tiny`` (the CPU demo), ``moe-tiny``, ``sft-tiny``, ``bert-tiny``, ``t5-tiny``,
``esm-tiny``, ``esm2-8m``, ``gpt2-small``, ``gpu-1b``.

A preset is a nested dict in the TOML layout of
:class:`~epochal.train.config.TrainConfig`; a config file and overrides are
merged over it. ``epochal train --preset NAME --print-config`` shows the result.

- ``tiny``: a 4-layer, 128-wide Llama-style model (RoPE, RMSNorm, SwiGLU, GQA,
  no biases, no dropout) trained for 300 steps on Python's standard-library
  sources with a 4096-id BPE tokenizer trained on them; about 2-4 minutes on 2
  CPU cores.
- ``moe-tiny``: ``tiny``'s model with a mixture of experts in every block (4 experts
  of width 192, top-2 routing renormalised as Mixtral, balance loss 0.01, z-loss
  0.001), 100 steps on ``tiny``'s corpus and tokenizer; the balance loss and tokens
  per expert of every block are in ``metrics.jsonl``. About three minutes on 2 CPU cores.
- ``sft-tiny``: supervised fine-tuning of ``tiny``'s model shape on the chat rows
  shipped with the package (``epochal/data/sft/examples/tiny_chat.jsonl``: 160 short
  conversations, arithmetic, weekdays, opposites, colours, capitals, counting) with a
  512-id byte-level BPE tokenizer trained on them whose chat template marks the
  assistant turns (``examples/tokenizer``); loss on the assistant turns, rows packed
  into 128 tokens, the last 10% of the rows validate; 100 steps of 8 x 128 tokens
  on a CPU (from random weights: ``checkpoint.init_from`` starts from a model). Give
  your own rows with ``--sft.train_file`` (and ``--sft.tokenizer``).
- ``bert-tiny``: a 4-layer, 128-wide Megatron-style BERT (pre-LN, learned
  positions, token types, the binary head) trained on the standard-library
  sources split into sentences, with a 4096-id WordPiece vocabulary trained on
  them offline, for about 7.5 epochs of Megatron's BERT samples (639 per
  epoch; every sample's masks are drawn from its index, so a sentence span
  repeated in a later epoch is masked afresh).
- ``t5-tiny``: a Megatron-style T5 (learned positions, LayerNorm, GELU, the head
  tied to the embeddings with a bias), 2 encoder + 2 decoder blocks, 128 wide,
  on the same sentence-split standard-library corpus and WordPiece vocabulary
  with 100 sentinels; Megatron's ``pretrain_t5`` span corruption (15% of the
  tokens, N-grams up to 10 from the geometric distribution), 128 encoder and 40
  decoder tokens (enough for the most a sample can mask: 1 + 2 x 18).
- ``esm-tiny``: a 2-layer, 64-wide ESM-2 (rotary, pre-LN, GELU, ``token_dropout``)
  with ESM-2's 33-token alphabet, on synthetic protein families (``data.mock``,
  :mod:`epochal.train.inputs.synthetic_proteins`) or ``--data.protein_path=FILE``;
  BioNeMo's samples (a member per cluster, cropped to 128 tokens, 15% / 80-10-10
  masks drawn per ``EpochIndex``) for 200 steps, about 5 epochs of the synthetic
  clusters; BioNeMo's optimizer recipe (below). Seconds on a CPU.
- ``esm2-8m``: ESM-2 8M's shape (``facebook/esm2_t6_8M_UR50D``: 6 layers, hidden 320,
  20 heads, FFN 1280, LayerNorm eps 1e-5, no dropout, ``token_dropout``), 1024 tokens;
  BioNeMo's recipe: Adam betas 0.9 / 0.98, eps 1e-8, lr 4e-4 (min 4e-5), weight decay
  0.01, linear warmup (2000 of 500,000 steps: a fraction of 0.004) then linear decay,
  clip 1.0. Needs a protein source.
- Every preset trains layout-invariant (``training.layout_invariant``: the same bits
  on any number of data-parallel processes and accumulation steps).
- Warmup is a fraction of the decay (``scheduler.lr_warmup_fraction``: 30 of 300
  steps, 700 of 20000), so ``--training.train_iters=20`` shortens it with the run.
- ``gpt2-small``: GPT-2 124M (learned positions, LayerNorm, tanh-GELU, tied
  embeddings, dropout 0.1), 1024 tokens, GPT-2's BPE, global batch 512,
  nanoGPT/Megatron-like schedule. Needs ``data.data_path``.
- ``gpu-1b``: a first job for one GPU (H100-class, 80 GB): a Llama-style 1.34B model
  (hidden 2048, 24 layers, 16 heads, SwiGLU 5632, RMSNorm, RoPE, untied head,
  vocabulary 50304 = GPT-2's padded), 2048 tokens, micro-batch 4 x 8 = 32 sequences
  per step, bfloat16 autocast, compiled blocks with the loss compiled, fused AdamW;
  on Megatron's mock corpus unless ``data.data_path`` (GPT-2 BPE ``.bin``/``.idx``,
  with ``data.vocab_file`` / ``data.merge_file``) is given. Its throughput is
  ``benchmarks/bench_gpu.py``'s ``epochal train`` row.
"""

from __future__ import annotations

import copy
import difflib
from typing import Any

from epochal.data.sft.examples import CHAT_FILE, TOKENIZER_DIR
from epochal.model.config import ConfigError

__all__ = ["PRESETS", "PRESET_SUMMARIES", "preset_dict"]

#: ESM-2's architecture (``facebook/esm2_*``): rotary, pre-LN, GELU, ``token_dropout``,
#: the 33-token alphabet (``<mask>`` 32, ``<pad>`` 1), no dropout.
_ESM_MODEL: dict[str, Any] = {
    "type": "esm",
    "vocab_size": 33,
    "position_embedding_type": "rope",
    "normalization": "LayerNorm",
    "norm_epsilon": 1e-5,
    "activation": "gelu",
    "num_tokentypes": 0,
    "token_dropout": True,
    "mask_token_id": 32,
    "pad_token_id": 1,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "make_vocab_size_divisible_by": 64,
}
#: BioNeMo's ESM-2 optimizer recipe (besides the learning rates).
_BIONEMO_ADAM: dict[str, Any] = {
    "weight_decay": 0.01,
    "adam_beta1": 0.9,
    "adam_beta2": 0.98,
    "adam_eps": 1e-8,
    "clip_grad": 1.0,
}

#: The stdlib corpus split into sentences with a WordPiece vocabulary trained on it
#: (``bert-tiny``, ``t5-tiny``).
_STDLIB_WORDPIECE_DATA: dict[str, Any] = {
    "corpus": "stdlib",
    "corpus_max_bytes": 1_000_000,
    "split_sentences": True,
    "wordpiece_vocab_size": 4096,
}
#: The schedule, optimizer and bookkeeping of ``bert-tiny`` and ``t5-tiny``.
_TINY_WORDPIECE_RECIPE: dict[str, Any] = {
    "training": {
        "layout_invariant": True,
        "micro_batch_size": 8,
        "global_batch_size": 16,
        "train_iters": 300,
        "eval_interval": 100,
        "eval_iters": 2,
        "seed": 1234,
    },
    "optimizer": {"lr": 1e-3, "min_lr": 1e-4, "weight_decay": 0.01, "clip_grad": 1.0},
    "scheduler": {"lr_decay_style": "linear", "lr_warmup_fraction": 0.1},
    "checkpoint": {"save_interval": 100, "keep_last": 2},
    "logging": {"log_interval": 10},
}


#: The tiny Llama-style model of ``tiny`` and ``sft-tiny`` (1.3M parameters).
_TINY_MODEL: dict[str, Any] = {
    "hidden_size": 128,
    "num_layers": 4,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "position_embedding_type": "rope",
    "normalization": "RMSNorm",
    "activation": "swiglu",
    "ffn_hidden_size": 384,
    "add_bias_linear": False,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "make_vocab_size_divisible_by": 128,
}

#: ``tiny``'s corpus (Python's standard library) and BPE tokenizer, shared by ``moe-tiny``.
_TINY_DATA: dict[str, Any] = {
    "corpus": "stdlib",
    "corpus_max_bytes": 3_000_000,
    "bpe_vocab_size": 4096,
    "seq_length": 128,
    "split": "98,2,0",
}
#: ``tiny``'s optimizer and learning-rate schedule.
_TINY_OPTIMIZER: dict[str, Any] = {
    "lr": 2e-3,
    "min_lr": 2e-4,
    "weight_decay": 0.1,
    "adam_beta2": 0.95,
    "clip_grad": 1.0,
}
_TINY_SCHEDULER: dict[str, Any] = {"lr_decay_style": "cosine", "lr_warmup_fraction": 0.1}

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "model": {**_TINY_MODEL},
        "data": {**_TINY_DATA},
        "training": {
            "layout_invariant": True,
            "micro_batch_size": 8,
            "global_batch_size": 16,
            "train_iters": 300,
            "eval_interval": 100,
            "eval_iters": 4,
            "seed": 1234,
        },
        "optimizer": {**_TINY_OPTIMIZER},
        "scheduler": {**_TINY_SCHEDULER},
        "checkpoint": {"save_interval": 100, "keep_last": 2},
        "logging": {"log_interval": 10},
    },
    "moe-tiny": {
        "model": {
            **_TINY_MODEL,
            "num_experts": 4,
            "moe_router_topk": 2,
            "moe_ffn_hidden_size": 192,
            "moe_aux_loss_coeff": 0.01,
            "moe_z_loss_coeff": 0.001,
        },
        "data": {**_TINY_DATA},  # tiny's corpus and tokenizer (one cache for both)
        "training": {
            "layout_invariant": True,
            "micro_batch_size": 8,
            "global_batch_size": 16,
            "train_iters": 100,
            "eval_interval": 50,
            "eval_iters": 2,
            "seed": 1234,
        },
        "optimizer": {**_TINY_OPTIMIZER},
        "scheduler": {**_TINY_SCHEDULER},
        "checkpoint": {"save_interval": 50, "keep_last": 2},
        "logging": {"log_interval": 10},
    },
    "sft-tiny": {
        "model": {**_TINY_MODEL},
        "data": {"seq_length": 128},
        "sft": {
            "train_file": str(CHAT_FILE),
            "tokenizer": str(TOKENIZER_DIR),
            "split": "90,10",
            "loss_on": "completion",
            "packing": True,
        },
        "training": {
            "layout_invariant": True,
            "micro_batch_size": 4,
            "global_batch_size": 8,
            "train_iters": 100,
            "eval_interval": 50,
            "eval_iters": 1,
            "seed": 1234,
        },
        "optimizer": {**_TINY_OPTIMIZER},
        "scheduler": {**_TINY_SCHEDULER},
        "checkpoint": {"save_interval": 50, "keep_last": 2},
        "logging": {"log_interval": 10},
    },
    "bert-tiny": {
        "model": {
            "type": "bert",
            "hidden_size": 128,
            "num_layers": 4,
            "num_attention_heads": 4,
            "ffn_hidden_size": 512,
            "position_embedding_type": "learned_absolute",
            "normalization": "LayerNorm",
            "activation": "gelu",
            "num_tokentypes": 2,
            "bert_binary_head": True,
            "hidden_dropout": 0.1,
            "attention_dropout": 0.1,
            "make_vocab_size_divisible_by": 128,
        },
        "data": {
            **_STDLIB_WORDPIECE_DATA,
            "seq_length": 128,
            "split": "90,10,0",
        },
        **_TINY_WORDPIECE_RECIPE,
    },
    "t5-tiny": {
        "model": {
            "type": "t5",
            "hidden_size": 128,
            "num_layers": 2,
            "num_attention_heads": 4,
            "ffn_hidden_size": 512,
            "position_embedding_type": "learned_absolute",
            "normalization": "LayerNorm",
            "activation": "gelu",
            "output_bias": True,
            "hidden_dropout": 0.1,
            "attention_dropout": 0.1,
            "make_vocab_size_divisible_by": 128,
        },
        "data": {
            **_STDLIB_WORDPIECE_DATA,
            "vocab_extra_ids": 100,
            "seq_length": 128,
            "seq_length_decoder": 40,
            "masking_max_ngram": 10,
            "masking_use_geometric_distribution": True,
            "split": "90,10,0",
        },
        **_TINY_WORDPIECE_RECIPE,
    },
    "esm-tiny": {
        "model": {
            **_ESM_MODEL,
            "hidden_size": 64,
            "num_layers": 2,
            "num_attention_heads": 4,
            "ffn_hidden_size": 256,
        },
        "data": {
            "mock": True,
            "tokenizer_type": "ESM2Tokenizer",
            "seq_length": 128,
            "protein_valid_fraction": 0.05,
        },
        "training": {
            "layout_invariant": True,
            "micro_batch_size": 8,
            "global_batch_size": 16,
            "train_iters": 200,
            "eval_interval": 100,
            "eval_iters": 2,
            "seed": 1234,
        },
        "optimizer": {
            "lr": 2e-3,
            "min_lr": 2e-4,
            **_BIONEMO_ADAM,
        },
        "scheduler": {"lr_decay_style": "linear", "lr_warmup_fraction": 0.1},
        "checkpoint": {"save_interval": 100, "keep_last": 2},
        "logging": {"log_interval": 20},
    },
    "esm2-8m": {
        "model": {
            **_ESM_MODEL,
            "hidden_size": 320,
            "num_layers": 6,
            "num_attention_heads": 20,
            "ffn_hidden_size": 1280,
        },
        "data": {
            "tokenizer_type": "ESM2Tokenizer",
            "seq_length": 1024,
            "protein_valid_fraction": 0.01,
        },
        "training": {
            "layout_invariant": True,
            "micro_batch_size": 8,
            "global_batch_size": 256,
            "train_iters": 500000,
            "eval_interval": 2000,
            "eval_iters": 10,
            "bf16": True,
        },
        "optimizer": {
            "lr": 4e-4,
            "min_lr": 4e-5,
            **_BIONEMO_ADAM,
        },
        "scheduler": {"lr_decay_style": "linear", "lr_warmup_fraction": 0.004},
        "checkpoint": {"save_interval": 2000, "keep_last": 3},
        "logging": {"log_interval": 10},
    },
    "gpu-1b": {
        "model": {
            "vocab_size": 50304,
            "hidden_size": 2048,
            "num_layers": 24,
            "num_attention_heads": 16,
            "num_query_groups": 16,
            "ffn_hidden_size": 5632,
            "position_embedding_type": "rope",
            "normalization": "RMSNorm",
            "norm_epsilon": 1e-5,
            "activation": "swiglu",
            "add_bias_linear": False,
            "untie_embeddings_and_output_weights": True,
            "hidden_dropout": 0.0,
            "attention_dropout": 0.0,
            "make_vocab_size_divisible_by": 128,
        },
        "data": {"mock": True, "tokenizer_type": "GPT2BPETokenizer", "seq_length": 2048},
        "training": {
            "layout_invariant": True,
            "device": "cuda",
            "micro_batch_size": 4,
            "global_batch_size": 32,
            "train_iters": 2000,
            "eval_interval": 500,
            "eval_iters": 4,
            "bf16": True,
            "compile": True,
            "compile_loss": True,
            "fused_adamw": True,
        },
        "optimizer": {
            "lr": 3e-4,
            "min_lr": 3e-5,
            "weight_decay": 0.1,
            "adam_beta2": 0.95,
            "clip_grad": 1.0,
        },
        "scheduler": {"lr_decay_style": "cosine", "lr_warmup_fraction": 0.05},
        "checkpoint": {"save_interval": 500, "keep_last": 2},
        "logging": {"log_interval": 10},
    },
    "gpt2-small": {
        "model": {
            "hidden_size": 768,
            "num_layers": 12,
            "num_attention_heads": 12,
            "max_position_embeddings": 1024,
            "position_embedding_type": "learned_absolute",
            "normalization": "LayerNorm",
            "activation": "gelu_tanh",
            "hidden_dropout": 0.1,
            "attention_dropout": 0.1,
        },
        "data": {"tokenizer_type": "GPT2BPETokenizer", "seq_length": 1024, "split": "969,30,1"},
        "training": {
            "layout_invariant": True,
            "micro_batch_size": 8,
            "global_batch_size": 512,
            "train_iters": 20000,
            "eval_interval": 1000,
            "eval_iters": 10,
            "bf16": True,
        },
        "optimizer": {
            "lr": 6e-4,
            "min_lr": 6e-5,
            "weight_decay": 0.1,
            "adam_beta2": 0.95,
            "clip_grad": 1.0,
        },
        "scheduler": {"lr_decay_style": "cosine", "lr_warmup_fraction": 0.035},
        "checkpoint": {"save_interval": 1000, "keep_last": 3},
        "logging": {"log_interval": 10},
    },
}


#: One line per preset, shown by ``epochal train --help`` (a test requires one for each preset).
PRESET_SUMMARIES: dict[str, str] = {
    "tiny": "a 4-layer Llama-style GPT on Python's standard library, 300 steps; CPU, minutes",
    "moe-tiny": "tiny with 4 experts, top-2, in every block, 100 steps; CPU, about three minutes",
    "sft-tiny": "the tiny GPT fine-tuned on chat rows shipped with the package, packed; CPU",
    "bert-tiny": "a 4-layer BERT (masked LM + next sentence) on the standard library's sentences",
    "t5-tiny": "a 2+2-layer T5 with Megatron's span corruption on the same sentences",
    "esm-tiny": "a 2-layer ESM-2 on synthetic protein families (or --data.protein_path=FILE)",
    "esm2-8m": "ESM-2 8M's shape and BioNeMo's recipe; needs a protein source",
    "gpt2-small": "GPT-2 124M, 1024 tokens, GPT-2's BPE; needs --data.data_path",
    "gpu-1b": "a 1.3B Llama-style GPT for one 80 GB GPU, bf16, compiled; mock data by default",
}


def preset_dict(name: str) -> dict[str, Any]:
    """A deep copy of preset ``name``.

    Raises:
        ConfigError: unknown name (lists the known ones).
    """
    if name not in PRESETS:
        near = difflib.get_close_matches(name, list(PRESETS), n=2, cutoff=0.5)
        hint = f"did you mean {' or '.join(near)}? " if near else ""
        raise ConfigError("preset", f"unknown preset {name!r}; {hint}(known: {', '.join(PRESETS)})")
    return copy.deepcopy(PRESETS[name])
