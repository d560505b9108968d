"""``epochal embed``: per-protein embeddings (and per-residue states, logits, predictions) in input order.

Examples::

    epochal embed --checkpoint runs/esm-tiny --input proteins.fasta --output emb.safetensors
    epochal embed --checkpoint hf/esm2_t6_8M_UR50D --input table.csv --output emb.parquet --per-residue
    torchrun --nproc-per-node 2 -m epochal.cli embed --checkpoint runs/finetuned --input p.fasta \\
        --output p.safetensors --predictions

``--checkpoint``: an epochal run / checkpoint (pretrained, fine-tuned or with LoRA
adapters) or a Hugging Face ESM / BERT folder (``EsmForMaskedLM`` or ``EsmModel``).
``--input``: FASTA (``.fasta``/``.fa``/``.faa``, gzipped too) or a CSV / TSV / parquet
table (``--sequence-column``, ``--id-column``), read with the protein rules and limits
of training (:mod:`epochal.data.proteins.readers`: upper-cased, characters outside the
alphabet refused, at most ``EPOCHAL_MAX_PROTEIN_LENGTH`` residues). Proteins are cut to
``--max-length`` tokens before they are tokenized. The output may not be, contain or
lie inside the input or the checkpoint, nor lie inside a run directory, a checkpoint or a
converted model, nor be a ``.safetensors`` file ``epochal convert`` wrote
(:mod:`epochal._ownership`); an earlier embedding is replaced. Output (:mod:`epochal.train.embed`):

- ``.safetensors``: ``embeddings`` float32 ``[n, hidden]``, ``lengths`` / ``offsets``
  and the requested ``residue_embeddings`` / ``logits`` / ``predictions``; the ids (and
  a classifier's class names) as JSON in the metadata (``ids``, ``labels``);
- ``.parquet``: one row per sequence: ``id``, ``sequence``, ``embedding`` and the
  requested lists (``residue_embeddings``, ``logits``, ``predictions``, and
  ``predicted_label`` for a classifier).

Runs on ``--device`` (default: CUDA when available), on as many ranks as ``torchrun``
starts (each embeds every ``W``-th sequence; rank 0 writes them in input order).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from epochal._text import plural

__all__ = ["add_arguments", "run", "write_output"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``epochal embed``."""
    parser.add_argument("--checkpoint", required=True, help="epochal run/checkpoint or HF folder")
    parser.add_argument("--input", required=True, help="FASTA, CSV, TSV or parquet")
    parser.add_argument("--output", required=True, help="out.safetensors or out.parquet")
    parser.add_argument("--sequence-column", default="sequence")
    parser.add_argument(
        "--id-column", default=None, help="table column of the ids (default: <file stem>_<row>)"
    )
    parser.add_argument(
        "--per-residue", action="store_true", help="also the per-residue hidden states"
    )
    parser.add_argument(
        "--logits", action="store_true", help="also the masked-LM logits per residue"
    )
    parser.add_argument(
        "--predictions", action="store_true", help="also the fine-tuned head's outputs"
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--max-length", type=int, default=1024, help="tokens per sequence, <cls>/<eos> included"
    )
    parser.add_argument(
        "--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if available)"
    )
    parser.add_argument("--no-progress", action="store_true")


def write_output(
    path: Path,
    result: dict[str, torch.Tensor],
    ids: list[str],
    sequences: list[str],
    labels: list[str] | None,
) -> None:
    """Write ``result`` (from :func:`epochal.train.embed.embed_sequences`) as safetensors or parquet.

    Raises:
        ValueError: another output suffix.
    """
    from epochal._atomic import atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".safetensors":
        from safetensors.torch import save

        meta = {"ids": json.dumps(ids)}
        if labels is not None:
            meta["labels"] = json.dumps(labels)
        tensors = {k: v.contiguous() for k, v in result.items()}
        atomic_write(path, save(tensors, metadata=meta))
        return
    if path.suffix != ".parquet":
        raise ValueError(f"--output {path}: write .safetensors or .parquet")
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, Any] = {
        "id": ids,
        "sequence": sequences,
        "embedding": result["embeddings"].tolist(),
    }
    offsets = result["offsets"].tolist()
    for key in ("residue_embeddings", "logits", "predictions"):
        if key not in result:
            continue
        value = result[key]
        if key == "predictions" and value.shape[0] == len(ids) and value.shape[0] != offsets[-1]:
            columns[key] = value.tolist()
        else:
            columns[key] = [value[offsets[i] : offsets[i + 1]].tolist() for i in range(len(ids))]
    if labels is not None and "predictions" in result:
        pred = result["predictions"]
        if pred.shape[0] == len(ids):
            columns["predicted_label"] = [labels[int(i)] for i in pred.argmax(-1)]
        else:
            columns["predicted_label"] = [
                "".join(labels[int(i)] for i in pred[offsets[k] : offsets[k + 1]].argmax(-1))
                for k in range(len(ids))
            ]
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.table(columns), tmp)
    os.replace(tmp, path)


def _read_input(args: argparse.Namespace) -> tuple[list[str], list[str], list[str]]:
    """``(ids, sequences, where)`` of ``--input``, by the protein rules every reader applies.

    Raises:
        ProteinInputError: a malformed file or record, or a file without any protein.
    """
    from epochal.data.proteins.readers import read_proteins
    from epochal.data.proteins.sequences import ProteinInputError

    records = list(read_proteins(args.input, args.sequence_column, args.id_column or None))
    if not records:
        raise ProteinInputError(f"{args.input}: no proteins (a table header without rows)")
    return [r[0] for r in records], [r[1] for r in records], [r[2] for r in records]


def run(args: argparse.Namespace) -> int:
    """Embed ``--input`` with ``--checkpoint`` into ``--output``; 0 on success, 1 on bad input.

    Every error is one line naming the file, record or option (the input and the checkpoint
    are never written over: an output that is, contains or lies inside either is refused).
    """
    import torch.distributed as dist

    from epochal._ownership import check_writable
    from epochal._paths import check_output_apart
    from epochal.train.embed import embed_sequences, load_encoder

    out = Path(args.output)
    if out.suffix not in (".safetensors", ".parquet"):
        print(
            f"epochal embed: error: --output {out}: write .safetensors or .parquet", file=sys.stderr
        )
        return 2
    try:
        check_output_apart(args.input, out, source_name="--input", output_name="--output")
        check_output_apart(args.checkpoint, out, source_name="--checkpoint", output_name="--output")
        # an earlier embedding may be replaced; another run's or command's file may not
        check_writable(out, writer="embed", option="--output")
    except ValueError as exc:
        print(f"epochal embed: error: {exc}", file=sys.stderr)
        return 2
    started = False
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group(
            "nccl" if torch.cuda.is_available() and args.device != "cpu" else "gloo"
        )
        started = True
    rank = dist.get_rank() if dist.is_initialized() else 0
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and dist.is_initialized() and ":" not in device:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    try:
        ids, sequences, where = _read_input(args)
        enc = load_encoder(args.checkpoint, device)
        result = embed_sequences(
            enc,
            sequences,
            per_residue=args.per_residue,
            logits=args.logits,
            predictions=args.predictions,
            batch_size=args.batch_size,
            max_length=args.max_length,
            progress=not args.no_progress,
            names=where,
        )
        if result is not None:
            write_output(out, result, ids, sequences, enc.class_names)
            print(
                f"epochal embed: {plural(len(ids), 'sequence')} -> {out} "
                f"(embeddings {tuple(result['embeddings'].shape)}"
                + "".join(
                    f", {k} {tuple(result[k].shape)}"
                    for k in ("residue_embeddings", "logits", "predictions")
                    if k in result
                )
                + f") on {device}",
                flush=True,
            )
    except (OSError, ValueError) as exc:
        if rank == 0:
            print(f"epochal embed: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if started:
            dist.destroy_process_group()
    return 0
