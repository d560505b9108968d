"""Context parallelism through the Accelerate front end, as Accelerate hands it to Megatron.

Accelerate passes ``MegatronLMPlugin(context_parallel_size=N)`` (and
``other_megatron_args={"context_parallel_size": N}``, which wins) to Megatron as
``context_parallel_size``; the expected sizes here come from the real Accelerate's
plugin. One ``epochal launch`` of two gloo processes runs a user's loop with CP2
(``cp_worker.py``) and must agree with the same loop at CP1 in this process within
1e-5 relative: losses, gradient norms, the evaluation loss and logits; its first loss
is transformers' own. What does not compose with context parallelism is refused
by name; Accelerate's ``ParallelismConfig(cp_size=N)`` (the FSDP2 engine's) too.
"""

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
from transformers import default_data_collator

from tests.accelerate import cp_worker
from tests.accelerate.conftest import tiny_gpt2
from tests.dist_utils import run_process

HERE = Path(__file__).resolve().parent


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(("MEGATRON_LM_", "ACCELERATE_"))}


@pytest.mark.parametrize(
    "kwargs, env",
    [
        ({"context_parallel_size": 2}, None),
        ({"other_megatron_args": {"context_parallel_size": 4}}, None),
        ({"context_parallel_size": 2, "other_megatron_args": {"context_parallel_size": 4}}, None),
        ({}, "2"),
        ({"context_parallel_size": 1}, None),
    ],
)
def test_plugin_takes_the_size_accelerate_gives_megatron(monkeypatch, kwargs, env):
    from accelerate.utils import MegatronLMPlugin as Real

    from epochal.accelerate import MegatronLMPlugin

    for key in _clean_env():
        monkeypatch.delenv(key)
    if env is not None:
        monkeypatch.setenv("MEGATRON_LM_CONTEXT_PARALLEL_SIZE", env)
    expected = Real(**kwargs).megatron_lm_default_args["context_parallel_size"]
    ours = MegatronLMPlugin(**kwargs)
    assert ours.cp_degree == expected
    assert ours.parallel_options()["context_parallel"] == expected


def test_plugin_refuses_a_size_below_one(monkeypatch):
    from epochal.accelerate import MegatronLMPlugin
    from epochal.accelerate.plugin import PluginError

    for key in _clean_env():
        monkeypatch.delenv(key)
    with pytest.raises(PluginError, match=r"context_parallel_size.*integer >= 1"):
        MegatronLMPlugin(other_megatron_args={"context_parallel_size": 0})
    monkeypatch.setenv("MEGATRON_LM_CONTEXT_PARALLEL_SIZE", "0")
    with pytest.raises(PluginError, match="MEGATRON_LM_CONTEXT_PARALLEL_SIZE"):
        MegatronLMPlugin()


def test_parallelism_config_cp_size_is_refused_by_name():
    from accelerate import ParallelismConfig
    from epochal.accelerate import Accelerator
    from epochal.accelerate.configuration import ConfigurationError

    with pytest.raises(
        ConfigurationError, match=r"cp_size=2.*fsdp_plugin.*context_parallel_size=2"
    ):
        Accelerator(parallelism_config=ParallelismConfig(cp_size=2))
    with pytest.raises(ConfigurationError, match=r"tp_size=2.*tp_degree=2"):
        Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    # a configuration that asks for nothing is accepted
    assert Accelerator(parallelism_config=ParallelismConfig()).num_processes == 1


def test_prepare_refuses_cp_that_does_not_fit_the_processes(monkeypatch):
    from torch.utils.data import DataLoader

    from epochal.accelerate import Accelerator, MegatronLMPlugin
    from epochal.accelerate.plugin import PluginError

    for key in _clean_env():
        monkeypatch.delenv(key)
    torch.manual_seed(0)
    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(context_parallel_size=2))
    loader = DataLoader(cp_worker.rows(4), batch_size=2, collate_fn=default_data_collator)
    with pytest.raises(PluginError, match=r"1 processes do not fit .*context_parallel_size=2"):
        accelerator.prepare(tiny_gpt2(), loader)


def _in_process(tmp_path: Path) -> dict:
    saved = _clean_env()
    for key in saved:
        del os.environ[key]
    try:
        return cp_worker.main(1, str(tmp_path / "cp1.json"))
    finally:
        os.environ.update(saved)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7)


@pytest.mark.distributed
@pytest.mark.slow  # the engine's CP2 against one process: tests/parallel/test_context_parallel.py
def test_cp2_loop_equals_cp1(tmp_path):
    one = _in_process(tmp_path)
    out = tmp_path / "cp2.json"
    cmd = [sys.executable, "-m", "epochal.cli", "launch", "--cpu", "--num_processes", "2"]
    cmd += [str(HERE / "cp_worker.py"), "2", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEGATRON_LM_", "ACCELERATE_"))}
    env["OMP_NUM_THREADS"] = "1"
    proc = run_process(cmd, timeout=300, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    ranks = [json.loads(out.read_text()), json.loads(Path(f"{out}.1").read_text())]
    assert ranks[0] == ranks[1]  # every rank of the group sees the whole batch's numbers
    two = ranks[0]
    # step 3 passes num_items_in_batch: each process returns its share (loss / processes)
    losses_two = [*two["losses"][:2], two["losses"][2] * two["world"]]
    for key, a_list, b_list in (
        ("losses", one["losses"], losses_two),
        ("grad_norms", one["grad_norms"], two["grad_norms"]),
    ):
        assert len(a_list) == len(b_list) == 3
        for a, b in zip(a_list, b_list, strict=True):
            assert _close(a, b), (key, a_list, b_list)
    assert _close(one["eval_loss"], two["eval_loss"])
    logits_one, logits_two = torch.tensor(one["eval_logits"]), torch.tensor(two["eval_logits"])
    assert logits_one.shape == logits_two.shape == (4, 15, 101)  # the batch's length, unpadded
    assert torch.allclose(logits_one, logits_two, rtol=1e-5, atol=1e-5)
    # the first step's loss is transformers' on the unprepared model
    torch.manual_seed(0)
    batch = default_data_collator(cp_worker.rows()[:4])
    reference = tiny_gpt2()(**batch).loss.item()
    assert _close(one["losses"][0], reference) and _close(two["losses"][0], reference)
    refused = two["refusals"]
    assert (
        refused["generate"].startswith("GenerateError")
        and "context_parallel_size=2" in (refused["generate"])
    )
    assert refused["t5"].startswith("PluginError") and "model.type='t5'" in refused["t5"]
    assert "context_parallel_size" in refused["t5"]
    assert refused["classifier"].startswith("PluginError")
    assert "model.head" in refused["classifier"]


def test_launch_config_sets_the_context_parallel_size(tmp_path):
    from epochal.accelerate.yaml_config import YamlConfigError, read_launch_config

    good = tmp_path / "cp.yaml"
    good.write_text(
        "distributed_type: MEGATRON_LM\nnum_processes: 4\nuse_cpu: true\n"
        "megatron_lm_config:\n  megatron_lm_tp_degree: 2\n"
        "  megatron_lm_context_parallel_size: 2\n"
    )
    env = read_launch_config(good).environment()
    assert env["MEGATRON_LM_CONTEXT_PARALLEL_SIZE"] == "2"
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("num_processes: 4", "num_processes: 2"))
    with pytest.raises(YamlConfigError, match="megatron_lm_context_parallel_size"):
        read_launch_config(bad)
