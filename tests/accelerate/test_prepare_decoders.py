"""``accelerator.prepare`` of a transformers Qwen2, Qwen3 or Mistral: transformers' loss, its weights back."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader
from transformers import default_data_collator

from epochal.accelerate import Accelerator
from tests.convert.hf_models import hf_decoder

pytestmark = pytest.mark.peer

FAMILIES = {
    "qwen2": dict(use_sliding_window=True, sliding_window=7, max_window_layers=0),
    "qwen3": dict(head_dim=24),
    "mistral": dict(sliding_window=7),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_prepared_decoder_gives_transformers_loss(family):
    model = hf_decoder(family, seed=2, **FAMILIES[family])
    ids = torch.randint(0, 100, (4, 24), generator=torch.Generator().manual_seed(5))
    data = [{"input_ids": r, "labels": r.clone()} for r in ids]  # 24 tokens > the window of 7
    with torch.no_grad():
        want = [model(input_ids=ids[i : i + 2], labels=ids[i : i + 2]).loss.item() for i in (0, 2)]
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    accelerator = Accelerator()
    loader = DataLoader(data, batch_size=2, collate_fn=default_data_collator)
    prepared, loader = accelerator.prepare(model, loader)
    prepared.eval()
    with torch.no_grad():
        got = [prepared(**batch).loss.item() for batch in loader]
    assert got == pytest.approx(want, abs=1e-5)
    state = accelerator.unwrap_model(prepared).state_dict()
    for name, tensor in reference.items():
        assert torch.equal(state[name], tensor), name
