"""`epochal config`: the wizard driven through a pseudo-terminal writes a TOML that `epochal train` runs."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from epochal.cli import main as cli_main
from epochal.train.config import build_config
from epochal.train.config.presets import PRESETS
from epochal.train.observe.metrics import read_metrics

# A tiny model and a 2-3 step run on Megatron's mock corpus, on top of the written file.
TINY_RUN = [
    "--training.device=cpu",  # compared with CPU references: the same with or without a GPU
    "--data.corpus=''",
    "--data.mock=true",
    "--model.hidden_size=32",
    "--model.num_layers=2",
    "--model.num_attention_heads=2",
    "--model.num_query_groups=1",
    "--model.ffn_hidden_size=64",
    "--data.seq_length=32",
    "--training.train_iters=2",
    "--training.eval_interval=0",
    "--checkpoint.save_interval=2",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]


def _env() -> dict[str, str]:
    # no GPU in the wizard's processes: its answers are bounded by CPU cores, as on CI
    return {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch):
    """In-process wizards see no GPU either (their launch bound counts CPU cores)."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)


class _Pty:
    """The ``epochal config`` process on a pseudo-terminal; ``expect`` reads up to a text, ``send`` types a line."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        master, slave = pty.openpty()
        self.master = master
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "epochal.cli", *argv],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            env=_env(),
            close_fds=True,
        )
        os.close(slave)
        self.seen = ""  # everything read so far
        self.pos = 0  # where the next expect starts looking

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            chunk = os.read(self.master, 4096)
        except OSError:  # EIO: the process closed the terminal
            return False
        if not chunk:
            return False
        self.seen += chunk.decode(errors="replace").replace("\r\n", "\n")
        return True

    def expect(self, text: str, timeout: float = 60) -> str:
        """Read until ``text`` appears after the last match; returns what came before it."""
        deadline = time.monotonic() + timeout
        while text not in self.seen[self.pos :]:
            left = deadline - time.monotonic()
            if left <= 0 or (not self._read(min(left, 1.0)) and self.proc.poll() is not None):
                if text in self.seen[self.pos :]:
                    break
                raise AssertionError(f"never saw {text!r}; output so far:\n{self.seen}")
        i = self.seen.index(text, self.pos)
        before = self.seen[self.pos : i]
        self.pos = i + len(text)
        return before

    def send(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def finish(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.2)
        while self._read(0.1):
            pass
        return self.proc.wait(timeout=1)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


def _train(config: Path, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "epochal.cli", "train", "--config", str(config)]
    cmd += [f"--run_dir={run_dir}", *TINY_RUN, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())


@pytest.mark.distributed
@pytest.mark.slow
def test_wizard_through_a_pty_reasks_invalid_answers_and_writes_a_config_that_trains(tmp_path):
    out = tmp_path / "job.toml"
    term = _Pty(["config", "--output", str(out)], tmp_path)
    try:
        term.expect(f"Model preset ({', '.join(PRESETS)}) [tiny]: ")
        term.send("")  # Enter keeps the default
        term.expect("How many machines (nodes) [1]: ")
        term.send("1")
        term.expect("Tensor parallel size (must divide the attention heads) [1]: ")
        term.send("3")  # the tiny preset has 4 heads
        reason = term.expect("Tensor parallel size (must divide the attention heads) [1]: ")
        assert (
            "invalid: parallel.tensor_parallel: must divide model.num_attention_heads=4" in reason
        )
        term.send("2")
        term.expect("Sequence parallelism")
        term.expect("[no]: ")
        term.send("yes")
        term.expect("Pipeline parallel size [1]: ")
        term.send("1")
        term.expect("Data parallel size (model replicas) [1]: ")
        term.send("1")
        term.expect("Micro-batch size (samples per forward/backward) [8]: ")
        term.send("2")
        term.expect("Global batch size (samples per optimizer step) [16]: ")
        term.send("5")
        reason = term.expect("Global batch size (samples per optimizer step) [16]: ")
        assert "invalid: training.global_batch_size: must be a multiple of micro_batch_size=2" in (
            reason
        )
        term.send("4")
        term.expect("Selective activation recompute? [yes/no] [no]: ")
        term.send("y")
        # no data parallelism: the distributed-optimizer question is not asked
        term.expect("Gradient clipping max norm (0 = off) [1.0]: ")
        term.send("0.5")
        term.expect("Mixed precision (no, fp16, bf16) [no]: ")
        term.send("fp8")
        reason = term.expect("Mixed precision (no, fp16, bf16) [no]: ")
        assert "choose one of no, fp16, bf16; got 'fp8'" in reason
        term.send("fp16")
        term.expect("or 'mock' [stdlib]: ")
        term.send("mock")
        term.expect("Run directory")
        term.expect("[runs/job]: ")  # named after the file, as `epochal train --config` would
        term.send("")
        assert term.finish() == 0, term.seen
    finally:
        term.close()
    assert "Distributed optimizer" not in term.seen
    assert f"wrote {out} (2 processes on 1 node; run directory runs/job)" in term.seen
    assert f"epochal train --config {out}" in term.seen
    assert f"torchrun --standalone --nproc-per-node=2 -m epochal.cli train --config {out}" in (
        term.seen
    )

    written = tomllib.loads(out.read_text())
    assert written["parallel"]["tensor_parallel"] == 2
    assert written["parallel"]["sequence_parallel"] is True
    assert written["parallel"]["pipeline_parallel"] == 1
    assert written["parallel"]["data_parallel"] == 1
    assert written["parallel"]["recompute_granularity"] == "selective"
    assert written["parallel"]["dp_sharding"] == "none"
    assert written["training"]["micro_batch_size"] == 2
    assert written["training"]["global_batch_size"] == 4
    assert written["training"]["bf16"] is False
    assert written["training"]["fp16"] is True
    assert written["optimizer"]["clip_grad"] == 0.5
    assert written["data"]["mock"] is True
    # the rest is the tiny preset's
    assert written["model"]["num_attention_heads"] == 4
    assert written["run_dir"] == "runs/job"
    config = build_config(config_file=out)
    assert config.parallel.launch_world_size() == 2

    # `epochal train --config FILE` launches the 2 tensor-parallel processes itself and trains.
    run = tmp_path / "run"
    proc = _train(out, run)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "launching 2 processes" in proc.stdout
    assert "trained steps 1-2" in proc.stdout
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_0000002"
    saved = tomllib.loads((run / "config.toml").read_text())
    assert saved["parallel"]["tensor_parallel"] == 2
    assert saved["parallel"]["recompute_granularity"] == "selective"
    assert saved["training"]["fp16"] is True  # trained with fp16 loss scaling
    scales = [r["loss_scale"] for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
    assert len(scales) == 2 and all(s <= 2.0**32 for s in scales)


def test_defaults_writes_without_asking_and_trains(tmp_path, capsys):
    out = tmp_path / "sub" / "defaults.toml"
    out.parent.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "epochal.cli", "config", "--defaults", "--output", str(out)],
        stdin=subprocess.DEVNULL,  # nothing to read: it must not ask
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[tiny]" not in proc.stdout  # no question was printed
    assert f"epochal train --config {out}" in proc.stdout
    assert "torchrun" not in proc.stdout  # one process needs no launcher
    assert [p.name for p in out.parent.iterdir()] == ["defaults.toml"]  # no temporary left
    # the defaults are the tiny preset, fully resolved, with the data-parallel size and the
    # run directory (named after the file) pinned
    assert build_config(config_file=out) == build_config(
        preset="tiny", overrides=["--parallel.data_parallel=1", "--run_dir=runs/defaults"]
    )

    run = tmp_path / "run"  # the file trains (in this process: the subprocess above is the point)
    small = ["--training.micro_batch_size=2", "--training.global_batch_size=4"]
    capsys.readouterr()
    assert cli_main(["train", "--config", str(out), f"--run_dir={run}", *TINY_RUN, *small]) == 0
    assert "trained steps 1-2" in capsys.readouterr().out
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_0000002"


def test_multi_node_answers_print_a_torchrun_command_per_node(tmp_path):
    from epochal.commands.config import collect, launch_commands

    replies = iter(["", "2", "2", "", "1", "2", "", "", "", "yes", "", "", "mock", ""])
    prompts: list[str] = []

    def read(prompt: str) -> str:
        prompts.append(prompt)
        return next(replies)

    answers = collect(read)
    assert answers["nodes"] == 2 and answers["data_parallel"] == 2
    assert answers["distributed_optimizer"] is True
    assert len(prompts) == 14, prompts
    assert answers["run_dir"] == "runs/epochal"  # the default output epochal.toml names it
    (cmd,) = launch_commands("job.toml", answers)
    assert cmd == (
        "torchrun --nnodes=2 --node-rank=$NODE_RANK --nproc-per-node=2 --rdzv-backend=c10d "
        "--rdzv-endpoint=$MASTER_ADDR:29500 -m epochal.cli train --config job.toml"
    )


def test_an_unsplittable_node_count_is_reasked(tmp_path):
    from epochal.commands.config import collect

    # 3 nodes for tensor 2 x data 1 = 2 processes: re-asked at the data-parallel question.
    # Data parallel 3 does not divide the preset's batch of 16: the batch questions come
    # later, so it is accepted, and the global batch default becomes 24 = 8 x 3.
    replies = iter(["", "3", "2", "", "1", "1", "3", "", "", "", "", "", "", "mock", ""])
    prompts: list[str] = []

    def read(prompt: str) -> str:
        prompts.append(prompt)
        return next(replies)

    answers = collect(read)
    assert answers["data_parallel"] == 3
    assert "Global batch size (samples per optimizer step) [24]: " in prompts
    assert answers["global_batch_size"] == 24
    assert prompts.count("Data parallel size (model replicas) [1]: ") == 2


def test_end_of_input_writes_nothing(tmp_path):
    out = tmp_path / "job.toml"
    proc = subprocess.run(
        [sys.executable, "-m", "epochal.cli", "config", "--output", str(out)],
        input="tiny\n1\n",  # input ends at the tensor-parallel question
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert proc.returncode == 1
    assert f"stopped; {out} not written" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_both_wizards_ask_one_set_of_layout_questions_and_write_their_own_format():
    from epochal.commands import config as toml_wizard
    from epochal.commands import config_accelerate as yaml_wizard
    from epochal.commands.wizard import layout_questions
    from epochal.train.config.answers import config_from_answers

    toml_questions = {q.key: q for q in toml_wizard.questions()}
    yaml_questions = {q.key: q for q in yaml_wizard.questions()}
    sample = {"nodes": 1, "tensor_parallel": 2, "data_parallel": 1}
    for key, q in layout_questions().items():
        asked = (toml_questions[key], yaml_questions[key])
        assert {a.prompt for a in asked} == {q.prompt}, key
        assert {a.ask_if(sample) for a in asked} == {q.ask_if(sample)}, key
        assert {repr(a.parse(q.default({"preset": "tiny"}))) for a in asked} == {
            repr(q.parse(q.default({})))
        }, key
    layout = {
        "nodes": 1,
        "tensor_parallel": 2,
        "sequence_parallel": True,
        "pipeline_parallel": 1,
        "data_parallel": 1,
        "selective_recompute": True,
        "clip_grad": 0.5,
        "precision": "no",
    }
    # the TOML keeps epochal's names ([parallel] options of the same names) ...
    config = config_from_answers({"preset": "tiny", **layout})
    assert (config.parallel.tensor_parallel, config.parallel.sequence_parallel) == (2, True)
    assert config.parallel.recompute_granularity == "selective"
    assert config.optimizer.clip_grad == 0.5
    # ... and the YAML Accelerate's
    spec = yaml_wizard.launch_config_from({**layout, "micro_batches": 1, "cpu": True})
    assert spec.num_processes == 2 and spec.megatron == {
        "megatron_lm_tp_degree": 2,
        "megatron_lm_pp_degree": 1,
        "megatron_lm_num_micro_batches": 1,
        "megatron_lm_sequence_parallelism": True,
        "megatron_lm_recompute_activations": True,
        "megatron_lm_gradient_clipping": 0.5,
    }
