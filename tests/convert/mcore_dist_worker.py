"""Save a real Megatron-Core GPTModel as a ``torch_dist`` checkpoint on TP gloo ranks.

Usage: python mcore_dist_worker.py OUT_DIR TP VARIANT PORT [LOAD_FOLDER]

``VARIANT``: ``llama`` (RoPE, RMSNorm, SwiGLU, GQA, no biases, untied head),
``gpt2`` (learned positions, LayerNorm, GELU, biases, tied head), ``esm`` (ESM-2 as
BioNeMo builds it: a rotary ``BertModel`` without token types or binary head; 33 ids) or ``bert``
(Megatron-Core's ``BertModel``: token types, LM head, pooler and binary head; its
logits are the masked-LM logits, ``binary.pt``/``binary_loaded.pt`` the binary head's,
for :func:`bert_inputs`). A ``-nemo`` suffix (``llama-nemo``) saves the model as NeMo 2
does instead: ``OUT_DIR/weights/`` with the tensors under ``module.`` (the test writes
``context/``). Writes Megatron-LM's
layout (``OUT_DIR/iter_0000007/`` with ``args`` in ``common.pt``, and the tracker file)
and ``OUT_DIR/logits.pt``: Megatron-Core's own logits ``[b, s, vocab]`` (gathered over
the TP ranks) for ``tokens.pt``'s ids. With ``LOAD_FOLDER`` it instead loads that
``torch_dist`` folder into a fresh model with ``dist_checkpointing.load`` (strictly,
into ``GPTModel.sharded_state_dict()``) and writes ``OUT_DIR/logits_loaded.pt``.
The tests run :func:`gloo_rank` on ranks forked by ``tests.dist_utils.run_gloo``;
the command line spawns its own ranks (``__main__`` guard).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def bert_inputs(tokens):
    """BERT's other inputs for ``tokens`` ``[b, s]``: token types (second half 1) and a
    padding mask (the last 3 positions of row 1 padded), both int64 ``[b, s]``."""
    import torch

    b, s = tokens.shape
    types = (torch.arange(s) >= s // 2).long().expand(b, s).clone()
    padding = torch.ones(b, s, dtype=torch.long)
    padding[1, s - 3 :] = 0
    return types, padding


def our_config(variant: str):
    from epochal.model import ModelConfig

    if variant in ("bert", "esm"):
        from tests.convert.hf_models import encoder_like

        if (
            variant == "esm"
        ):  # BioNeMo's ESM-2 layout; token dropout off (Megatron's BertModel has none)
            return encoder_like("esm", token_dropout=False, make_vocab_size_divisible_by=64)
        return encoder_like(bert_binary_head=True, make_vocab_size_divisible_by=64)

    common = dict(
        vocab_size=100,
        make_vocab_size_divisible_by=64,  # 128 rows at TP1 and at TP2 (64 x 2)
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    if variant == "llama":
        return ModelConfig(
            **common,
            num_query_groups=2,
            ffn_hidden_size=64,
            position_embedding_type="rope",
            normalization="RMSNorm",
            activation="swiglu",
            add_bias_linear=False,
            untie_embeddings_and_output_weights=True,
        )
    return ModelConfig(**common, ffn_hidden_size=64, activation="gelu")


def rank_main(rank: int, world: int, out: str, variant: str, port: str, load: str) -> None:
    """One rank of a ``torch.multiprocessing.spawn`` launch: join the group, then :func:`gloo_rank`."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    gloo_rank(rank, world, out, variant, load)


def gloo_rank(rank: int, world: int, out: str, variant: str, load: str) -> None:
    """Save (or, with ``load``, load) on a gloo group that is already up (``tests.dist_utils.run_gloo``)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.transformer_config import TransformerConfig

    from epochal.convert.megatron.args import megatron_args_from_config

    nemo = variant.endswith("-nemo")  # e.g. "llama-nemo": save as NeMo 2 does
    variant = variant.removesuffix("-nemo")
    mrandom.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    parallel_state.initialize_model_parallel(world, 1)
    cfg = our_config(variant)
    llama = variant == "llama"
    tc = TransformerConfig(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.num_kv_heads,
        ffn_hidden_size=cfg.ffn_size,
        add_bias_linear=not llama,
        gated_linear_unit=llama,
        activation_func=F.silu if llama else F.gelu,
        normalization=cfg.normalization,
        layernorm_epsilon=cfg.norm_epsilon,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        tensor_model_parallel_size=world,
        init_method_std=0.2,
    )
    torch.manual_seed(0)
    if variant in ("bert", "esm"):
        model = _bert(cfg, tc)
    else:
        model = GPTModel(
            config=tc,
            transformer_layer_spec=get_gpt_layer_local_spec(normalization=cfg.normalization),
            vocab_size=cfg.padded_vocab_size,
            max_sequence_length=cfg.max_position_embeddings,
            position_embedding_type="rope" if llama else "learned_absolute",
            share_embeddings_and_output_weights=not llama,
        ).eval()
    with torch.no_grad():  # non-trivial norms
        for name, p in model.named_parameters():
            if "layer_norm" in name or "layernorm" in name:
                p.uniform_(0.5, 1.5)
    if load:
        # Megatron-LM's load_checkpoint: {"model": ...} plus the common items (args, ...)
        loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, load)
        assert loaded["args"].num_layers == cfg.num_layers
        model.load_state_dict(loaded["model"], strict=True)
        _write_logits(model, world, rank, Path(out), "logits_loaded.pt")
        dist.barrier()
        dist.destroy_process_group()
        return
    if nemo:  # NeMo 2's layout: the model's tensors under "module." in weights/
        folder = Path(out) / "weights"
        folder.mkdir(parents=True, exist_ok=True)
        dist_checkpointing.save(model.sharded_state_dict(prefix="module."), str(folder))
        _write_logits(model, world, rank, Path(out), "logits.pt")
        dist.barrier()
        dist.destroy_process_group()
        return
    args = megatron_args_from_config(
        cfg,
        tensor_parallel=world,
        pipeline_parallel=1,
        iteration=7,
        dtype=torch.float32,
        transformer_impl="local",
    )
    folder = Path(out) / "iter_0000007"
    folder.mkdir(parents=True, exist_ok=True)
    # Megatron-LM's save_checkpoint layout: the model under "model", args and iteration beside
    state = {"model": model.sharded_state_dict(), "args": args, "iteration": 7}
    dist_checkpointing.save(state, str(folder))
    _write_logits(model, world, rank, Path(out), "logits.pt")
    if rank == 0:
        (Path(out) / "latest_checkpointed_iteration.txt").write_text("7")
    dist.barrier()
    dist.destroy_process_group()


def _bert(cfg, tc):
    """Megatron-Core's BertModel (local spec) for our BERT ``cfg`` under ``tc``'s TP size."""
    from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
    from megatron.core.models.bert.bert_model import BertModel

    return BertModel(
        config=tc,
        num_tokentypes=cfg.num_tokentypes,
        transformer_layer_spec=bert_layer_local_spec,
        vocab_size=cfg.padded_vocab_size,
        max_sequence_length=cfg.max_position_embeddings,
        position_embedding_type=cfg.position_embedding_type,
        parallel_output=False,
        share_embeddings_and_output_weights=True,
        add_binary_head=cfg.bert_binary_head,
    ).eval()


def _write_logits(model, world: int, rank: int, out: Path, name: str) -> None:
    """Megatron-Core's logits for ``out/tokens.pt``, gathered over the TP ranks, by rank 0."""
    import torch
    import torch.distributed as dist

    tokens = torch.load(out / "tokens.pt")
    if type(model).__name__ == "BertModel":
        types, padding = bert_inputs(tokens)
        if model.embedding.tokentype_embeddings is None:
            types = None
        with torch.no_grad():
            logits, binary = model(tokens, padding, tokentype_ids=types)  # whole vocabulary
        if rank == 0:
            torch.save(logits, out / name)
            torch.save(binary, out / name.replace("logits", "binary"))
        return
    s = tokens.shape[1]
    mask = torch.ones(1, 1, s, s, dtype=torch.bool).triu(1)
    with torch.no_grad():
        logits = model(tokens, torch.arange(s)[None].expand_as(tokens), mask)  # [b, s, V/tp]
    parts = [torch.empty_like(logits) for _ in range(world)]
    dist.all_gather(parts, logits.contiguous())
    if rank == 0:
        torch.save(torch.cat(parts, dim=-1), out / name)


if __name__ == "__main__":
    import torch.multiprocessing as mp

    out_dir, tp, variant, port = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    load = sys.argv[5] if len(sys.argv) > 5 else ""
    mp.spawn(rank_main, args=(tp, out_dir, variant, port, load), nprocs=tp)
