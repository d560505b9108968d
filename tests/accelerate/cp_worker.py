"""An Accelerate-style loop with context parallelism given as Accelerate gives it to Megatron.

``python cp_worker.py CP OUT.json`` (one process with ``CP=1``, or ``CP`` processes
under ``epochal launch``) trains a tiny GPT-2 with
``MegatronLMPlugin(other_megatron_args={"context_parallel_size": CP})`` on rows of
15 tokens with ragged right padding (so context parallelism pads them to a multiple
of ``2 x CP``): two plain steps, one step with ``num_items_in_batch``, then an
evaluation batch with ``return_logits``. Under context parallelism it then asks
for what does not compose with it (``megatron_generate``, a T5 and a GPT-2
sequence classifier prepared with the same plugin) and records each refusal.
Every process writes its losses, gradient norms, evaluation loss and logits and the
refusals to ``OUT.json`` (suffixed with the rank beyond rank 0).
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
from tests.accelerate.num_items_worker import ragged  # noqa: E402


def rows(n: int = 16) -> list[dict[str, torch.Tensor]]:
    """Rows of 15 tokens, 3 to 14 targets each (labels -100 and attention 0 after)."""
    return ragged(n, length=15)


def main(cp: int, out_path: str) -> dict:
    """Train three steps and evaluate one batch; write (and return) what the loop saw."""
    set_seed(0)
    model = tiny_gpt2()
    plugin = MegatronLMPlugin(other_megatron_args={"context_parallel_size": cp}, return_logits=True)
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(rows(), batch_size=4, collate_fn=default_data_collator)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    out: dict = {"losses": [], "grad_norms": [], "world": accelerator.num_processes}
    batches = iter(loader)
    for step in range(3):
        batch = next(batches)
        extra = {}
        if step == 2:  # the target count of the (whole) batch, as transformers takes it
            extra["num_items_in_batch"] = int((batch["labels"][:, 1:] != -100).sum())
        loss = model(**batch, **extra).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        out["losses"].append(loss.item())
        out["grad_norms"].append(model.last_metrics["grad_norm"])
    model.eval()
    evaluated = model(**next(batches))
    out["eval_loss"] = evaluated.loss.item()
    logits = evaluated.logits.double()
    out["eval_logits"] = logits.tolist()
    if cp > 1:
        out["refusals"] = refusals(model, cp)
    rank = accelerator.process_index
    path = out_path if rank == 0 else f"{out_path}.{rank}"
    with open(path, "w") as f:
        json.dump(out, f)
    return out


def _refusal(run) -> str:
    try:
        run()
    except ValueError as exc:  # PluginError, GenerateError: both ValueErrors
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


def _prepare_with_cp(model: torch.nn.Module, rows: list[dict], cp: int) -> None:
    plugin = MegatronLMPlugin(other_megatron_args={"context_parallel_size": cp})
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    loader = DataLoader(rows, batch_size=2, collate_fn=default_data_collator)
    accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3), loader)


def refusals(engine, cp: int) -> dict[str, str]:
    """The errors of what context parallelism does not support, by name."""
    import transformers

    ids = torch.randint(3, 101, (4, 16), generator=torch.Generator().manual_seed(5))
    set_seed(1)  # the same weights on every process
    t5 = transformers.T5ForConditionalGeneration(
        transformers.T5Config(
            num_layers=2,
            d_model=32,
            num_heads=4,
            d_kv=8,
            d_ff=64,
            vocab_size=101,
            dropout_rate=0.0,
            decoder_start_token_id=0,
        )
    )
    t5_rows = [{"input_ids": r, "labels": r.clone()} for r in ids]
    set_seed(1)
    classifier = transformers.GPT2ForSequenceClassification(
        transformers.GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=4,
            vocab_size=101,
            n_positions=16,
            num_labels=3,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            pad_token_id=0,
        )
    )
    cls_rows = [{"input_ids": r, "labels": torch.tensor(i % 3)} for i, r in enumerate(ids)]
    return {
        "generate": _refusal(lambda: engine.megatron_generate(ids[:1, :4], max_new_tokens=2)),
        "t5": _refusal(lambda: _prepare_with_cp(t5, t5_rows, cp)),
        "classifier": _refusal(lambda: _prepare_with_cp(classifier, cls_rows, cp)),
    }


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
