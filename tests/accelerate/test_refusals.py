"""A refusal reaches the user as one line at their script's line; loaders keep BatchEncoding."""

import os
import subprocess
import sys

import torch
from transformers import BatchEncoding

from epochal.accelerate.local_sgd import LocalSGDError
from epochal.accelerate.prepare_data import concat_micro_batches, send_to_device
from epochal.accelerate.refusals import is_refusal
from tests.dist_utils import kill_tree, start_process


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
    # both runs at once (each spends seconds importing, one core each)
    plain, traced = (
        start_process([sys.executable, str(script)], env=e, stderr=subprocess.PIPE)
        for e in (env, {**env, "EPOCHAL_TRACEBACK": "1"})
    )
    try:
        _, out = plain.communicate(timeout=300)
        _, traced_out = traced.communicate(timeout=300)
    finally:
        kill_tree(plain)
        kill_tree(traced)
    assert plain.returncode == 1
    lines = out.strip().splitlines()
    assert "Traceback" not in out
    assert lines[-1].startswith(f"{script}:4: ") and "DummyOptim" in lines[-1]
    assert traced.returncode == 1 and "Traceback" in traced_out


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


def test_a_refused_batch_names_the_scripts_line_not_torchs(capsys):
    """``model(**batch)`` runs through ``torch.nn.Module.__call__``: the line named is the caller's."""
    import inspect

    from torch.utils.data import DataLoader
    from transformers import default_data_collator

    from epochal.accelerate import Accelerator
    from epochal.accelerate.batches import BatchError
    from epochal.accelerate.refusals import _hook, where
    from tests.accelerate.conftest import blocks, tiny_gpt2

    accelerator = Accelerator(cpu=True)
    loader = DataLoader(blocks(4), batch_size=2, collate_fn=default_data_collator)
    model, _ = accelerator.prepare(tiny_gpt2(), loader)
    batch = {**next(iter(loader)), "pixel_values": torch.zeros(2, 3)}
    line = inspect.currentframe().f_lineno + 2
    try:
        model(**batch)
    except BatchError as exc:
        error = exc
    assert where(error.__traceback__) == f"{__file__}:{line}"
    _hook(BatchError, error, error.__traceback__)
    printed = capsys.readouterr().err.strip()
    assert printed.startswith(f"{__file__}:{line}: BatchError: ") and "pixel_values" in printed
    assert "torch" not in printed.split(": BatchError")[0]
