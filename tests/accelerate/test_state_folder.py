"""``save_state(dir)`` into a folder that holds the user's files: they stay as they were.

Peer: Hugging Face Accelerate writes its own files (``model.safetensors``,
``optimizer.bin``, ``random_states_0.pkl``, ...) into such a folder and leaves every
other file alone. epochal writes ``latest``, ``step_NNNNNNN/`` (and ``scheduler.bin``,
``custom_checkpoint_<i>.pt``) there: the user's other files are kept, its earlier
checkpoint alone is replaced, and a name of the user's it would have to write is
refused before anything is written, naming the path.
"""

import copy

import pytest
import torch
from torch.utils.data import DataLoader
from transformers import default_data_collator

import accelerate
import epochal.accelerate
from epochal.accelerate.checkpointing import StateFolderError
from tests.accelerate.conftest import blocks, tiny_gpt2


def _users_files(folder):
    """What a user keeps in ``out/``: their own ``step_0000001/``, a ``latest`` note, a table."""
    (folder / "step_0000001").mkdir(parents=True)
    (folder / "step_0000001" / "notes.txt").write_text("my first step\n")
    (folder / "results.csv").write_text("step,loss\n1,4.6\n")
    return folder


def _snapshot(folder):
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
        for p in sorted(folder.rglob("*"))
    }


class _Counter:
    def __init__(self):
        self.n = 0

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, state):
        self.n = state["n"]


@pytest.fixture(scope="module")
def trained():
    """``step(package)``: a prepared tiny GPT-2 of ``package`` after ``n`` steps (a function)."""
    torch.manual_seed(0)
    start, data = tiny_gpt2(), blocks(16)

    def make(package):
        accelerator = package.Accelerator(cpu=True)
        model = copy.deepcopy(start)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(data, batch_size=4, collate_fn=default_data_collator)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        batches = iter(loader)

        def step():
            loss = model(**next(batches)).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

        return accelerator, step

    return make


def test_accelerate_leaves_the_users_files_alone(trained, tmp_path):
    """The peer's behaviour this front end follows."""
    out = _users_files(tmp_path / "out")
    (out / "latest").write_text("my own pointer\n")
    before = _snapshot(out)
    accelerator, step = trained(accelerate)
    step()
    accelerator.save_state(str(out))
    after = _snapshot(out)
    assert {k: after[k] for k in before} == before
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl"} <= set(after)


def test_save_state_keeps_the_users_files_and_replaces_only_its_own(trained, tmp_path):
    out = _users_files(tmp_path / "out")
    before = _snapshot(out)
    accelerator, step = trained(epochal.accelerate)
    step()
    step()
    accelerator.save_state(out)  # step 2: beside the user's step_0000001/
    step()
    accelerator.save_state(out)  # step 3 replaces step 2, and only it
    after = _snapshot(out)
    assert {k: after[k] for k in before} == before
    assert (out / "latest").read_text() == "step_0000003\n"
    assert not (out / "step_0000002").exists() and (out / "step_0000003").is_dir()
    accelerator.load_state(out)  # its own checkpoint loads
    assert _snapshot(out) == after


def test_a_name_of_the_users_is_refused_before_anything_is_written(trained, tmp_path):
    accelerator, step = trained(epochal.accelerate)
    step()  # step 1: it would write step_0000001/
    clashes = {
        "latest": lambda out: (out / "latest").write_text("my own pointer\n"),
        "step_0000001": lambda out: (out / "step_0000001").mkdir(),
        "custom_checkpoint_0.pt": lambda out: (out / "custom_checkpoint_0.pt").write_bytes(b"x"),
    }
    accelerator.register_for_checkpointing(_Counter())
    for name, make in clashes.items():
        out = tmp_path / name / "out"
        out.mkdir(parents=True)
        (out / "results.csv").write_text("step,loss\n1,4.6\n")
        make(out)
        before = _snapshot(out)
        with pytest.raises(StateFolderError) as refused:
            accelerator.save_state(out)
        assert f"{out / name} is not accelerator.save_state's" in str(refused.value)
        assert _snapshot(out) == before
