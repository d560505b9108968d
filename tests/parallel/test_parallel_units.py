"""Single-process tests of epochal.parallel: options, layout validation, splits, recompute, clipping, launch."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from epochal.model import GPTModel
from epochal.model.config import ConfigError
from epochal.parallel.checkpoint import TiedOptimizerState
from epochal.parallel.config import ParallelConfig
from epochal.parallel.dims import ParallelDims
from epochal.parallel.grad_clip import clip_grad_norm_parallel
from epochal.parallel.launch import needs_relaunch, under_launcher
from epochal.parallel.pipeline import (
    split_stage_module,
    stage_indices,
    stage_layer_counts,
    stage_layer_ranges,
)
from epochal.parallel.recompute import SAVE_OPS, apply_recompute, recompute_plan
from epochal.parallel.tensor_parallel import kv_heads_replicated
from tests.parallel.harness import tiny_config


# ------------------------------------------------------------------ options
@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"tensor_parallel": 0}, "tensor_parallel"),
        ({"pipeline_parallel": -1}, "pipeline_parallel"),
        ({"sequence_parallel": True}, "sequence_parallel"),
        ({"pipeline_parallel": 2, "virtual_pipeline": 2}, "virtual_pipeline"),
        ({"pipeline_schedule": "interleaved_1f1b"}, "pipeline_schedule"),
        ({"pipeline_schedule": "zb"}, "pipeline_schedule"),
        ({"dp_sharding": "zero3"}, "dp_sharding"),
        ({"recompute_granularity": "some"}, "recompute_granularity"),
        ({"decoder_last_pipeline_num_layers": 1}, "decoder_last_pipeline_num_layers"),
        ({"data_parallel": 0}, "data_parallel"),
    ],
)
def test_parallel_config_errors_name_the_option(kwargs, option):
    with pytest.raises(ConfigError) as err:
        ParallelConfig(**kwargs)
    assert err.value.option == option


def test_config_tree_has_a_parallel_section():
    from epochal.train.config import build_config, to_toml

    cfg = build_config(
        preset="tiny", overrides=["--parallel.tensor_parallel=2", "--parallel.dp_sharding=full"]
    )
    assert cfg.parallel.tensor_parallel == 2 and cfg.parallel.dp_sharding == "full"
    assert "[parallel]" in to_toml(cfg)
    with pytest.raises(ConfigError, match=r"parallel\.pipeline_schedule"):
        build_config(preset="tiny", overrides=["--parallel.pipeline_schedule=zb"])


def test_launch_world_size():
    assert ParallelConfig().launch_world_size() == 1
    assert (
        ParallelConfig(tensor_parallel=2, pipeline_parallel=2, data_parallel=2).launch_world_size()
        == 8
    )
    assert ParallelConfig(tensor_parallel=2, nproc_per_node=4).launch_world_size() == 4


def test_needs_relaunch_only_outside_a_launcher(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "EPOCHAL_RELAUNCHED"):
        monkeypatch.delenv(key, raising=False)
    assert not under_launcher()
    assert needs_relaunch(ParallelConfig(tensor_parallel=2))
    assert not needs_relaunch(ParallelConfig())
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert under_launcher() and not needs_relaunch(ParallelConfig(tensor_parallel=2))


# ------------------------------------------------------------------- layout
def test_dims_from_world_size_and_rank_coordinates():
    dims = ParallelDims.from_config(ParallelConfig(tensor_parallel=2, pipeline_parallel=2), 8)
    assert (dims.tp, dims.pp, dims.dp, dims.world_size) == (2, 2, 2, 8)
    assert dims.coords(0) == {"pp": 0, "dp": 0, "cp": 0, "tp": 0}
    assert dims.coords(1) == {"pp": 0, "dp": 0, "cp": 0, "tp": 1}  # tensor-parallel ranks adjacent
    assert dims.coords(2) == {"pp": 0, "dp": 1, "cp": 0, "tp": 0}
    assert dims.coords(5) == {"pp": 1, "dp": 0, "cp": 0, "tp": 1}
    with pytest.raises(ConfigError, match="parallel.tensor_parallel.*divide the world size 6"):
        ParallelDims.from_config(ParallelConfig(tensor_parallel=4), 6)
    with pytest.raises(ConfigError, match="parallel.data_parallel"):
        ParallelDims.from_config(ParallelConfig(data_parallel=2), 4)


def _validate(dims: ParallelDims, model_kw: dict | None = None, *, mbs=2, gbs=8, seq=16, **cfg):
    dims.validate(
        tiny_config(**(model_kw or {})),
        micro_batch_size=mbs,
        global_batch_size=gbs,
        seq_length=seq,
        config=ParallelConfig(**cfg),
    )


@pytest.mark.parametrize(
    ("dims", "model_kw", "cfg", "gbs", "option"),
    [
        (ParallelDims(tp=3), {}, {}, 8, "parallel.tensor_parallel"),  # 4 heads
        (
            ParallelDims(tp=2),
            {"num_attention_heads": 6, "num_query_groups": 3, "hidden_size": 48},
            {},
            8,
            "parallel.tensor_parallel",
        ),
        (ParallelDims(tp=2), {"ffn_hidden_size": 33}, {}, 8, "parallel.tensor_parallel"),
        (
            ParallelDims(tp=4),
            {"make_vocab_size_divisible_by": 2, "vocab_size": 102},
            {},
            8,
            "parallel.tensor_parallel",
        ),
        (ParallelDims(pp=3), {}, {"pipeline_parallel": 3}, 8, "model.num_layers"),
        (
            ParallelDims(pp=2, vpp=4),
            {},
            {
                "pipeline_parallel": 2,
                "virtual_pipeline": 4,
                "pipeline_schedule": "interleaved_1f1b",
            },
            8,
            "model.num_layers",
        ),
        (ParallelDims(dp=3), {}, {}, 8, "training.global_batch_size"),
        (
            ParallelDims(pp=2),
            {},
            {"pipeline_parallel": 2},
            2,
            "training.global_batch_size",
        ),  # 1 micro-batch < 2 stages
    ],
)
def test_layout_validation_names_the_option(dims, model_kw, cfg, gbs, option):
    with pytest.raises(ConfigError) as err:
        _validate(dims, model_kw, gbs=gbs, **cfg)
    assert err.value.option == option


def test_sequence_parallel_needs_divisible_sequence():
    with pytest.raises(ConfigError, match="parallel.sequence_parallel"):
        _validate(ParallelDims(tp=2), seq=15, tensor_parallel=2, sequence_parallel=True)
    _validate(ParallelDims(tp=2), seq=16, tensor_parallel=2, sequence_parallel=True)


def test_kv_heads_replicated_only_when_groups_do_not_split():
    assert not kv_heads_replicated(tiny_config(), 2)
    assert not kv_heads_replicated(tiny_config(num_query_groups=2), 2)
    assert kv_heads_replicated(tiny_config(num_query_groups=1), 2)
    assert kv_heads_replicated(tiny_config(num_query_groups=2), 4)
    _validate(ParallelDims(tp=4), {"num_query_groups": 2, "ffn_hidden_size": 64})


# ------------------------------------------------------------------ pipeline
@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        ((8, 1, 1), {}, [8]),
        ((8, 2, 1), {}, [4, 4]),
        ((8, 2, 2), {}, [2, 2, 2, 2]),
        ((8, 3, 1), {"last": 2}, [3, 3, 2]),
        ((8, 4, 1), {"first": 1, "last": 1}, [1, 3, 3, 1]),
        ((8, 2, 2), {"last": 2}, [3, 1, 3, 1]),
        ((6, 2, 1), {"first": 0}, [0, 6]),
    ],
)
def test_stage_layer_counts(args, kwargs, expected):
    assert stage_layer_counts(*args, **kwargs) == expected


@pytest.mark.parametrize(
    ("args", "kwargs", "option"),
    [
        ((7, 2, 1), {}, "model.num_layers"),
        ((8, 2, 1), {"last": 9}, "parallel.decoder_last_pipeline_num_layers"),
        ((8, 3, 1), {"last": 3}, "parallel.decoder_last_pipeline_num_layers"),
        ((11, 3, 2), {"last": 3}, "parallel.virtual_pipeline"),
        ((2, 3, 1), {"first": 1, "last": 1}, "parallel.decoder_last_pipeline_num_layers"),
        ((8, 3, 1), {"first": 3}, "parallel.decoder_first_pipeline_num_layers"),  # 5 over 2 ranks
    ],
)
def test_stage_layer_count_errors(args, kwargs, option):
    with pytest.raises(ConfigError) as err:
        stage_layer_counts(*args, **kwargs)
    assert err.value.option == option


def test_interleaved_placement_follows_megatron():
    ranges = stage_layer_ranges(stage_layer_counts(8, 2, 2))
    assert [list(r) for r in ranges] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert stage_indices(0, 2, 2) == [0, 2] and stage_indices(1, 2, 2) == [1, 3]
    # pipeline rank 0 holds layers 0-1 and 4-5, rank 1 holds 2-3 and 6-7 (Megatron's interleaving)


def test_stage_modules_keep_global_names_and_tied_init():
    model = GPTModel(tiny_config(), seed=3)
    first = split_stage_module(model, range(0, 2), is_first=True, is_last=False)
    last = split_stage_module(model, range(2, 4), is_first=False, is_last=True)
    assert list(first.layers) == ["0", "1"] and list(last.layers) == ["2", "3"]
    assert first.output is None and first.norm is None and last.tok_embeddings is None
    assert "layers.3.mlp.fc2.weight" in dict(last.named_parameters())
    assert torch.equal(first.tok_embeddings.weight, last.output.weight)
    tokens = torch.randint(0, 100, (2, 16))
    h = first(tokens)
    assert h.shape == (2, 16, 32)
    assert torch.allclose(last(h), model(tokens), atol=1e-6)


# ------------------------------------------------------------------ recompute
def test_recompute_plan():
    assert recompute_plan(5, "none", "uniform", 1) == []
    assert recompute_plan(5, "full", "uniform", 2) == [[0, 1], [2, 3], [4]]
    assert recompute_plan(5, "full", "block", 2) == [[0], [1]]
    assert recompute_plan(3, "selective", "uniform", 1) == [[0], [1], [2]]
    with pytest.raises(ConfigError, match="recompute_method"):
        recompute_plan(3, "full", "sideways", 1)


def test_selective_recompute_saves_the_cpu_attention_kernel():
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in SAVE_OPS
    assert torch.ops.aten.mm.default in SAVE_OPS and torch.ops.aten.bmm.default in SAVE_OPS


@pytest.mark.parametrize(
    ("granularity", "method", "n", "units"),
    [
        ("full", "uniform", 1, 4),
        ("full", "uniform", 2, 0),
        ("full", "block", 2, 4),
        ("selective", "uniform", 1, 4),
    ],
)
def test_recompute_gives_the_same_gradients_and_names(granularity, method, n, units):
    config = tiny_config(hidden_dropout=0.1, attention_dropout=0.1)
    tokens = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    grads = []
    for wrap in (False, True):
        model = GPTModel(config, seed=1)
        if wrap:
            keys = apply_recompute(model.layers, granularity, method=method, num_layers=n)
            assert len(keys) == units
        torch.manual_seed(5)
        model(tokens).float().pow(2).mean().backward()
        grads.append({k: v.grad for k, v in model.named_parameters()} if not wrap else None)
        if wrap:
            names = set(get_model_state_dict(model))
            assert names == set(GPTModel(config).state_dict())
            ref = grads[0]
            for name, p in model.named_parameters():
                clean = ".".join(x for x in name.split(".") if not x.startswith("_"))
                assert torch.allclose(p.grad, ref[clean], atol=1e-6), name


# ------------------------------------------------------------------ clipping and state
def test_parallel_clipping_equals_torch_in_one_process():
    a = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(3)]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    for p, q in zip(a, b):
        p.grad = torch.randn(5, 3)
        q.grad = p.grad.clone()
    expected = torch.nn.utils.clip_grad_norm_(b, 0.5)
    got = clip_grad_norm_parallel(a, 0.5)
    assert torch.allclose(got, expected)
    for p, q in zip(a, b):
        assert torch.allclose(p.grad, q.grad, atol=1e-7)
    # excluded copies are clipped but not counted
    extra = torch.nn.Parameter(torch.zeros(2))
    extra.grad = torch.full((2,), 100.0)
    norm = clip_grad_norm_parallel([*a, extra], 0.0, exclude_from_norm=[extra])
    assert torch.allclose(norm, clip_grad_norm_parallel(a, 0.0))


def test_tied_optimizer_state_renames_the_head_copy():
    class Opt:
        def __init__(self):
            self.loaded = None

        def state_dict(self):
            return {
                "state.output.weight.exp_avg": 1,
                "param_groups.output.weight.lr": 2,
                "state.layers.3.x.step": 3,
            }

        def load_state_dict(self, sd):
            self.loaded = sd

    opt = Opt()
    wrapped = TiedOptimizerState(opt, rename=True)
    sd = wrapped.state_dict()
    assert set(sd) == {
        "state.tok_embeddings.weight.exp_avg",
        "param_groups.tok_embeddings.weight.lr",
        "state.layers.3.x.step",
    }
    wrapped.load_state_dict(sd)
    assert opt.loaded == opt.state_dict()
    assert TiedOptimizerState(opt, rename=False).state_dict() == opt.state_dict()


# ------------------------------------------------------------------ trainer
def test_parallel_trainer_in_one_process_matches_the_trainer(tmp_path):
    from epochal.train.config import build_config
    from epochal.train.inputs.loaders import make_loaders
    from epochal.train.parallel_trainer import ParallelTrainer
    from epochal.train.trainer import Trainer
    from tests.train.synthetic import CountingDataset

    results = []
    for cls in (Trainer, ParallelTrainer):
        cfg = build_config(
            preset="tiny",
            overrides=[
                "--data.corpus=",
                "--data.mock=true",
                "--data.seq_length=16",
                "--model.hidden_size=32",
                "--model.num_layers=2",
                "--model.num_attention_heads=4",
                "--model.ffn_hidden_size=64",
                "--training.micro_batch_size=2",
                "--training.global_batch_size=4",
                "--training.train_iters=4",
                "--training.eval_interval=2",
                "--training.eval_iters=1",
                "--scheduler.lr_warmup_iters=1",
                "--checkpoint.save_interval=0",
                "--checkpoint.save_final=false",
                "--logging.progress=false",
                "--logging.tensorboard=false",
                f"--run_dir={tmp_path / cls.__name__}",
            ],
        )
        data = make_loaders(
            cfg,
            CountingDataset(1000, 16, 96),
            CountingDataset(8, 16, 96, offset=10**6),
            vocab_size=96,
        )
        results.append(cls(cfg, data=data, log=False).train())
    plain, parallel = results
    assert parallel.losses == pytest.approx(plain.losses, abs=1e-5)
    assert parallel.eval_loss == pytest.approx(plain.eval_loss, abs=1e-5)


def test_parallel_trainer_checks_the_layout_before_building_data(tmp_path, monkeypatch):
    """A layout that cannot fit the model fails at once, not after a (long) data build."""
    import epochal.train.parallel_trainer as pt
    from epochal.parallel.launch import DistributedInfo
    from epochal.train.config import build_config

    def no_data(*args, **kwargs):
        raise AssertionError("the data was built before the layout was checked")

    monkeypatch.setattr(pt, "build_data", no_data)
    cfg = build_config(
        preset="tiny",
        overrides=[
            "--parallel.tensor_parallel=2",
            "--model.num_attention_heads=3",
            "--model.num_query_groups=1",
            "--model.hidden_size=48",
            f"--run_dir={tmp_path}",
        ],
    )
    two_ranks = DistributedInfo(0, 2, 0, torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"num_attention_heads=3") as err:
        pt.ParallelTrainer(cfg, log=False, dist_info=two_ranks)
    assert err.value.option == "parallel.tensor_parallel"
