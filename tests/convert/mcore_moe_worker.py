"""Megatron-Core mixture-of-experts GPTModel (local spec, CPU, one gloo process) for peer tests.

Usage: python mcore_moe_worker.py OUT_DIR PORT [LOAD_DIR] (the tests run :func:`gloo_rank` on a
rank forked by ``tests.dist_utils.run_gloo``)

Builds three tiny MoE models (2 layers, hidden 64, 4 experts top-2, SwiGLU): ``shared``
(a gated shared expert, every block MoE), ``plain`` (no shared expert, MoE in block 0
only: ``moe_layer_freq=[1, 0]``) and ``deepseek`` (DeepSeek-V3's routing: sigmoid scores,
a random balancing bias, group-limited, scaled; an ungated shared expert). Without ``LOAD_DIR`` it saves each, randomly initialised,
as Megatron-LM does: ``OUT_DIR/{name}/dist/iter_0000007`` (``dist_checkpointing.save``) and
``OUT_DIR/{name}/legacy/iter_0000007/mp_rank_00/model_optim_rng.pt`` (``state_dict()``;
for ``shared`` also ``OUT_DIR/grouped/...``: the same weights loaded by ``dist_checkpointing``
into a ``GroupedMLP`` model, ``mlp.experts.weight1/weight2``),
and writes Megatron-Core's logits for ``OUT_DIR/tokens.pt`` to ``OUT_DIR/{name}/logits.pt``.
With ``LOAD_DIR`` it loads ``LOAD_DIR/{name}/dist/iter_0000000`` (``dist_checkpointing.load``)
and ``LOAD_DIR/{name}/legacy/iter_0000000/mp_rank_00`` (strict ``load_state_dict``) into
fresh models and writes ``OUT_DIR/{name}/logits_dist.pt`` / ``logits_legacy.pt``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

VARIANTS = ("shared", "plain", "deepseek")


def our_config(variant: str):
    """Our ModelConfig of ``variant``."""
    from epochal.model import ModelConfig

    moe = dict(
        moe_shared_expert_intermediate_size=48 if variant == "shared" else None,
        moe_shared_expert_gate=variant == "shared",
        moe_layer_freq=1 if variant == "shared" else [1, 0],
    )
    moe.update(DEEPSEEK if variant == "deepseek" else {})
    return ModelConfig(
        vocab_size=100,
        make_vocab_size_divisible_by=64,
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=96,
        max_position_embeddings=32,
        position_embedding_type="rope",
        normalization="RMSNorm",
        activation="swiglu",
        add_bias_linear=False,
        untie_embeddings_and_output_weights=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        num_experts=4,
        moe_router_topk=2,
        moe_ffn_hidden_size=32,
        **moe,
    )


#: DeepSeek-V3's routing: sigmoid scores with the balancing bias, the top-2 of the best
#: one of two groups, the routed scaling factor, an ungated shared expert
DEEPSEEK = dict(
    moe_shared_expert_intermediate_size=48,
    moe_shared_expert_gate=False,
    moe_layer_freq=1,
    moe_router_score_function="sigmoid",
    moe_router_enable_expert_bias=True,
    moe_router_num_groups=2,
    moe_router_group_topk=1,
    moe_router_topk_scaling_factor=2.5,
)


def _model(cfg, grouped: bool = False):
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    tc = TransformerConfig(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.num_kv_heads,
        ffn_hidden_size=cfg.ffn_size,
        add_bias_linear=False,
        gated_linear_unit=True,
        activation_func=F.silu,
        normalization=cfg.normalization,
        layernorm_epsilon=cfg.norm_epsilon,
        num_moe_experts=cfg.num_experts,
        moe_router_topk=cfg.moe_router_topk,
        moe_ffn_hidden_size=cfg.moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size=cfg.moe_shared_expert_intermediate_size,
        moe_shared_expert_gate=cfg.moe_shared_expert_gate,
        moe_layer_freq=cfg.moe_layer_freq,
        moe_router_score_function=cfg.moe_router_score_function,
        moe_router_enable_expert_bias=cfg.moe_router_enable_expert_bias,
        moe_router_num_groups=cfg.moe_router_num_groups,
        moe_router_group_topk=cfg.moe_router_group_topk,
        moe_router_topk_scaling_factor=cfg.moe_router_topk_scaling_factor,
        moe_token_dispatcher_type="allgather",
        moe_grouped_gemm=grouped,
        moe_aux_loss_coeff=0.0,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        init_method_std=0.2,
    )
    return GPTModel(
        config=tc,
        transformer_layer_spec=get_gpt_decoder_block_spec(tc, use_transformer_engine=False),
        vocab_size=cfg.padded_vocab_size,
        max_sequence_length=cfg.max_position_embeddings,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
    ).eval()


def _logits(model, tokens):
    import torch

    s = tokens.shape[1]
    mask = torch.ones(1, 1, s, s, dtype=torch.bool).triu(1)
    with torch.no_grad():
        return model(tokens, torch.arange(s)[None].expand_as(tokens), mask)


def main(out: str, port: str, load: str) -> None:
    """The command line's entry: a group of one process on ``port``, then :func:`gloo_rank`."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=0, world_size=1)
    gloo_rank(0, 1, out, load)


def gloo_rank(rank: int, world: int, out: str, load: str) -> None:
    """Save (or, with ``load``, load) on a one-process gloo group that is already up
    (``tests.dist_utils.run_gloo``)."""
    import torch
    import torch.distributed as dist

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    import megatron.core.transformer.moe.moe_utils as moe_utils
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.tensor_parallel import random as mrandom

    from epochal.convert.megatron.args import megatron_args_from_config

    moe_utils.te_general_gemm = None  # no Transformer Engine on CPU
    mrandom.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    parallel_state.initialize_model_parallel(1, 1)
    root = Path(out)
    tokens = torch.load(root / "tokens.pt")
    for variant in VARIANTS:
        cfg = our_config(variant)
        torch.manual_seed(0)
        model = _model(cfg)
        with torch.no_grad():  # non-trivial norms
            for name, p in model.named_parameters():
                if "layernorm" in name or "layer_norm" in name:
                    p.uniform_(0.5, 1.5)
            for name, b in model.named_buffers():  # a balancing bias that moves the choice
                if name.endswith("expert_bias"):
                    b.normal_(std=0.05)
        (root / variant).mkdir(parents=True, exist_ok=True)
        if load:
            src = Path(load) / variant
            loaded = dist_checkpointing.load(
                {"model": model.sharded_state_dict()}, str(src / "dist" / "iter_0000000")
            )
            assert loaded["args"].num_experts == cfg.num_experts
            model.load_state_dict(loaded["model"], strict=True)
            torch.save(_logits(model, tokens), root / variant / "logits_dist.pt")
            legacy = src / "legacy" / "iter_0000000" / "mp_rank_00" / "model_optim_rng.pt"
            payload = torch.load(legacy, weights_only=False)
            model = _model(cfg)
            model.load_state_dict(payload["model"], strict=True)
            torch.save(_logits(model, tokens), root / variant / "logits_legacy.pt")
            continue
        args = megatron_args_from_config(
            cfg,
            tensor_parallel=1,
            pipeline_parallel=1,
            iteration=7,
            dtype=torch.float32,
            transformer_impl="local",
        )
        folder = root / variant / "dist" / "iter_0000007"
        folder.mkdir(parents=True)
        dist_checkpointing.save(
            {"model": model.sharded_state_dict(), "args": args, "iteration": 7}, str(folder)
        )
        (folder.parent / "latest_checkpointed_iteration.txt").write_text("7")
        if variant == "shared":  # the same weights in GroupedMLP's layout, moved by Megatron
            import megatron.core.transformer.moe.grouped_gemm_util as gg

            gg.assert_grouped_gemm_is_available = lambda: None  # built only, never run
            grouped = _model(cfg, grouped=True)
            assert type(grouped.decoder.layers[0].mlp.experts).__name__ == "GroupedMLP"
            loaded = dist_checkpointing.load({"model": grouped.sharded_state_dict()}, str(folder))
            grouped.load_state_dict(loaded["model"], strict=True)
            rank_dir = root / "grouped" / "iter_0000007" / "mp_rank_00"
            rank_dir.mkdir(parents=True)
            grouped_args = type(args)(**{**vars(args), "moe_grouped_gemm": True})
            torch.save(
                {
                    "args": grouped_args,
                    "checkpoint_version": 3.0,
                    "iteration": 7,
                    "model": grouped.state_dict(),
                },
                rank_dir / "model_optim_rng.pt",
            )
        rank_dir = root / variant / "legacy" / "iter_0000007" / "mp_rank_00"
        rank_dir.mkdir(parents=True)
        torch.save(
            {"args": args, "checkpoint_version": 3.0, "iteration": 7, "model": model.state_dict()},
            rank_dir / "model_optim_rng.pt",
        )
        (rank_dir.parent.parent / "latest_checkpointed_iteration.txt").write_text("7")
        torch.save(_logits(model, tokens), root / variant / "logits.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "")
