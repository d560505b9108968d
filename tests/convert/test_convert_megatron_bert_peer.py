"""Peer test against the real Megatron-Core ``BertModel`` (``bert_layer_local_spec``, CPU, gloo).

Our BERT exported at TP1, TP2 and PP2 loads strictly, rank file by rank file, into
Megatron-Core's ``BertModel`` built for that rank (two gloo processes for TP2 and
PP2; the pipeline's hidden states go from stage 0 to stage 1 with a gloo
send/recv), and gives our masked-LM and binary logits within 1e-4 (fp32) at the
real (unpadded) positions; a random Megatron-Core ``BertModel`` saved in
Megatron's layout imports into ours with its logits. Megatron-Core's CPU path
needs shims (CUDA device, CUDA RNG tracker, ``Tensor.cuda`` for the pipeline's
embedding sync); they are applied inside the spawned processes only.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.dist_utils import run_gloo

pytestmark = pytest.mark.peer
pytest.importorskip("megatron.core")

ATOL = 1e-4


def _cfg(binary: bool):
    from tests.convert.hf_models import encoder_like

    return encoder_like(bert_binary_head=binary, make_vocab_size_divisible_by=8)


def _inputs():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 100, (2, 24), generator=g)
    types = torch.randint(0, 2, (2, 24), generator=g)
    padding = torch.ones(2, 24, dtype=torch.long)
    padding[1, 17:] = 0
    return tokens, types, padding


def _shims() -> None:
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = lambda: "cpu"
    mrandom.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    torch.Tensor.cuda = lambda self, *a, **k: self  # LanguageModule's PP embedding sync


def _mcore_bert(cfg, args, *, tp: int, pp: int, first: bool, last: bool):
    from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
    from megatron.core.models.bert.bert_model import BertModel as McoreBert
    from megatron.core.transformer.transformer_config import TransformerConfig

    tc = TransformerConfig(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        ffn_hidden_size=cfg.ffn_size,
        layernorm_epsilon=cfg.norm_epsilon,
        add_bias_linear=True,
        activation_func=F.gelu,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32,
    )
    model = McoreBert(
        config=tc,
        num_tokentypes=args.num_tokentypes,
        transformer_layer_spec=bert_layer_local_spec,
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=first,
        post_process=last,
        parallel_output=False,
        share_embeddings_and_output_weights=True,
        add_binary_head=args.bert_binary_head,
    )
    return model.eval()


def _ours(cfg, seed: int):
    from epochal.model import build_model
    from tests.convert.hf_models import randomize

    return randomize(build_model(cfg), seed).eval()


def _check(ours_out, theirs, padding, vocab: int, binary: bool) -> None:
    real = padding.bool()
    ours_mlm, ours_bin = ours_out if binary else (ours_out, None)
    mlm, bin_logits = theirs
    assert mlm.shape[:-1] == ours_mlm.shape[:-1]  # the vocabulary padding depends on TP
    assert ours_mlm[..., :vocab].abs().max() > 1.0
    torch.testing.assert_close(mlm[real][:, :vocab], ours_mlm[real][:, :vocab], rtol=0, atol=ATOL)
    if binary:
        torch.testing.assert_close(bin_logits, ours_bin, rtol=0, atol=ATOL)
    else:
        assert bin_logits is None


def _single(rank: int, world: int, tmp: str) -> list[str]:
    from megatron.core import parallel_state

    from epochal.convert.megatron.args import megatron_args_from_config
    from epochal.convert.megatron.legacy import load_megatron_checkpoint, save_megatron_checkpoint
    from epochal.model import build_model
    from tests.convert.hf_models import randomize

    _shims()
    parallel_state.initialize_model_parallel(1, 1)
    tokens, types, padding = _inputs()
    checked = []
    for binary in (True, False):
        cfg = _cfg(binary)
        model = _ours(cfg, seed=5)
        with torch.no_grad():
            ref = model(tokens, token_types=types, padding_mask=padding)
        out = Path(tmp) / f"export_{binary}"
        save_megatron_checkpoint(cfg, model.state_dict(), out, spec="local")
        payload = torch.load(
            out / "iter_0000000" / "mp_rank_00" / "model_optim_rng.pt", weights_only=False
        )
        mc = _mcore_bert(cfg, payload["args"], tp=1, pp=1, first=True, last=True)
        mc.load_state_dict(payload["model"], strict=True)
        with torch.no_grad():
            theirs = mc(tokens, padding, tokentype_ids=types)
        _check(ref, theirs, padding, cfg.vocab_size, binary)
        checked.append(f"export:tp1:binary={binary}")

        # import: a random Megatron-Core BertModel in Megatron's file layout -> ours
        args = megatron_args_from_config(
            cfg,
            tensor_parallel=1,
            pipeline_parallel=1,
            iteration=7,
            dtype=torch.float32,
            transformer_impl="local",
        )
        mc = randomize(_mcore_bert(cfg, args, tp=1, pp=1, first=True, last=True), seed=9)
        rank_dir = Path(tmp) / f"import_{binary}" / "iter_0000007" / "mp_rank_00"
        rank_dir.mkdir(parents=True)
        torch.save(
            {"args": args, "checkpoint_version": 3.0, "iteration": 7, "model": mc.state_dict()},
            rank_dir / "model_optim_rng.pt",
        )
        (rank_dir.parent.parent / "latest_checkpointed_iteration.txt").write_text("7")
        ck = load_megatron_checkpoint(rank_dir.parent.parent, model_type="bert")
        assert ck.config == cfg, (ck.config, cfg)
        assert ck.iteration == 7
        ours = build_model(ck.config).eval()
        ours.load_state_dict(ck.state, strict=True)
        with torch.no_grad():
            _check(
                ours(tokens, token_types=types, padding_mask=padding),
                mc(tokens, padding, tokentype_ids=types),
                padding,
                cfg.vocab_size,
                binary,
            )
        checked.append(f"import:tp1:binary={binary}")
    return checked


def _parallel(rank: int, world: int, tmp: str) -> list[str]:
    import torch.distributed as dist
    from megatron.core import parallel_state

    from epochal.convert.megatron.legacy import save_megatron_checkpoint

    _shims()
    tokens, types, padding = _inputs()
    cfg = _cfg(True)
    model = _ours(cfg, seed=11)
    with torch.no_grad():
        ref = model(tokens, token_types=types, padding_mask=padding)
    checked = []
    for tp, pp in ((2, 1), (1, 2)):
        parallel_state.initialize_model_parallel(tp, pp)
        out = Path(tmp) / f"tp{tp}_pp{pp}"
        if rank == 0:
            save_megatron_checkpoint(
                cfg, model.state_dict(), out, tensor_parallel=tp, pipeline_parallel=pp, spec="local"
            )
        dist.barrier()
        t, p = (rank, 0) if tp == 2 else (0, rank)
        name = f"mp_rank_{t:02d}" if pp == 1 else f"mp_rank_{t:02d}_{p:03d}"
        payload = torch.load(out / "iter_0000000" / name / "model_optim_rng.pt", weights_only=False)
        first, last = p == 0, p == pp - 1
        mc = _mcore_bert(cfg, payload["args"], tp=tp, pp=pp, first=first, last=last)
        mc.load_state_dict(payload["model"], strict=True)
        with torch.no_grad():
            if pp == 1:
                theirs = mc(tokens, padding, tokentype_ids=types)
            elif first:  # stage 0: embeddings + layer 0 -> hidden states [s, b, h] to stage 1
                dist.send(mc(tokens, padding, tokentype_ids=types).contiguous(), dst=1)
            else:
                hidden = torch.empty(tokens.shape[1], tokens.shape[0], cfg.hidden_size)
                dist.recv(hidden, src=0)
                mc.set_input_tensor(hidden)
                theirs = mc(tokens, padding, tokentype_ids=types)
        if last:
            _check(ref, theirs, padding, cfg.vocab_size, True)
        checked.append(f"export:tp{tp}:pp{pp}:rank{rank}")
        parallel_state.destroy_model_parallel()
        dist.barrier()
    return checked


def test_megatron_core_bert_tp1_loads_our_export_and_we_load_its_weights(tmp_path):
    (checked,) = run_gloo(_single, 1, str(tmp_path))
    assert checked == [
        "export:tp1:binary=True",
        "import:tp1:binary=True",
        "export:tp1:binary=False",
        "import:tp1:binary=False",
    ]


@pytest.mark.distributed
@pytest.mark.slow  # the TP1 peer test and the torch_dist TP2 export test cover the default tier
def test_megatron_core_bert_loads_our_tp2_and_pp2_exports(tmp_path):
    results = run_gloo(_parallel, 2, str(tmp_path))
    assert results == [
        ["export:tp2:pp1:rank0", "export:tp1:pp2:rank0"],
        ["export:tp2:pp1:rank1", "export:tp1:pp2:rank1"],
    ]
