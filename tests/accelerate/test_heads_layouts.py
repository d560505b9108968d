"""Classification models under ``epochal launch``: TP2, PP2 and DP2 on CPU agree with one process.

One ``epochal launch`` (two gloo ranks) runs ``heads_script.py`` three times:
GPT-2 sequence classification (last-token pooling) with TP2 and sequence
parallelism, BERT sequence classification (token types, the pooler on the last
stage) with PP2, Llama token classification with DP2. Each must reproduce the one-process run (DP2: the same global batch as two
micro-batches): the train losses, the evaluation loss, the predictions gathered
with ``gather_for_metrics`` and the logits' sum.
"""

import json
import math
import os
import sys
from pathlib import Path

import pytest

from tests.accelerate import heads_script
from tests.accelerate.test_layouts import TP2_YAML
from tests.dist_utils import run_process

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.distributed

#: (name, script arguments, MEGATRON_LM_* of the run, micro-batches of the reference)
RUNS = [
    (
        "gpt2_sequence_tp2",
        ["--arch", "gpt2", "--family", "sequence"],
        {"TP_DEGREE": "2", "SEQUENCE_PARALLELISM": "true"},
        1,
    ),
    ("bert_sequence_pp2", ["--arch", "bert", "--family", "sequence"], {"PP_DEGREE": "2"}, 1),
    ("llama_token_dp2", ["--arch", "llama", "--family", "token", "--num_labels", "3"], {}, 2),
]


def _one_process(argv: list[str], micro_batches: int, report: Path) -> dict:
    saved = {k: v for k, v in os.environ.items() if k.startswith(("MEGATRON_LM_", "ACCELERATE_"))}
    for key in saved:
        del os.environ[key]
    os.environ["MEGATRON_LM_NUM_MICRO_BATCHES"] = str(micro_batches)
    os.environ["ACCELERATE_USE_MEGATRON_LM"] = "true"  # as the launched runs' YAML asks
    try:
        heads_script.main([*argv, "--report", str(report)])
    finally:
        for key in [k for k in os.environ if k.startswith(("MEGATRON_LM_", "ACCELERATE_"))]:
            del os.environ[key]
        os.environ.update(saved)
    return json.loads(report.read_text())


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("heads_launch")
    (tmp / "tp2.yaml").write_text(TP2_YAML)
    plan = [
        {
            "env": {
                "MEGATRON_LM_TP_DEGREE": "1",
                **{f"MEGATRON_LM_{k}": v for k, v in env.items()},
            },
            "argv": [*argv, "--report", str(tmp / f"{name}.json")],
        }
        for name, argv, env, _ in RUNS
    ]
    (tmp / "plan.json").write_text(json.dumps(plan))
    cmd = [
        sys.executable,
        "-m",
        "epochal.cli",
        "launch",
        "--config_file",
        str(tmp / "tp2.yaml"),
        str(HERE / "heads_script.py"),
        "--plan",
        str(tmp / "plan.json"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = run_process(cmd, timeout=600, env=env, cwd=str(tmp))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    return {name: json.loads((tmp / f"{name}.json").read_text()) for name, *_ in RUNS}


@pytest.mark.parametrize("name,argv,env,micro_batches", RUNS, ids=[r[0] for r in RUNS])
def test_classifier_layout_agrees_with_one_process(
    launched, tmp_path, name, argv, env, micro_batches
):
    ours = launched[name]
    reference = _one_process(argv, micro_batches, tmp_path / "one.json")
    assert len(ours["train_losses"]) == len(reference["train_losses"]) == 3
    for a, b in zip(ours["train_losses"], reference["train_losses"]):
        assert math.isclose(a, b, abs_tol=1e-5), (ours, reference)
    assert math.isclose(ours["eval_loss"], reference["eval_loss"], abs_tol=1e-5)
    assert ours["predictions"] == reference["predictions"]
    assert math.isclose(ours["logit_sum"], reference["logit_sum"], abs_tol=1e-3)
