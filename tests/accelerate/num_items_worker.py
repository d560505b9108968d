"""``num_items_in_batch`` the way Accelerate's autoregressive gradient-accumulation example passes it.

``python num_items_worker.py OUT.json`` (one process, or two under ``epochal launch``)
trains a tiny GPT-2 on rows of different lengths (padding labelled -100) for three
steps of the same global batch of 8 rows, in the example's pattern: each process
counts its batch's targets, ``accelerator.gather`` sums them into
``num_items_in_batch``, ``model(**batch, num_items_in_batch=...)``, the loss times
``accelerator.num_processes``, and the printed loss is ``gather(loss).sum() /
num_processes``. Rank 0 writes the losses and gradient norms to ``OUT.json``.
"""

import json
import os
import sys

import torch
from torch.utils.data import DataLoader
from transformers import default_data_collator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from epochal.accelerate import Accelerator, set_seed  # noqa: E402
from tests.accelerate.conftest import tiny_gpt2  # noqa: E402


def ragged(n: int, length: int = 16, vocab: int = 101) -> list[dict[str, torch.Tensor]]:
    """Rows with 3 to 15 targets: labels -100 (and attention 0) after each row's length."""
    g = torch.Generator().manual_seed(11)
    rows = []
    for _ in range(n):
        ids = torch.randint(0, vocab, (length,), generator=g)
        keep = int(torch.randint(4, length + 1, (1,), generator=g))
        labels, mask = ids.clone(), torch.ones(length, dtype=torch.long)
        labels[keep:], mask[keep:] = -100, 0
        rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return rows


def main(out_path: str | None = None) -> None:
    """Train three steps; rank 0 writes the losses, gradient norms and counts to ``out_path``."""
    set_seed(0)
    model = tiny_gpt2()
    accelerator = Accelerator()
    world = accelerator.num_processes
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # the same global batch of 8 in every layout: 8 rows here, 4 per rank on two
    loader = DataLoader(ragged(24), batch_size=8 // world, collate_fn=default_data_collator)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    out: dict = {"losses": [], "grad_norms": [], "num_items": []}
    for batch in loader:
        local = (batch["labels"][:, 1:] != -100).sum()
        num_items = accelerator.gather(local).sum().item()
        loss = model(**batch, num_items_in_batch=num_items).loss * world
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        printed = accelerator.gather(loss.detach().reshape(1)).sum().item() / world
        out["losses"].append(printed)
        out["grad_norms"].append(model.last_metrics["grad_norm"])
        out["num_items"].append(num_items)
    if accelerator.is_main_process:
        with open(out_path or sys.argv[1], "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
