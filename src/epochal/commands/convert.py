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
single-file export (:func:`epochal.convert.epochal_ckpt.save_consolidated`: the
format of ``export_consolidated``, plus the config, step and run configuration
in its metadata, so ``epochal generate`` and ``convert`` read it on its own).
Outputs are written to a temporary name and renamed when complete; an existing
output is only replaced with ``--overwrite``. Exit status 0 on success, 2 on a
bad input or option (the message names the file or option).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

__all__ = ["add_arguments", "detect_format", "run"]

FORMATS = ("epochal", "hf", "megatron")
TARGETS = (*FORMATS, "safetensors")
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
        choices=("gpt2", "llama", "bert", "megatron-bert", "esm", "t5", "mt5"),
        default=None,
        help="HF output class (default: GPT -> gpt2 for learned positions, llama for RoPE; "
        "BERT -> bert (post-LN) or megatron-bert (pre-LN); ESM -> esm; T5 -> t5 (or mt5))",
    )
    group.add_argument(
        "--tensor-parallel", type=int, default=1, help="Megatron output: tensor-parallel size"
    )
    group.add_argument(
        "--pipeline-parallel", type=int, default=1, help="Megatron output: pipeline size"
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
        "--bos-token-id", type=int, default=None, help="HF output: bos_token_id in config.json"
    )
    group.add_argument(
        "--eos-token-id", type=int, default=None, help="HF output: eos_token_id in config.json"
    )
    group.add_argument(
        "--pad-token-id",
        type=int,
        default=None,
        help="HF output: pad_token_id in config.json (default: the tokenizer's pad token, else eos)",
    )
    group.add_argument("--overwrite", action="store_true", help="replace an existing output")


def detect_format(path: str | Path) -> str:
    """``"hf"``, ``"megatron"`` or ``"epochal"`` for a checkpoint folder.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    from epochal.convert.megatron.legacy import TRACKER_FILE
    from epochal.convert.megatron.nemo2 import is_nemo2
    from epochal.convert.megatron.torch_dist import is_torch_dist

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    if (path / "config.json").is_file():
        return "hf"
    if (path / TRACKER_FILE).is_file() or is_torch_dist(path) or is_nemo2(path):
        return "megatron"
    if path.is_dir():
        children = [p.name for p in path.iterdir()]
        if any(n.startswith("mp_rank_") for n in children) or any(
            n.startswith("iter_") for n in children
        ):
            return "megatron"
    return "epochal"


def _load(args: argparse.Namespace, fmt: str) -> tuple:
    """Returns ``(config, state, step, extra)`` (extra: HF token ids)."""
    if args.model_config is not None and fmt != "megatron":
        raise ValueError(f"--model-config applies to NeMo 2 checkpoints; {args.input} is {fmt}")
    if fmt == "hf":
        from epochal.convert.hf.io import load_hf_checkpoint

        hf = load_hf_checkpoint(
            args.input, make_vocab_size_divisible_by=args.make_vocab_size_divisible_by or 128
        )
        eos = hf.eos_token_ids
        eos = eos[0] if len(eos) == 1 else (list(eos) or None)
        return hf.config, hf.state, 0, {"bos": hf.bos_token_id, "eos": eos}
    if fmt == "megatron":
        from epochal.convert.megatron.legacy import load_megatron_checkpoint

        ck = load_megatron_checkpoint(
            args.input,
            iteration=args.iteration,
            vocab_size=args.vocab_size,
            make_vocab_size_divisible_by=args.make_vocab_size_divisible_by,
            model_config=args.model_config,
        )
        return ck.config, ck.state, ck.iteration or 0, {}
    from epochal.convert.epochal_ckpt import load_epochal_checkpoint

    ck = load_epochal_checkpoint(args.input, vocab_size=args.vocab_size)
    return ck.config, ck.state, ck.step, {**_run_tokenizer_info(ck), "run_config": ck.run_config}


def _run_tokenizer_info(ck) -> dict:
    """BOS/EOS/PAD ids and a ``tokenizer.json`` of the run's tokenizer, when it can be rebuilt."""
    from epochal.convert.epochal_ckpt import run_tokenizer

    tokenizer = run_tokenizer(ck)
    if tokenizer is None:
        return {}
    info = {
        "bos": getattr(tokenizer, "bos", None),
        "eos": getattr(tokenizer, "eod", None),
        "pad": getattr(tokenizer, "pad", None),
    }
    source = getattr(tokenizer, "source", None)
    if isinstance(source, str) and source.endswith(".json") and Path(source).is_file():
        info["tokenizer_json"] = source
    return info


def _save(args: argparse.Namespace, fmt: str, config, state, step: int, extra: dict) -> tuple:
    """Write ``args.target``; returns ``(output path, layout note for the summary)``."""
    dtype = DTYPES[args.dtype] if args.dtype else None
    source = f"{fmt}:{args.input}"
    if args.target == "hf" and getattr(config, "head", "mlm") != "mlm":
        from epochal.convert.hf.encoder import save_hf_encoder

        out = save_hf_encoder(config, state, args.output, dtype=dtype, overwrite=args.overwrite)
        return out, f", encoder as {config.type}'s bare model + epochal_head.safetensors"
    if args.target == "hf":
        from epochal.convert.hf.io import save_hf_checkpoint

        eos = extra.get("eos") if args.eos_token_id is None else args.eos_token_id
        pad = extra.get("pad") if args.pad_token_id is None else args.pad_token_id
        if pad is None and extra.get("tokenizer_json"):  # a padding token for AutoTokenizer
            pad = eos[0] if isinstance(eos, list) and eos else eos
        out = save_hf_checkpoint(
            config,
            state,
            args.output,
            architecture=args.hf_architecture,
            dtype=dtype,
            bos_token_id=extra.get("bos") if args.bos_token_id is None else args.bos_token_id,
            eos_token_id=eos,
            pad_token_id=pad,
            # the run's tokenizer next to the weights, its special tokens matching config.json
            tokenizer_file=extra.get("tokenizer_json"),
            overwrite=args.overwrite,
        )
        return out, ""
    if args.target == "megatron":
        from epochal.convert.megatron.legacy import save_megatron_checkpoint

        out = save_megatron_checkpoint(
            config,
            state,
            args.output,
            tensor_parallel=args.tensor_parallel,
            pipeline_parallel=args.pipeline_parallel,
            iteration=step if args.megatron_iteration is None else args.megatron_iteration,
            spec=args.megatron_spec,
            ckpt_format=args.ckpt_format,
            dtype=dtype,
            overwrite=args.overwrite,
        )
        return out, f", TP{args.tensor_parallel} x PP{args.pipeline_parallel}"
    if args.target == "safetensors":
        from epochal.convert.epochal_ckpt import save_consolidated

        out = save_consolidated(
            config,
            state,
            args.output,
            step=step,
            run_config=extra.get("run_config"),
            source=source,
            dtype=dtype,
            overwrite=args.overwrite,
        )
        return out, ""
    from epochal.convert.epochal_ckpt import save_epochal_checkpoint

    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    return save_epochal_checkpoint(
        config, state, args.output, source=source, overwrite=args.overwrite
    ), ""


def merge_adapters(config, state) -> tuple:
    """``(config, state, note)`` with LoRA adapters folded into the weights (a plain model).

    Every export of a LoRA run is the merged model (``W + (alpha / r) B A``,
    :func:`epochal.model.lora.merge_lora_state`); ``note`` says so in the summary.
    """
    if not getattr(config, "lora_rank", 0):
        return config, state, ""
    import dataclasses

    from epochal.model.lora import merge_lora_state

    merged = merge_lora_state(state, config)
    plain = dataclasses.replace(config, lora_rank=0, freeze_encoder=False)
    return plain, merged, f", LoRA rank {config.lora_rank} adapters merged"


def run(args: argparse.Namespace) -> int:
    """Convert ``args.input`` to ``args.target``; print a one-line summary.

    Returns 2 with a one-line message for a bad input, option or output path
    (every ``ValueError``/``OSError``: ``ConversionError``, ``UnsafeCheckpointError``,
    ``CheckpointError``, ``ConfigError``, missing files, an existing output).
    """
    t0 = time.perf_counter()
    try:
        fmt = detect_format(args.input) if args.source == "auto" else args.source
        config, state, step, extra = _load(args, fmt)
        config, state, merged = merge_adapters(config, state)
        out, layout = _save(args, fmt, config, state, step, extra)
        layout += merged
    except (ValueError, OSError) as exc:
        print(f"epochal convert: error: {exc}", file=sys.stderr)
        return 2
    params = sum(
        t.numel()
        for name, t in state.items()
        if not (config.tie_embeddings and name == "output.weight")
    )
    print(
        f"converted {fmt}:{args.input} -> {args.target}:{out} ({config.num_layers} layers, "
        f"{params / 1e6:.1f}M parameters{layout}) in {time.perf_counter() - t0:.2f} s"
    )
    return 0
