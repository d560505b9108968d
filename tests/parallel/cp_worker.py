"""Context-parallel runs for the tests (module-level functions, importable by spawned ranks).

Each rank compares its own run with the single-process reference and returns the
differences (an empty list = equal), as :mod:`tests.parallel.groups` does.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.parallel import bert_worker, harness

STEPS = 5
#: the layouts gather keys and values unless they name another exchange (the default,
#: ``auto``, would exchange the tiny model's heads)
ALLGATHER = {"context_parallel_exchange": "allgather"}
#: a tiny ESM-2 at CP2 through the trainer (layout-invariant, as every preset); no token
#: dropout (refused under context parallelism)
ESM_CP2 = [*bert_worker.ESM, "--model.token_dropout=false", "--parallel.context_parallel=2"]


def gpt_config(**overrides: Any) -> Any:
    """A 2-layer GPT (RoPE, grouped keys/values) with no dropout."""
    values: dict[str, Any] = dict(num_layers=2, position_embedding_type="rope", num_query_groups=2)
    values.update(overrides)
    return harness.tiny_config(**values)


def packed_gpt_batches(steps: int, global_batch: int = 8, seed: int = 11) -> list[dict[str, Any]]:
    """Global batches of packed rows: documents of random lengths back to back in each row.

    Besides the tokens of :func:`harness.global_batches`, each row carries per-document
    ``position_ids`` ``[G, S]`` (restarting at 0) and a document mask ``attention_mask``
    ``[G, 1, S, S]`` (True = a key of another document), what ``data.reset_position_ids``
    and ``data.reset_attention_mask`` give the model.
    """
    g = torch.Generator().manual_seed(seed)
    out = []
    for batch in harness.global_batches(steps, global_batch):
        g_size, s = batch["tokens"].shape
        starts = torch.rand(g_size, s, generator=g) < 0.25
        starts[:, 0] = True
        docs = starts.long().cumsum(1)
        first = torch.where(starts, torch.arange(s), 0).cummax(1).values
        batch["position_ids"] = torch.arange(s) - first
        batch["attention_mask"] = docs[:, None, :, None] != docs[:, None, None, :]
        out.append(batch)
    return out


def compare_layout(
    rank: int,
    world: int,
    layout: dict[str, Any],
    overrides: dict[str, Any],
    steps: int = STEPS,
    save_dir: str | None = None,
    packed: bool = False,
) -> dict[str, Any]:
    """Train ``steps`` steps of the tiny GPT under ``layout``; its losses and its differences
    from one process (losses, evaluation loss, gradient norms, gradients, final weights).
    ``packed``: on :func:`packed_gpt_batches` (per-document masks and positions)."""
    batches = packed_gpt_batches(steps) if packed else harness.global_batches(steps, 8)
    layout = {**ALLGATHER, **layout}
    config = gpt_config(**overrides)
    ref = harness.reference_run(config, batches, 2)
    got = harness.parallel_run(harness.layout(**layout), config, batches, 2, save_dir=save_dir)
    return {"losses": got["losses"], "ref": ref["losses"], "problems": harness.compare(ref, got)}


def step_folder(save_dir: str, steps: int) -> str:
    """The checkpoint folder :func:`compare_layout` wrote after ``steps`` steps."""
    return f"{save_dir}/step_{steps:07d}"


def resume_single(save_dir: str, steps: int) -> list[float]:
    """One process: resume ``save_dir`` and train the next ``steps`` batches; the losses."""
    batches = harness.global_batches(2 * steps, 8)[steps:]
    folder = step_folder(save_dir, steps)
    return harness.single_process_run(gpt_config(), batches, 2, load_dir=folder)["losses"]


def resume_layout(rank: int, world: int, layout: dict[str, Any], save_dir: str, steps: int) -> list:
    """``world`` ranks under ``layout``: resume ``save_dir``, train the next ``steps`` batches."""
    torch.manual_seed(0)
    batches = harness.global_batches(2 * steps, 8)[steps:]
    got = harness.parallel_run(
        harness.layout(**{**ALLGATHER, **layout}),
        gpt_config(),
        batches,
        2,
        load_dir=step_folder(save_dir, steps),
    )
    return got["losses"]


def two_rank_checks(rank: int, world: int, tmp: str) -> dict[str, Any]:
    """The 2-rank context-parallel checks in one launch (every rank returns its own).

    ``gpt``: tiny GPT (causal, RoPE, grouped keys/values) at CP2 against one process,
    writing a checkpoint to ``tmp/cp2``; ``esm``: the trainer on a tiny ESM-2
    (bidirectional, padded batches of different lengths) at CP2.
    """
    out = {"gpt": compare_layout(rank, world, {"context_parallel": 2}, {}, save_dir=f"{tmp}/cp2")}
    out["esm"] = bert_worker.rank_main(rank, world, f"{tmp}/esm_cp2", ESM_CP2, variable=True)
    out["gpt_packed"] = compare_layout(
        rank, world, {"context_parallel": 2}, {}, steps=LONG, packed=True
    )
    for granularity in ("full", "selective"):  # a recomputed layer gathers keys/values again
        out[f"recompute_{granularity}"] = compare_layout(
            rank,
            world,
            {"context_parallel": 2, "recompute_granularity": granularity},
            {},
            steps=3,
            packed=True,
        )
    out["esm_packed"] = bert_worker.rank_main(
        rank, world, f"{tmp}/esm_packed_cp2", ESM_PACKED_CP2, variable=True
    )
    out["bert_pairs"] = bert_worker.rank_main(rank, world, f"{tmp}/pairs_cp2", PAIRS_CP2_PLAIN)
    # the all-to-all of heads (parallel.context_parallel_exchange = "a2a")
    out["gpt_a2a"] = compare_layout(rank, world, A2A, {})
    out["gpt_packed_a2a"] = compare_layout(rank, world, A2A, {}, steps=3, packed=True)
    out["esm_packed_a2a"] = bert_worker.rank_main(
        rank, world, f"{tmp}/esm_packed_a2a", ESM_PACKED_A2A, variable=True
    )
    # the ring (parallel.context_parallel_exchange = "p2p"; its masks: test_context_ring)
    out["gpt_p2p"] = compare_layout(rank, world, P2P, {})
    return out


#: context parallelism by an all-to-all of heads (DeepSpeed-Ulysses)
A2A = {"context_parallel": 2, "context_parallel_exchange": "a2a"}
#: context parallelism by a ring of keys and values
P2P = {"context_parallel": 2, "context_parallel_exchange": "p2p"}


#: BERT's pairs (token types, padding, the binary head) at CP2 outside the canonical units
PAIRS_CP2_PLAIN = [
    *bert_worker.PAIRS,
    "--parallel.context_parallel=2",
    "--parallel.invariant_degree=1",
    "--parallel.context_parallel_exchange=allgather",
]


#: packed ESM-2 (THD rows, bidirectional) at CP2: the rows are padded to a multiple of 4
#: (four rows per micro-batch: a rank's share of a row is longer than the model's
#: max_position_embeddings, as in the presets' packed runs)
PACKED_ROWS = [
    "--data.pack_sequences=true",
    "--training.train_iters=20",
    "--training.micro_batch_size=4",
]
ESM_PACKED_CP2 = [*ESM_CP2, *PACKED_ROWS]
#: the same outside the canonical units, heads exchanged (each protein of a row whole)
ESM_PACKED_A2A = [
    *ESM_PACKED_CP2,
    "--parallel.invariant_degree=1",
    "--parallel.context_parallel_exchange=a2a",
]
#: packed and pipeline runs are 20 steps (losses compared at every step)
LONG = 20


def four_rank_checks(rank: int, world: int, tmp: str) -> dict[str, Any]:
    """The 4-rank checks in one launch: CP4, CP2 x DP2 (distributed optimizer), CP2 x TP2 with
    sequence parallelism, the CP2 checkpoint resumed on CP4, and the ESM-2 run of
    :func:`two_rank_checks` at CP2 x DP2 (half the accumulation steps)."""
    tp2_sp = {"context_parallel": 2, "tensor_parallel": 2, "sequence_parallel": True}
    return {
        "cp4": compare_layout(rank, world, {"context_parallel": 4}, {}),
        "cp4_a2a": compare_layout(
            rank, world, {**A2A, "context_parallel": 4}, {"num_query_groups": 4}
        ),
        "cp4_p2p": compare_layout(rank, world, {**P2P, "context_parallel": 4}, {}),
        "cp2_dp2": compare_layout(
            rank, world, {"context_parallel": 2, "dp_sharding": "optimizer"}, {}
        ),
        "cp2_tp2_sp": compare_layout(rank, world, tp2_sp, {}),
        "esm_dp2": bert_worker.rank_main(
            rank, world, f"{tmp}/esm_cp2_dp2", [*ESM_CP2, "--parallel.data_parallel=2"], True
        ),
        "resume_cp4": resume_layout(rank, world, {"context_parallel": 4}, f"{tmp}/cp2", STEPS),
        "cp2_pp2": compare_layout(
            rank, world, {"context_parallel": 2, "pipeline_parallel": 2}, {}, steps=LONG
        ),
    }


def four_rank_packed_checks(rank: int, world: int, tmp: str) -> dict[str, Any]:
    """CP4 on packed rows: the tiny GPT with document masks and the packed ESM-2 (slow tier)."""
    return {
        "gpt_packed": compare_layout(
            rank, world, {"context_parallel": 4}, {}, steps=LONG, packed=True
        ),
        "esm_packed": bert_worker.rank_main(
            rank,
            world,
            f"{tmp}/esm_packed_cp4",
            [*ESM_PACKED_CP2, "--parallel.context_parallel=4"],
            variable=True,
        ),
    }
