"""A gloo rank of the ``epochal embed`` DP2 test (module-level for spawned ranks)."""

from __future__ import annotations


def rank_main(rank: int, world_size: int, checkpoint: str, fasta: str, out: str) -> int:
    """Run ``epochal embed`` on this rank (the process group is already up)."""
    from tests.train.finetune_data import embed

    return embed(checkpoint, fasta, out, "--batch-size", "3", "--per-residue")
