"""Project the measured communication ledger onto a model and a cluster: seconds per step per collective.

The inputs are the bytes ``benchmarks/bench_comm.py`` counted on real runs
(:class:`~epochal.parallel.comm_ledger.CommLedger`), written per unit of model
size to ``comm_measured.json`` beside this module: per collective, the bytes
per micro-batch and per step divided by the parameters the rank holds
(gradient traffic) or by the activation elements (token x hidden) of a
micro-batch times the rank's layers (tensor-parallel traffic), or by the key
(or value) elements of a micro-batch's whole sequence times the rank's layers
(context-parallel traffic: the all-gathers of K and V). Here they are
multiplied by the same units of the target model, scaled from the measured
fp32 to the target's gradient and activation widths, multiplied by the ring's
bus factor for the target group size, and divided by the bandwidth of the link
the group spans; every call adds the link's latency.

What can overlap with compute follows how epochal schedules each collective:

- data-parallel gradient reduction, once per step (FSDP2): during the backward
  pass of the last micro-batch (two thirds of its compute);
- the layout-invariant exchange, once per micro-batch (one all-to-all in flight,
  started as each unit's gradients are complete): during that micro-batch's
  backward and the next micro-batch's forward (one micro-batch of compute; the
  last one only its backward); the final all-gather of the reduced gradients
  cannot overlap;
- tensor / sequence-parallel all-gathers and reduce-scatters, pipeline
  messages and the small calls (losses, norms): on the critical path (epochal
  does not overlap them with the matrix multiplications);
- context parallelism's K/V all-gathers (forward) and the reduce-scatters of their
  gradients (backward; measured on gloo, which has none, as an all-reduce of the
  same size, projected as NCCL's reduce-scatter), and its gradient all-reduce once
  per step: on the critical path too (each attention waits for its gather; a ring
  of send/receive, Megatron's ``p2p``, would hide them behind the block computation,
  see :func:`ring_overlap`).

Compute time per micro-batch is the model's training FLOPs
(:func:`epochal.model.flops.training_flops_per_token`) over the tensor-, context- and
pipeline-parallel GPUs at an assumed model FLOPs utilization.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any

from epochal.model.config import ModelConfig
from epochal.model.flops import training_flops_per_token
from epochal.parallel.comm_ledger import BUS_FACTOR

__all__ = [
    "Cluster",
    "Projection",
    "Run",
    "format_projection",
    "invariance_cost",
    "measured",
    "project",
    "ring_overlap",
]

#: bytes of one layout-invariant exchange at most: ``OrderedGradReducer``'s default
#: ``bucket_numel`` (4M fp32 elements); a larger unit is exchanged in several calls
BUCKET_BYTES = 4 << 22


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """A GPU cluster.

    Attributes:
        gpus_per_node: GPUs per node.
        intra_node_GBps: bus bandwidth between GPUs of a node, GB/s (1e9 bytes).
        inter_node_GBps: bus bandwidth of each GPU between nodes, GB/s.
        intra_latency_s / inter_latency_s: seconds each collective call costs besides its bytes.
        peak_tflops: dense bf16 peak per GPU, TFLOP/s.
        mfu: the model FLOPs utilization the compute runs at (0-1).
    """

    gpus_per_node: int = 8
    intra_node_GBps: float = 450.0
    inter_node_GBps: float = 50.0
    intra_latency_s: float = 10e-6
    inter_latency_s: float = 20e-6
    peak_tflops: float = 989.0
    mfu: float = 0.4


@dataclass(frozen=True, kw_only=True)
class Run:
    """A training run: model, batch and layout.

    Attributes:
        model: the model's shapes.
        seq_length: tokens per sequence.
        micro_batch_size / global_batch_size: sequences.
        tp / cp / pp / dp: parallel sizes (TP inside a node first, then CP, PP, DP).
        grad_bytes: bytes per gradient element reduced over data parallelism (4: fp32).
        act_bytes: bytes per activation element exchanged by TP/PP (2: bf16).
    """

    model: ModelConfig
    seq_length: int
    micro_batch_size: int
    global_batch_size: int
    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 1
    grad_bytes: int = 4
    act_bytes: int = 2

    @property
    def micro_batches(self) -> int:
        """Micro-batches per data-parallel rank and step."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)


@dataclass(frozen=True)
class Projection:
    """One collective of a step, per rank.

    Attributes:
        kind / group: the collective and its group (``dp``, ``tp``, ``pp``, ...).
        calls: calls per step.
        bytes: nccl-tests' size per step, bytes.
        seconds: time on the link per step (bus bytes / bandwidth + calls x latency).
        hidden: of ``seconds``, what can overlap with compute.
    """

    kind: str
    group: str
    calls: float
    bytes: float
    seconds: float
    hidden: float

    @property
    def exposed(self) -> float:
        """Seconds the step waits for it."""
        return self.seconds - self.hidden


def measured() -> dict[str, Any]:
    """The coefficients measured by ``benchmarks/bench_comm.py`` (the copy in the package)."""
    text = resources.files("epochal.parallel").joinpath("comm_measured.json").read_text()
    return json.loads(text)


_COUNTS: dict[str, int] = {}


def parameter_count(model: ModelConfig) -> int:
    """The model's parameters, counted on the meta device (no memory)."""
    import torch

    from epochal.model import build_model

    key = repr(model)
    if key not in _COUNTS:
        with torch.device("meta"):
            net = build_model(model)
        _COUNTS[key] = sum(p.numel() for p in net.parameters())
    return _COUNTS[key]


def micro_batch_seconds(run: Run, cluster: Cluster) -> float:
    """Compute time of one micro-batch (forward and backward) on one GPU of its TP x PP group."""
    tokens = run.micro_batch_size * run.seq_length
    flops = training_flops_per_token(run.model, run.seq_length) * tokens
    return flops / (run.tp * run.cp * run.pp * cluster.peak_tflops * 1e12 * cluster.mfu)


def _link(group: str, run: Run, cluster: Cluster) -> tuple[float, float, int]:
    """(bandwidth bytes/s, latency s, group size) of a group under ``run``'s placement."""
    world = run.tp * run.cp * run.pp * run.dp
    size = {"dp": run.dp, "tp": run.tp, "cp": run.cp, "pp": run.pp}.get(group, world)
    inside = {"tp": run.tp, "cp": run.tp * run.cp, "pp": run.tp * run.cp * run.pp}.get(
        group, world
    )  # the span of ranks the group's members lie in
    if inside <= cluster.gpus_per_node:
        return cluster.intra_node_GBps * 1e9, cluster.intra_latency_s, size
    return cluster.inter_node_GBps * 1e9, cluster.inter_latency_s, size


def project(
    run: Run,
    cluster: Cluster,
    layout: str,
    data: dict[str, Any] | None = None,
    *,
    overlap: bool = True,
) -> tuple[list[Projection], float]:
    """Seconds per step of every collective of ``layout``'s measured ledger, applied to ``run``.

    Args:
        run: the target run.
        cluster: the target cluster.
        layout: a layout of the measured file (``dp2_tp2_sp``, ``dp2_tp2_sp_inv``, ...)
            with the same kinds of parallelism as ``run``.
        data: the measured coefficients (default: :func:`measured`).
        overlap: False = nothing overlaps with compute (every collective exposed).

    Returns:
        (the collectives of rank 0's ledger, the step's compute seconds).

    Raises:
        KeyError: ``layout`` was not measured (the message lists those that were).
    """
    data = data or measured()
    if layout not in data["layouts"]:
        raise KeyError(f"layout {layout!r} was not measured; measured: {sorted(data['layouts'])}")
    dtype = data["model"]["dtype_bytes"]
    ledger = data["layouts"][layout]["ranks"][0]["collectives"]
    params = parameter_count(run.model) / (run.tp * run.pp)
    layers = run.model.num_layers / run.pp
    act = run.micro_batch_size * run.seq_length // run.cp * run.model.hidden_size  # this rank's
    units = {
        "param": params * run.grad_bytes / dtype,
        "act*layer": act * layers * run.act_bytes / dtype,
        "act": act * run.act_bytes / dtype,
        "kv*layer": kv_elements(run) * layers * run.act_bytes / dtype,
        "1": 1.0,
    }
    m = run.micro_batches
    t_mb = micro_batch_seconds(run, cluster)
    out = []
    for row in ledger:
        bw, latency, n = _link(row["group"], run, cluster)
        per_mb = row["bytes_per_micro_batch"] * units[row["unit_per_micro_batch"]]
        per_step = row["bytes_per_step"] * units[row["unit_per_step"]]
        calls = row["calls_per_micro_batch"] * m + row["calls_per_step"]
        if row["group"] == "tp" or row["unit_per_micro_batch"] == "kv*layer":  # per layer
            calls = row["calls_per_micro_batch"] * m * layers / _measured_layers(data, layout)
            calls += row["calls_per_step"]
        if row["unit_per_micro_batch"] == "kv*layer" and row["kind"] == "all_reduce":
            # gloo's stand-in for the K/V gradients' reduce-scatter (NCCL has one): split
            # the per-micro-batch part off as a reduce-scatter of the same size
            scatter = row["calls_per_micro_batch"] * m * layers / _measured_layers(data, layout)
            rs = per_mb * m * BUS_FACTOR["reduce_scatter"](n) / bw + scatter * latency
            out.append(Projection("reduce_scatter", row["group"], scatter, per_mb * m, rs, 0.0))
            calls, per_mb = row["calls_per_step"], 0.0
        if row["kind"] == "all_to_all" and row["group"] == "dp" and per_mb:
            calls = max(calls, m * math.ceil(per_mb / BUCKET_BYTES))  # the reducer's buckets
        size = per_mb * m + per_step
        factor = BUS_FACTOR[row["kind"]](n)
        seconds = size * factor / bw + calls * latency
        hidden = 0.0
        if overlap and row["group"] == "dp" and row["size"] == "scaled":
            if per_mb:  # once per micro-batch, in the background of the compute that follows
                each = seconds / m
                hidden = (m - 1) * min(each, t_mb) + min(each, 2 * t_mb / 3)
            elif row["kind"] in ("all_reduce", "reduce_scatter"):  # during the last backward
                hidden = min(seconds, 2 * t_mb / 3)
        out.append(Projection(row["kind"], row["group"], calls, size, seconds, hidden))
    return out, m * t_mb


def kv_elements(run: Run) -> float:
    """Key (or value) elements of one micro-batch's whole sequence and one layer, per TP rank."""
    model = run.model
    heads = max(1, model.num_kv_heads // run.tp)  # groups sharded over TP, else one per rank
    return run.micro_batch_size * run.seq_length * heads * model.head_dim


def ring_overlap(run: Run, cluster: Cluster) -> tuple[float, float]:
    """Per layer and micro-batch: (K/V exchange seconds, this rank's attention-core seconds).

    The exchange: the all-gathers of K and V (forward) and the reduce-scatters of
    their gradients (backward, the same size). What a ring (Megatron's ``p2p``) could
    hide: each of the ``cp - 1`` blocks of keys and values arrives while the previous
    block's attention is computed, so the exchange hides behind the attention core
    when the first figure is the smaller. Attention core: ``QK^T`` and ``PV`` of this
    rank's tokens against the causal half of the sequence, forward and backward (3x),
    over the tensor- and context-parallel ranks.
    """
    model = run.model
    bw, latency, n = _link("cp", run, cluster)
    kv = 2 * kv_elements(run) * run.act_bytes  # K and V, gathered
    exchange = 2 * (kv * BUS_FACTOR["all_gather"](n) / bw + 2 * latency)
    heads = model.num_attention_heads * model.head_dim
    s = run.seq_length
    flops = 3 * 2 * 2 * run.micro_batch_size * s * s * heads / 2  # causal: half the scores
    compute = flops / (run.tp * run.cp * cluster.peak_tflops * 1e12 * cluster.mfu)
    return exchange, compute


def invariance_cost(
    run: Run, cluster: Cluster, plain: str, invariant: str, *, overlap: bool = True
) -> float:
    """The step time layout invariance adds, as a fraction of the plain step (0.05 = 5%).

    Args:
        run / cluster: the target.
        plain / invariant: the measured layouts without and with invariance.
        overlap: as for :func:`project`.
    """
    a, compute = project(run, cluster, plain, overlap=overlap)
    b, _ = project(run, cluster, invariant, overlap=overlap)
    base = compute + sum(r.exposed for r in a)
    return sum(r.exposed for r in b) / base - sum(r.exposed for r in a) / base


def _measured_layers(data: dict[str, Any], layout: str) -> float:
    return float(data["layouts"][layout]["ranks"][0]["layers"])


def format_projection(rows: list[Projection], compute: float) -> str:
    """A table of :func:`project`'s result: per collective, calls, GB, seconds, hidden, exposed."""
    lines = [
        f"{'collective':<24}{'calls':>8}{'GB':>9}{'link s':>9}{'hidden s':>10}{'exposed s':>11}"
    ]
    for r in sorted(rows, key=lambda r: -r.seconds):
        lines.append(
            f"{r.kind + ' ' + r.group:<24}{r.calls:>8.0f}{r.bytes / 1e9:>9.2f}"
            f"{r.seconds:>9.3f}{r.hidden:>10.3f}{r.exposed:>11.3f}"
        )
    exposed = sum(r.exposed for r in rows)
    lines.append(
        f"compute {compute:.2f} s + exposed communication {exposed:.2f} s = "
        f"step {compute + exposed:.2f} s"
    )
    return "\n".join(lines)
