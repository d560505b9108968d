"""Named configurations: ``tiny`` (the CPU demo), ``moe-tiny``, ``long-tiny``, ``sft-tiny``, ``bert-tiny``,
``t5-tiny``, ``esm-tiny``, ``esm2-8m``, ``gpt2-small``, ``gpu-1b``.

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
- ``long-tiny``: ``tiny``'s model on 4096-token sequences of its corpus, each split over
  two processes (``parallel.context_parallel = 2``, Megatron's load-balanced chunks;
  attention by an all-to-all of heads, ``parallel.context_parallel_exchange = "a2a"``),
  one sequence per micro-batch and 4 per step, 60 steps (about ten minutes on 2 CPU
  cores). Layout-invariant like every
  preset, so the run resumes or replays bit for bit on one process, and scales by raising
  ``data.seq_length`` and ``parallel.context_parallel`` together.
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

from epochal._checks import ConfigError
from epochal.data.sft.examples import CHAT_FILE, TOKENIZER_DIR
from epochal.train.config.merge import DROP, Replace, deep_merge

__all__ = ["PRESETS", "PRESET_SUMMARIES", "preset_dict"]

#: ``tiny``: a 4-layer Llama-style GPT (1.3M parameters) on Python's standard library with a
#: BPE tokenizer trained on it; the base of the other presets.
_TINY: dict[str, Any] = {
    "model": {
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
    },
    "data": {
        "corpus": "stdlib",
        "corpus_max_bytes": 3_000_000,
        "bpe_vocab_size": 4096,
        "seq_length": 128,
        "split": "98,2,0",
    },
    "training": {
        "layout_invariant": True,
        "micro_batch_size": 8,
        "global_batch_size": 16,
        "train_iters": 300,
        "eval_interval": 100,
        "eval_iters": 4,
        "seed": 1234,
    },
    "optimizer": {
        "lr": 2e-3,
        "min_lr": 2e-4,
        "weight_decay": 0.1,
        "adam_beta2": 0.95,
        "clip_grad": 1.0,
    },
    "scheduler": {"lr_decay_style": "cosine", "lr_warmup_fraction": 0.1},
    "checkpoint": {"save_interval": 100, "keep_last": 2},
    "logging": {"log_interval": 10},
}

#: ``tiny``'s model with experts, on its corpus and tokenizer (one cache for both).
_MOE_TINY = deep_merge(
    _TINY,
    {
        "model": {
            "num_experts": 4,
            "moe_router_topk": 2,
            "moe_ffn_hidden_size": 192,
            "moe_aux_loss_coeff": 0.01,
            "moe_z_loss_coeff": 0.001,
        },
        "training": {"train_iters": 100, "eval_interval": 50, "eval_iters": 2},
        "checkpoint": {"save_interval": 50},
    },
)

#: ``tiny``'s model on sequences of 4096 tokens, each split over two context-parallel ranks.
_LONG_TINY = deep_merge(
    _TINY,
    {
        "data": {"seq_length": 4096},
        "parallel": {"context_parallel": 2, "context_parallel_exchange": "a2a"},
        "training": {
            "micro_batch_size": 1,
            "global_batch_size": 4,
            "train_iters": 60,
            "eval_interval": 30,
            "eval_iters": 2,
        },
        "checkpoint": {"save_interval": 30},
    },
)

#: ``tiny``'s model fine-tuned on the chat rows shipped with the package (they replace the corpus).
_SFT_TINY = deep_merge(
    _TINY,
    {
        "data": Replace({"seq_length": 128}),
        "sft": {
            "train_file": str(CHAT_FILE),
            "tokenizer": str(TOKENIZER_DIR),
            "split": "90,10",
            "loss_on": "completion",
            "packing": True,
        },
        "training": {
            "micro_batch_size": 4,
            "global_batch_size": 8,
            "train_iters": 100,
            "eval_interval": 50,
            "eval_iters": 1,
        },
        "checkpoint": {"save_interval": 50},
    },
)

#: ``tiny``'s schedule and bookkeeping for a Megatron-style BERT on the standard library split
#: into sentences, with a WordPiece vocabulary trained on them.
_BERT_TINY = deep_merge(
    _TINY,
    {
        "model": Replace(
            {
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
            }
        ),
        "data": Replace(
            {
                "corpus": "stdlib",
                "corpus_max_bytes": 1_000_000,
                "split_sentences": True,
                "wordpiece_vocab_size": 4096,
                "seq_length": 128,
                "split": "90,10,0",
            }
        ),
        "training": {"eval_iters": 2},
        "optimizer": Replace({"lr": 1e-3, "min_lr": 1e-4, "weight_decay": 0.01, "clip_grad": 1.0}),
        "scheduler": {"lr_decay_style": "linear"},
    },
)

#: ``bert-tiny``'s encoder shape as a Megatron-style T5 (2 + 2 blocks, the tied head with a bias)
#: on its corpus and vocabulary with 100 sentinels and Megatron's span corruption.
_T5_TINY = deep_merge(
    _BERT_TINY,
    {
        "model": {
            "type": "t5",
            "num_layers": 2,
            "num_tokentypes": DROP,
            "bert_binary_head": DROP,
            "output_bias": True,
        },
        "data": {
            "vocab_extra_ids": 100,
            "seq_length_decoder": 40,
            "masking_max_ngram": 10,
            "masking_use_geometric_distribution": True,
        },
    },
)

#: BioNeMo's ESM-2 optimizer recipe (besides the learning rates).
_BIONEMO_ADAM: dict[str, Any] = {
    "weight_decay": 0.01,
    "adam_beta1": 0.9,
    "adam_beta2": 0.98,
    "adam_eps": 1e-8,
    "clip_grad": 1.0,
}

#: A 2-layer ESM-2 (its architecture, ``facebook/esm2_*``: rotary, pre-LN, GELU,
#: ``token_dropout``, the 33-token alphabet with ``<mask>`` 32 and ``<pad>`` 1, no dropout) on
#: synthetic protein families, with ``tiny``'s bookkeeping and BioNeMo's optimizer.
_ESM_TINY = deep_merge(
    _TINY,
    {
        "model": Replace(
            {
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
                "hidden_size": 64,
                "num_layers": 2,
                "num_attention_heads": 4,
                "ffn_hidden_size": 256,
            }
        ),
        "data": Replace(
            {
                "mock": True,
                "tokenizer_type": "ESM2Tokenizer",
                "seq_length": 128,
                "protein_valid_fraction": 0.05,
            }
        ),
        "training": {"train_iters": 200, "eval_iters": 2},
        "optimizer": Replace({"lr": 2e-3, "min_lr": 2e-4, **_BIONEMO_ADAM}),
        "scheduler": {"lr_decay_style": "linear"},
        "logging": {"log_interval": 20},
    },
)

#: ESM-2 8M's shape with BioNeMo's recipe; a protein source must be given.
_ESM2_8M = deep_merge(
    _ESM_TINY,
    {
        "model": {
            "hidden_size": 320,
            "num_layers": 6,
            "num_attention_heads": 20,
            "ffn_hidden_size": 1280,
        },
        "data": {"mock": DROP, "seq_length": 1024, "protein_valid_fraction": 0.01},
        "training": {
            "global_batch_size": 256,
            "train_iters": 500000,
            "eval_interval": 2000,
            "eval_iters": 10,
            "seed": DROP,
            "bf16": True,
        },
        "optimizer": {"lr": 4e-4, "min_lr": 4e-5},
        "scheduler": {"lr_warmup_fraction": 0.004},
        "checkpoint": {"save_interval": 2000, "keep_last": 3},
        "logging": {"log_interval": 10},
    },
)

#: ``tiny``'s architecture at 1.34B parameters, for one 80 GB GPU.
_GPU_1B = deep_merge(
    _TINY,
    {
        "model": {
            "vocab_size": 50304,
            "hidden_size": 2048,
            "num_layers": 24,
            "num_attention_heads": 16,
            "num_query_groups": 16,
            "ffn_hidden_size": 5632,
            "norm_epsilon": 1e-5,
            "untie_embeddings_and_output_weights": True,
        },
        "data": Replace({"mock": True, "tokenizer_type": "GPT2BPETokenizer", "seq_length": 2048}),
        "training": {
            "device": "cuda",
            "micro_batch_size": 4,
            "global_batch_size": 32,
            "train_iters": 2000,
            "eval_interval": 500,
            "seed": DROP,
            "bf16": True,
            "compile": True,
            "compile_loss": True,
            "fused_adamw": True,
        },
        "optimizer": {"lr": 3e-4, "min_lr": 3e-5},
        "scheduler": {"lr_warmup_fraction": 0.05},
        "checkpoint": {"save_interval": 500},
    },
)

#: GPT-2 124M with ``tiny``'s optimizer shape and a nanoGPT/Megatron-like schedule.
_GPT2_SMALL = deep_merge(
    _TINY,
    {
        "model": Replace(
            {
                "hidden_size": 768,
                "num_layers": 12,
                "num_attention_heads": 12,
                "max_position_embeddings": 1024,
                "position_embedding_type": "learned_absolute",
                "normalization": "LayerNorm",
                "activation": "gelu_tanh",
                "hidden_dropout": 0.1,
                "attention_dropout": 0.1,
            }
        ),
        "data": Replace(
            {"tokenizer_type": "GPT2BPETokenizer", "seq_length": 1024, "split": "969,30,1"}
        ),
        "training": {
            "global_batch_size": 512,
            "train_iters": 20000,
            "eval_interval": 1000,
            "eval_iters": 10,
            "seed": DROP,
            "bf16": True,
        },
        "optimizer": {"lr": 6e-4, "min_lr": 6e-5},
        "scheduler": {"lr_warmup_fraction": 0.035},
        "checkpoint": {"save_interval": 1000, "keep_last": 3},
    },
)

#: Every preset, resolved (a nested dict in the TOML layout).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": _TINY,
    "moe-tiny": _MOE_TINY,
    "long-tiny": _LONG_TINY,
    "sft-tiny": _SFT_TINY,
    "bert-tiny": _BERT_TINY,
    "t5-tiny": _T5_TINY,
    "esm-tiny": _ESM_TINY,
    "esm2-8m": _ESM2_8M,
    "gpu-1b": _GPU_1B,
    "gpt2-small": _GPT2_SMALL,
}


#: One line per preset, shown by ``epochal train --help`` (a test requires one for each preset).
PRESET_SUMMARIES: dict[str, str] = {
    "tiny": "a 4-layer Llama-style GPT on Python's standard library, 300 steps; CPU, minutes",
    "moe-tiny": "tiny with 4 experts, top-2, in every block, 100 steps; CPU, about three minutes",
    "long-tiny": "tiny on 4096-token sequences, each split over 2 processes (context parallelism)",
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
