"""Ranks of the T5 layout tests: a tiny T5 trained on Megatron's span-corruption samples.

The data is the real file path of ``epochal train``: a sentence-split corpus written
with epochal's builder, a WordPiece vocabulary with 100 sentinels, and
``epochal.train.inputs.loaders.build_data`` (``build_t5_datasets``). Module-level so that spawned
gloo ranks (tests/dist_utils.run_gloo) can import it.
"""

from __future__ import annotations

import os
from typing import Any

SEQ, DEC = 32, 16
STEPS = 4
BASE = [
    "--training.device=cpu",  # compared with CPU references: the same with or without a GPU
    "--data.corpus=",
    f"--data.seq_length={SEQ}",
    f"--data.seq_length_decoder={DEC}",
    "--data.tokenizer_type=BertWordPieceLowerCase",
    "--data.vocab_extra_ids=100",
    "--data.split=90,10,0",
    "--data.masking_max_ngram=3",
    "--model.type=t5",
    "--model.activation=gelu",
    "--model.position_embedding_type=learned_absolute",
    "--model.normalization=LayerNorm",
    "--model.add_bias_linear=true",
    "--model.output_bias=true",
    "--model.hidden_size=32",
    "--model.num_layers=2",
    "--model.num_attention_heads=4",
    "--model.num_query_groups=4",
    "--model.ffn_hidden_size=64",
    "--model.make_vocab_size_divisible_by=16",
    "--training.micro_batch_size=2",
    "--training.global_batch_size=8",
    f"--training.train_iters={STEPS}",
    "--training.eval_interval=0",
    "--training.eval_iters=1",
    "--scheduler.lr_warmup_iters=1",
    "--optimizer.lr=0.005",
    "--optimizer.clip_grad=0.5",
    "--checkpoint.save_interval=0",
    "--checkpoint.save_final=false",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]
#: Hugging Face T5 v1.1 style: relative attention bias, RMSNorm, gated GELU, no biases.
HF_STYLE = [
    "--model.position_embedding_type=relative",
    "--model.relative_attention_num_buckets=8",
    "--model.relative_attention_max_distance=16",
    "--model.normalization=RMSNorm",
    "--model.activation=gated_gelu",
    "--model.add_bias_linear=false",
    "--model.output_bias=false",
    "--model.softmax_scale=1.0",
    "--model.untie_embeddings_and_output_weights=true",
    "--model.decoder_num_layers=3",
]


def write_corpus(directory: str) -> list[str]:
    """A sentence-split corpus and a vocabulary in ``directory``; the data overrides.

    Written once (skipped when the vocabulary exists): a multi-process run writes it
    before its ranks start, which then only read it."""
    from tests.data.bert_corpus import random_sentence_documents, write_sentence_corpus, write_vocab

    vocab = os.path.join(directory, "vocab.txt")
    if not os.path.exists(vocab):
        write_vocab(directory)
        write_sentence_corpus(directory, "corpus", random_sentence_documents(3, 80), megatron=False)
    return [
        f"--data.data_path=['{os.path.join(directory, 'corpus')}']",
        f"--data.vocab_file={vocab}",
        f"--data.cache_dir={os.path.join(directory, 'cache')}",
    ]


def config(run_dir: str, extra: list[str]) -> Any:
    from epochal.train.config import build_config

    data = write_corpus(os.path.dirname(run_dir.rstrip("/")) or ".")
    return build_config(preset="tiny", overrides=[f"--run_dir={run_dir}", *BASE, *data, *extra])


def relative_bias(trainer: Any) -> list[float] | None:
    """The encoder's relative bias table (replicated under TP: every column must be right)."""
    table = getattr(trainer.model_parts[0], "encoder_relative_bias", None)
    if table is None:
        return None
    weight = table.weight
    if hasattr(weight, "full_tensor"):
        weight = weight.full_tensor()
    return weight.detach().flatten().tolist()


def single(run_dir: str, extra: list[str] = ()) -> dict[str, Any]:
    """The single-process Trainer's losses and evaluation values."""
    from epochal.train.trainer import Trainer

    cfg = config(run_dir, list(extra))
    tr = Trainer(cfg, log=False)
    result = tr.train()
    return {
        "losses": result.losses,
        "eval": result.eval_loss,
        "logged": tr.last_eval_logged,
        "relative_bias": relative_bias(tr),
    }


def rank_main(rank: int, world_size: int, run_dir: str, extra: list[str]) -> dict[str, Any]:
    """One gloo rank of a ParallelTrainer run with the overrides ``extra`` (the layout)."""
    from epochal.parallel.launch import init_distributed
    from epochal.train.parallel_trainer import ParallelTrainer

    cfg = config(run_dir, extra)
    info = init_distributed(cfg.parallel, "cpu")
    tr = ParallelTrainer(cfg, log=False, dist_info=info)
    result = tr.train()
    return {
        "losses": result.losses,
        "eval": result.eval_loss,
        "logged": tr.last_eval_logged,
        "relative_bias": relative_bias(tr),
    }
