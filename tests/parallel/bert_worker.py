"""Ranks of the BERT / ESM layout tests: a tiny BERT trained on BioNeMo-style masked data.

The data is ``MaskedTokenDataset`` (fresh masks per epoch) under
``MultiEpochDatasetResampler`` over fixed-length synthetic sequences; module-level
so that spawned gloo ranks (tests/dist_utils.run_gloo) can import it. With
:func:`esm` overrides the model is a tiny ESM-2 and the data is ``epochal train``'s
own protein path (the synthetic FASTA of ``data.mock``, BioNeMo's samples padded to
``data.seq_length``).
"""

from __future__ import annotations

from typing import Any

VOCAB = 32
SEQ = 16
STEPS = 4
BASE = [
    "--training.device=cpu",  # compared with CPU references: the same with or without a GPU
    "--data.corpus=",
    "--data.mock=true",
    f"--data.seq_length={SEQ}",
    "--model.type=bert",
    "--model.activation=gelu",
    "--model.position_embedding_type=learned_absolute",
    "--model.normalization=LayerNorm",
    "--model.hidden_size=32",
    "--model.num_layers=4",
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


def sequences(n: int, seed: int) -> list[list[int]]:
    """``n`` learnable sequences ``[CLS=0, ..., EOS=2]`` of ``SEQ`` ids (body ids 4..27)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        start = int(torch.randint(0, 24, (1,), generator=g))
        out.append([0, *[4 + (start + (1 + i % 3) * k) % 24 for k in range(SEQ - 2)], 2])
    return out


def datasets(num_samples: int) -> tuple[Any, Any]:
    """(train, valid): masked sequences, train resampled over epochs with fresh masks."""
    from epochal.data import MaskedTokenDataset, MultiEpochDatasetResampler

    def masked(seqs: list[list[int]], seed: int) -> Any:
        return MaskedTokenDataset(
            seqs,
            mask_token_id=3,
            random_tokens=range(4, 28),
            special_token_ids=[0, 1, 2],
            seed=seed,
        )

    train = MultiEpochDatasetResampler(masked(sequences(24, 1), 5), num_samples=num_samples, seed=9)
    valid = MultiEpochDatasetResampler(masked(sequences(16, 2), 6), num_epochs=1, shuffle=False)
    return train, valid


PAIRS = [  # Megatron-style pairs: token types, the binary head, padding; original BERT blocks
    "--model.bert_binary_head=true",
    "--model.num_tokentypes=2",
    "--model.transformer_block_type=post_ln",
]


def pad_outside(item: dict[str, Any], real: Any) -> None:
    """Make the tokens outside the bool ``real`` ``[s]`` padding (id 1, not predicted), in place."""
    key = "text" if "text" in item else "tokens"  # Megatron's key for the ids, or BioNeMo's
    item[key] = item[key].masked_fill(~real, 1)
    item["labels"] = item["labels"].masked_fill(~real, -100)
    item["loss_mask"] = item["loss_mask"] & real
    item["padding_mask"] = real.long()


class WithSegments:
    """Adds Megatron's pair keys to masked samples, as a pure function of the index.

    ``types``: 0 on the first half, 1 on the second; ``is_random``: ``i % 2``;
    the last ``tokens[1] % 3`` positions become padding (id 1, ``padding_mask`` 0,
    not predicted); the ids are under Megatron's key, ``text``.
    """

    def __init__(self, base: Any) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        item = dict(self.base[i])
        s = item["tokens"].shape[0]
        pad = int(item["tokens"][1]) % 3
        real = torch.arange(s) < s - pad
        pad_outside(item, real)
        item["types"] = (torch.arange(s) >= s // 2).long()
        item["is_random"] = torch.tensor(int(i) % 2)
        item["text"] = item.pop("tokens")  # Megatron's key for the ids (BertDataset's)
        return item


ESM = [  # ESM-2's architecture on the synthetic samples (with variable=True): rotary, no token types, token dropout
    "--model.type=esm",
    "--model.position_embedding_type=rope",
    "--model.num_tokentypes=0",
    "--model.token_dropout=true",
    "--model.mask_token_id=3",
    f"--model.vocab_size={VOCAB}",
]


class VariableLengths:
    """Right-pads samples to different lengths, as a pure function of the index.

    Sample ``i`` keeps its first ``SEQ - pad`` tokens (``pad = (tokens[2] + i) % (SEQ // 2)``,
    on top of any padding it has); the rest become padding (id 1, ``padding_mask`` 0,
    not predicted): what packing (``data.pack_sequences``) cuts out.
    """

    def __init__(self, base: Any) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        item = dict(self.base[i])
        ids = item["text"] if "text" in item else item["tokens"]  # Megatron's key or BioNeMo's
        s = ids.shape[0]
        pad = (int(ids[2]) + int(i)) % (s // 2)
        real = torch.arange(s) < s - pad
        if "padding_mask" in item:
            real &= item["padding_mask"].bool()
        pad_outside(item, real)
        return item


def esm(cache_dir: str) -> list[str]:
    """Overrides that make the model a tiny ESM-2 trained from protein files cached in ``cache_dir``."""
    return [
        "--model.type=esm",
        "--model.position_embedding_type=rope",
        "--model.num_tokentypes=0",
        "--model.token_dropout=true",
        "--model.mask_token_id=32",
        "--model.vocab_size=33",
        "--data.tokenizer_type=ESM2Tokenizer",
        f"--data.cache_dir={cache_dir}",
        "--data.protein_valid_fraction=0.05",
    ]


def config(run_dir: str, extra: list[str]) -> Any:
    from epochal.train.config import build_config

    return build_config(preset="tiny", overrides=[f"--run_dir={run_dir}", *BASE, *extra])


def data(cfg: Any, dp_rank: int = 0, dp_size: int = 1, variable: bool = False) -> Any:
    """The loaders; ``variable``: synthetic samples of different lengths (:class:`VariableLengths`).

    Configs made with :func:`esm` (``ESM2Tokenizer``) train on ``epochal train``'s own protein
    path; the rest (:data:`ESM` included) on the synthetic samples."""
    from epochal.train.inputs.loaders import build_data, make_loaders

    if cfg.data.tokenizer_type == "ESM2Tokenizer":  # esm(): epochal train's own protein path
        return build_data(cfg, dp_rank=dp_rank, dp_size=dp_size)
    train, valid = datasets(cfg.training.train_iters * cfg.training.global_batch_size)
    if cfg.model.bert_binary_head:
        train, valid = WithSegments(train), WithSegments(valid)
    if variable:
        train, valid = VariableLengths(train), VariableLengths(valid)
    return make_loaders(cfg, train, valid, vocab_size=VOCAB, dp_rank=dp_rank, dp_size=dp_size)


def single(run_dir: str, extra: list[str] = (), variable: bool = False) -> dict[str, Any]:
    """The single-process Trainer's losses and evaluation values."""
    from epochal.train.trainer import Trainer

    cfg = config(run_dir, list(extra))
    tr = Trainer(cfg, data=data(cfg, variable=variable), log=False)
    result = tr.train()
    return {"losses": result.losses, "eval": result.eval_loss, "logged": tr.last_eval_logged}


def rank_main(
    rank: int, world_size: int, run_dir: str, extra: list[str], variable: bool = False
) -> dict[str, Any]:
    """One gloo rank of a ParallelTrainer run with the overrides ``extra`` (the layout)."""
    from epochal.parallel.dims import ParallelDims
    from epochal.parallel.launch import init_distributed
    from epochal.train.parallel_trainer import ParallelTrainer

    cfg = config(run_dir, extra)
    info = init_distributed(cfg.parallel, "cpu")
    dims = ParallelDims.from_config(cfg.parallel, info.world_size)
    tr = ParallelTrainer(
        cfg,
        data=data(cfg, dims.coords(rank)["dp"], dims.dp, variable=variable),
        log=False,
        dist_info=info,
    )
    result = tr.train()
    return {"losses": result.losses, "eval": result.eval_loss, "logged": tr.last_eval_logged}
