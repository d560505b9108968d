"""``model.megatron_generate(...)`` on the prepared GPT model: Accelerate's arguments and semantics.

Accelerate's Megatron-LM engine generates with Megatron-LM's text generation; this
module maps the same call onto epochal's decoder
(:func:`~epochal.model.generation.decoding.generate`, KV-cached):

- ``inputs`` ``[b, s]`` are right-padded token ids; row ``i``'s prompt is its first
  ``attention_mask[i].sum()`` tokens (the whole row without a mask). A mask that is
  not ones-then-zeros is an error (Megatron would read the padding as prompt);
- ``max_new_tokens`` (or ``max_length - s``) is rounded up as Megatron does: the
  output buffer is ``s + max_new_tokens`` (``+ 1`` with ``add_BOS``) rounded up to a
  multiple of 4, and every row generates until it fills that buffer or ends;
- ``top_k=1`` is greedy; otherwise the next token is *sampled* (``top_k=0,
  top_p=0``, Accelerate's defaults, sample the whole distribution) after dividing
  the logits by ``temperature``, keeping the ``top_k`` best or the ``top_p``
  nucleus (not both, as in Megatron); after every step ``top_p *= top_p_decay``
  floored at ``top_p_bound``. Draws come from generators seeded by
  ``random_seed`` (default 0): the same call repeats exactly, and the global
  ``torch`` RNG is left alone (Megatron reseeds it);
- ``num_beams`` (one prompt only, as in Accelerate) runs beam search with
  ``length_penalty`` (hypotheses scored ``sum_logprobs / generated_length **
  length_penalty``); ``num_beams=1`` is a one-beam search;
- ``stop_token`` (default: the end-of-document id: ``<|endoftext|>`` of
  ``other_megatron_args["vocab_file"]`` when given, else the model config's
  ``eos_token_id``; ``None``: no stop) ends a row, in every mode (Accelerate
  passes it to beam search only; its greedy and sampling stop at the
  end-of-document id, the default);
- ``add_BOS`` puts the end-of-document id before every prompt (Megatron's BOS).

Returns a ``LongTensor`` ``[b, width]`` on the model's device: each row is its
prompt (with BOS) followed by its generated tokens, then the end-of-document id
as padding after a row that stopped. ``width`` is the buffer length, or shorter
when every row stopped before it (Megatron's early termination); beam search
always returns the whole buffer. Every rank returns the same tensor.

Layouts: the trained weights are gathered whole to every rank (a collective: every
rank calls ``megatron_generate``, as in Accelerate) and each rank decodes the same
prompts with the plain model, so tensor- and pipeline-parallel runs give the
tokens of one process. Data parallelism must be 1, as in Accelerate. Decoding
runs in the parameters' dtype, without autocast.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import torch

from epochal.model.generation.decoding import GenerationConfig, beam_search, generate

__all__ = ["GenerateError", "end_of_document", "megatron_generate"]

#: the keywords Accelerate's ``megatron_generate`` reads from ``**kwargs``
_KWARGS = ("top_p_decay", "top_p_bound", "add_BOS", "stop_token", "random_seed")


class GenerateError(ValueError):
    """An argument ``megatron_generate`` cannot take (the message names it)."""


def end_of_document(vocab_file: str | None, hf_config: Any) -> int | None:
    """The end-of-document id: ``<|endoftext|>`` of a GPT-2 ``vocab_file``, else ``eos_token_id``.

    An ``eos_token_id`` outside the model's vocabulary counts as none.

    Raises:
        GenerateError: ``vocab_file`` is unreadable or has no ``<|endoftext|>``.
    """
    if vocab_file is not None:
        try:
            vocab = json.loads(Path(vocab_file).read_text(encoding="utf-8"))
            return int(vocab["<|endoftext|>"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise GenerateError(
                f"other_megatron_args['vocab_file']={vocab_file!r}: not a GPT-2 vocab.json "
                f"with an '<|endoftext|>' entry ({exc!r})"
            ) from None
    eos = getattr(hf_config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    vocab = getattr(hf_config, "vocab_size", None)
    if eos is None or (vocab is not None and not 0 <= int(eos) < vocab):
        return None  # none, or outside the vocabulary (a small model with GPT-2's config)
    return int(eos)


def _seed(random_seed: int, group: int) -> int:
    digest = hashlib.sha256(f"megatron-generate/{int(random_seed)}/{group}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise GenerateError(message)


def _prompts(inputs: Any, attention_mask: Any) -> list[list[int]]:
    _check(
        isinstance(inputs, torch.Tensor) and inputs.dim() == 2 and inputs.shape[0] >= 1,
        "inputs: must be a [batch, length] tensor of token ids",
    )
    ids = inputs.detach().long().cpu()
    if attention_mask is None:
        return ids.tolist()
    mask = torch.as_tensor(attention_mask).detach().long().cpu()
    _check(
        mask.shape == ids.shape,
        f"attention_mask: shape {tuple(mask.shape)} != inputs' {tuple(ids.shape)}",
    )
    lengths = mask.sum(dim=-1)
    expected = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
    _check(
        bool((mask == expected).all()),
        "attention_mask: prompts must be right-padded (each row ones, then zeros), as "
        "megatron_generate reads the first attention_mask.sum() tokens of each row; "
        "use tokenizer.padding_side = 'right'",
    )
    _check(bool((lengths >= 1).all()), "attention_mask: every row needs at least one token")
    return [row[: int(n)] for row, n in zip(ids.tolist(), lengths.tolist())]


def megatron_generate(
    engine: Any,
    inputs: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    max_length: int | None = None,
    max_new_tokens: int | None = None,
    num_beams: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    length_penalty: float | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """Generate with the prepared model ``engine`` (see the module docstring).

    Raises:
        GenerateError: an invalid argument, data parallelism, or a model that does
            not generate (not a GPT-style causal LM).
    """
    from epochal.accelerate.checkpointing import full_state
    from epochal.model.build import model_from_state

    trainer = engine.trainer
    config = trainer.model_config
    unknown = sorted(set(kwargs) - set(_KWARGS))
    _check(
        not unknown,
        f"megatron_generate: unknown keyword(s) {unknown}; it takes {', '.join(_KWARGS)}",
    )
    _check(
        engine.adapter.family in ("causal", "megatron") and config.type == "gpt",
        f"megatron_generate generates with GPT-style causal language models; this model is "
        f"a {engine.adapter.family} {config.type!r} model",
    )
    cp = trainer.engine.dims.cp
    _check(
        cp == 1,
        f"megatron_generate with MegatronLMPlugin context_parallel_size={cp}: decoding runs "
        "whole sequences on each model replica (context parallelism cuts training sequences "
        "only); generate with accelerator.unwrap_model(model).generate(...), or launch a "
        "run with context_parallel_size=1 and load_state",
    )
    dp = trainer.engine.dims.dp
    _check(
        dp == 1,
        f"megatron_generate requires data-parallel size 1 (as in Accelerate), this run has {dp}: "
        "launch it with as many processes as tp_degree x pp_degree",
    )
    _check(
        max_length is not None or max_new_tokens is not None,
        "max_length or max_new_tokens is required",
    )
    temperature = 1.0 if temperature is None else float(temperature)
    _check(0.0 < temperature <= 100.0, f"temperature: must be in (0, 100], got {temperature}")
    top_k = 0 if top_k is None else top_k
    _check(
        isinstance(top_k, int) and 0 <= top_k <= 1000, f"top_k: must be in [0, 1000], got {top_k}"
    )
    top_p = 0.0 if top_p is None else float(top_p)
    _check(0.0 <= top_p <= 1.0, f"top_p: must be in [0, 1], got {top_p}")
    _check(not (top_p > 0 and top_k > 0), "top_p and top_k sampling cannot be set together")
    top_p_decay = float(kwargs.get("top_p_decay", 0.0))
    _check(0.0 <= top_p_decay <= 1.0, f"top_p_decay: must be in [0, 1], got {top_p_decay}")
    top_p_bound = float(kwargs.get("top_p_bound", 0.0))
    _check(0.0 <= top_p_bound <= 1.0, f"top_p_bound: must be in [0, 1], got {top_p_bound}")
    add_bos = kwargs.get("add_BOS", False)
    _check(isinstance(add_bos, bool), f"add_BOS: must be a boolean, got {add_bos!r}")
    if num_beams is not None:
        _check(
            isinstance(num_beams, int) and num_beams >= 1,
            f"num_beams: must be an integer >= 1, got {num_beams!r}",
        )
        _check(
            inputs.shape[0] == 1,
            f"num_beams: beam search takes one prompt (batch size 1), got {inputs.shape[0]}",
        )
    eod = end_of_document(getattr(engine, "vocab_file", None), engine.config)
    stop_token = kwargs.get("stop_token", eod)
    _check(
        stop_token is None or (isinstance(stop_token, int) and not isinstance(stop_token, bool)),
        f"stop_token: must be an integer or None, got {stop_token!r}",
    )
    _check(
        not add_bos or eod is not None,
        "add_BOS: the end-of-document id (the BOS) is unknown: set the model config's "
        "eos_token_id or other_megatron_args['vocab_file']",
    )
    seed = kwargs.get("random_seed", 0)
    _check(isinstance(seed, int), f"random_seed: must be an integer, got {seed!r}")
    length_penalty = 1.0 if length_penalty is None else float(length_penalty)

    prompts = _prompts(inputs, attention_mask)
    width = int(inputs.shape[1])
    new = int(max_new_tokens) if max_new_tokens is not None else int(max_length) - width
    _check(new > 0, f"max_new_tokens: must be > 0, got {new}")
    total = 4 * math.ceil((new + width + int(add_bos)) / 4)  # Megatron's buffer length
    positions = config.max_position_embeddings
    _check(
        total <= positions,
        f"max_new_tokens: prompt length {width}{' + BOS' if add_bos else ''} + {new} new tokens "
        f"(rounded up to {total}, a multiple of 4) exceeds the model's {positions} positions",
    )
    pad = eod if eod is not None else (stop_token if stop_token is not None else 0)

    model = model_from_state(config, full_state(trainer)).to(trainer.device).eval()
    options = dict(
        stop_token_ids=() if stop_token is None else (int(stop_token),),
        pad_token_id=pad,
        add_bos=add_bos,
        bos_token_id=eod,
    )
    rows: list[list[int]] = [[] for _ in prompts]
    if num_beams is not None:
        prompt = ([eod] if add_bos else []) + prompts[0]
        cfg = GenerationConfig(
            max_new_tokens=total - len(prompt),
            num_beams=num_beams,
            length_penalty=length_penalty,
            **options,
        )
        out = beam_search(model, prompts, cfg)
        rows[0] = out.sequences[0]
        return _pack(rows, total, pad, trainer.device)
    sampling = dict(do_sample=top_k != 1, temperature=temperature, top_k=top_k, top_p=top_p)
    sampling.update(top_p_decay=top_p_decay, top_p_bound=top_p_bound)
    lengths = [len(p) + int(add_bos) for p in prompts]
    if max(lengths) + total - min(lengths) <= positions:
        groups = [list(range(len(prompts)))]  # one batch (left-padded inside the decoder)
    else:  # one batch per prompt length keeps every row within the model's positions
        groups = [[i for i, n in enumerate(lengths) if n == m] for m in sorted(set(lengths))]
    finished = [False] * len(prompts)
    for g, members in enumerate(groups):
        shortest = min(lengths[i] for i in members)
        cfg = GenerationConfig(
            max_new_tokens=total - shortest,
            seed=seed if len(groups) == 1 else _seed(seed, g),
            **sampling,
            **options,
        )
        out = generate(model, [prompts[i] for i in members], cfg)
        for j, i in enumerate(members):
            seq = out.sequences[j][:total]  # each row fills the buffer, no more
            rows[i] = seq
            finished[i] = stop_token is not None and stop_token in seq[lengths[i] :]
    width = total if not all(finished) else max(len(r) for r in rows)
    return _pack(rows, width, pad, trainer.device)


def _pack(rows: list[list[int]], width: int, pad: int, device: torch.device) -> torch.Tensor:
    out = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row[:width], dtype=torch.long)
    return out.to(device)
