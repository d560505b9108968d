"""The bodies of the shared 2- and 4-process groups: every layout check runs in one spawned group.

Spawning processes and importing torch costs seconds on a loaded 2-core
machine, so each group runs a list of checks and returns ``{name: problems}``
(an empty list = the layout matched the single-process run). Each check is
independent: an exception is reported as that check's problem and the group
goes on with the next one.
"""

from __future__ import annotations

import os
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from tests.parallel import harness as H

STEPS = 3

#: (name, layout kwargs, model overrides, micro-batch size, global batch, compile)
TWO_RANK_LAYOUTS: list[tuple[str, dict, dict, int, int, bool]] = [
    ("tp2", dict(tensor_parallel=2), dict(num_layers=2), 2, 4, False),
    (
        "tp2_gqa_rope_swiglu_untied",
        dict(tensor_parallel=2),
        dict(
            num_layers=2,
            num_query_groups=2,
            position_embedding_type="rope",
            normalization="RMSNorm",
            activation="swiglu",
            ffn_hidden_size=64,
            add_bias_linear=False,
            untie_embeddings_and_output_weights=True,
        ),
        2,
        4,
        False,
    ),
    (
        "tp2_mqa_alibi",
        dict(tensor_parallel=2),
        dict(num_layers=2, num_query_groups=1, position_embedding_type="alibi"),
        2,
        4,
        False,
    ),
    (
        "tp2_gathered_logits",
        dict(tensor_parallel=2, loss_parallel=False),
        dict(num_layers=2),
        2,
        4,
        False,
    ),
    ("sp", dict(tensor_parallel=2, sequence_parallel=True), dict(num_layers=2), 2, 4, False),
    (
        "sp_mqa_rope",
        dict(tensor_parallel=2, sequence_parallel=True),
        dict(
            num_layers=2,
            num_query_groups=1,
            position_embedding_type="rope",
            normalization="RMSNorm",
        ),
        2,
        4,
        False,
    ),
    # the 28 padded ids (of 128) outside the softmax: rank 1's vocabulary slice is part padding
    (
        "tp2_padded_vocab_outside_softmax",
        dict(tensor_parallel=2),
        dict(num_layers=2, padded_vocab_in_softmax=False),
        2,
        4,
        False,
    ),
    (
        "pp2_padded_vocab_outside_softmax",
        dict(pipeline_parallel=2),
        dict(padded_vocab_in_softmax=False),
        2,
        8,
        False,
    ),
    ("pp2_gpipe", dict(pipeline_parallel=2, pipeline_schedule="gpipe"), {}, 2, 8, False),
    ("pp2_1f1b", dict(pipeline_parallel=2, pipeline_schedule="1f1b"), {}, 2, 8, False),
    (
        "pp2_interleaved",
        dict(pipeline_parallel=2, virtual_pipeline=2, pipeline_schedule="interleaved_1f1b"),
        {},
        2,
        8,
        False,
    ),
    (
        "pp2_uneven_untied",
        dict(pipeline_parallel=2, decoder_last_pipeline_num_layers=1),
        dict(untie_embeddings_and_output_weights=True),
        2,
        8,
        False,
    ),
    ("dp2_none", dict(dp_sharding="none"), dict(num_layers=2), 2, 8, False),
    ("dp2_optimizer", dict(dp_sharding="optimizer"), dict(num_layers=2), 2, 8, False),
    ("dp2_full", dict(dp_sharding="full"), dict(num_layers=2), 2, 8, False),
    (
        "recompute_full_sp",
        dict(tensor_parallel=2, sequence_parallel=True, recompute_granularity="full"),
        dict(num_layers=2),
        2,
        4,
        False,
    ),
    (
        "recompute_selective_tp2",
        dict(tensor_parallel=2, recompute_granularity="selective"),
        dict(num_layers=2),
        2,
        4,
        False,
    ),
    (
        "recompute_uniform2_dp2_full",
        dict(dp_sharding="full", recompute_granularity="full", recompute_num_layers=2),
        dict(num_layers=2),
        2,
        8,
        False,
    ),
    (
        "recompute_block_pp2",
        dict(pipeline_parallel=2, recompute_granularity="full", recompute_method="block"),
        {},
        2,
        8,
        False,
    ),
    (
        "recompute_selective_dp2_optimizer",
        dict(dp_sharding="optimizer", recompute_granularity="selective"),
        dict(num_layers=2),
        2,
        8,
        False,
    ),
]

#: 2-rank layouts of the slow tier (same tuple layout): ``torch.compile`` under data
#: parallelism and under TP + SP (about 16 and 18 s on two cores, mostly inductor's C++
#: kernels); the single-process trainer's compile is tested in the default tier.
SLOW_TWO_RANK_LAYOUTS: list[tuple[str, dict, dict, int, int, bool]] = [
    ("compile_dp2", dict(dp_sharding="optimizer"), dict(num_layers=1), 2, 8, True),
    (
        "compile_sp_rope",
        dict(tensor_parallel=2, sequence_parallel=True),
        dict(num_layers=1, position_embedding_type="rope"),
        2,
        4,
        True,
    ),
]

#: 4-rank layouts (same tuple layout).
FOUR_RANK_LAYOUTS: list[tuple[str, dict, dict, int, int, bool]] = [
    ("tp2_dp2", dict(tensor_parallel=2), dict(num_layers=2), 2, 8, False),
    (
        "tp2_sp_dp2_full_recompute",
        dict(
            tensor_parallel=2,
            sequence_parallel=True,
            dp_sharding="full",
            recompute_granularity="full",
        ),
        dict(num_layers=2, num_query_groups=1, position_embedding_type="rope"),
        2,
        8,
        False,
    ),
    (
        # RoPE: the second stage gets a sequence slice but must rotate by full positions
        "pp2_tp2_sp_rope",
        dict(pipeline_parallel=2, tensor_parallel=2, sequence_parallel=True),
        dict(position_embedding_type="rope"),
        2,
        8,
        False,
    ),
    (
        "pp2_dp2_optimizer_gpipe",
        dict(pipeline_parallel=2, dp_sharding="optimizer", pipeline_schedule="gpipe"),
        {},
        2,
        8,
        False,
    ),
    (
        "pp2_interleaved_dp2",
        dict(
            pipeline_parallel=2,
            virtual_pipeline=2,
            pipeline_schedule="interleaved_1f1b",
            recompute_granularity="selective",
        ),
        {},
        1,
        8,
        False,
    ),
]


def _guard(fn: Callable[..., list[str]], *args: Any, **kwargs: Any) -> list[str]:
    try:
        return fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - report, go on with the next check
        return [traceback.format_exc()[-3000:]]


def _check_layout(
    ref: dict, kw: dict, config: Any, batches: list, mbs: int, comp: bool
) -> list[str]:
    return H.compare(ref, H.parallel_run(H.layout(**kw), config, batches, mbs, compile=comp))


#: the start of PyTorch's warning when an FSDP2-wrapped module's forward returns a view
VIEW_WARNING = "FSDP2-wrapped module"


def _layout_checks(layouts: list[tuple[str, dict, dict, int, int, bool]]) -> dict[str, list[str]]:
    """``{name: problems}`` per layout, and ``{name + "_view_warnings": messages}``: the
    FSDP2 view warnings the layout's run emitted (each message once)."""
    out: dict[str, list[str]] = {}
    refs: dict[tuple, dict] = {}
    for name, kw, model_kw, mbs, gbs, comp in layouts:
        config = H.tiny_config(**model_kw)
        steps = 2 if comp else STEPS
        batches = H.global_batches(steps, gbs)
        key = (tuple(sorted(model_kw.items())), mbs, gbs, steps)
        if key not in refs:
            refs[key] = H.reference_run(config, batches, mbs)
        ref = refs[key]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out[name] = _guard(_check_layout, ref, kw, config, batches, mbs, comp)
        out[name + "_view_warnings"] = sorted(
            {str(w.message) for w in caught if str(w.message).startswith(VIEW_WARNING)}
        )
        if comp:
            # The failure mode seen with per-block compile under TP+SP is a silently zero
            # embedding gradient; compare() catches it only if the true gradient is large.
            big = float(ref["grads"][0]["tok_embeddings.weight"].abs().max())
            out[name + "_embedding_grad_visible"] = (
                [] if big > 100 * 1e-5 else [f"embedding grad too small to check: {big}"]
            )
        dist.barrier()
    return out


def _custom_loss(
    labels: torch.Tensor, logits: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """Megatron's token mean computed by hand on gathered logits (a user's loss hook)."""
    ce = torch.nn.functional.cross_entropy(
        logits.float().flatten(0, 1), labels.flatten(), reduction="none"
    )
    m = loss_mask.flatten()
    return (ce * m).sum() / m.sum().clamp(min=1.0)


def _vocab_parallel_loss_check() -> list[str]:
    """Vocabulary-parallel losses, gradients and top-1 hits equal the whole logits' (rank r
    holds ids [4r, 4r + 4) of 8): every id in the softmax, the first 6 (rank 1's slice part
    padding) and the first 3 (rank 1's slice all padding: ``vocab``)."""
    from epochal.parallel.loss import vocab_parallel_cross_entropy, vocab_parallel_prediction_hits

    rank = dist.get_rank()
    problems = []
    for vocab in (None, 6, 3):
        g = torch.Generator().manual_seed(3)
        logits = torch.randn(3, 5, 8, generator=g) * 4
        labels = torch.randint(0, vocab or 8, (3, 5), generator=g)
        weights = torch.rand(3, 5, generator=g)
        full = logits.clone().requires_grad_(True)
        ref = torch.nn.functional.cross_entropy(
            full[..., :vocab].flatten(0, 1), labels.flatten(), reduction="none"
        ).view(3, 5)
        (ref * weights).sum().backward()
        local = logits[..., rank * 4 : (rank + 1) * 4].clone().requires_grad_(True)
        got = vocab_parallel_cross_entropy(local, labels, dist.group.WORLD, vocab)
        (got * weights).sum().backward()
        if not torch.allclose(got, ref, atol=1e-5):
            problems.append(f"vocab={vocab}: losses differ by {(got - ref).abs().max()}")
        grad_ref = full.grad[..., rank * 4 : (rank + 1) * 4]
        if not torch.allclose(local.grad, grad_ref, atol=1e-6):
            problems.append(
                f"vocab={vocab}: logit gradients differ by {(local.grad - grad_ref).abs().max()}"
            )
        hits = vocab_parallel_prediction_hits(local, labels, dist.group.WORLD, vocab)
        want = logits[..., :vocab].argmax(-1) == labels
        if not torch.equal(hits, want):
            problems.append(f"vocab={vocab}: top-1 hits {hits.tolist()} != {want.tolist()}")
    return problems


def _dropout_streams_check(sequence_parallel: bool) -> list[str]:
    """TP2 with dropout: a rank's heads get their own masks, replicated activations the same ones.

    Rank 1's attention heads are made copies of rank 0's, so with one shared
    stream both ranks' attention outputs would be identical.
    """
    from torch.distributed.device_mesh import init_device_mesh

    from epochal.model import GPTModel
    from epochal.parallel.tensor_parallel import apply_tensor_parallel

    config = H.tiny_config(num_layers=1, attention_dropout=0.5, hidden_dropout=0.5)
    model = GPTModel(config, seed=0)
    attention = model.layers["0"].attention
    half = attention.wq.weight.shape[0] // 2
    with torch.no_grad():
        for linear in (attention.wq, attention.wk, attention.wv):
            linear.weight[half:] = linear.weight[:half]
            if linear.bias is not None:
                linear.bias[half:] = linear.bias[:half]
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    apply_tensor_parallel(model, mesh, sequence_parallel=sequence_parallel)
    model.train()
    seen: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Any:
        def hook(mod: torch.nn.Module, args: tuple) -> None:
            x = args[0]
            seen[name] = (x.to_local() if hasattr(x, "to_local") else x).detach().clone()

        return hook

    attention.wo.register_forward_pre_hook(keep("heads"))  # after the TP plan's own input hook
    model.layers["0"].register_forward_pre_hook(keep("residual"))
    torch.manual_seed(123)
    tokens = torch.arange(2 * H.SEQ).view(2, H.SEQ) % config.vocab_size
    model(tokens)

    def gathered(t: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(t) for _ in range(2)]
        dist.all_gather(out, t.contiguous())
        return out

    problems = []
    heads = gathered(seen["heads"])
    if torch.equal(heads[0], heads[1]):
        problems.append("both ranks' attention heads drew the same dropout masks")
    states = gathered(torch.get_rng_state())
    if not torch.equal(states[0], states[1]):
        problems.append("the shared random stream diverged between tensor-parallel ranks")
    residual = gathered(seen["residual"])
    same_residual = torch.equal(residual[0], residual[1])
    if not sequence_parallel and not same_residual:
        problems.append("replicated embedding-dropout outputs differ between ranks")
    return problems


def _outputs_not_views_check() -> list[str]:
    """Under TP2 every model type's outputs are plain local tensors, not views of a DTensor.

    FSDP2 warns about (and an in-place op would break) a wrapped module that returns a
    view; under TP x DP the root module's output is the output head's.
    """
    from torch.distributed.device_mesh import init_device_mesh

    from epochal.model import build_model
    from epochal.parallel.tensor_parallel import apply_tensor_parallel

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    tokens = torch.arange(2 * H.SEQ).view(2, H.SEQ) % 50
    bert = dict(
        type="bert",
        position_embedding_type="learned_absolute",
        normalization="LayerNorm",
        activation="gelu",
    )
    problems = []
    for name, model_kw, tp_kw in [
        ("gpt", {}, {}),
        ("gpt gathered logits", {}, dict(loss_parallel=False)),
        ("gpt sequence parallel", {}, dict(sequence_parallel=True)),
        ("bert", bert, {}),
        ("t5", dict(type="t5", position_embedding_type="relative"), {}),
    ]:
        model = build_model(H.tiny_config(num_layers=1, **model_kw))
        apply_tensor_parallel(model, mesh, **tp_kw)
        out = model(tokens, tokens) if name == "t5" else model(tokens)
        for t in out if isinstance(out, tuple) else (out,):
            if not t.requires_grad or t._base is not None or isinstance(t, DTensor):
                problems.append(f"{name}: output {tuple(t.shape)} is a view or not a local tensor")
        if name == "gpt":  # the gradient still reaches the head through the local output
            out.sum().backward()
            if model.output.weight.grad is None:
                problems.append("gpt: no gradient reached the output head")
    return problems


def two_rank_group(rank: int, world: int, tmp: str) -> dict[str, list[str]]:
    """All 2-process checks (run by :func:`tests.dist_utils.run_gloo`)."""
    torch.set_num_threads(1)
    out = {"vocab_parallel_loss": _guard(_vocab_parallel_loss_check)}
    out["tp2_outputs_not_views"] = _guard(_outputs_not_views_check)
    for sp in (False, True):
        out[f"tp2_dropout_streams{'_sp' if sp else ''}"] = _guard(_dropout_streams_check, sp)
    out.update(_layout_checks(TWO_RANK_LAYOUTS))
    # a user loss hook under TP receives gathered logits and gives the same result
    config = H.tiny_config(num_layers=2)
    batches = H.global_batches(STEPS, 4)
    ref = H.reference_run(config, batches, 2)
    out["tp2_custom_loss"] = _guard(
        lambda: H.compare(
            ref,
            H.parallel_run(H.layout(tensor_parallel=2), config, batches, 2, loss_fn=_custom_loss),
        )
    )
    # resharding: a single-process checkpoint (written by the parent) resumed under PP2 (tied head on stage 1)
    config = H.tiny_config()
    batches = H.global_batches(4, 8, seed=11)
    ref = H.reference_run(config, batches, 2)

    def resume_pp2() -> list[str]:
        got = H.parallel_run(
            H.layout(pipeline_parallel=2),
            config,
            batches[2:],
            2,
            load_dir=os.path.join(tmp, "single", "step_0000002"),
        )
        return H.compare({k: ref[k][2:] if k != "params" else ref[k] for k in ref}, got)

    out["reshard_single_to_pp2"] = _guard(resume_pp2)
    return out


def slow_two_rank_group(rank: int, world: int, tmp: str) -> dict[str, list[str]]:
    """The 2-process checks of the slow tier."""
    torch.set_num_threads(1)
    return _layout_checks(SLOW_TWO_RANK_LAYOUTS)


def four_rank_group(rank: int, world: int, tmp: str) -> dict[str, Any]:
    """All 4-process checks, including a checkpoint saved under TP2 x PP2 and resumed under DP4."""
    torch.set_num_threads(1)
    out: dict[str, Any] = _layout_checks(FOUR_RANK_LAYOUTS)
    config = H.tiny_config()
    batches = H.global_batches(4, 8, seed=11)
    ref = H.reference_run(config, batches, 2)
    tail = {k: ref[k][2:] if k != "params" else ref[k] for k in ref}
    save_root = os.path.join(tmp, "tp2pp2")

    def save_tp2_pp2() -> list[str]:
        got = H.parallel_run(
            H.layout(tensor_parallel=2, pipeline_parallel=2, sequence_parallel=True),
            config,
            batches[:2],
            2,
            save_dir=save_root,
        )
        head = {k: ref[k][:2] for k in ("losses", "norms", "grads")}
        head["params"] = got["params"]  # the state after 2 steps is checked by the resumed runs
        return H.compare(head, got)

    out["reshard_save_tp2_pp2"] = _guard(save_tp2_pp2)
    dist.barrier()
    ckpt = os.path.join(save_root, "step_0000002")
    out["reshard_tp2_pp2_to_dp4"] = _guard(
        lambda: H.compare(
            tail,
            H.parallel_run(H.layout(dp_sharding="full"), config, batches[2:], 2, load_dir=ckpt),
        )
    )
    out["reshard_tp2_pp2_to_pp2_dp2_interleaved"] = _guard(
        lambda: H.compare(
            tail,
            H.parallel_run(
                H.layout(
                    pipeline_parallel=2,
                    virtual_pipeline=2,
                    pipeline_schedule="interleaved_1f1b",
                    dp_sharding="optimizer",
                ),
                config,
                batches[2:],
                2,
                load_dir=ckpt,
            ),
        )
    )
    return out
