"""Communication ledger: the collectives each parallel layout issues per training step, counted on real runs.

Every layout trains the same small GPT (same seed, synthetic batches, AdamW,
gradient clipping) through :class:`epochal.parallel.engine.ParallelEngine` on
gloo processes of this machine, as the trainer's step does
(``forward_backward``, ``clip_grad_norm``, the optimizer step); the steps after
a warm-up step run under :class:`epochal.parallel.comm_ledger.CommLedger`,
which counts every collective each rank issues (``torch.distributed``'s
functions and process-group methods, FSDP2's reductions, DTensor's functional
collectives for TP/SP, the pipeline's send/receive). Each layout runs at two
micro-batch counts per rank (``--micro-batches``), so every collective's calls
and bytes split into a part per micro-batch and a part per step (a straight-line
fit through the two counts). The table gives, per layout and per rank (ranks
with the same ledger share rows), each collective kind and group with its calls
and bytes per step and the bytes per unit of model size, so that they can be
projected to another model:

- data-parallel (``dp``) traffic: bytes per parameter held by the rank (its
  tensor-parallel shard of its pipeline stage);
- tensor-parallel (``tp``) traffic: bytes per activation element
  (token x hidden) of a micro-batch per layer of the rank;
- pipeline (``pp``) traffic: bytes per activation element of a micro-batch;
- expert-parallel (``ep``) traffic: the all-to-alls that send tokens to their
  experts and back, bytes per activation element of a micro-batch per layer of the
  rank (the ``ep*`` layouts give the model 4 experts, top-2, in every block); the
  expert-data-parallel (``edp``) gather of expert gradients: bytes per parameter;
- context-parallel (``cp``) traffic: per micro-batch, bytes per key (or value)
  element of the whole sequence per layer of the rank (micro-batch x sequence x
  the rank's key-value heads x head size: the all-gathers of K and V, and on gloo
  their backward all-reduce, NCCL's reduce-scatter of the same size); per step,
  bytes per parameter (the gradient sum over the context-parallel group); the
  layout-invariant ``cp2_exact`` exchanges heads (all-to-alls, per key element) and
  sums the weight gradients per micro-batch, so its all-reduces count per parameter;
- ``fixed`` rows: calls whose size does not grow with the model (loss scalars,
  the exact gradient norm's histogram, the experts' token counts), in bytes.

``--json PATH`` writes these coefficients (with the model and layout they were
measured on); ``epochal.parallel.comm_projection`` reads the copy committed in
the package to project a step's communication time onto a cluster
(``docs/concepts/communication.md``). Regenerate that copy with::

    python benchmarks/bench_comm.py --json src/epochal/parallel/comm_measured.json

    python benchmarks/bench_comm.py                    # every layout (2 and 4 processes)
    python benchmarks/bench_comm.py --layouts dp2,dp2_inv --steps 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.dist_utils import run_gloo  # spawned gloo ranks, killed on any failure

from epochal.model import ModelConfig
from epochal.parallel.comm_ledger import CommLedger
from epochal.parallel.config import ParallelConfig
from epochal.parallel.dims import ParallelDims
from epochal.parallel.engine import ParallelEngine
from epochal.train.optim.optimizer import OptimizersContainer, build_adamw
from epochal.train.steps.gpt import GPTTrainStep

#: name -> (processes, ParallelConfig fields, layout_invariant)
LAYOUTS: dict[str, tuple[int, dict[str, Any], bool]] = {
    "dp2": (2, {}, False),
    "dp2_inv": (2, {}, True),
    "dp2_zero2": (2, {"dp_sharding": "optimizer"}, False),
    "dp2_zero2_inv": (2, {"dp_sharding": "optimizer"}, True),
    "tp2_sp": (2, {"tensor_parallel": 2, "sequence_parallel": True}, False),
    # layout-invariant TP in canonical units (parallel.invariant_degree = 8)
    "tp2_sp_exact": (2, {"tensor_parallel": 2, "sequence_parallel": True}, True),
    "pp2": (2, {"pipeline_parallel": 2}, False),
    "dp2_tp2_sp": (4, {"tensor_parallel": 2, "sequence_parallel": True}, False),
    "dp2_tp2_sp_inv": (4, {"tensor_parallel": 2, "sequence_parallel": True}, True),
    "dp2_pp2": (4, {"pipeline_parallel": 2}, False),
    # expert parallelism (the model gets 4 experts, top-2, in every block)
    "ep2": (2, {"expert_parallel": 2}, False),
    "ep2_inv": (2, {"expert_parallel": 2}, True),
    "dp4_ep2_inv": (4, {"expert_parallel": 2}, True),
    "tp2_pp2": (
        4,
        {"tensor_parallel": 2, "sequence_parallel": True, "pipeline_parallel": 2},
        False,
    ),
    # plain CP gathering keys and values (what the projections price)
    "cp2": (2, {"context_parallel": 2, "context_parallel_exchange": "allgather"}, False),
    # layout-invariant CP in canonical units: heads exchanged, weight gradients per micro-batch
    "cp2_exact": (2, {"context_parallel": 2}, True),
    "dp2_cp2": (4, {"context_parallel": 2, "context_parallel_exchange": "allgather"}, False),
}


def model_config(layers: int = 4, experts: int | None = None) -> ModelConfig:
    """The benchmark's GPT: 64 wide, 4 heads, vocabulary 512, no dropout.

    ``experts``: a mixture of experts in every block (top-2, experts 128 wide, as the MLP).
    """
    moe = {} if experts is None else {"num_experts": experts, "moe_router_topk": 2}
    return ModelConfig(
        vocab_size=512,
        hidden_size=64,
        num_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=64,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        **moe,
    )


def local_parameters(engine: ParallelEngine) -> int:
    """Parameters this rank holds before data-parallel sharding (its TP shard of its stage)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for part in engine.model_parts:
        for p in part.parameters():
            if not isinstance(p, DTensor):
                total += p.numel()
                continue
            n = p.numel()
            for name, placement in zip(p.device_mesh.mesh_dim_names or (), p.placements):
                if placement.is_shard() and not name.startswith("dp"):
                    n //= p.device_mesh.size(p.device_mesh.mesh_dim_names.index(name))
            total += n
    return total


def _split(calls: list[tuple[str, str, int]], small: dict[str, float]) -> dict[str, list[float]]:
    """``kind|group|scaled`` or ``...|fixed`` -> [calls, bytes] of one step's calls.

    A call is ``fixed`` (a size that does not grow with the model: loss scalars,
    the exact norm's histogram, flags) when it is under an eighth of its group's
    reference size (``small``), else ``scaled``.
    """
    out: dict[str, list[float]] = {}
    for kind, group, size in calls:
        cls = "fixed" if size < small.get(group, float("inf")) else "scaled"
        row = out.setdefault(f"{kind}|{group}|{cls}", [0, 0])
        row[0] += 1
        row[1] += size
    return out


def measure(rank: int, world: int, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One layout on this rank: per micro-batch count, the ledger's mean step; and the sizes."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")  # a view output, harmless
    size, fields, invariant = LAYOUTS[name]
    cfg = model_config(args.layers, 4 if fields.get("expert_parallel", 1) > 1 else None)
    seq, mbs = args.seq, args.micro_batch_size
    pconf = ParallelConfig(**fields)
    dims = ParallelDims.from_config(pconf, world)
    counts = [int(m) for m in args.micro_batches.split(",")]
    for m in counts:
        dims.validate(
            cfg, micro_batch_size=mbs, global_batch_size=mbs * m * dims.dp, seq_length=seq,
            config=pconf,
        )  # fmt: skip
    mesh = dims.build_mesh("cpu")
    canonical = pconf.invariant_degree if name.endswith("_exact") else 0
    engine = ParallelEngine(
        pconf,
        cfg,
        dims,
        mesh,
        device=torch.device("cpu"),
        seed=0,
        exact_sync=invariant,
        canonical_degree=canonical,
    )
    opts = OptimizersContainer(
        engine.model_parts, lambda p: build_adamw([p], lr=1e-4, weight_decay=0.1)
    )
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, cfg.vocab_size, (max(counts), mbs, seq + 1), generator=g)
    micro = [
        {"tokens": d[:, :-1], "labels": d[:, 1:], "loss_mask": torch.ones(mbs, seq)} for d in data
    ]

    def step(m: int) -> None:
        opts.zero_grad()
        engine.forward_backward(
            micro[:m] if engine.needs_batches() else [], num_microbatches=m, step=GPTTrainStep()
        )
        engine.clip_grad_norm(1.0)
        opts.step()

    for m in counts:  # warm-up: FSDP2's lazy initialization, the pipeline's shape inference
        step(m)
    names = [n for n in mesh.mesh_dim_names if mesh[n].size() > 1]
    groups = {n: mesh.get_group(n) for n in names}
    if engine.ep is not None:  # the all-to-alls; the expert gradients' gather (dp / ep > 1)
        groups["ep"] = engine.ep.group
        if engine.ep.edp_group is not None:
            groups["edp"] = engine.ep.edp_group
    parameters = local_parameters(engine)
    layers = sum(len(part.layers) for part in engine.model_parts)
    activation = mbs * seq * cfg.hidden_size * 4  # one micro-batch's fp32 activations
    # the keys (or values) of a micro-batch's whole sequence and one layer, on this rank
    kv_elements = mbs * seq * max(1, cfg.num_kv_heads // dims.tp) * cfg.head_dim
    small = {"dp": parameters * 4 / 8, "tp": activation / 8, "pp": activation / 8}
    small |= {"cp": kv_elements * 4 / 8, "ep": activation / 8, "edp": parameters * 4 / 8}
    per_count = {}
    for m in counts:
        ledger = CommLedger(groups=groups)
        dist.barrier()
        with ledger:
            for _ in range(args.steps):
                step(m)
                ledger.end_step()
        steps = [_split(c, small) for c in ledger.calls]
        keys = sorted({k for s in steps for k in s})
        per_count[m] = {
            k: [sum(s.get(k, [0, 0])[i] for s in steps) / len(steps) for i in (0, 1)] for k in keys
        }
    return {
        "per_count": per_count,
        "parameters": parameters,
        "layers": layers,
        "kv_elements": kv_elements,
        "group_sizes": {n: groups[n].size() for n in names},
    }


#: the units scaled traffic is divided by: (per micro-batch, per step) by group. Traffic
#: once per step is gradient traffic (proportional to parameters); traffic per
#: micro-batch is activation traffic, except data parallelism's (the layout-invariant
#: exchange, ZeRO-2's parameter gathers), which moves parameters or their gradients.
UNITS = {
    "dp": ("param", "param"),
    "tp": ("act*layer", "param"),
    "pp": ("act", "param"),
    "ep": ("act*layer", "param"),  # tokens to their experts and back, per MoE layer
    "edp": ("param", "param"),  # expert gradients (layout-invariant: gathered per step)
    "cp": ("kv*layer", "param"),  # K/V all-gathers per micro-batch; the gradient sum per step
}
#: layout-invariant context parallelism (canonical units) exchanges heads with all-to-alls
#: and sums the weight gradients over the group with all-reduces once per micro-batch
INVARIANT_UNITS = {("cp", "all_reduce"): ("param", "param")}


def fit(
    res: dict[str, Any], args: argparse.Namespace, invariant: bool = False
) -> list[dict[str, Any]]:
    """Per collective: calls and bytes = per_micro_batch * m + per_step, from two counts m."""
    (m1, r1), (m2, r2) = sorted(res["per_count"].items())[:2]
    act = args.micro_batch_size * args.seq * args.hidden  # activation elements of a micro-batch
    rows = []
    for key in sorted(set(r1) | set(r2)):
        kind, group, cls = key.split("|")
        (c1, b1), (c2, b2) = r1.get(key, [0, 0]), r2.get(key, [0, 0])
        calls_mb, bytes_mb = (c2 - c1) / (m2 - m1), (b2 - b1) / (m2 - m1)
        units = UNITS.get(group, ("1", "1")) if cls == "scaled" else ("1", "1")
        if invariant and cls == "scaled":
            units = INVARIANT_UNITS.get((group, kind), units)
        sizes = {"param": res["parameters"], "act*layer": act * res["layers"], "act": act, "1": 1}
        sizes["kv*layer"] = res.get("kv_elements", 0) * res["layers"]
        rows.append(
            {
                "kind": kind,
                "group": group,
                "size": cls,
                "unit_per_micro_batch": units[0],
                "unit_per_step": units[1],
                "group_size": res["group_sizes"].get(group, 0),
                "calls_per_micro_batch": calls_mb,
                "calls_per_step": c1 - calls_mb * m1,
                "bytes_per_micro_batch": bytes_mb / sizes[units[0]],
                "bytes_per_step": (b1 - bytes_mb * m1) / sizes[units[1]],
                "measured": {str(m1): [c1, b1], str(m2): [c2, b2]},
            }
        )
    return rows


def report(name: str, ranks: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Print one layout's table; return its JSON record."""
    size, fields, invariant = LAYOUTS[name]
    (m1, m2) = sorted(int(m) for m in args.micro_batches.split(","))[:2]
    print(
        f"\n{name}: {size} processes, {fields or 'defaults'}, layout_invariant={invariant}; "
        f"per rank: calls and bytes per step at {m1} and {m2} micro-batches, and the fit "
        "bytes = (per micro-batch x m + per step) x unit"
    )
    print(
        f"  {'ranks':<8}{'kind':<15}{'group':<6}{'size':<7}{f'calls@{m1}':>9}{f'bytes@{m1}':>12}"
        f"{f'calls@{m2}':>9}{f'bytes@{m2}':>12}{'B/mb':>9} {'unit':<10}{'B/step':>9} unit"
    )
    blocks: dict[str, list[int]] = {}
    for r, res in enumerate(ranks):
        blocks.setdefault(json.dumps(res["per_count"], sort_keys=True), []).append(r)
    record: dict[str, Any] = {"processes": size, "parallel": fields, "invariant": invariant}
    record["ranks"] = []
    for members in blocks.values():
        res = ranks[members[0]]
        rows = fit(res, args, invariant)
        for row in rows:
            (c1, b1), (c2, b2) = row["measured"].values()
            print(
                f"  {','.join(map(str, members)):<8}{row['kind']:<15}{row['group']:<6}"
                f"{row['size']:<7}{c1:>9g}{b1:>12g}{c2:>9g}{b2:>12g}"
                f"{row['bytes_per_micro_batch']:>9.4g} {row['unit_per_micro_batch']:<9}"
                f"{row['bytes_per_step']:>9.4g} {row['unit_per_step']}"
            )
        record["ranks"].append(
            {
                "ranks": members,
                "parameters": res["parameters"],
                "layers": res["layers"],
                "collectives": rows,
            }
        )
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated names")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument(
        "--micro-batches", default="2,4", help="two micro-batch counts per rank and step"
    )
    parser.add_argument("--steps", type=int, default=2, help="counted steps after one warm-up")
    parser.add_argument("--json", default="", help="write the coefficients here")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    args.hidden = model_config().hidden_size
    names = args.layouts.split(",")
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown:
        parser.error(f"--layouts: unknown {unknown}; choose from {', '.join(LAYOUTS)}")
    cfg = model_config(args.layers)
    print(
        f"GPT {cfg.num_layers} layers x {cfg.hidden_size} wide, vocabulary {cfg.vocab_size}; "
        f"micro-batches of {args.micro_batch_size} x {args.seq} tokens, "
        f"{args.micro_batches} per rank and step; fp32; {args.steps} counted steps after 1; "
        "gloo on CPU. Bytes: nccl-tests' size of each collective (all-gather: the gathered "
        "output, reduce-scatter: the full input); units: param = parameters on the rank, "
        "act = activation elements (tokens x hidden) of a micro-batch, act*layer = that x the "
        "rank's layers; kv*layer = key (or value) elements of a micro-batch's whole sequence x "
        "the rank's layers; fixed = calls under 1/8 of a unit's size (scalars), in bytes."
    )
    out: dict[str, Any] = {
        "command": "python benchmarks/bench_comm.py " + " ".join(sys.argv[1:]),
        "model": {
            "layers": cfg.num_layers,
            "hidden": cfg.hidden_size,
            "vocab": cfg.vocab_size,
            "seq": args.seq,
            "micro_batch_size": args.micro_batch_size,
            "micro_batches_per_rank": args.micro_batches,
            "dtype_bytes": 4,
        },
        "layouts": {},
    }
    for name in names:
        ranks = run_gloo(measure, LAYOUTS[name][0], name, args, timeout=args.timeout)
        out["layouts"][name] = report(name, ranks, args)
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, args.json)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
