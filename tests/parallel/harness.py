"""Shared helpers of the parallel tests: tiny models, synthetic batches, reference and parallel runs.

Everything here is importable by spawned ranks (module-level functions only).
The reference is the plain single-process computation the trainer does:
Megatron's per-micro-batch token-mean loss divided by the number of
micro-batches, AdamW with Megatron's parameter groups, global-norm clipping.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from epochal.model import GPTModel, ModelConfig
from epochal.model.init import canonical_name
from epochal.parallel.checkpoint import TiedOptimizerState
from epochal.parallel.config import ParallelConfig
from epochal.parallel.dims import ParallelDims
from epochal.parallel.engine import ParallelEngine
from epochal.train.optim.optimizer import OptimizersContainer, build_adamw, clip_grad_norm
from epochal.train.state.checkpoint import Checkpointer
from epochal.train.state.model_state import ModelState
from epochal.train.state.rng import get_rng_state
from epochal.train.steps.gpt import GPTTrainStep, LossFnStep

SEQ = 16
LR = 5e-3
CLIP = 0.5  # small enough that clipping is active in the first steps


def tiny_config(**overrides: Any) -> ModelConfig:
    """A 4-layer, 32-wide GPT with no dropout (so layouts are comparable)."""
    values = dict(
        vocab_size=100,
        hidden_size=32,
        num_layers=4,
        num_attention_heads=4,
        max_position_embeddings=SEQ,
        make_vocab_size_divisible_by=64,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    values.update(overrides)
    return ModelConfig(**values)


def global_batches(
    steps: int, global_batch: int, vocab: int = 100, seed: int = 7
) -> list[dict[str, torch.Tensor]]:
    """``steps`` global batches: dicts of ``tokens``/``labels`` int64 and ``loss_mask`` float ``[G, SEQ]``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (global_batch, SEQ + 1), generator=g)
        mask = (torch.rand(global_batch, SEQ, generator=g) > 0.15).float()
        out.append(
            {
                "tokens": tokens[:, :-1].contiguous(),
                "labels": tokens[:, 1:].contiguous(),
                "loss_mask": mask,
            }
        )
    return out


def micro_batches(
    batch: dict[str, torch.Tensor], mbs: int, dp_rank: int = 0, dp: int = 1
) -> list[dict[str, torch.Tensor]]:
    """This data-parallel rank's micro-batches of a global batch (Megatron's ``single`` sampler order)."""
    total = batch["tokens"].shape[0]
    out = []
    for start in range(0, total, mbs * dp):
        lo = start + dp_rank * mbs
        out.append({k: v[lo : lo + mbs] for k, v in batch.items()})
    return out


def _adamw(parts: list[torch.nn.Module]) -> list[torch.optim.Optimizer]:
    return [build_adamw([p], lr=LR, weight_decay=0.1, betas=(0.9, 0.95)) for p in parts]


def _forward_backward(model: torch.nn.Module, batch: dict[str, torch.Tensor], mbs: int) -> float:
    """One global batch in one process, the trainer's way; returns the step loss."""
    mbs_list = micro_batches(batch, mbs)
    total = 0.0
    for mb in mbs_list:
        per_document = {k: mb[k] for k in ("position_ids", "attention_mask") if k in mb}
        logits = model(mb["tokens"], **per_document)[..., : model.config.softmax_vocab_size]
        ce = torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), mb["labels"].flatten(), reduction="none"
        )
        m = mb["loss_mask"].flatten()
        loss = (ce * m).sum() / m.sum().clamp(min=1.0) / len(mbs_list)
        loss.backward()
        total += loss.item()
    return total


def reference_run(
    config: ModelConfig, batches: list[dict[str, torch.Tensor]], mbs: int, seed: int = 0
) -> dict[str, Any]:
    """Single-process run: per step the loss, the gradient norm and the (unclipped) gradients by name."""
    torch.manual_seed(0)
    model = GPTModel(config, seed=seed)
    (opt,) = _adamw([model])
    losses, norms, grads = [], [], []
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        total = _forward_backward(model, batch, mbs)
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        norms.append(float(clip_grad_norm(list(model.parameters()), CLIP)))
        opt.step()
        losses.append(total)
    return {
        "losses": losses,
        "norms": norms,
        "grads": grads,
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
    }


def full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (collective), or the tensor itself."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def _app_state(
    parts: list[torch.nn.Module], opts: OptimizersContainer, engine: ParallelEngine | None
) -> dict[str, Any]:
    rename = (
        engine is not None and engine.tied and engine.has_last_stage and not engine.has_first_stage
    )
    return {"model": ModelState(parts), "optimizer": TiedOptimizerState(opts, rename)}


def parallel_run(
    pconfig: ParallelConfig,
    config: ModelConfig,
    batches: list[dict[str, torch.Tensor]],
    mbs: int,
    *,
    compile: bool = False,
    seed: int = 0,
    load_dir: str | None = None,
    save_dir: str | None = None,
    loss_fn: Any = None,
) -> dict[str, Any]:
    """Run ``batches`` under ``pconfig`` on the current process group (every rank calls it).

    With ``load_dir`` the model and optimizer first resume from that checkpoint
    folder; with ``save_dir`` a checkpoint is written after the last batch (as
    the trainer does: :class:`ModelState`, the optimizers container wrapped in
    :class:`TiedOptimizerState`, :class:`Checkpointer`).
    """
    torch.manual_seed(0)
    dims = ParallelDims.from_config(pconfig, dist.get_world_size())
    global_batch = batches[0]["tokens"].shape[0]
    dims.validate(
        config, micro_batch_size=mbs, global_batch_size=global_batch, seq_length=SEQ, config=pconfig
    )
    mesh = dims.build_mesh("cpu")
    engine = ParallelEngine(
        pconfig,
        config,
        dims,
        mesh,
        device=torch.device("cpu"),
        seed=seed,
        compile=compile,
        custom_loss=loss_fn is not None,
    )
    opts = OptimizersContainer(engine.model_parts, lambda part: _adamw([part])[0])
    if load_dir is not None:
        Checkpointer(load_dir, rank=dist.get_rank(), barrier=dist.barrier).load(
            load_dir, _app_state(engine.model_parts, opts, engine)
        )
    # the evaluation path (forward only, pipeline schedules' eval) on the first batch
    first = micro_batches(batches[0], mbs, engine.dp_rank, dims.dp)
    per_document = "attention_mask" in batches[0]  # packed documents: masks and positions
    reads = engine.needs_batches(per_document)
    step = GPTTrainStep() if loss_fn is None else LossFnStep(loss_fn)
    eval0 = float(engine.eval_loss(first if reads else [], num_microbatches=len(first), step=step))
    losses, norms, grads = [], [], []
    for batch in batches:
        opts.zero_grad(set_to_none=True)
        mb = micro_batches(batch, mbs, engine.dp_rank, dims.dp)
        loss = engine.forward_backward(mb if reads else [], num_microbatches=len(mb), step=step)
        step_grads = {}
        for part in engine.model_parts:
            for name, p in part.named_parameters():
                if p.grad is not None:
                    step_grads[canonical_name(name)] = full(p.grad).detach().clone()
        grads.append(step_grads)
        norms.append(float(engine.clip_grad_norm(CLIP)))
        opts.step()
        losses.append(float(loss))
    if save_dir is not None:
        Checkpointer(save_dir, rank=dist.get_rank(), barrier=dist.barrier).save(
            len(batches),
            _app_state(engine.model_parts, opts, engine),
            trainer_state={"step": len(batches)},
            rng_state=get_rng_state(),
        )
    params = {}
    for part in engine.model_parts:
        for name, p in part.named_parameters():
            params[canonical_name(name)] = full(p).detach().clone()
    return {"losses": losses, "norms": norms, "grads": grads, "params": params, "eval0": eval0}


def single_process_run(
    config: ModelConfig,
    batches: list[dict[str, torch.Tensor]],
    mbs: int,
    *,
    load_dir: str | None = None,
    save_dir: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """:func:`reference_run` with the trainer's checkpoint objects (no process group)."""
    model = GPTModel(config, seed=seed)
    opts = OptimizersContainer([model], lambda part: _adamw([part])[0])
    if load_dir is not None:
        Checkpointer(load_dir).load(load_dir, _app_state([model], opts, None))
    losses = []
    for batch in batches:
        opts.zero_grad(set_to_none=True)
        total = _forward_backward(model, batch, mbs)
        clip_grad_norm(list(model.parameters()), CLIP)
        opts.step()
        losses.append(total)
    if save_dir is not None:
        Checkpointer(save_dir).save(
            len(batches),
            _app_state([model], opts, None),
            trainer_state={"step": len(batches)},
            rng_state=get_rng_state(),
        )
    return {
        "losses": losses,
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
    }


def compare(
    ref: dict[str, Any], got: dict[str, Any], atol: float = 1e-5, param_atol: float = 1e-3
) -> list[str]:
    """Differences between a reference and a parallel run (empty = equal).

    Losses, gradient norms and every gradient of every step must agree within
    ``atol``. Final parameters get ``param_atol``: AdamW divides by the root of
    the second moment, so gradients that are rounding noise (~1e-9, summed in
    another order) move their weights by a visible fraction of the learning rate.
    """
    problems = []
    for step, (a, b) in enumerate(zip(ref["losses"], got["losses"], strict=True)):
        if abs(a - b) > atol:
            problems.append(f"step {step}: loss {b} != {a}")
    if "eval0" in got and abs(got["eval0"] - ref["losses"][0]) > atol:
        problems.append(f"evaluation loss {got['eval0']} != {ref['losses'][0]}")
    for step, (a, b) in enumerate(zip(ref["norms"], got["norms"], strict=True)):
        if abs(a - b) > atol * max(1.0, abs(a)):
            problems.append(f"step {step}: grad norm {b} != {a}")
    for step, (ga, gb) in enumerate(zip(ref["grads"], got["grads"], strict=True)):
        if not gb:
            problems.append(f"step {step}: no gradients")
        missing = sorted(set(got["params"]) - set(gb))
        if missing:  # a parameter this rank holds got no gradient at all
            problems.append(f"step {step}: no gradient for {missing}")
        for name, g in gb.items():
            key = (
                name
                if name in ga
                else ("tok_embeddings.weight" if name == "output.weight" else name)
            )
            if key not in ga:
                problems.append(f"step {step}: unexpected parameter {name}")
                continue
            err = (g - ga[key]).abs().max().item()
            if err > atol:
                problems.append(f"step {step}: grad {name} differs by {err:.3g}")
    for name, p in got["params"].items():
        key = name if name in ref["params"] else "tok_embeddings.weight"
        err = (p - ref["params"][key]).abs().max().item()
        if err > param_atol:
            problems.append(f"final param {name} differs by {err:.3g}")
    return problems


def layout(**kw: Any) -> ParallelConfig:
    """A :class:`ParallelConfig` from keyword arguments."""
    return ParallelConfig(**kw)


def replace(config: ModelConfig, **kw: Any) -> ModelConfig:
    """``dataclasses.replace`` for model configs."""
    return dataclasses.replace(config, **kw)
