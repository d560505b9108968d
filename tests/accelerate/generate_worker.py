"""``megatron_generate`` after two train steps of a tiny GPT-2, on one layout or several.

:func:`trained` prepares and trains the model (same seed, data and steps on every
layout); :func:`greedy` is the call every layout must answer alike. Run as a
script under ``epochal launch`` (two ranks): ``python generate_worker.py OUT_DIR``
trains with TP2 and with PP2 and writes each rank's greedy tokens to
``OUT_DIR/<layout>_rank<r>.json``, then prepares a DP2 run and records the error
``megatron_generate`` raises there.
"""

import json
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from transformers import default_data_collator

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from epochal.accelerate import Accelerator, set_seed  # noqa: E402
from epochal.accelerate.utils import MegatronLMDummyScheduler, MegatronLMPlugin  # noqa: E402
from tests.accelerate.conftest import blocks, tiny_gpt2  # noqa: E402

#: right-padded prompts of lengths 5, 2 and 3
PROMPTS = torch.tensor([[5, 6, 8, 9, 10], [11, 12, 0, 0, 0], [3, 4, 5, 0, 0]])
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
EOS = 7


def trained(steps: int = 2, **plugin: object):
    """``(accelerator, prepared model)`` after ``steps`` train steps of 4 rows."""
    set_seed(0)
    model = tiny_gpt2(positions=32)
    model.config.eos_token_id = EOS
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(**plugin))
    scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=10, warmup_num_steps=0)
    loader = DataLoader(blocks(4 * steps), batch_size=4, collate_fn=default_data_collator)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for batch in loader:
        model(**batch)
    return accelerator, model


def greedy(model) -> list[list[int]]:
    """Greedy tokens of :data:`PROMPTS` (no stop token: every row fills the buffer)."""
    return model.megatron_generate(
        PROMPTS, MASK, max_new_tokens=6, top_k=1, stop_token=None
    ).tolist()


def main() -> None:
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    for name, plugin in (("tp2", {"tp_degree": 2}), ("pp2", {"pp_degree": 2})):
        _, model = trained(**plugin)
        (out / f"{name}_rank{rank}.json").write_text(json.dumps(greedy(model)))
    _, model = trained()  # two processes, one model each: data parallel
    try:
        greedy(model)
        error = None
    except ValueError as exc:
        error = str(exc)
    (out / f"dp2_rank{rank}.json").write_text(json.dumps(error))


if __name__ == "__main__":
    for key in [k for k in os.environ if k.startswith("MEGATRON_LM_")]:
        del os.environ[key]  # the plugin's arguments decide the layout
    main()
