"""Peer test against the real megatron-core GPTModel (local layer spec, CPU, one gloo rank).

Exported rank files load strictly into megatron-core and give our logits; a
random megatron-core model (including ``rotary_interleaved=True`` and RoPE scaling:
``rope_scaling=True`` / ``seq_len_interpolation_factor``) written with Megatron's
layout imports into ours with the same logits. megatron-core's CPU
path needs two small shims (it asks for the CUDA device and a CUDA RNG
tracker); they are applied inside the spawned test process only.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tests.dist_utils import run_gloo

pytestmark = pytest.mark.peer
pytest.importorskip("megatron.core")


def _mcore_model(cfg, args, *, padded_vocab: int, rotary_interleaved: bool = False):
    """megatron-core's GPTModel for ``cfg``, its RoPE options taken from ``args`` as Megatron-LM does."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel as McoreGPT
    from megatron.core.transformer.transformer_config import TransformerConfig

    activation = {
        "swiglu": F.silu,
        "gelu": F.gelu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    }[cfg.activation]
    tc = TransformerConfig(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.num_kv_heads,
        kv_channels=cfg.head_dim,
        ffn_hidden_size=cfg.ffn_size,
        normalization=cfg.normalization,
        layernorm_epsilon=cfg.norm_epsilon,
        add_bias_linear=cfg.add_bias_linear,
        add_qkv_bias=cfg.qkv_bias,
        gated_linear_unit=cfg.activation == "swiglu",
        activation_func=activation,
        bias_activation_fusion=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        rotary_interleaved=rotary_interleaved,
    )
    model = McoreGPT(
        config=tc,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization=cfg.normalization),
        vocab_size=padded_vocab,
        max_sequence_length=cfg.max_position_embeddings,
        position_embedding_type=cfg.position_embedding_type,
        rotary_base=int(cfg.rotary_base),
        rope_scaling=args.use_rope_scaling,
        rope_scaling_factor=args.rope_scaling_factor,
        seq_len_interpolation_factor=args.rotary_seq_len_interpolation_factor,
        share_embeddings_and_output_weights=cfg.tie_embeddings,
    )
    return model.eval()


def _mcore_logits(model, tokens):
    s = tokens.shape[1]
    pos = torch.arange(s)[None].expand(tokens.shape[0], -1)
    mask = torch.ones(1, 1, s, s, dtype=torch.bool).triu(1)
    with torch.no_grad():
        return model(tokens, pos, attention_mask=mask)


def _peer(rank: int, world: int, tmp: str) -> list[str]:
    from pathlib import Path

    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mrandom

    from epochal.convert.megatron.args import megatron_args_from_config
    from epochal.convert.megatron.legacy import load_megatron_checkpoint, save_megatron_checkpoint
    from epochal.model import GPTModel
    from tests.convert.hf_models import gpt2_like, llama_like, ours, randomize

    torch.cuda.current_device = lambda: "cpu"  # megatron-core's CPU shims (this process only)
    mrandom.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    parallel_state.initialize_model_parallel(1, 1)
    tokens = torch.randint(0, 100, (2, 40), generator=torch.Generator().manual_seed(0))
    checked = []
    configs = {
        "gpt2": gpt2_like(num_layers=2, activation="gelu"),
        "llama_gqa": llama_like(num_layers=2),
        "rope_bias_layernorm_tied": llama_like(
            num_layers=2,
            normalization="LayerNorm",
            add_bias_linear=True,
            untie_embeddings_and_output_weights=False,
            activation="gelu_tanh",
            ffn_hidden_size=64,
        ),
        # base 1e6: wavelengths up to 2e5 tokens, across Megatron-Core's fixed llama3
        # thresholds (8192 / 4 and 8192 tokens), so the scaling changes frequencies
        "llama3_scaling": llama_like(
            num_layers=2, rotary_base=1e6, rope_scaling_type="llama3", rope_scaling_factor=8.0
        ),
        "linear_scaling": llama_like(
            num_layers=2, rope_scaling_type="linear", rope_scaling_factor=4.0
        ),
    }
    for name, cfg in configs.items():
        # export: our weights -> Megatron files -> strict load into megatron-core
        model = ours(cfg, seed=5)
        out = Path(tmp) / f"export_{name}"
        save_megatron_checkpoint(cfg, model.state_dict(), out, spec="local")
        payload = torch.load(
            out / "iter_0000000" / "mp_rank_00" / "model_optim_rng.pt", weights_only=False
        )
        mc = _mcore_model(cfg, payload["args"], padded_vocab=payload["args"].padded_vocab_size)
        mc.load_state_dict(payload["model"], strict=True)
        with torch.no_grad():
            ref = model(tokens)[..., :100]
        torch.testing.assert_close(_mcore_logits(mc, tokens)[..., :100], ref, rtol=0, atol=1e-5)
        checked.append(f"export:{name}")

    for name, cfg, interleaved in (
        ("llama_gqa", configs["llama_gqa"], False),
        ("rope_interleaved", configs["llama_gqa"], True),
        ("gpt2", configs["gpt2"], False),
        ("llama3_scaling", configs["llama3_scaling"], False),
        ("linear_scaling", configs["linear_scaling"], False),
    ):
        # import: a random megatron-core model saved in Megatron's layout -> ours
        padded = 128
        args = megatron_args_from_config(
            cfg,
            tensor_parallel=1,
            pipeline_parallel=1,
            iteration=3,
            dtype=torch.float32,
            transformer_impl="local",
        )
        args.rotary_interleaved = interleaved
        mc = _mcore_model(cfg, args, padded_vocab=padded, rotary_interleaved=interleaved)
        randomize(mc, seed=9)
        rank_dir = Path(tmp) / f"import_{name}" / "iter_0000003" / "mp_rank_00"
        rank_dir.mkdir(parents=True)
        torch.save(
            {"args": args, "checkpoint_version": 3.0, "iteration": 3, "model": mc.state_dict()},
            rank_dir / "model_optim_rng.pt",
        )
        (rank_dir.parent.parent / "latest_checkpointed_iteration.txt").write_text("3")
        ckpt = load_megatron_checkpoint(rank_dir.parent.parent)
        assert ckpt.config == dataclasses.replace(cfg), (ckpt.config, cfg)
        model = GPTModel(ckpt.config).eval()
        model.load_state_dict(ckpt.state, strict=True)
        ref = _mcore_logits(mc, tokens)[..., :100]
        assert ref.abs().max() > 1.0
        with torch.no_grad():
            torch.testing.assert_close(model(tokens)[..., :100], ref, rtol=0, atol=1e-5)
            if cfg.rope_scaling_type is not None:  # the scaling is exercised
                plain = GPTModel(dataclasses.replace(cfg, rope_scaling_type=None)).eval()
                plain.load_state_dict(ckpt.state, strict=True)
                assert (plain(tokens)[..., :100] - ref).abs().max() > 1e-3
        checked.append(f"import:{name}")
    return checked


def test_megatron_core_loads_our_export_and_we_load_its_weights(tmp_path):
    (checked,) = run_gloo(_peer, 1, str(tmp_path))
    assert checked == [
        "export:gpt2",
        "export:llama_gqa",
        "export:rope_bias_layernorm_tied",
        "export:llama3_scaling",
        "export:linear_scaling",
        "import:llama_gqa",
        "import:rope_interleaved",
        "import:gpt2",
        "import:llama3_scaling",
        "import:linear_scaling",
    ]
