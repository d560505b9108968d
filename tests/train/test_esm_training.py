"""``model.type = "esm"`` trains from protein files through ``epochal train``'s own data path.

A FASTA file (plus an MMseqs2 cluster TSV) is converted into BioNeMo's layout, split
into train / validation clusters and read as BioNeMo's samples; the loss falls, the
run summary shows fresh members and masks per epoch, BioNeMo's own cluster + SQLite
paths train the same way, bad options and files are named. Out of the run: ``epochal
convert --to hf`` loads in ``transformers``' ``EsmForMaskedLM`` with equal logits, and
``epochal fill-mask`` predicts residues.
"""

from __future__ import annotations

import json

import pytest
import torch

from epochal.data import ProteinInputError, proteins_to_bionemo_layout
from epochal.model import ConfigError
from epochal.train.config import build_config
from epochal.train.inputs.epoch_evidence import epoch_summary
from epochal.train.inputs.loaders import build_data
from epochal.train.inputs.synthetic_proteins import synthetic_families
from epochal.train.observe.metrics import read_metrics
from epochal.train.trainer import Trainer

QUIET = [
    "--logging.progress=false",
    "--logging.tensorboard=false",
    "--checkpoint.save_final=false",
    "--checkpoint.save_interval=0",
]


def write_fasta(folder, num_families: int = 24) -> tuple[str, str]:
    """A FASTA of synthetic families and its MMseqs2-style cluster TSV."""
    families = synthetic_families(num_families, seed=7)
    fasta, tsv = folder / "proteins.fasta", folder / "clusters.tsv"
    fasta.write_text("".join(f">{pid} test\n{seq}\n" for fam in families for pid, seq in fam))
    tsv.write_text("".join(f"{fam[0][0]}\t{pid}\n" for fam in families for pid, _ in fam))
    return str(fasta), str(tsv)


@pytest.fixture(scope="module")
def proteins(tmp_path_factory):
    return write_fasta(tmp_path_factory.mktemp("proteins"))


def config(tmp_path, *extra: str):
    return build_config(
        preset="esm-tiny",
        overrides=[
            f"--run_dir={tmp_path / 'run'}",
            f"--data.cache_dir={tmp_path / 'cache'}",
            "--data.seq_length=64",
            "--training.micro_batch_size=4",
            "--training.global_batch_size=8",
            "--training.eval_iters=1",
            *QUIET,
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def trained(proteins, tmp_path_factory):
    """A 40-step run on the FASTA with clusters: about 15 epochs of 22 clusters."""
    tmp = tmp_path_factory.mktemp("esm")
    fasta, tsv = proteins
    cfg = config(
        tmp,
        f"--data.protein_path={fasta}",
        f"--data.protein_clusters={tsv}",
        "--data.protein_valid_fraction=0.1",
        "--training.train_iters=40",
        "--training.eval_interval=20",
        "--checkpoint.save_final=true",
    )
    trainer = Trainer(cfg, log=False)
    return trainer, trainer.train(), tmp / "run"


def test_trains_from_a_fasta_file_and_the_loss_falls(trained):
    trainer, result, run = trained
    data = trainer.data
    assert (
        "proteins.fasta" in data.description
        and "22 train clusters, 2 validation" in data.description
    )
    assert len(data.train_loader.dataset) == 40 * 8  # train_iters * global_batch_size
    batch = next(iter(data.valid_loader))
    assert batch["tokens"].shape == (4, 64) and batch["padding_mask"].dtype == torch.int64
    assert torch.all(batch["labels"][batch["loss_mask"] == 0] == -100)
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert last < first - 0.3, result.losses
    assert result.eval_loss is not None and result.eval_loss < result.losses[0]
    assert set(trainer.last_eval_logged) >= {"lm loss", "mlm accuracy", "mlm ppl"}


def test_epoch_records_show_fresh_members_and_masks(trained):
    _, _, run = trained
    records = read_metrics(run / "metrics.jsonl")
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert len(epochs) >= 10 and all(r["unit"] == "cluster" for r in epochs)
    assert sum(r["member_repeats"] for r in epochs) > 0
    assert sum(r["member_repeats"] - r["same_members"] for r in epochs) > 0
    assert len({r["masks"] for r in epochs}) == len(epochs)
    line = epoch_summary(records)
    assert "epochs of 22 samples; sample order and masks differed in every epoch" in line
    assert "repeated clusters compared" in line and "drew another member" in line


def test_bionemo_cluster_and_database_paths(proteins, tmp_path):
    fasta, tsv = proteins
    layout = proteins_to_bionemo_layout(fasta, tmp_path / "layout", clusters=tsv, num_valid=3)
    cfg = config(
        tmp_path,
        f"--data.train_cluster_path={layout.train_clusters}",
        f"--data.train_database_path={layout.database}",
        f"--data.valid_cluster_path={layout.valid_clusters}",
        "--training.train_iters=2",
    )
    assert not cfg.data.mock  # the preset's synthetic data is replaced
    data = build_data(cfg)
    assert data.train_loader.dataset.samples_per_epoch == 21
    assert data.valid_loader.dataset.samples_per_epoch == 3
    result = Trainer(cfg, data=data, log=False).train()
    assert len(result.losses) == 2 and result.eval_loss is not None


def test_default_data_is_synthetic_and_the_same_everywhere(tmp_path):
    a = build_data(config(tmp_path / "a", "--training.train_iters=2"))
    b = build_data(config(tmp_path / "b", "--training.train_iters=2"))
    assert "synthetic protein families" in a.description
    for i in (0, 7, 15):
        x, y = a.train_loader.dataset[i], b.train_loader.dataset[i]
        assert all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize(
    ("overrides", "option"),
    [
        (["--data.mask_token_prob=1.5"], "data.mask_token_prob"),
        (["--data.mask_token_prob=0.8", "--data.mask_random_prob=0.3"], "data.mask_token_prob"),
        (["--data.masking_probability=-0.1"], "data.masking_probability"),
        (["--data.random_mask_strategy=vowels"], "data.random_mask_strategy"),
        (["--data.protein_valid_fraction=1.0"], "data.protein_valid_fraction"),
        (["--data.protein_clusters=c.tsv"], "data.protein_clusters"),
        (["--data.train_cluster_path=t.parquet"], "data.train_database_path"),
        (["--data.valid_cluster_path=v.parquet"], "data.valid_cluster_path"),
        (
            [
                "--data.protein_path=p.fasta",
                "--data.train_cluster_path=t.parquet",
                "--data.train_database_path=t.sqlite",
            ],
            "data.protein_path",
        ),
    ],
)
def test_bad_options_are_named(overrides, option, tmp_path):
    with pytest.raises(ConfigError, match=option.replace(".", r"\.")):
        config(tmp_path, *overrides)


def test_bad_data_is_named(tmp_path):
    with pytest.raises(ConfigError, match="data.tokenizer_type"):
        build_data(config(tmp_path, "--data.tokenizer_type=GPT2BPETokenizer"))
    with pytest.raises(ConfigError, match="data.protein_path"):
        build_data(config(tmp_path, f"--data.protein_path={tmp_path / 'missing.fasta'}"))
    bad = tmp_path / "bad.fasta"
    bad.write_text(">ok\nMKTAYIAK\n>bad\nMKT1AYI\n")
    with pytest.raises(ProteinInputError, match=r"bad\.fasta:3"):
        build_data(config(tmp_path, f"--data.protein_path={bad}"))


@pytest.mark.peer
def test_hf_export_of_the_run_equals_transformers_and_fill_mask_predicts(trained, tmp_path):
    transformers = pytest.importorskip("transformers")
    from epochal.cli import main
    from epochal.model.build import build_model
    from epochal.train.state.epochal_ckpt import load_epochal_checkpoint

    _, _, run = trained
    hf = tmp_path / "hf"
    assert main(["convert", str(run), str(hf), "--to", "hf"]) == 0
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(hf))
    model = transformers.EsmForMaskedLM.from_pretrained(str(hf)).eval()
    text = "MKTAYIAKQRQISFVKSHFSRQLEERLG"
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    ck = load_epochal_checkpoint(run)
    ours = build_model(ck.config)
    ours.load_state_dict(ck.state)
    with torch.no_grad():
        theirs = model(input_ids=ids).logits[0]
        mine = ours.eval()(ids)[0, :, : theirs.shape[-1]]
    assert torch.allclose(mine, theirs, atol=1e-4), (mine - theirs).abs().max()
    out = tmp_path / "preds.jsonl"
    argv = ["fill-mask", "--checkpoint", str(run), "--text", "MKTAYIAK<mask>RQISF", "--top-k", "3"]
    assert main([*argv, "--output", str(out)]) == 0
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    (preds,) = record["predictions"]
    assert len(preds) == 3 and all(len(tok) == 1 and tok.isalpha() for tok, _ in preds)
