"""The guide-style script under ``epochal launch``: TP2, PP2 and DP2 on CPU agree with one process.

One ``epochal launch --config_file tp2.yaml`` (two gloo ranks) runs the script
for several layouts one after the other (``layouts_worker.py``): GPT-2 with TP2
(the YAML's layout), PP2 and DP2 (saving a checkpoint at step 2), Llama with TP2,
BERT with TP2, PP2 and DP2, T5 with TP2 and DP2. Tensor and pipeline parallelism
must reproduce the one-process run (same micro-batches); data parallelism the
one-process run of the same global batch (two micro-batches). The DP2 checkpoint
is then loaded by one process, which must continue with DP2's losses.
"""

import json
import math
import os
import sys
from pathlib import Path

import pytest

from tests.accelerate.conftest import TASKS, run_in_process
from tests.dist_utils import run_process

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.distributed

TP2_YAML = """\
compute_environment: LOCAL_MACHINE
distributed_type: MEGATRON_LM
downcast_bf16: 'no'
machine_rank: 0
main_process_ip: null
main_process_port: null
main_training_function: main
megatron_lm_config:
  megatron_lm_gradient_clipping: 1.0
  megatron_lm_num_micro_batches: 1
  megatron_lm_pp_degree: 1
  megatron_lm_sequence_parallelism: true
  megatron_lm_tp_degree: 2
mixed_precision: 'no'
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
use_cpu: true
"""

#: (name, model, MEGATRON_LM_* of the run (None: the YAML's), micro-batches of the reference)
RUNS = [
    ("gpt2_tp2", "gpt2", None, 1),
    ("gpt2_pp2", "gpt2", {"PP_DEGREE": "2"}, 1),
    ("gpt2_dp2", "gpt2", {"TP_DEGREE": "1"}, 2),
    ("llama_tp2", "llama", {"TP_DEGREE": "2"}, 1),
    ("bert_tp2", "bert", {"TP_DEGREE": "2", "SEQUENCE_PARALLELISM": "true"}, 1),
    ("bert_pp2", "bert", {"PP_DEGREE": "2"}, 1),
    ("bert_dp2", "bert", {"TP_DEGREE": "1"}, 2),
    ("t5_tp2", "t5", {"TP_DEGREE": "2"}, 1),
    ("t5_dp2", "t5", {"TP_DEGREE": "1"}, 2),
]


def _close(a: list[float], b: list[float], tol: float = 1e-4) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, abs_tol=tol) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Reports of every run of one ``epochal launch`` (2 ranks), and the DP2 checkpoint folder."""
    tmp = tmp_path_factory.mktemp("launch")
    (tmp / "tp2.yaml").write_text(TP2_YAML)
    plan = []
    for name, model, env, _ in RUNS:
        argv = [*TASKS[model], "--report", str(tmp / f"{name}.json")]
        if name == "gpt2_dp2":
            argv += ["--checkpointing_steps", "2", "--output_dir", str(tmp / "ckpt")]
        plan.append({"env": {f"MEGATRON_LM_{k}": v for k, v in (env or {}).items()}, "argv": argv})
    (tmp / "plan.json").write_text(json.dumps(plan))
    cmd = [
        sys.executable,
        "-m",
        "epochal.cli",
        "launch",
        "--config_file",
        str(tmp / "tp2.yaml"),
        str(HERE / "layouts_worker.py"),
        str(tmp / "plan.json"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = run_process(cmd, timeout=600, env=env, cwd=str(tmp))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    return {name: json.loads((tmp / f"{name}.json").read_text()) for name, *_ in RUNS}, tmp


@pytest.mark.parametrize("name,model,env,micro_batches", RUNS, ids=[r[0] for r in RUNS])
def test_layout_agrees_with_one_process(launched, one_process, name, model, env, micro_batches):
    reports, _ = launched
    ours, reference = reports[name], one_process(model, micro_batches)
    assert ours["global_batch_size"] == reference["global_batch_size"]
    assert ours["consumed_samples"] == reference["consumed_samples"]
    assert _close(ours["train_losses"], reference["train_losses"]), (ours, reference)
    assert math.isclose(ours["eval_loss"], reference["eval_loss"], abs_tol=1e-4)


def test_dp2_checkpoint_continues_in_one_process(launched, tmp_path):
    reports, tmp = launched
    dp2 = reports["gpt2_dp2"]
    resumed = run_in_process(
        [
            *TASKS["gpt2"],
            "--resume_from_checkpoint",
            str(tmp / "ckpt" / "step_2"),
            "--output_dir",
            str(tmp_path),
        ],
        tmp_path / "resumed.json",
        {"MEGATRON_LM_NUM_MICRO_BATCHES": "2"},
    )
    assert resumed["consumed_samples"] == dp2["consumed_samples"]
    assert _close(resumed["train_losses"], dp2["train_losses"][2:], tol=1e-5)
    assert math.isclose(resumed["eval_loss"], dp2["eval_loss"], abs_tol=1e-5)
