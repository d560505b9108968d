"""The rest of the Accelerator surface: loaders, YAML, ``epochal config``, trackers, and clear errors."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from torch.utils.data import DataLoader, IterableDataset
from transformers import default_data_collator

from epochal.accelerate import Accelerator, AcceleratorError, init_empty_weights
from epochal.accelerate.batches import BatchAdapter, BatchError
from epochal.accelerate.plugin import MegatronLMPlugin, PluginError
from epochal.accelerate.preparation import PrepareError
from epochal.accelerate.prepare_data import DataLoaderError, PreparedDataLoader
from epochal.accelerate.yaml_config import YamlConfigError, read_launch_config
from tests.accelerate.conftest import tiny_gpt2


def _prepared(data, dp_rank, dp_size, micro_batches, shuffle, train=True):
    return PreparedDataLoader(
        DataLoader(
            data, batch_size=2, shuffle=shuffle, collate_fn=lambda xs: {"x": torch.tensor(xs)}
        ),
        micro_batch_size=2,
        num_microbatches=micro_batches,
        dp_rank=dp_rank,
        dp_size=dp_size,
        seed=7,
        train=train,
        device=torch.device("cpu"),
    )


def _micro_batches(loader, steps):
    """The micro-batches of the next ``steps`` steps (passes over epochs, as a script's epoch loop)."""
    out = []
    while len(out) < steps:
        for batch in loader:
            out.append([batch["x"][j : j + 2].tolist() for j in range(0, len(batch["x"]), 2)])
            if len(out) == steps:
                break
    return out


@pytest.mark.parametrize("shuffle", [False, True])
def test_loader_reads_the_same_micro_batches_on_any_data_parallel_size(shuffle):
    data = list(range(22))  # 5 global batches of 4 per epoch, 2 samples left out
    one = _prepared(data, 0, 1, 2, shuffle)
    ranks = [_prepared(data, r, 2, 1, shuffle) for r in (0, 1)]
    assert len(one) == len(ranks[0]) == 5
    single = _micro_batches(one, 8)  # runs into the second epoch
    split = list(zip(*(_micro_batches(r, 8) for r in ranks)))
    assert single == [[a[0], b[0]] for a, b in split]
    first_epoch = [x for step in single[:5] for mb in step for x in mb]
    assert len(set(first_epoch)) == 20  # every sample at most once per epoch
    assert one.consumed_samples == 4 * 8
    assert len(list(_prepared(data, 0, 1, 2, shuffle))) == 5  # a pass ends with its epoch
    if shuffle:
        assert single[5] != single[0]  # a new permutation each epoch
    resumed = _prepared(data, 0, 1, 2, shuffle)
    resumed.load_state_dict({"consumed_samples": 8, "mode": "train"})
    assert _micro_batches(resumed, 1) == single[2:3]


def test_evaluation_loader_starts_over_and_ignores_positions():
    loader = _prepared(list(range(8)), 0, 1, 1, False, train=False)
    first = _micro_batches(loader, 2)
    loader.load_state_dict({"consumed_samples": 4, "mode": "validation"})
    assert _micro_batches(loader, 2) == first and loader.consumed_samples == 0


class _Stream(IterableDataset):
    def __iter__(self):
        yield from range(4)


def test_loaders_the_sampler_would_change_are_refused():
    with pytest.raises(DataLoaderError, match="map-style"):
        _prepared(_Stream(), 0, 1, 1, False)
    sampler = torch.utils.data.WeightedRandomSampler([1.0] * 8, 8)
    with pytest.raises(DataLoaderError, match="custom sampler"):
        PreparedDataLoader(
            DataLoader(list(range(8)), batch_size=2, sampler=sampler),
            micro_batch_size=2,
            num_microbatches=1,
            dp_rank=0,
            dp_size=1,
            seed=0,
            train=True,
            device=torch.device("cpu"),
        )
    with pytest.raises(DataLoaderError, match="fewer than one global batch"):
        _prepared(list(range(3)), 0, 2, 1, False)


def test_causal_batches_padded_on_the_left_are_refused():
    adapter = BatchAdapter("causal", num_microbatches=1)
    ids = torch.tensor([[5, 6, 7, 8]])
    ok = adapter.split(
        {
            "input_ids": ids,
            "attention_mask": torch.tensor([[1, 1, 1, 0]]),
            "labels": torch.tensor([[5, 6, 7, -100]]),
        }
    )
    assert ok[0]["loss_mask"].tolist() == [[1.0, 1.0, 0.0, 0.0]] and ok[0]["labels"][
        0, :2
    ].tolist() == [6, 7]
    with pytest.raises(BatchError, match="padded on the right"):
        adapter.split({"input_ids": ids, "attention_mask": torch.tensor([[0, 1, 1, 1]])})
    with pytest.raises(BatchError, match="not divisible"):
        BatchAdapter("causal", num_microbatches=2).split(
            {"input_ids": torch.zeros(3, 4, dtype=torch.long)}
        )


def test_what_cannot_be_done_raises():
    with pytest.raises(AcceleratorError, match="give 1 or more"):
        Accelerator(gradient_accumulation_steps=0)
    with pytest.raises(PluginError, match="expert_model_parallel_size=2"):
        MegatronLMPlugin(expert_model_parallel_size=2)
    with pytest.raises(PluginError, match="other_megatron_args"):
        MegatronLMPlugin(other_megatron_args={"position_embedding_type": "alibi"})
    accelerator = Accelerator()
    with pytest.raises(AcceleratorError, match="gradient"):
        accelerator.backward(torch.ones(1, requires_grad=True).sum())
    with pytest.raises(AcceleratorError, match="gradient_clipping"):
        Accelerator(megatron_lm_plugin=MegatronLMPlugin()).clip_grad_norm_([], 0.5)
    with pytest.raises(AcceleratorError, match="prepare the model first"):
        accelerator.clip_grad_norm_([], 0.5)  # a plain loop clips the step model(**batch) computed
    with pytest.raises(AcceleratorError, match="returned by prepare"):
        accelerator.skip_first_batches(None, 3)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=8)
    )
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    with pytest.raises(PrepareError, match="same prepare"):
        accelerator.prepare(model, scheduler)
    with pytest.raises(PrepareError, match="DataLoader"):
        accelerator.prepare(model, optimizer)


def test_empty_weights_wait_for_load_state(tmp_path):
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=8)
    data = [{"input_ids": torch.arange(8) % 50, "labels": torch.arange(8) % 50} for _ in range(4)]
    loader = DataLoader(data, batch_size=2, collate_fn=default_data_collator)
    trained = Accelerator()
    source, loader_a = trained.prepare(transformers.GPT2LMHeadModel(config), loader)
    trained.save_state(tmp_path / "state")
    with init_empty_weights():
        empty = transformers.GPT2LMHeadModel(config)
    assert empty.transformer.wte.weight.is_meta
    accelerator = Accelerator()
    model, loader_b = accelerator.prepare(empty, loader)
    with pytest.raises(RuntimeError, match="load_state"):
        model(**next(iter(loader_b)))
    accelerator.load_state(tmp_path / "state")
    model.eval()
    source.eval()
    batch = next(iter(loader_b))
    assert model(**batch).loss.item() == source(**batch).loss.item()


def test_yaml_files_of_accelerate_are_read_and_ours_are_accelerates(tmp_path):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    written = tmp_path / "accelerate.yaml"
    ClusterConfig(
        compute_environment="LOCAL_MACHINE",
        distributed_type="MEGATRON_LM",
        mixed_precision="bf16",
        use_cpu=True,
        debug=False,
        num_processes=8,
        num_machines=2,
        machine_rank=1,
        main_process_ip="10.0.0.1",
        main_process_port=29501,
        megatron_lm_config={
            "megatron_lm_tp_degree": 2,
            "megatron_lm_pp_degree": 2,
            "megatron_lm_num_micro_batches": 4,
            "megatron_lm_sequence_parallelism": True,
            "megatron_lm_gradient_clipping": 0.5,
        },
    ).to_yaml_file(written)
    spec = read_launch_config(written)
    assert (spec.num_processes, spec.nproc_per_node, spec.machine_rank, spec.main_process_ip) == (
        8,
        4,
        1,
        "10.0.0.1",
    )
    env = spec.environment()
    assert env["MEGATRON_LM_TP_DEGREE"] == "2" and env["MEGATRON_LM_NUM_MICRO_BATCHES"] == "4"
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16" and env["ACCELERATE_USE_CPU"] == "true"

    ours = tmp_path / "ours.yaml"
    answers = "2\n1\n10.0.0.1\n29501\n2\nyes\n2\n2\n4\nyes\nyes\n0.5\nbf16\nyes\n"
    run = subprocess.run(
        [sys.executable, "-m", "epochal.cli", "config", "--accelerate", "-o", str(ours)],
        input=answers,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    loaded = load_config_from_file(str(ours))
    assert (loaded.distributed_type, loaded.num_processes, loaded.num_machines) == (
        "MEGATRON_LM",
        8,
        2,
    )
    assert loaded.megatron_lm_config["megatron_lm_pp_degree"] == 2
    assert read_launch_config(ours).environment() == spec.environment() | {
        "MEGATRON_LM_RECOMPUTE_ACTIVATIONS": "True",
        "MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER": "True",
    }

    bad = tmp_path / "bad.yaml"
    bad.write_text("distributed_type: FSDP\n")
    with pytest.raises(YamlConfigError, match="distributed_type"):
        read_launch_config(bad)
    bad.write_text("megatron_lm_config:\n  megatron_lm_expert_model_parallel_size: 2\n")
    with pytest.raises(YamlConfigError, match="megatron_lm_expert_model_parallel_size"):
        read_launch_config(bad)


def test_trackers_write_tensorboard_and_offline_wandb(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    accelerator = Accelerator(log_with=["tensorboard", "wandb"], project_dir=tmp_path)
    accelerator.init_trackers("clm", {"learning_rate": 1e-3, "model": "gpt2"})
    accelerator.log({"train_loss": 2.5, "perplexity": 12.0}, step=1)
    accelerator.end_training()
    events = list(Path(tmp_path, "clm").glob("events.out.tfevents.*"))
    assert events
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events[0]))
    acc.Reload()
    assert acc.Scalars("train_loss")[0].value == 2.5
    assert list(Path(tmp_path, "wandb").glob("offline-run-*"))
    with pytest.raises(ValueError, match="comet_ml"):
        Accelerator(log_with="comet_ml")


def _dummy_run(cache, state=None):
    from epochal.accelerate.utils import MegatronLMDummyDataLoader, MegatronLMDummyScheduler

    transformers.set_seed(0)
    model = tiny_gpt2(vocab=301, layers=1)
    reference = copy.deepcopy(model).eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=4)
    loader = MegatronLMDummyDataLoader(
        mock_data=True, seq_length=16, micro_batch_size=2, data_cache_path=str(cache)
    )
    accelerator = Accelerator()
    accelerator.state.megatron_lm_plugin.eval_iters = 2
    out = accelerator.prepare(model, optimizer, scheduler, loader, loader, loader)
    if state is not None:
        accelerator.load_state(state)
    return accelerator, reference, *out


def test_megatron_indexed_datasets_train_and_resume(tmp_path):
    """MegatronLMDummyDataLoader: Megatron's GPT samples, the transformers model's loss, exact position."""
    accelerator, reference, model, _, _, train, valid, test = _dummy_run(tmp_path / "cache")
    assert test is None and valid is not None
    model.eval()
    batch = next(valid)
    logits = reference(input_ids=batch["tokens"]).logits
    losses = torch.nn.functional.cross_entropy(
        logits.transpose(1, 2), batch["labels"], reduction="none"
    )
    expected = (losses * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
    assert model(**batch).loss.item() == pytest.approx(expected.item(), abs=1e-5)
    model.train()
    model(**next(train))
    accelerator.save_state(tmp_path / "state")
    after = model(**next(train)).loss.item()
    _, _, model2, _, _, train2, _, _ = _dummy_run(tmp_path / "cache", tmp_path / "state")
    assert train2.consumed_samples == 2
    assert model2(**next(train2)).loss.item() == after


@pytest.mark.parametrize("shuffle", [True, False])
def test_prepare_says_when_the_shuffle_order_differs_and_what_is_left_out(shuffle, capsys):
    data = [{"x": torch.tensor(i)} for i in range(7)]  # batch 2: 3 whole batches, 1 left out
    Accelerator().prepare(DataLoader(data, batch_size=2, shuffle=shuffle))
    out = capsys.readouterr().out
    assert "the train loader reads 6 of 7 samples per pass" in out
    assert ("shuffles with Megatron's per-epoch permutation" in out) is shuffle
