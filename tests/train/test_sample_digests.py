"""Every train record carries the digest of its global batch's samples; ``epochal inspect RUN --step N``.

The digest names the samples, not how they were split: one process and two gloo
ranks, micro-batch 8 and micro-batch 4 with accumulation, a run stopped and resumed
all record the same digest at every step, and another seed records other digests.
``inspect --step N`` lists the samples the trainer read at step N (GPT: the tokens of
the listed document ranges are the tokens the step received; ESM-2: the listed
member of the listed cluster is the protein the step read), and a resumed run's
summary says whether its data names the samples the checkpoint recorded.
"""

from __future__ import annotations

import json

import pytest
import torch

from epochal.cli import main
from epochal.train.config import build_config
from epochal.train.observe.metrics import read_metrics
from epochal.train.trainer import Trainer
from tests.dist_utils import run_gloo
from tests.tiny_gpt_args import TINY_GPT_ARGS

STEPS = 4
GPT = [
    "--training.device=cpu",
    "--data.corpus=",
    *TINY_GPT_ARGS,
    "--model.vocab_size=128",  # the mock corpus's ids are taken modulo this
    "--training.global_batch_size=16",
    f"--training.train_iters={STEPS}",
    "--training.eval_interval=0",
    "--training.eval_iters=0",
    "--logging.progress=false",
    "--logging.tensorboard=false",
    "--checkpoint.save_interval=0",
]


def gpt_config(run_dir, cache, *extra):
    return build_config(
        preset="tiny", overrides=[*GPT, f"--run_dir={run_dir}", f"--data.cache_dir={cache}", *extra]
    )


def digests(run_dir) -> dict[int, str]:
    """``{step: sample_digest}`` of a run's train records (the latest record of a step wins)."""
    return {
        r["step"]: r["sample_digest"]
        for r in read_metrics(run_dir / "metrics.jsonl")
        if r["kind"] == "train"
    }


def spy_batches(trainer: Trainer) -> list[tuple[int, dict]]:
    """Record ``(step, micro-batch)`` of every micro-batch the trainer reads, in order."""
    seen: list[tuple[int, dict]] = []
    read = trainer.step_batch

    def spy(micro_batch):
        seen.append((trainer.step + 1, {k: v.clone() for k, v in micro_batch.items()}))
        return read(micro_batch)

    trainer.step_batch = spy
    return seen


def inspect_json(run_dir, step: int, capsys) -> dict:
    capsys.readouterr()
    assert main(["inspect", str(run_dir), "--step", str(step), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def gpt_runs(tmp_path_factory):
    """Mock GPT data, global batch 16: micro-batch 8 stopped after step 2 and resumed;
    micro-batch 4 (4 accumulated micro-batches) with its micro-batches recorded; another seed."""
    tmp = tmp_path_factory.mktemp("digests")
    cache = tmp / "cache"
    mb8 = ["--training.micro_batch_size=8"]
    stop = gpt_config(tmp / "mb8", cache, *mb8, "--training.exit_interval=2")
    first = Trainer(stop, log=False).train()
    resumed = Trainer(gpt_config(tmp / "mb8", cache, *mb8), log=False).train()
    acc = Trainer(gpt_config(tmp / "mb4", cache, "--training.micro_batch_size=4"), log=False)
    seen = spy_batches(acc)
    acc.train()
    Trainer(gpt_config(tmp / "seed", cache, *mb8, "--training.seed=7"), log=False).train()
    return {"tmp": tmp, "first": first, "resumed": resumed, "acc": acc, "seen": seen}


def test_digests_equal_across_micro_batches_and_resume_differ_with_seed(gpt_runs):
    tmp = gpt_runs["tmp"]
    mb8, mb4, seed = digests(tmp / "mb8"), digests(tmp / "mb4"), digests(tmp / "seed")
    assert list(mb4) == list(range(1, STEPS + 1)) and len(set(mb4.values())) == STEPS
    assert all(len(d) == 16 and int(d, 16) >= 0 for d in mb4.values())
    assert mb8 == mb4  # micro-batch 8, stopped after step 2 and resumed = micro-batch 4 x 4
    assert all(seed[s] != mb4[s] for s in mb4)


def test_the_checkpoint_records_digests_and_the_resume_summary_says_they_match(gpt_runs):
    first, resumed = gpt_runs["first"], gpt_runs["resumed"]
    assert first.final_step == 2 and first.sample_check is None
    state = json.loads((first.last_checkpoint / "trainer_state.json").read_text())
    recorded = {e["step"]: e for e in state["sample_digests"]}
    assert [(s, e["first_sample"], e["samples"]) for s, e in recorded.items()] == [
        (2, 16, 16),
        (3, 32, 16),
    ]
    after = digests(gpt_runs["tmp"] / "mb8")
    assert after[2] == recorded[2]["digest"] and after[3] == recorded[3]["digest"]
    assert resumed.start_step == 2
    assert resumed.sample_check == "sample digests match the checkpoint (steps 2-3)"


def test_inspect_lists_the_tokens_the_step_read(gpt_runs, capsys):
    tmp, acc, seen = gpt_runs["tmp"], gpt_runs["acc"], gpt_runs["seen"]
    listing = inspect_json(tmp / "mb4", 3, capsys)
    assert listing["first_sample"] == 32 and listing["digest"] == digests(tmp / "mb4")[3]
    assert listing["recorded_digest"] == listing["digest"]
    read = [mb for step, mb in seen if step == 3]
    assert len(read) == 4  # four accumulated micro-batches of 4
    tokens = torch.cat([mb["tokens"] for mb in read])
    labels = torch.cat([mb["labels"] for mb in read])
    corpus = acc.data.train_loader.dataset.dataset  # the documents the GPT windows cut
    assert [s["sample"] for s in listing["samples"]] == list(range(32, 48))
    for k, sample in enumerate(listing["samples"]):
        spans = sample["identity"]["documents"]
        window = torch.cat(
            [torch.as_tensor(corpus.get(d, offset=a, length=b - a)) for d, a, b in spans]
        )
        assert torch.equal(window[:-1], tokens[k]) and torch.equal(window[1:], labels[k])


def test_inspect_text_output_and_errors(gpt_runs, capsys):
    run = gpt_runs["tmp"] / "mb4"
    capsys.readouterr()
    assert main(["inspect", str(run), "--step", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{run} step 2: global samples 16-31 (16 samples)"
    assert out[2] == f"sample digest {digests(run)[2]}, as recorded in metrics.jsonl"
    assert out[3].split() == ["sample", "dataset", "epoch", "window", "documents"]
    assert len(out) == 4 + 16 and out[4].split()[0] == "16"
    assert main(["inspect", str(run)]) == 1
    assert "give --step N" in capsys.readouterr().err
    assert main(["inspect", str(run), "--step", "10000000"]) == 1
    assert "beyond the" in capsys.readouterr().err


def _dp2_rank(rank: int, world_size: int, run_dir: str, cache: str) -> dict[int, str] | None:
    from epochal.parallel.launch import init_distributed
    from epochal.train.parallel_trainer import ParallelTrainer

    cfg = gpt_config(run_dir, cache, "--training.micro_batch_size=4")
    trainer = ParallelTrainer(cfg, log=False, dist_info=init_distributed(cfg.parallel, "cpu"))
    trainer.train()
    return digests(trainer.run_dir) if rank == 0 else None


@pytest.mark.distributed
def test_two_data_parallel_ranks_record_the_digests_of_one_process(gpt_runs):
    tmp = gpt_runs["tmp"]
    ranks = run_gloo(_dp2_rank, 2, str(tmp / "dp2"), str(tmp / "cache"))
    assert ranks[0] == digests(tmp / "mb4")  # DP2 x 2 micro-batches of 4 = 1 process x 4


def test_inspect_lists_the_esm_clusters_and_members_the_step_read(tmp_path, capsys):
    cfg = build_config(
        preset="esm-tiny",
        overrides=[
            "--training.device=cpu",
            f"--run_dir={tmp_path / 'esm'}",
            f"--data.cache_dir={tmp_path / 'cache'}",
            "--data.seq_length=32",  # shorter than most proteins: samples are cropped windows
            "--model.hidden_size=32",
            "--model.num_layers=1",
            "--model.ffn_hidden_size=64",
            "--training.micro_batch_size=4",
            "--training.global_batch_size=8",
            "--training.train_iters=3",
            "--training.eval_iters=0",
            "--logging.progress=false",
            "--logging.tensorboard=false",
            "--checkpoint.save_interval=0",
            "--checkpoint.save_final=false",
        ],
    )
    trainer = Trainer(cfg, log=False)
    seen = spy_batches(trainer)
    trainer.train()
    listing = inspect_json(tmp_path / "esm", 2, capsys)
    assert listing["digest"] == listing["recorded_digest"] == digests(tmp_path / "esm")[2]
    proteins = trainer.data.train_loader.dataset.resampler.dataset  # ESMMaskedResidueDataset
    read = [mb for step, mb in seen if step == 2]
    tokens, labels = torch.cat([m["tokens"] for m in read]), torch.cat([m["labels"] for m in read])
    padding = torch.cat([m["padding_mask"] for m in read])
    for k, sample in enumerate(listing["samples"]):
        cluster, member = sample["identity"]["cluster"], sample["details"]["member"]
        assert member in list(proteins.clusters[cluster])
        n = int(padding[k].sum())
        original = torch.where(labels[k] != -100, labels[k], tokens[k])[:n].tolist()
        whole = proteins.tokenize(proteins.protein_dataset[member]).tolist()
        assert any(whole[i : i + n] == original for i in range(len(whole) - n + 1)), member


def test_a_resume_on_changed_data_warns_in_the_summary(tmp_path, capsys):
    from epochal.data.indexed.preprocess import preprocess_documents
    from epochal.data.indexed.tokenizer import build_tokenizer

    docs = [f"document {i}: " + "abcdefgh"[i % 8] * (10 + i % 7) for i in range(40)]
    preprocess_documents(docs, build_tokenizer("ByteLevelTokenizer"), tmp_path / "text")
    options = [
        *GPT,
        "--training.micro_batch_size=8",
        f"--data.data_path=[{json.dumps(str(tmp_path / 'text'))}]",
        "--data.tokenizer_type=ByteLevelTokenizer",
        "--model.vocab_size=259",
        "--data.mock=false",
        "--data.split=100,0,0",
        f"--data.cache_dir={tmp_path / 'cache'}",
        f"--run_dir={tmp_path / 'run'}",
        "--training.train_iters=2",
    ]
    Trainer(build_config(preset="tiny", overrides=options), log=False).train()
    capsys.readouterr()
    # 20 steps need more epochs of the 40 documents: Megatron's index shuffles them all anew
    more = ["--training.train_iters=20", "--training.exit_interval=3"]  # one step is enough
    assert main(["train", *options, *more]) == 0
    out = capsys.readouterr().out
    assert "warning: sample digests differ from the checkpoint (step 2: recorded " in out
    assert out.count("warning: sample digests differ") == 2  # at the resume and in the summary
    assert "a new training.train_iters made the dataset index more epochs" in out
