"""A refusal reaches the user as one line at their script's line; loaders keep BatchEncoding."""

import os
import subprocess
import sys

import torch
from transformers import BatchEncoding

from epochal.accelerate.local_sgd import LocalSGDError
from epochal.accelerate.prepare_data import concat_micro_batches, send_to_device
from epochal.accelerate.refusals import is_refusal


def test_a_refusal_prints_one_line_naming_the_script_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "from epochal.accelerate import Accelerator\n"
        "from epochal.accelerate.utils import DummyOptim\n"
        "accelerator = Accelerator(cpu=True)\n"
        "accelerator.prepare(DummyOptim([]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEGATRON_LM_", "ACCELERATE_"))}
    env.pop("EPOCHAL_TRACEBACK", None)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr
    assert lines[-1].startswith(f"{script}:4: ") and "DummyOptim" in lines[-1]
    env["EPOCHAL_TRACEBACK"] = "1"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and "Traceback" in proc.stderr


def test_only_the_front_ends_errors_are_refusals():
    assert is_refusal(LocalSGDError("x"))
    assert not is_refusal(ValueError("x")) and not is_refusal(KeyError("x"))


def test_a_batch_encoding_stays_one():
    parts = [BatchEncoding({"input_ids": torch.ones(2, 3, dtype=torch.long)}) for _ in range(2)]
    for batch in (concat_micro_batches(parts), concat_micro_batches(parts[:1])):
        assert isinstance(batch, BatchEncoding)
        assert isinstance(send_to_device(batch, torch.device("cpu")), BatchEncoding)
        batch.to("cpu")  # what Accelerate's example scripts call
    assert concat_micro_batches(parts)["input_ids"].shape == (4, 3)
    assert type(concat_micro_batches([{"a": torch.ones(1, 2)}])) is dict
