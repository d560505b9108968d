"""Checkpoint checksums: damaged files are named, ``resume="auto"`` falls back, exports verify.

Issue 15, items 2 and 5: a bit-flipped ``.distcp`` used to resume silently (the
loss jumped from ~5 to over 200); truncated, zeroed or missing ``.distcp`` files
and a truncated ``rng_rank0.pt`` gave raw ``RuntimeError``/``EOFError``/
``FileNotFoundError``/``[Errno 22]`` tracebacks.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from epochal._checksum import MANIFEST, ChecksumError
from epochal.cli import main as cli_main
from epochal.model import GPTModel
from epochal.train.state.checkpoint import CheckpointCorruptError, Checkpointer, CheckpointError
from epochal.train.state.model_state import ModelState
from tests.train.test_checkpoint import CFG, save, trained
from tests.train.test_trainer import trainer


def flip(path, nbytes=8):
    """Invert ``nbytes`` bytes in the middle of ``path`` (size unchanged)."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + nbytes] = bytes(b ^ 0xFF for b in data[mid : mid + nbytes])
    path.write_bytes(bytes(data))


def distcp(folder):
    files = sorted(folder.glob("*.distcp"))
    assert files, folder
    return files[0]


# --------------------------------------------------------------- the trainer
def test_auto_resume_skips_a_bit_flipped_step_and_continues_exactly(tmp_path):
    full = trainer(tmp_path).train()  # steps 1-4, checkpoints at 2 and 4
    ckpts = tmp_path / "checkpoints"
    step4 = ckpts / "step_0000004"
    damaged = distcp(step4)
    flip(damaged)
    damaged_bytes = damaged.read_bytes()
    with pytest.warns(UserWarning, match=rf"{damaged.name}.*resuming from .*step_0000002"):
        resumed = trainer(tmp_path).train()
    assert resumed.resumed_from.endswith("step_0000002") and resumed.start_step == 2
    assert resumed.losses == full.losses[2:]  # bit-exact continuation from step 2
    # nothing was deleted: the damaged step was moved aside when step 4 was saved again
    kept = ckpts / "damaged-step_0000004"
    assert (kept / damaged.name).read_bytes() == damaged_bytes
    assert (kept / MANIFEST).is_file()
    with pytest.raises(CheckpointCorruptError, match=damaged.name):
        Checkpointer(ckpts).check_intact(kept)
    Checkpointer(ckpts).check_intact(step4)  # the new step 4 is intact
    assert sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step_")) == [
        "step_0000002",
        "step_0000004",
    ]


def test_explicit_resume_of_a_damaged_step_is_an_error(tmp_path):
    trainer(tmp_path).train()
    step4 = tmp_path / "checkpoints" / "step_0000004"
    flip(distcp(step4))
    with pytest.raises(CheckpointCorruptError, match=rf"{distcp(step4)}: damaged"):
        trainer(tmp_path, f"--checkpoint.resume={step4}").train()
    assert (step4 / MANIFEST).is_file()  # untouched


def test_auto_resume_with_every_step_damaged_is_an_error(tmp_path):
    trainer(tmp_path).train()
    for folder in (tmp_path / "checkpoints").glob("step_*"):
        flip(distcp(folder))
    with pytest.raises(CheckpointCorruptError, match="every checkpoint is damaged"):
        trainer(tmp_path).train()


MOCK = [
    "--training.device=cpu",  # compared with CPU references: the same with or without a GPU
    "--data.corpus=",
    "--data.mock=true",
    "--data.seq_length=8",
    "--model.hidden_size=32",
    "--model.num_layers=2",
    "--model.ffn_hidden_size=64",
    "--training.micro_batch_size=2",
    "--training.global_batch_size=4",
    "--training.train_iters=2",
    "--training.eval_iters=0",
    "--scheduler.lr_warmup_iters=1",
    "--checkpoint.save_interval=2",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]


def test_cli_names_the_damaged_file_without_a_traceback(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli_main(["train", f"--run_dir={run}", *MOCK]) == 0
    step2 = run / "checkpoints" / "step_0000002"
    (step2 / "rng_rank0.pt").write_bytes((step2 / "rng_rank0.pt").read_bytes()[:100])
    capsys.readouterr()
    rc = cli_main(["train", f"--run_dir={run}", f"--checkpoint.resume={step2}", *MOCK])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"{step2 / 'rng_rank0.pt'}: damaged" in err and "Traceback" not in err


# ---------------------------------------------------------- the checkpointer
def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _zero(path):
    path.write_bytes(bytes(path.stat().st_size))


DAMAGE = {
    "flipped distcp": (distcp, flip, "differs from the checkpoint's manifest"),
    "truncated distcp": (distcp, _truncate, "truncated"),
    "zeroed distcp": (distcp, _zero, "differs from the checkpoint's manifest"),
    "missing distcp": (distcp, os.remove, "missing"),
    "truncated rng": (lambda f: f / "rng_rank0.pt", _truncate, "truncated"),
    "flipped metadata": (lambda f: f / ".metadata", flip, "differs"),
    "truncated trainer_state": (lambda f: f / "trainer_state.json", _truncate, "truncated"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_file_is_named(tmp_path, damage):
    pick, hurt, why = DAMAGE[damage]
    m, opt = trained()
    folder = save(Checkpointer(tmp_path / "ck"), 1, m, opt)
    target = pick(folder)
    hurt(target)
    m2, opt2 = trained(seed=1)
    with pytest.raises(CheckpointCorruptError, match=rf"{target}: .*{why}") as info:
        Checkpointer(tmp_path / "ck").load(folder, {"model": ModelState([m2]), "optimizer": opt2})
    assert isinstance(info.value, CheckpointError) and isinstance(info.value, ValueError)
    assert info.value.__cause__ is None or isinstance(info.value.__cause__, ChecksumError)


def test_manifest_lists_every_file_and_a_damaged_manifest_is_an_error(tmp_path):
    import json

    m, opt = trained()
    folder = save(Checkpointer(tmp_path / "ck"), 1, m, opt)
    files = json.loads((folder / MANIFEST).read_text())["files"]
    assert sorted(files) == sorted(p.name for p in folder.iterdir() if p.name != MANIFEST)
    assert {"size", "sha256"} <= set(files["rng_rank0.pt"])
    (folder / MANIFEST).write_text("{")
    with pytest.raises(CheckpointCorruptError, match=rf"{folder / MANIFEST}: malformed"):
        Checkpointer(tmp_path / "ck").load(folder, {"model": ModelState([GPTModel(CFG)])})


def test_checkpoint_without_manifest_loads_with_a_warning(tmp_path):
    """Checkpoints saved before checksums existed still load (unverified, with a warning);
    their damaged RNG file is still a clear error, not ``[Errno 22]``."""
    m, opt = trained()
    folder = save(Checkpointer(tmp_path / "ck"), 1, m, opt, tag="old")
    os.remove(folder / MANIFEST)
    m2, opt2 = trained(seed=1)
    with pytest.warns(UserWarning, match="no manifest.json"):
        state, _ = Checkpointer(tmp_path / "ck").load(
            folder, {"model": ModelState([m2]), "optimizer": opt2}
        )
    assert state["tag"] == "old"
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), m2.parameters()))
    _truncate(folder / "rng_rank0.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CheckpointError, match=rf"{folder / 'rng_rank0.pt'}: .*corrupt"):
            Checkpointer(tmp_path / "ck").load(folder, {"model": ModelState([m2])})


# ----------------------------------------------------------------- exports
def test_consolidated_export_records_and_verifies_its_checksum(tmp_path):
    from safetensors import safe_open

    from epochal.parallel.checkpoint import load_consolidated
    from epochal.train.parallel_trainer import export_consolidated

    m, opt = trained()
    folder = save(Checkpointer(tmp_path / "ck"), 1, m, opt)
    out = tmp_path / "model.safetensors"
    export_consolidated(folder, out, skip=["output.weight"])
    with safe_open(str(out), framework="pt") as f:  # still a standard safetensors file
        assert len(f.metadata()["epochal_sha256"]) == 64
    fresh = GPTModel(CFG, seed=5)
    load_consolidated(out, fresh, strict=False)
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), fresh.parameters()))
    flip(out)
    with pytest.raises(ValueError, match=rf"{out}: damaged"):
        load_consolidated(out, GPTModel(CFG), strict=False)


def test_convert_refuses_a_damaged_safetensors_export_and_checkpoint(tmp_path, capsys):
    from epochal.train.state.epochal_ckpt import load_epochal_checkpoint, save_consolidated

    m, opt = trained()
    save(Checkpointer(tmp_path / "run" / "checkpoints"), 1, m, opt, model_config=CFG.to_dict())
    out = tmp_path / "model.safetensors"
    save_consolidated(CFG, m.state_dict(), out, step=1, source="trained-here")
    assert load_epochal_checkpoint(out).step == 1
    # one bit inside the header's metadata: still a valid file for safetensors
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(out.read_bytes().replace(b"trained-here", b"trained-herd", 1))
    with pytest.raises(ValueError, match=rf"{damaged}: damaged"):
        load_epochal_checkpoint(damaged)
    flip(out)
    assert cli_main(["convert", str(out), str(tmp_path / "hf"), "--to", "hf"]) == 2
    assert f"{out}: damaged" in capsys.readouterr().err
    step1 = tmp_path / "run" / "checkpoints" / "step_0000001"
    flip(distcp(step1))
    with pytest.raises(CheckpointCorruptError, match=rf"{distcp(step1)}: damaged"):
        load_epochal_checkpoint(tmp_path / "run")
