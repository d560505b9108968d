"""Embeddings and predictions of an encoder (``epochal embed``), in input order, on any number of ranks.

:func:`load_encoder` reads an epochal run / checkpoint (pretrained or fine-tuned, LoRA
adapters included) or a Hugging Face ESM / BERT folder (masked-LM or bare encoder) with
its tokenizer. :func:`embed_sequences` runs it over sequences in batches:

- every sequence is ``<cls> residues <eos>`` (``[CLS] ... [SEP]`` for BERT), cut to
  ``max_length`` tokens (a protein is cut before it is tokenized), padded to the
  longest of its batch; more tokens than the model's positions is an error that
  names the sequence and ``--max-length``;
- ``embeddings`` float32 ``[n, hidden]``: the last hidden states (after the final
  norm: Hugging Face's ``last_hidden_state``) averaged over the residue positions
  (no ``<cls>`` / ``<eos>`` / padding);
- optional, concatenated over the sequences' residues (``offsets`` ``[n + 1]``:
  sequence ``i`` owns rows ``offsets[i]:offsets[i+1]``): ``residue_embeddings``
  ``[total, hidden]``, masked-LM ``logits`` ``[total, vocab]`` (models with the LM
  head), and the fine-tuned head's ``predictions`` (``[n, num_labels]`` for a
  sequence head, ``[total, num_labels]`` for a residue head).

Under ``torch.distributed`` (``torchrun``), rank ``r`` of ``W`` computes the sequences
``r, r + W, ...`` and rank 0 puts the results back in input order (one gather).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from epochal.data.datasets.labelled import end_token
from epochal.model.build import build_model
from epochal.model.config import ModelConfig
from epochal.model.heads import mean_over_residues

__all__ = ["Encoder", "embed_sequences", "load_encoder"]


@dataclass
class Encoder:
    """A model ready for inference.

    Attributes:
        model: the model (eval mode).
        config: its config.
        tokenizer: ``encode(str) -> ids`` with ``cls``, ``pad`` and ``eos`` (or ``sep``).
        has_lm_head: the masked-LM head holds real weights (logits are meaningful).
        class_names: a classifier's classes (its run's ``label_vocab.json``), or None.
        source: what was read.
    """

    model: nn.Module
    config: ModelConfig
    tokenizer: Any
    has_lm_head: bool
    class_names: list[str] | None = None
    source: str = ""


def _esm_tokenizer(vocab_file: Path | str | None) -> Any:
    from epochal.data.indexed.tokenizer_esm import ESM2Tokenizer

    return ESM2Tokenizer(vocab_file if vocab_file and Path(vocab_file).is_file() else None)


def load_encoder(
    path: str | Path, device: str | torch.device = "cpu", *, option: str = "--checkpoint"
) -> Encoder:
    """Read the encoder at ``path`` (see the module docstring) onto ``device``.

    A classifier's class names come from the ``label_vocab.json`` next to the checkpoint
    (the folder given, the step folder, its run directory; a Hugging Face folder's own),
    else from the run directory its configuration recorded when that is an absolute path
    (a relative one is never resolved against the current directory).

    Args:
        option: the option that named ``path``, for error messages.

    Raises:
        CheckpointError: nothing readable there, or not an encoder (``model.type``
            ``"bert"`` / ``"esm"``).
    """
    from epochal.train.state.checkpoint import CheckpointError
    from epochal.train.state.encoder_init import is_hf_folder, read_encoder

    path = Path(path)
    config, state, has_lm_head = read_encoder(path, option=option)
    if not config.is_encoder:
        raise CheckpointError(
            f"{path}: holds a {config.type!r} model; embeddings need an ESM or BERT encoder"
        )
    class_names = None
    if is_hf_folder(path):
        vocab = path / "vocab.txt"
        if config.type == "esm":
            tokenizer = _esm_tokenizer(vocab)
        else:
            from epochal.data.indexed.tokenizer import build_tokenizer

            tokenizer = build_tokenizer("BertWordPieceLowerCase", vocab_file=str(vocab))
        class_names = _class_names(path)
    else:
        tokenizer, class_names = _run_tokenizer(path, config)
    with torch.device("meta"):
        model = build_model(config)
    model.to_empty(device=device)
    model.init_buffers()
    missing, _ = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "output.weight" and config.tie_embeddings)]
    if missing:
        raise CheckpointError(f"{path}: lacks weights the model needs: {sorted(missing)[:8]}")
    model.tie_weights()
    return Encoder(model.eval(), config, tokenizer, has_lm_head, class_names, str(path))


def _run_tokenizer(path: Path, config: ModelConfig) -> tuple[Any, list[str] | None]:
    from epochal.train.config import config_from_saved
    from epochal.train.inputs.finetune import finetune_tokenizer
    from epochal.train.state.epochal_ckpt import find_step_folder, tokenizer_for_run

    folder = find_step_folder(path)
    saved = None
    if (folder / "config.toml").is_file():
        import tomllib

        saved = config_from_saved(tomllib.loads((folder / "config.toml").read_text()))
    names = _class_names(path, folder, saved.run_dir if saved is not None else None)
    if config.type == "esm":
        return _esm_tokenizer(saved.data.vocab_file if saved is not None else None), names
    if saved is None:
        raise ValueError(f"{folder}: no config.toml to rebuild the BERT tokenizer from")
    if config.head != "mlm":
        return finetune_tokenizer(saved), names
    return tokenizer_for_run(saved, str(folder / "config.toml")), names


def _class_names(
    path: Path, step_folder: Path | None = None, run_dir: str | None = None
) -> list[str] | None:
    """The classes of the ``label_vocab.json`` that goes with the checkpoint, or None."""
    from epochal.data.datasets.labelled import LabelVocab
    from epochal.train.inputs.finetune import label_vocab_file

    found = label_vocab_file(path, step_folder, run_dir)
    return None if found is None else LabelVocab.load(found).labels


def encode_cut(tok: Any, text: str, count: int) -> list[int]:
    """The first ``count`` token ids of ``text``, cutting a protein before it is encoded.

    A text of one token per character (``tok.one_token_per_character``: every protein
    the readers return, for ESM-2's tokenizer) is cut to ``count`` characters first, so
    the memory does not grow with the protein's length; other text is encoded whole.
    """
    one_each = getattr(tok, "one_token_per_character", None)
    if one_each is not None and one_each(text):
        return tok.encode(text[:count])
    return tok.encode(text)[:count]


def _check_positions(enc: Encoder, sequences: list[str], max_length: int, names: Any) -> None:
    """Refuse a sequence whose tokens exceed the model's positions (before any rank computes)."""
    positions = enc.config.max_position_embeddings
    if not positions or max_length <= positions:
        return
    one_each = getattr(enc.tokenizer, "one_token_per_character", None)
    for i, text in enumerate(sequences):
        n = (
            len(text)
            if one_each is not None and one_each(text)
            else len(enc.tokenizer.encode(text))
        )
        tokens = min(n, max_length - 2) + 2
        if tokens > positions:
            name = names[i] if names is not None else f"sequence {i + 1}"
            raise ValueError(
                f"{name}: {tokens} tokens (<cls>, {tokens - 2} residues, <eos>) exceed the "
                f"{positions} positions of the model {enc.source}; pass --max-length "
                f"{positions} to embed its first {positions - 2} residues"
            )


def _batch(ids: list[list[int]], tok: Any, device: torch.device) -> dict[str, torch.Tensor]:
    eos = end_token(tok)
    longest = max(len(x) for x in ids) + 2
    tokens = torch.full((len(ids), longest), tok.pad, dtype=torch.long)
    padding = torch.zeros_like(tokens)
    residue = torch.zeros_like(tokens)
    for i, body in enumerate(ids):
        n = len(body)
        tokens[i, : n + 2] = torch.tensor([tok.cls, *body, eos])
        padding[i, : n + 2] = 1
        residue[i, 1 : n + 1] = 1
    return {
        k: v.to(device) for k, v in (("tokens", tokens), ("padding", padding), ("residue", residue))
    }


@torch.no_grad()
def _run(
    enc: Encoder, seqs: list[str], what: set[str], batch_size: int, max_length: int, progress: bool
) -> list[dict[str, torch.Tensor]]:
    from tqdm.auto import tqdm

    model, tok = enc.model, enc.tokenizer
    device = next(model.parameters()).device
    out: list[dict[str, torch.Tensor]] = []
    bar = tqdm(total=len(seqs), desc="embed", unit="seq", disable=not progress)
    for start in range(0, len(seqs), batch_size):
        chunk = [encode_cut(tok, s, max_length - 2) for s in seqs[start : start + batch_size]]
        b = _batch(chunk, tok, device)
        h = model.encode(b["tokens"], None, b["padding"])
        pooled = mean_over_residues(h.float(), b["residue"]).cpu()
        logits = preds = None
        if "logits" in what:
            logits = (model.output(model.lm_head(h)) + model.lm_head.bias)[
                ..., : enc.config.vocab_size
            ]
        if "predictions" in what:
            preds = model.head(h, b["residue"]).float()
        for i, body in enumerate(chunk):
            row: dict[str, torch.Tensor] = {
                "embeddings": pooled[i],
                "length": torch.tensor(len(body)),
            }
            sl = slice(1, len(body) + 1)
            if "residue_embeddings" in what:
                row["residue_embeddings"] = h[i, sl].float().cpu()
            if logits is not None:
                row["logits"] = logits[i, sl].float().cpu()
            if preds is not None:
                row["predictions"] = (preds[i, sl] if preds.dim() == 3 else preds[i]).cpu()
            out.append(row)
        bar.update(len(chunk))
    bar.close()
    return out


def embed_sequences(
    enc: Encoder,
    sequences: list[str],
    *,
    per_residue: bool = False,
    logits: bool = False,
    predictions: bool = False,
    batch_size: int = 8,
    max_length: int = 1024,
    progress: bool = True,
    names: list[str] | None = None,
) -> dict[str, torch.Tensor] | None:
    """Embeddings (and more) of ``sequences`` in their order (see the module docstring).

    A sequence is cut to ``max_length - 2`` residues before it is tokenized (proteins
    of one token per residue), so the memory does not grow with the longest protein.
    ``names`` (the sequences' locations or ids) name a sequence in errors.

    Returns:
        On rank 0 (or without ``torch.distributed``): ``{"embeddings", "lengths",
        "offsets", ...}`` (``lengths`` int64 ``[n]``: residues embedded per sequence);
        None on the other ranks.

    Raises:
        ValueError: ``logits`` for a model without a masked-LM head, ``predictions`` for
            one without a fine-tuning head, ``batch_size < 1`` or ``max_length < 3``, a
            sequence longer than the model's positions (names it and ``--max-length``).
    """
    if batch_size < 1 or max_length < 3:
        raise ValueError(
            f"batch_size must be >= 1 and max_length >= 3, got {batch_size}, {max_length}"
        )
    if logits and not enc.has_lm_head:
        raise ValueError(
            f"{enc.source}: the model has no masked-LM head (a fine-tuned or bare encoder): no logits"
        )
    if predictions and enc.model.head is None:
        raise ValueError(f"{enc.source}: the model has no fine-tuning head: no predictions")
    _check_positions(enc, sequences, max_length, names)
    what = {"residue_embeddings"} if per_residue else set()
    what |= {"logits"} if logits else set()
    what |= {"predictions"} if predictions else set()
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    mine = list(range(rank, len(sequences), world))
    rows = _run(
        enc, [sequences[i] for i in mine], what, batch_size, max_length, progress and rank == 0
    )
    if distributed:
        gathered: list[Any] = [None] * world if rank == 0 else None  # type: ignore[assignment]
        dist.gather_object(list(zip(mine, rows)), gathered, dst=0)
        if rank != 0:
            return None
        ordered = sorted((pair for part in gathered for pair in part), key=lambda p: p[0])
        rows = [r for _, r in ordered]
    return _stack(rows, enc.config.hidden_size)


def _stack(rows: list[dict[str, torch.Tensor]], hidden: int) -> dict[str, torch.Tensor]:
    if not rows:
        return {
            "embeddings": torch.zeros(0, hidden),
            "lengths": torch.zeros(0, dtype=torch.long),
            "offsets": torch.zeros(1, dtype=torch.long),
        }
    out = {"embeddings": torch.stack([r["embeddings"] for r in rows])}
    out["lengths"] = torch.stack([r["length"] for r in rows]).long()
    out["offsets"] = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(out["lengths"], 0)])
    for key in ("residue_embeddings", "logits", "predictions"):
        if key in rows[0]:
            parts = [r[key] for r in rows]
            out[key] = torch.cat(parts) if parts[0].dim() == 2 else torch.stack(parts)
    return out
