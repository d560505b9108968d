"""The activation estimate of the memory check against what PyTorch really keeps.

Measured in this process: every tensor storage an op creates during the train step's
forward (the trainer's own model, autocast and loss) is recorded by a dispatch mode,
and what is still alive after the forward is what the backward keeps. The estimate
(:mod:`epochal.train.run_checks.activation_memory`) must be within 10% of it for
each shape: dropout (the CPU's math attention), grouped-query SwiGLU with RoPE and
RMSNorm (the fused kernel), bf16 autocast, selective and full recompute. The
per-layer formula reduces to Korthikanti et al.'s ``sbh(34 + 5as/h)`` under that
paper's assumptions, and ``epochal train --preset gpu-1b --training.device=cpu`` is
refused on a machine with 24 GB free (its state alone fits), naming the estimate and
what to change.
"""

from __future__ import annotations

import gc

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from epochal.cli import main as cli_main
from epochal.train.config import build_config
from epochal.train.run_checks import activation_memory as A
from epochal.train.run_checks import state_memory
from epochal.train.trainer import Trainer

SHAPE = [
    "--data.corpus=", "--data.mock=true", "--training.device=cpu", "--logging.progress=false",
    "--logging.tensorboard=false", "--training.eval_iters=0", "--model.hidden_size=64",
    "--model.num_layers=2", "--model.num_attention_heads=4", "--data.seq_length=32",
    "--training.micro_batch_size=4", "--training.global_batch_size=4", "--model.vocab_size=64",
]  # fmt: skip
LLAMA = [
    "--model.position_embedding_type=rope", "--model.normalization=RMSNorm",
    "--model.activation=swiglu", "--model.num_query_groups=2", "--model.hidden_dropout=0",
    "--model.attention_dropout=0", "--model.add_bias_linear=false", "--model.ffn_hidden_size=96",
]  # fmt: skip
CASES = {
    "gpt-dropout-math-attention": [],
    "gpt-dropout-bf16": ["--training.bf16=true"],
    "llama-gqa-fused-attention": [*LLAMA, "--model.num_layers=3"],
    "llama-bf16-selective": [*LLAMA, "--training.bf16=true", "--parallel.recompute_granularity=selective"],
    "gpt-selective-math": ["--parallel.recompute_granularity=selective"],
    "gpt-full-recompute-groups-of-2": [
        "--model.num_layers=4", "--parallel.recompute_granularity=full",
        "--parallel.recompute_num_layers=2",
    ],
    "gpt-block-recompute-long": [
        "--model.num_layers=3", "--parallel.recompute_granularity=full",
        "--parallel.recompute_method=block", "--data.seq_length=64",
        "--training.micro_batch_size=2", "--training.global_batch_size=2",
    ],
}  # fmt: skip


class _Allocations(TorchDispatchMode):
    """Records each storage an op outputs (weakly): ``alive()`` sums those still held."""

    def __init__(self, ignore: list[torch.Tensor]) -> None:
        super().__init__()
        self.seen: dict[int, tuple[StorageWeakRef, int]] = {}
        for t in ignore:  # parameters (and views of them) are state, not activations
            self.seen[t.untyped_storage().data_ptr()] = (StorageWeakRef(t.untyped_storage()), 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and (key not in self.seen or self.seen[key][0].expired()):
                    self.seen[key] = (StorageWeakRef(storage), storage.nbytes())
        return out

    def alive(self) -> int:
        gc.collect()
        return sum(n for ref, n in self.seen.values() if not ref.expired())


def _measured_and_estimated(tmp_path, overrides: list[str]) -> tuple[int, int]:
    config = build_config(
        preset=None,
        overrides=[*SHAPE, *overrides, f"--run_dir={tmp_path}", "--training.memory_check=false"],
    )
    trainer = Trainer(config)
    model = trainer.step_model()
    b, s = config.training.micro_batch_size, config.data.seq_length
    g = torch.Generator().manual_seed(0)
    tokens, labels = (torch.randint(0, 64, (b, s), generator=g) for _ in range(2))
    params = list(trainer.model_parts[0].parameters())
    gc.collect()
    with trainer.autocast(), _Allocations(params) as allocations:
        losses = model(tokens, labels=labels)
    measured = allocations.alive()
    assert losses.requires_grad  # the graph (and what it keeps) is alive
    weights = state_memory.parameter_counts(trainer.model_config)[2]
    estimate = A.activation_bytes(config, trainer.model_config, "cpu", weights)
    return measured, estimate.stored


@pytest.mark.parametrize("case", list(CASES))
def test_the_estimate_is_within_10_percent_of_what_the_forward_keeps(tmp_path, case):
    measured, estimated = _measured_and_estimated(tmp_path, CASES[case])
    assert measured > 100_000  # a real graph was measured
    assert 0.9 <= estimated / measured <= 1.1, (case, measured, estimated)


def _sizes(**changes) -> A._Sizes:
    base = dict(e=2, r=2, mask=1, autocast=False, tp=1, sp=False, fused=False, math=2,
                native_gqa=False, layer_weights=0.0)  # fmt: skip
    return A._Sizes(**{**base, **changes})


def test_the_layer_formula_is_megatrons_under_its_assumptions():
    """16-bit activations, LayerNorm, GELU with ffn = 4h, dropout, the scores materialised."""
    config = build_config(preset=None, overrides=[*SHAPE, "--training.memory_check=false"])
    from epochal.train.run_checks import preflight_model

    model = preflight_model(config)
    s, b, h, a = 32, 4, model.hidden_size, model.num_attention_heads
    assert model.ffn_size == 4 * h and model.hidden_dropout > 0 and model.attention_dropout > 0
    assert A._layer(model, _sizes(), b, s, False) == s * b * h * (34 + 5 * a * s / h)
    # tensor + sequence parallel divide every term (the paper's Table 2), but for the
    # linears' gathered inputs that PyTorch's tensor-parallel plans keep whole
    t = 2
    split = A._layer(model, _sizes(tp=t, sp=True), b, s, False)
    assert split == s * b * h * (34 + 5 * a * s / h) / t + 4 * s * b * h * (1 - 1 / t)
    # full recompute keeps each layer's input: the paper's 2sbh
    p = config.parallel
    kept, _ = A._stack(model, _sizes(), type(p)(recompute_granularity="full"), 3, b, s)
    assert kept == 3 * 2 * s * b * h


@pytest.mark.parametrize(
    ("schedule", "stages", "micro", "chunks", "held"),
    [
        ("1f1b", 4, 8, 1, 4),
        ("1f1b", 4, 2, 1, 2),
        ("gpipe", 4, 8, 1, 8),
        ("interleaved_1f1b", 4, 16, 2, 11 / 2),
    ],  # fmt: skip
)
def test_micro_batches_in_flight_on_the_first_stage(schedule, stages, micro, chunks, held):
    """1F1B holds ``p`` micro-batches; interleaved ``1 + (p-1)/(pv)`` of the model (the paper)."""
    assert A.in_flight(schedule, stages, micro, chunks) == held
    if chunks > 1:  # Korthikanti et al.: the interleaved schedule's factor
        assert held / stages == 1 + (stages - 1) / (stages * chunks)


def test_gpu_1b_on_a_24_gb_cpu_is_refused_naming_the_estimate(tmp_path, capsys, monkeypatch):
    """Its state (23.03 GB) fits in 24 GB; with its activations it does not."""
    monkeypatch.setattr(state_memory, "available_memory", lambda device: (24 * 10**9, "free"))
    from epochal.commands import train as train_command

    def not_refused(config):  # never start a 1.4B-parameter run in the test process
        raise AssertionError("gpu-1b on 24 GB was not refused before training")

    monkeypatch.setattr(train_command, "_train", not_refused)
    run = tmp_path / "run"
    assert cli_main(["train", "--preset=gpu-1b", f"--run_dir={run}", "--training.device=cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and not run.exists()
    assert "training.device: the run needs " in err and "only 24.00 GB is free" in err
    assert "weights, gradients and AdamW state need 23.03 GB" in err
    assert "the activations of a micro-batch of 4 x 2048 tokens need " in err
    for option in ("training.micro_batch_size (now 4; at 1 the activations need ",
                   "parallel.recompute_granularity=selective: ", "full: ",
                   "data.seq_length (now 2048)", "training.memory_check=false"):  # fmt: skip
        assert option in err, option
    config = build_config(preset="gpu-1b", overrides=["--training.device=cpu"])
    from epochal.train.run_checks import preflight_model

    model = preflight_model(config)
    estimate = A.activation_bytes(config, model, "cpu", state_memory.parameter_counts(model)[2])
    assert f"need {estimate.total / 1e9:,.2f} GB more" in err
    assert estimate.total > 24e9 - 23.03e9  # the estimate, not the state, refuses it
    # recompute lowers it, as the message offers
    full = build_config(
        preset="gpu-1b",
        overrides=["--training.device=cpu", "--parallel.recompute_granularity=full"],
    )
    assert A.activation_bytes(full, model, "cpu").total < estimate.total / 3
