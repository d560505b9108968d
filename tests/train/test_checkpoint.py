"""Checkpointer: DCP round trip, write-then-rename, latest pointer, keep-last-k, safe loading."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch

from epochal._checksum import MANIFEST, build_manifest
from epochal.model import GPTModel, ModelConfig
from epochal.train.optim.optimizer import OptimizersContainer, build_adamw
from epochal.train.state.checkpoint import Checkpointer, CheckpointError, load_metadata_safely
from epochal.train.state.model_state import ModelState
from epochal.train.state.rng import get_rng_state

CFG = ModelConfig(
    vocab_size=40,
    hidden_size=16,
    num_layers=2,
    num_attention_heads=2,
    max_position_embeddings=8,
    position_embedding_type="rope",
    hidden_dropout=0.0,
    attention_dropout=0.0,
)


def trained(seed=0):
    m = GPTModel(CFG, seed=seed)
    opt = OptimizersContainer([m], lambda part: build_adamw([part], lr=1e-2, weight_decay=0.1))
    m(torch.arange(6)[None]).sum().backward()
    opt.step()
    return m, opt


def save(ck, step, m, opt, rng=None, **extra):
    return ck.save(
        step,
        {"model": ModelState([m]), "optimizer": opt},
        trainer_state={"step": step, **extra},
        rng_state=rng if rng is not None else get_rng_state(),
        config_toml="x = 1\n",
    )


def test_round_trip(tmp_path):
    m, opt = trained()
    ck = Checkpointer(tmp_path / "ck")
    saved_rng = get_rng_state()
    folder = save(ck, 7, m, opt, rng=saved_rng, consumed=28)
    assert folder.name == "step_0000007" and ck.latest() == folder
    assert (tmp_path / "ck" / "latest").read_text().strip() == "step_0000007"
    assert (folder / "config.toml").read_text() == "x = 1\n"
    m2, opt2 = GPTModel(CFG, seed=1), None
    opt2 = OptimizersContainer([m2], lambda part: build_adamw([part], lr=1e-2, weight_decay=0.1))
    state, rng = ck.load(folder, {"model": ModelState([m2]), "optimizer": opt2})
    assert state == {"step": 7, "consumed": 28}
    assert rng.keys() == saved_rng.keys()
    assert all(torch.equal(rng[k], saved_rng[k]) for k in rng)
    for (n, a), b in zip(m.state_dict().items(), m2.state_dict().values()):
        assert torch.equal(a, b), n
    assert m2.output.weight is m2.tok_embeddings.weight
    s1, s2 = opt.optimizers[0].state_dict()["state"], opt2.optimizers[0].state_dict()["state"]
    for k in s1:
        assert torch.equal(s1[k]["exp_avg_sq"], s2[k]["exp_avg_sq"])


def test_keep_last_and_stale_tmp(tmp_path):
    m, opt = trained()
    ck = Checkpointer(tmp_path / "ck", keep_last=2)
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / ".tmp-step_0000099").mkdir()  # a save killed half-way
    for step in (1, 2, 3):
        save(ck, step, m, opt)
    assert [s for s, _ in ck.step_folders()] == [2, 3]
    assert not (tmp_path / "ck" / ".tmp-step_0000099").exists()
    # Pointer missing (crash after rename, before the pointer): the newest complete folder is used.
    os.remove(tmp_path / "ck" / "latest")
    assert ck.latest().name == "step_0000003"
    (tmp_path / "ck" / "latest").write_text("step_0000042\n")
    with pytest.raises(CheckpointError, match="latest"):
        ck.latest()
    assert Checkpointer(tmp_path / "empty").latest() is None


def test_resave_same_step_replaces(tmp_path):
    m, opt = trained()
    ck = Checkpointer(tmp_path / "ck")
    save(ck, 5, m, opt, tag="old")
    save(ck, 5, m, opt, tag="new")
    assert json.loads((ck.latest() / "trainer_state.json").read_text())["tag"] == "new"


def test_crash_between_the_renames_of_a_resave_loses_nothing(tmp_path, monkeypatch):
    """Re-saving step 5 moves the old step_5 aside, then renames the new one in; a
    kill between the two renames must leave the old copy loadable through ``latest``."""
    import epochal._atomic as atomic

    m, opt = trained()
    ck = Checkpointer(tmp_path / "ck")
    save(ck, 5, m, opt, tag="old")
    real_replace = os.replace

    def killed_after_first_rename(src, dst):
        real_replace(src, dst)
        if str(dst).endswith(".old-step_0000005"):
            raise KeyboardInterrupt("killed")

    monkeypatch.setattr(atomic.os, "replace", killed_after_first_rename)
    with pytest.raises(KeyboardInterrupt):
        save(ck, 5, m, opt, tag="new")
    monkeypatch.setattr(atomic.os, "replace", real_replace)
    assert not (tmp_path / "ck" / "step_0000005").exists()
    with pytest.warns(UserWarning, match="interrupted"):
        folder = ck.latest()
    assert folder.name == ".old-step_0000005"
    m2 = GPTModel(CFG, seed=3)
    opt2 = OptimizersContainer([m2], lambda part: build_adamw([part], lr=1e-2, weight_decay=0.1))
    state, _ = ck.load(folder, {"model": ModelState([m2]), "optimizer": opt2})
    assert state["tag"] == "old"
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), m2.parameters()))
    # The next save completes and clears the parked copy.
    save(ck, 6, m, opt, tag="next")
    assert ck.latest().name == "step_0000006"
    assert not list((tmp_path / "ck").glob(".old-*"))


class Evil:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def forge_manifest(folder):
    """What an attacker who rewrites files also does: a manifest that matches them."""
    (folder / MANIFEST).write_bytes(build_manifest(folder))


def test_malicious_metadata_is_refused(tmp_path, monkeypatch):
    m, opt = trained()
    ck = Checkpointer(tmp_path / "ck")
    folder = save(ck, 1, m, opt)
    (folder / ".metadata").write_bytes(pickle.dumps(Evil()))
    forge_manifest(folder)  # checksums catch damage, the restricted unpickler catches malice
    monkeypatch.chdir(tmp_path)
    m2 = GPTModel(CFG, seed=1)
    with pytest.raises(CheckpointError, match="refusing to unpickle"):
        ck.load(folder, {"model": ModelState([m2])})
    assert not (tmp_path / "PWNED").exists()
    with pytest.raises(CheckpointError, match="refusing"):
        load_metadata_safely(pickle.dumps({"a": Evil()}))
    with pytest.raises(CheckpointError, match="expected DCP Metadata"):
        load_metadata_safely(pickle.dumps({"a": 1}))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_metadata_safely(b"\x80\x04garbage")


def test_malicious_rng_and_missing_files(tmp_path, monkeypatch):
    m, opt = trained()
    ck = Checkpointer(tmp_path / "ck")
    folder = save(ck, 1, m, opt)
    (folder / "rng_rank0.pt").write_bytes(pickle.dumps(Evil()))
    forge_manifest(folder)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="rng_rank0.pt"):
        ck.load(folder, {"model": ModelState([GPTModel(CFG)])})
    assert not (tmp_path / "PWNED").exists()
    (folder / "trainer_state.json").write_text("{not json")
    forge_manifest(folder)
    with pytest.raises(CheckpointError, match="trainer_state.json"):
        ck.load(folder, {"model": ModelState([GPTModel(CFG)])})
    with pytest.raises(CheckpointError, match="does not exist"):
        ck.load(tmp_path / "nowhere", {})


def test_keep_last_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="keep_last"):
        Checkpointer(tmp_path, keep_last=0)
