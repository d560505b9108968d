"""Frozen weights, ``num_items_in_batch`` and a written learning rate under several layouts.

``python model_options_worker.py OUT.json`` (under ``epochal launch``, two ranks)
runs :func:`run` for DP2 (one micro-batch per rank), TP2 and PP2 (two
micro-batches) one after the other; ``run(None)`` is the one-process reference
(two micro-batches): the same global batches everywhere.
"""

import json
import os
import sys

import torch
from torch.utils.data import DataLoader
from transformers import default_data_collator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from epochal.accelerate import Accelerator, set_seed  # noqa: E402
from epochal.accelerate.utils import MegatronLMPlugin  # noqa: E402
from tests.accelerate.conftest import tiny_gpt2  # noqa: E402

#: layout name -> (MEGATRON_LM_* of the run, micro-batches per step)
LAYOUTS = {
    "dp2": ({"TP_DEGREE": "1", "PP_DEGREE": "1"}, 1),
    "tp2": ({"TP_DEGREE": "2", "PP_DEGREE": "1"}, 2),
    "pp2": ({"TP_DEGREE": "1", "PP_DEGREE": "2"}, 2),
}


def ragged(n: int, length: int = 16, vocab: int = 101) -> list[dict[str, torch.Tensor]]:
    """Causal samples with different numbers of targets (-100 after each sample's length)."""
    g = torch.Generator().manual_seed(6)
    out = []
    for i in range(n):
        ids = torch.randint(0, vocab, (length,), generator=g)
        labels, mask = ids.clone(), torch.ones(length, dtype=torch.long)
        keep = 4 + (5 * i) % (length - 4)
        labels[keep:], mask[keep:] = -100, 0
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


def run(micro_batches: int) -> dict:
    """Two steps (global batch 4 of ragged rows): losses, grad norms, frozen weights, a weight sum."""
    set_seed(0)
    model = tiny_gpt2()
    model.transformer.h[0].requires_grad_(False)
    frozen = model.transformer.h[0].attn.c_attn.weight.detach().clone()
    data = ragged(8)
    plugin = MegatronLMPlugin(gradient_clipping=1.0, num_micro_batches=micro_batches)
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    loader = DataLoader(data, batch_size=2, collate_fn=default_data_collator)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    targets = sum(int((d["labels"][1:] != -100).sum()) for d in data)
    out: dict = {"losses": [], "grad_norms": []}
    for step, batch in enumerate(loader):
        if step == 1:
            optimizer.param_groups[0]["lr"] = 0.1
        # a count of the global batch (both steps' targets over two: any divisor will do)
        loss = model(**batch, num_items_in_batch=targets // 2).loss
        out["losses"].append(loss.item() * accelerator.num_processes)  # each process's share
        out["grad_norms"].append(model.last_metrics["grad_norm"])
    unwrapped = accelerator.unwrap_model(model)
    out["frozen_kept"] = bool(torch.equal(unwrapped.transformer.h[0].attn.c_attn.weight, frozen))
    out["head_sum"] = unwrapped.lm_head.weight.double().sum().item()
    return out


def main() -> None:
    results = {}
    for name, (env, micro_batches) in LAYOUTS.items():
        os.environ.update({f"MEGATRON_LM_{k}": v for k, v in env.items()})
        results[name] = run(micro_batches)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
