"""``epochal generate``: sample text from a checkpoint (greedy, top-k/top-p sampling, beam search).

Examples::

    epochal generate --checkpoint runs/tiny --prompt "def main(" --max-new-tokens 40
    epochal generate --checkpoint hf/gpt2 --prompt "Hello" --do-sample --top-p 0.9 --seed 1
    epochal generate --checkpoint runs/tiny --prompt-file prompts.txt --num-beams 4 --output out.jsonl
    epochal generate --checkpoint runs/tiny --prompt "x = " --tensor-parallel 2   # launches torchrun

The checkpoint may be an epochal run / checkpoint folder (any parallel layout),
a Hugging Face GPT-2/Llama/T5 folder or a Megatron-LM legacy checkpoint (detected
as in ``epochal convert``). For a T5 (encoder-decoder) model the prompt is the
encoder's input and the output is the decoder's continuation from the decoder
start token (the model's pad id), as Hugging Face ``generate()`` does. The tokenizer is, in order: the ``--tokenizer-*``
options, the training run's own tokenizer (rebuilt from its ``config.toml``),
or a ``tokenizer.json`` inside a Hugging Face folder; without one, prompts must
be token ids (``--prompt-ids 1,2,3``). Generation stops at a Hugging Face
model's ``eos_token_id`` (every one of a list, as ``transformers`` does), else at
the tokenizer's end-of-document token (Megatron's behaviour), and for a checkpoint
whose tokenizer has a chat template (a fine-tuning run's, a Hugging Face folder's)
also at its end-of-turn tokens, as ``--chat`` does, unless ``--no-stop-at-eod``;
``--stop-token-id`` adds stop tokens. ``--add-bos``
prepends the model's ``bos_token_id``, else the tokenizer's BOS.

With ``--chat`` every ``--prompt`` is a user message (after ``--system``'s
message when given; a ``--prompt-file`` line may also be JSON with a whole
``messages`` list), rendered by the checkpoint's chat template with the
generation prompt, exactly as ``transformers``' ``apply_chat_template(messages,
add_generation_prompt=True)`` renders it; generation stops at the end of the
assistant's turn (the template's EOS and end-of-turn tokens such as
``<|im_end|>`` / ``<|eot_id|>``, a Hugging Face folder's ``generation_config.json``
eos ids, ``--stop`` tokens) and only the assistant's reply is printed. The chat
template is the fine-tuning run's tokenizer folder (``sft.tokenizer`` /
``checkpoint.init_from``, recorded in its ``config.toml``), a Hugging Face
folder's ``tokenizer_config.json`` / ``chat_template.jinja``, or the folder
``--tokenizer-model`` names.

With ``--tensor-parallel N`` the model is sharded over N processes
(``epochal.parallel``'s tensor-parallel plan, gathered logits); every rank runs
the same generation and rank 0 prints. With ``--invariant-degree D`` (GPT models)
every product and the attention run in the canonical units of
:mod:`epochal.parallel.canonical_plan`, so one process and every ``N`` dividing ``D``
give the same logits bit for bit, hence the same tokens. Outside ``torchrun`` the command
re-launches itself under it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from epochal._text import plural

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``epochal generate``."""
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="epochal run/checkpoint, HF folder or Megatron checkpoint",
    )
    parser.add_argument("--format", choices=("auto", "epochal", "hf", "megatron"), default="auto")
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="unpadded vocabulary if the checkpoint lacks it",
    )
    src = parser.add_argument_group("prompts")
    src.add_argument("--prompt", action="append", default=[], help="a text prompt (repeatable)")
    src.add_argument(
        "--prompt-file", default=None, help="text file, one prompt per line (or JSONL with 'text')"
    )
    src.add_argument(
        "--prompt-ids", action="append", default=[], help="comma-separated token ids (repeatable)"
    )
    src.add_argument(
        "--chat",
        action="store_true",
        help="prompts are user messages, rendered by the chat template; print the reply",
    )
    src.add_argument("--system", default=None, help="--chat: a system message before each prompt")
    tok = parser.add_argument_group("tokenizer (default: the checkpoint's)")
    tok.add_argument(
        "--tokenizer-type",
        default=None,
        help="GPT2BPETokenizer, HuggingFaceTokenizer, TikTokenizer, ...",
    )
    tok.add_argument("--tokenizer-model", default=None)
    tok.add_argument("--vocab-file", default=None)
    tok.add_argument("--merge-file", default=None)
    dec = parser.add_argument_group("decoding")
    dec.add_argument("--max-new-tokens", type=int, default=64)
    dec.add_argument(
        "--do-sample", action="store_true", help="sample (default: greedy, or beam search)"
    )
    dec.add_argument("--temperature", type=float, default=1.0)
    dec.add_argument("--top-k", type=int, default=0)
    dec.add_argument("--top-p", type=float, default=0.0)
    dec.add_argument("--top-p-decay", type=float, default=0.0)
    dec.add_argument("--top-p-bound", type=float, default=0.0)
    dec.add_argument("--num-beams", type=int, default=1)
    dec.add_argument("--length-penalty", type=float, default=1.0)
    dec.add_argument("--early-stopping", action="store_true")
    dec.add_argument("--num-return-sequences", type=int, default=1)
    dec.add_argument("--seed", type=int, default=0)
    dec.add_argument(
        "--add-bos", action="store_true", help="prepend the tokenizer's BOS (Megatron's add_BOS)"
    )
    dec.add_argument(
        "--stop-token-id",
        type=int,
        action="append",
        default=[],
        help="extra stop token (repeatable)",
    )
    dec.add_argument(
        "--stop",
        action="append",
        default=[],
        help="extra stop token as text, one token of the vocabulary, e.g. '<|im_end|>' (repeatable)",
    )
    dec.add_argument(
        "--no-stop-at-eod",
        action="store_true",
        help="do not stop at the model's eos / the tokenizer's end-of-document token",
    )
    run_g = parser.add_argument_group("execution")
    run_g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    run_g.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    run_g.add_argument(
        "--tensor-parallel", type=int, default=1, help="shard the model over this many processes"
    )
    run_g.add_argument(
        "--invariant-degree",
        type=int,
        default=1,
        metavar="D",
        help="compute in the canonical units of parallel.invariant_degree=D (a power of two): "
        "the logits of one process and of every --tensor-parallel dividing D are the same "
        "bits, those a layout-invariant run trained with (GPT models; default 1: off)",
    )
    run_g.add_argument("--output", default=None, help="also write the results as JSONL here")


def _load_model(args: argparse.Namespace) -> Any:
    """The checkpoint (:class:`~epochal.convert.formats.ModelCheckpoint`), with the
    ``--tokenizer-*`` tokenizer when given, else the checkpoint's own."""
    from epochal.convert.formats import load_model_checkpoint

    ck = load_model_checkpoint(
        args.checkpoint,
        args.format,
        vocab_size=args.vocab_size,
        with_tokenizer=args.tokenizer_type is None,
    )
    if args.tokenizer_type is not None:
        from epochal.data.indexed.tokenizer import build_tokenizer

        ck.tokenizer = build_tokenizer(
            args.tokenizer_type,
            vocab_file=args.vocab_file,
            merge_file=args.merge_file,
            tokenizer_model=args.tokenizer_model,
        )
        _check_recorded_tokenizer(ck)
    return ck


def _check_recorded_tokenizer(ck: Any) -> None:
    """Refuse a ``--tokenizer-type`` other than the one the run's data was preprocessed with.

    Raises:
        ConfigError: naming ``--tokenizer-type`` and both tokenizers.
    """
    if not ck.run_config or "data" not in ck.run_config:
        return
    from epochal.train.config import config_from_saved
    from epochal.train.inputs.recorded_tokenizer import check_recorded_tokenizer

    try:
        data = config_from_saved(ck.run_config).data
    except ValueError:
        return  # a config this version cannot read: nothing to compare with
    check_recorded_tokenizer(
        data,
        ck.tokenizer,
        option="--tokenizer-type",
        fix="leave --tokenizer-type out to use the run's own tokenizer",
    )


def _prompts(args: argparse.Namespace, tokenizer: Any) -> tuple[list[list[int]], list[str | None]]:
    texts: list[str] = list(args.prompt)
    if args.prompt_file:
        from epochal.commands.generate_chat import prompt_file_lines

        path = Path(args.prompt_file)
        for n, line in prompt_file_lines(path):
            if line.lstrip().startswith("{"):
                try:
                    texts.append(str(json.loads(line)["text"]))
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise ValueError(
                        f"--prompt-file {path}:{n}: JSON line without a 'text' string"
                    ) from None
            else:
                texts.append(line)
    ids: list[list[int]] = []
    shown: list[str | None] = []
    if texts:
        if tokenizer is None:
            raise ValueError(
                "no tokenizer for text prompts: pass --tokenizer-type ... or use --prompt-ids"
            )
        for text in texts:
            ids.append(tokenizer.encode(text))
            shown.append(text)
    for spec in args.prompt_ids:
        try:
            ids.append([int(x) for x in spec.replace(" ", "").split(",") if x])
        except ValueError:
            raise ValueError(f"--prompt-ids {spec!r}: expected comma-separated integers") from None
        shown.append(None)
    if not ids:
        raise ValueError("nothing to generate: give --prompt, --prompt-file or --prompt-ids")
    return ids, shown


def _stop_ids(texts: list[str], tokenizer: Any) -> list[int]:
    """``--stop`` texts as ids: each must encode to one token of ``tokenizer``."""
    if texts and tokenizer is None:
        raise ValueError("--stop needs a tokenizer; give the id with --stop-token-id")
    out = []
    for text in texts:
        ids = tokenizer.encode(text)
        if len(ids) != 1:
            raise ValueError(
                f"--stop {text!r}: not one token of the tokenizer (it encodes to {ids}); "
                "give one token, or its id with --stop-token-id"
            )
        out.append(int(ids[0]))
    return out


def run(args: argparse.Namespace) -> int:
    """Load the checkpoint, generate, print (rank 0) and optionally write JSONL."""
    from epochal.parallel.config import ParallelConfig
    from epochal.parallel.launch import init_distributed, is_logging_rank, needs_relaunch, relaunch

    if args.tensor_parallel < 1:
        print("epochal generate: error: --tensor-parallel must be >= 1", file=sys.stderr)
        return 2
    parallel = ParallelConfig(
        tensor_parallel=args.tensor_parallel, nproc_per_node=args.tensor_parallel
    )
    if needs_relaunch(parallel):
        return relaunch(parallel, _argv(args))
    try:
        return _generate(args, parallel, init_distributed, is_logging_rank)
    except (
        ValueError,
        OSError,
    ) as exc:  # ConversionError/ConfigError/GenerationConfigError are ValueErrors
        print(f"epochal generate: error: {exc}", file=sys.stderr)
        return 2


def _argv(args: argparse.Namespace) -> list[str]:
    """Rebuild a ``generate`` command line from parsed options (used when relaunching)."""
    out = ["generate"]
    for key, value in vars(args).items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                out.append(flag)
        elif isinstance(value, list):
            out += [f"{flag}={item}" for item in value]
        elif value is not None:
            out.append(f"{flag}={value}")
    return out


def _generate(args, parallel, init_distributed, is_logging_rank) -> int:
    from epochal.model.build import model_from_state
    from epochal.model.generation.decoding import GenerationConfig, generate
    from epochal.model.generation.limits import check_generation_sizes
    from epochal.train.config.limits import device_memory_bytes

    t0 = time.perf_counter()
    if args.output:  # never written over the checkpoint or the prompts
        from epochal._paths import check_output_apart

        check_output_apart(
            args.checkpoint, args.output, source_name="--checkpoint", output_name="--output"
        )
        if args.prompt_file:
            check_output_apart(
                args.prompt_file, args.output, source_name="--prompt-file", output_name="--output"
            )
    info = init_distributed(parallel, args.device)
    ck = _load_model(args)
    config, tokenizer = ck.config, ck.tokenizer
    if config.is_encoder:
        raise ValueError(
            f"{args.checkpoint} holds a {config.type!r} encoder, which does not generate text; "
            "use epochal fill-mask"
        )
    chat = None
    if args.chat:
        from epochal.commands.generate_chat import chat_prompts

        chat = chat_prompts(args, ck)
        ids, shown, stops = chat.ids, chat.shown, chat.stops
    else:
        ids, shown = _prompts(args, tokenizer)
        stops = list(args.stop_token_id) + _stop_ids(args.stop, tokenizer)
    if not args.no_stop_at_eod and chat is None:
        # a Hugging Face model's own eos ids win (as in transformers), else the tokenizer's EOD
        eod = getattr(tokenizer, "eod", None)
        ends = list(ck.eos_token_ids or (() if eod is None else (eod,)))
        if args.tokenizer_type is None:  # a chat model's answer ends at its end of turn
            from epochal.commands.generate_chat import end_of_turn_stops

            ends += end_of_turn_stops(ck)
        stops += [int(t) for t in ends if 0 <= t < config.vocab_size]
    bos = ck.bos_token_id
    if bos is None:
        bos = getattr(tokenizer, "bos", None)
    gen_config = GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        do_sample=args.do_sample,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        top_p_decay=args.top_p_decay,
        top_p_bound=args.top_p_bound,
        num_beams=args.num_beams,
        length_penalty=args.length_penalty,
        early_stopping=args.early_stopping,
        num_return_sequences=args.num_return_sequences,
        stop_token_ids=tuple(dict.fromkeys(stops)),
        add_bos=args.add_bos,
        bos_token_id=bos,
        seed=args.seed,
    )
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
        args.dtype
    ]
    check_generation_sizes(
        config,
        gen_config,
        ids,
        dtype,
        memory=device_memory_bytes(args.device),
        source=str(args.checkpoint),
    )
    model = model_from_state(config, ck.state)  # GPT, or T5 (the prompts are its encoder input)
    model = model.to(device=info.device, dtype=dtype).eval()
    _parallelize(model, args, info)
    t_load = time.perf_counter() - t0
    t1 = time.perf_counter()
    out = generate(model, ids, gen_config)
    seconds = time.perf_counter() - t1
    if not is_logging_rank():
        return 0
    if chat is not None:
        return chat.report(args, out, seconds, t_load)
    records = []
    per_prompt = gen_config.num_return_sequences if gen_config.num_beams > 1 else 1
    for j, tokens in enumerate(out.tokens):
        prompt_index = j // per_prompt
        text = tokenizer.decode(tokens) if tokenizer is not None else None
        record = {
            "prompt_index": prompt_index,
            "prompt": shown[prompt_index],
            "prompt_ids": ids[prompt_index],
            "tokens": tokens,
            "text": text,
            "finished": out.finished[j],
        }
        if out.scores is not None:
            record["score"] = out.scores[j]
        records.append(record)
        head = shown[prompt_index] if shown[prompt_index] is not None else str(ids[prompt_index])
        body = text if text is not None else str(tokens)
        print(f"=== [{prompt_index}] {head}\n{body}")
    if args.output:
        from epochal._atomic import atomic_write

        atomic_write(args.output, "".join(json.dumps(r) + "\n" for r in records))
    n = sum(len(t) for t in out.tokens)
    print(
        f"generated {plural(n, 'token')} for {plural(len(ids), 'prompt')} in {seconds:.2f} s "
        f"({n / max(seconds, 1e-9):.1f} tokens/s; "
        f"load {t_load:.2f} s; TP{args.tensor_parallel})"
    )
    return 0


def _parallelize(model, args: argparse.Namespace, info) -> None:  # noqa: ANN001 - a model, DistInfo
    """Shard ``model`` over ``--tensor-parallel`` ranks, in canonical units with ``--invariant-degree``.

    Raises:
        ValueError: the process count is not the tensor-parallel size, or the model
            cannot be computed in the canonical units asked for (the reason named).
    """
    mesh = None
    if args.tensor_parallel > 1:
        from torch.distributed.device_mesh import init_device_mesh

        if info.world_size != args.tensor_parallel:
            raise ValueError(
                f"--tensor-parallel {args.tensor_parallel} needs exactly that many processes, got {info.world_size}"
            )
        mesh = init_device_mesh(info.device.type, (args.tensor_parallel,), mesh_dim_names=("tp",))
    degree = args.invariant_degree
    if degree > 1:
        from epochal.parallel.canonical_plan import canonical_refusal, install_canonical

        why = canonical_refusal(model.config, degree, tp=args.tensor_parallel)
        if why is not None:
            raise ValueError(f"--invariant-degree {degree}: not for this model: {why}")
        install_canonical(
            model,
            degree,
            mesh["tp"] if mesh is not None else None,
            gather_logits=True,
            training=False,
        )
    elif mesh is not None:
        from epochal.parallel.tensor_parallel import apply_tensor_parallel

        apply_tensor_parallel(model, mesh["tp"], sequence_parallel=False, loss_parallel=False)
