"""Subprocess entry point for the kill-and-resume tests: train a tiny model on synthetic data.

Usage: python resume_worker.py RUN_DIR TRAIN_ITERS [--bert | --t5 | --esm | --finetune | --sft | --moe]
[--pause-after N] [override ...]

``--bert``: a tiny BERT on masked data that gets fresh masks every epoch
(``tests/parallel/bert_worker.py``: ``MaskedTokenDataset`` under
``MultiEpochDatasetResampler``), with dropout, instead of the GPT.
``--t5``: a tiny T5 (relative bias, gated GELU) on Megatron's span-corruption
samples from files (``tests/parallel/t5_worker.py``; the corpus lives next to
RUN_DIR), with dropout.
``--esm``: a tiny ESM-2 on ``epochal train``'s protein path (the synthetic FASTA of
``data.mock`` converted to BioNeMo's layout in ``esm-cache`` next to RUN_DIR; members
and masks drawn per ``EpochIndex``), with dropout.
``--moe``: the GPT with mixture-of-experts blocks routed as DeepSeek-V3 (sigmoid scores,
the balancing bias moved after every step, group-limited, the sequence-wise balance loss).
``--sft``: the tiny GPT fine-tuned on packed chat rows (``[sft]``; the rows in ``sft``
next to RUN_DIR, written by the test before the runs start), with dropout.

With ``--pause-after N`` the process writes ``RUN_DIR/paused`` after step N (and
after that step's evaluation/checkpoint) and then sleeps, so the test can kill it
at a known point mid-run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from epochal.train.config import build_config  # noqa: E402
from epochal.train.inputs.loaders import make_loaders  # noqa: E402
from epochal.train.trainer import Trainer  # noqa: E402
from tests.train.synthetic import CountingDataset  # noqa: E402

BASE = [
    "--training.device=cpu",  # compared with CPU references: the same with or without a GPU
    "--data.corpus=",
    "--data.mock=true",
    "--data.seq_length=16",
    "--model.hidden_size=32",
    "--model.num_layers=2",
    "--model.num_attention_heads=4",
    "--model.ffn_hidden_size=64",
    "--model.hidden_dropout=0.1",
    "--model.attention_dropout=0.1",
    "--training.micro_batch_size=2",
    "--training.global_batch_size=4",
    "--training.eval_interval=4",
    "--training.eval_iters=2",
    "--scheduler.lr_warmup_iters=2",
    "--scheduler.lr_decay_iters=12",
    "--checkpoint.save_interval=3",
    "--checkpoint.keep_last=10",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]

BASE_BERT = [  # on top of tests/parallel/bert_worker.py's BASE
    "--model.num_layers=2",
    "--model.hidden_dropout=0.1",
    "--model.attention_dropout=0.1",
    "--training.micro_batch_size=2",
    "--training.global_batch_size=4",
    "--training.eval_interval=4",
    "--training.eval_iters=2",
    "--scheduler.lr_warmup_iters=2",
    "--scheduler.lr_decay_iters=12",
    "--checkpoint.save_interval=3",
    "--checkpoint.keep_last=10",
]


#: ``--moe``: the GPT's blocks routed as DeepSeek-V3 (the balancing bias moved every step)
DEEPSEEK_MOE = (
    "--model.num_experts=8",
    "--model.moe_router_topk=4",
    "--model.moe_ffn_hidden_size=32",
    "--model.moe_shared_expert_intermediate_size=32",
    "--model.moe_router_score_function=sigmoid",
    "--model.moe_router_enable_expert_bias=true",
    "--model.moe_router_bias_update_rate=0.01",
    "--model.moe_router_num_groups=4",
    "--model.moe_router_group_topk=2",
    "--model.moe_router_load_balancing_type=seq_aux_loss",
    "--model.moe_aux_loss_coeff=0.001",
)


def main(argv: list[str]) -> int:
    run_dir, iters, rest = argv[0], int(argv[1]), argv[2:]
    pause_after = None
    bert = rest[:1] == ["--bert"]
    t5 = rest[:1] == ["--t5"]
    esm = rest[:1] == ["--esm"]
    finetune = rest[:1] == ["--finetune"]
    sft = rest[:1] == ["--sft"]
    moe = rest[:1] == ["--moe"]
    rest = rest[1:] if bert or t5 or esm or finetune or sft or moe else rest
    if rest[:1] == ["--pause-after"]:
        pause_after, rest = int(rest[1]), rest[2:]
    if bert:
        from tests.parallel import bert_worker

        cfg = bert_worker.config(run_dir, [*BASE_BERT, f"--training.train_iters={iters}", *rest])
        data = bert_worker.data(cfg)
    elif t5:
        from tests.parallel import t5_worker

        overrides = [*t5_worker.HF_STYLE, *BASE_BERT, f"--training.train_iters={iters}", *rest]
        cfg = t5_worker.config(run_dir, overrides)
        data = None  # epochal train's own file path (build_t5_datasets)
    elif finetune:  # a pretrained tiny ESM fine-tuned with a residue head (dropout everywhere)
        from tests.parallel import finetune_worker

        head = "residue_classification"
        files = finetune_worker.prepare(Path(run_dir).parent / "finetune", head)
        overrides = [
            *BASE_BERT,
            "--model.head_dropout=0.25",
            f"--training.train_iters={iters}",
            *rest,
        ]
        cfg = finetune_worker.config(run_dir, files, head, overrides)
        data = None
    elif sft:
        from tests.parallel import sft_worker

        rows = Path(run_dir).parent / "sft"
        overrides = [
            f"--sft.train_file={rows / 'train.jsonl'}",
            f"--sft.valid_file={rows / 'valid.jsonl'}",
            "--sft.split=",
            "--sft.packing=true",
            "--model.hidden_dropout=0.1",
            "--model.attention_dropout=0.1",
            *BASE_BERT,
            "--scheduler.lr_warmup_iters=0",  # the preset's fraction warms up instead
            "--scheduler.lr_warmup_fraction=0.2",
            f"--training.train_iters={iters}",
            "--logging.progress=false",
            "--logging.tensorboard=false",
            *rest,
        ]
        cfg = sft_worker.config(run_dir, overrides)
        data = None  # epochal train's own fine-tuning path (epochal.train.inputs.sft)
    elif esm:
        from tests.parallel import bert_worker

        cache = str(Path(run_dir).parent / "esm-cache")
        overrides = [*bert_worker.esm(cache), *BASE_BERT, f"--training.train_iters={iters}", *rest]
        cfg = bert_worker.config(run_dir, overrides)
        data = None  # epochal train's own protein path (epochal.train.inputs.esm)
    else:
        cfg = build_config(
            preset="tiny",
            overrides=[
                *BASE,
                *(DEEPSEEK_MOE if moe else ()),
                f"--run_dir={run_dir}",
                f"--training.train_iters={iters}",
                *rest,
            ],
        )
        data = make_loaders(
            cfg,
            CountingDataset(100_000, 16, 96),
            CountingDataset(64, 16, 96, offset=10**6),
            vocab_size=96,
        )
    trainer = Trainer(cfg, data=data, log=False)
    if pause_after is not None:

        def pause(tr: Trainer, step: int, metrics: dict) -> None:
            if step == pause_after:
                (Path(run_dir) / "paused").write_text(str(step))
                time.sleep(600)

        trainer.add_callback(pause)
    trainer.train()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
