"""``epochal convert``: move a model between epochal, Hugging Face and Megatron-LM checkpoints.

Examples::

    epochal convert runs/tiny hf/tiny --to hf                 # our checkpoint -> LlamaForCausalLM
    epochal convert hf/gpt2 runs/gpt2 --to epochal            # GPT2LMHeadModel -> model-only run dir
    epochal convert runs/tiny megatron/tiny --to megatron --tensor-parallel 2 --pipeline-parallel 2
    epochal convert megatron/tiny hf/tiny --to hf --vocab-size 4096
    epochal convert runs/tiny tiny.safetensors --to safetensors   # one file for inference

The input format is detected (``config.json`` -> Hugging Face;
``latest_checkpointed_iteration.txt``, ``mp_rank_*`` folders or a ``torch_dist`` folder
-> Megatron-LM; ``weights/`` + ``context/`` -> NeMo 2 (read as Megatron, see
:mod:`epochal.convert.megatron.nemo2`, ``--model-config``);
otherwise an epochal run/checkpoint folder or consolidated ``.safetensors``
file) unless ``--from`` names it. ``--to safetensors`` writes the consolidated
single-file export (:func:`epochal.train.state.epochal_ckpt.save_consolidated`: the
format of ``export_consolidated``, plus the config, step and run configuration
in its metadata, so ``epochal generate`` and ``convert`` read it on its own).
Outputs are written to a temporary name and renamed when complete; an existing
output is only replaced with ``--overwrite``, and an output that is the input, contains
it or lies inside it is refused (replacing it would delete the input). ``--overwrite``
replaces only an earlier output of ``epochal convert`` (a Hugging Face or Megatron
folder, a model-only run directory, a consolidated file): another run's directory, a
checkpoint, a ``save_state`` folder, a path inside one of them, or a file another
command wrote is refused (:mod:`epochal._ownership`). Exit status 0 on success, 2 on a
bad input or option (the message names the file or option).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import get_args

import torch

from epochal.convert.formats import (
    FORMATS,
    TARGETS,
    detect_format,
    load_checkpoint,
    save_checkpoint,
)
from epochal.formats.hf.io import Architecture

__all__ = ["add_arguments", "detect_format", "run"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``epochal convert``."""
    parser.add_argument("input", help="input checkpoint (folder)")
    parser.add_argument(
        "output",
        help="output folder (a Megatron save dir, a HF model dir or a run dir), "
        "or the .safetensors file of --to safetensors",
    )
    parser.add_argument("--to", dest="target", choices=TARGETS, required=True, help="output format")
    parser.add_argument(
        "--from", dest="source", choices=("auto", *FORMATS), default="auto", help="input format"
    )
    group = parser.add_argument_group("input options")
    group.add_argument(
        "--iteration", type=int, default=None, help="Megatron input: iteration to read"
    )
    group.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="unpadded vocabulary size when the input lacks it",
    )
    group.add_argument(
        "--make-vocab-size-divisible-by",
        type=int,
        default=None,
        help="our vocabulary padding multiple (default: the input's, else 128)",
    )
    group.add_argument(
        "--model-config",
        default=None,
        help="NeMo 2 input: a JSON/YAML file of Megatron-Core config fields (num_layers, "
        "num_attention_heads, rotary_base, ...) completing or replacing context/model.yaml",
    )
    group = parser.add_argument_group("output options")
    group.add_argument(
        "--hf-architecture",
        choices=get_args(Architecture),
        default=None,
        help="HF output class (default: GPT -> gpt2 for learned positions; with RoPE and "
        "experts glm4_moe for sigmoid routing, qwen3_moe for QK-norm, qwen2_moe for a shared "
        "expert, else mixtral; with RoPE qwen3 "
        "for QK-norm, qwen2 for biases on q/k/v only, mistral for a sliding window, else llama; "
        "BERT -> bert (post-LN) or megatron-bert (pre-LN); ESM -> esm; T5 -> t5 (or mt5))",
    )
    group.add_argument(
        "--tensor-parallel", type=int, default=1, help="Megatron output: tensor-parallel size"
    )
    group.add_argument(
        "--pipeline-parallel", type=int, default=1, help="Megatron output: pipeline size"
    )
    group.add_argument(
        "--expert-parallel",
        type=int,
        default=1,
        help="Megatron output (legacy files, mixture of experts): expert-parallel size",
    )
    group.add_argument(
        "--ckpt-format",
        choices=("torch", "torch_dist"),
        default="torch",
        help="Megatron output: legacy mp_rank_* files (torch, default) or Megatron-LM's "
        "default distributed format (torch_dist; --tensor-parallel = the loading job's TP, "
        "for the vocabulary padding)",
    )
    group.add_argument(
        "--megatron-spec",
        choices=("transformer_engine", "local"),
        default="transformer_engine",
        help="Megatron output: layer-spec parameter names",
    )
    group.add_argument(
        "--megatron-iteration",
        type=int,
        default=None,
        help="Megatron output: iteration number (default: the input's step, else 0)",
    )
    group.add_argument(
        "--dtype", choices=tuple(DTYPES), default=None, help="cast the weights (default: keep)"
    )
    group.add_argument(
        "--bos-token-id",
        type=int,
        default=None,
        help="HF output: bos_token_id in config.json (epochal output: the id it records)",
    )
    group.add_argument(
        "--eos-token-id",
        type=int,
        default=None,
        help="HF output: eos_token_id in config.json (epochal output: the id it records)",
    )
    group.add_argument(
        "--pad-token-id",
        type=int,
        default=None,
        help="HF output: pad_token_id in config.json (default: the tokenizer's pad token, else eos; "
        "epochal output: the id it records)",
    )
    tokenizers = group.add_mutually_exclusive_group()
    tokenizers.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help="HF output: ship this Hugging Face tokenizer folder (its chat template, special "
        "tokens and ids) instead of the run's",
    )
    tokenizers.add_argument(
        "--no-tokenizer",
        action="store_true",
        help="HF output: write the weights without a tokenizer and generation config (a "
        "fine-tuning run whose tokenizer folder is gone needs this or --tokenizer)",
    )
    group.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing output that epochal convert wrote",
    )


def run(args: argparse.Namespace) -> int:
    """Convert ``args.input`` to ``args.target``; print a one-line summary.

    Returns 2 with a one-line message for a bad input, option or output path
    (every ``ValueError``/``OSError``: ``ConversionError``, ``UnsafeCheckpointError``,
    ``CheckpointError``, ``ConfigError``, missing files, an existing output).
    """
    t0 = time.perf_counter()
    from epochal._ownership import CONVERTED, CONVERTED_RUN, check_writable
    from epochal._paths import check_output_apart

    try:
        # before anything is read or written: replacing the output must never delete the input
        check_output_apart(args.input, args.output)
        # nor replace (even with --overwrite) or write into another run's or command's output
        check_writable(
            args.output,
            writer="convert",
            option="output",
            own=frozenset({CONVERTED, CONVERTED_RUN}),
        )
        ck = load_checkpoint(
            args.input,
            args.source,
            iteration=args.iteration,
            vocab_size=args.vocab_size,
            make_vocab_size_divisible_by=args.make_vocab_size_divisible_by,
            model_config=args.model_config,
        )
        out = save_checkpoint(
            ck,
            args.output,
            args.target,
            source=f"{ck.format}:{args.input}",
            dtype=DTYPES[args.dtype] if args.dtype else None,
            overwrite=args.overwrite,
            hf_architecture=args.hf_architecture,
            bos_token_id=args.bos_token_id,
            eos_token_id=args.eos_token_id,
            pad_token_id=args.pad_token_id,
            tensor_parallel=args.tensor_parallel,
            pipeline_parallel=args.pipeline_parallel,
            expert_parallel=args.expert_parallel,
            megatron_iteration=args.megatron_iteration,
            megatron_spec=args.megatron_spec,
            ckpt_format=args.ckpt_format,
            tokenizer=args.tokenizer,
            no_tokenizer=args.no_tokenizer,
        )
    except (ValueError, OSError) as exc:
        print(f"epochal convert: error: {exc}", file=sys.stderr)
        return 2
    config, state = ck.config, ck.state
    layout = (
        f", TP{args.tensor_parallel} x PP{args.pipeline_parallel}"
        + (f" x EP{args.expert_parallel}" if args.expert_parallel > 1 else "")
        if args.target == "megatron"
        else ""
    )
    params = sum(
        t.numel()
        for name, t in state.items()
        if not (config.tie_embeddings and name == "output.weight")
    )
    print(
        f"converted {ck.format}:{args.input} -> {args.target}:{out} ({config.num_layers} layers, "
        f"{params / 1e6:.1f}M parameters{layout}) in {time.perf_counter() - t0:.2f} s"
    )
    return 0
