"""What the user sets on the model and the optimizer before and after ``prepare``, as PyTorch honours it.

Frozen weights and optimizers over part of the model, a learning rate written into
the prepared optimizer's groups, optimizers whose constructor makes state
(Adagrad), and the batch keys and model keywords transformers takes: each is
honoured as plain PyTorch / transformers does, or refused naming it. Peers: the
same transformers model trained by plain PyTorch, and transformers' own losses.
"""

import copy

import pytest
import torch
import transformers
from torch.utils.data import DataLoader
from transformers import default_data_collator

from epochal.accelerate import Accelerator, set_seed
from epochal.accelerate.batches import BatchError
from epochal.accelerate.engine import EngineError
from epochal.accelerate.preparation import PrepareError
from epochal.accelerate.utils import MegatronLMDummyScheduler, MegatronLMPlugin
from tests.accelerate.conftest import blocks, tiny_gpt2
from tests.accelerate.model_options_worker import ragged


def _loader(data, batch_size=4):
    return DataLoader(data, batch_size=batch_size, collate_fn=default_data_collator)


def _reference_steps(model, optimizer, data, batch_size=4, before_step=None):
    """Plain PyTorch: forward, backward, step over ``data``; the losses."""
    losses = []
    for step, batch in enumerate(_loader(data, batch_size)):
        if before_step is not None:
            before_step(step, optimizer)
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _freeze(model):
    model.transformer.wpe.requires_grad_(False)
    model.transformer.h[0].requires_grad_(False)


def _untrained(name):
    return name.startswith(("transformer.wpe.", "transformer.h.0."))


@pytest.mark.parametrize("case", ["frozen_all_in_optimizer", "frozen_left_out", "left_out"])
def test_untrained_weights_keep_their_values(case):
    """Frozen weights and weights the optimizer does not hold stay bit for bit; the rest train as in PyTorch."""
    set_seed(0)
    model = tiny_gpt2()
    if case != "left_out":
        _freeze(model)
    reference = copy.deepcopy(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def params(m):
        if case == "frozen_all_in_optimizer":
            return list(m.parameters())
        return [p for n, p in m.named_parameters() if not _untrained(n)]

    data = blocks(8)
    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(gradient_clipping=0.0))
    prepared, _, loader = accelerator.prepare(
        model, torch.optim.SGD(params(model), lr=0.5, momentum=0.9), _loader(data)
    )
    ours = [prepared(**batch).loss.item() for batch in loader]
    ref_opt = torch.optim.SGD(params(reference), lr=0.5, momentum=0.9)
    theirs = _reference_steps(reference, ref_opt, data)
    assert ours == pytest.approx(theirs, abs=1e-5)
    trained = accelerator.unwrap_model(prepared).state_dict()
    for name, tensor in reference.state_dict().items():
        if _untrained(name):
            assert torch.equal(trained[name], before[name]), name
        else:
            assert not torch.equal(trained[name], before[name]), name
            assert torch.allclose(trained[name], tensor, atol=1e-5), name


def test_fresh_adagrad_is_accepted_and_trains_as_pytorch():
    """Adagrad makes its state when built: a fresh one prepares; a stepped one is refused."""
    set_seed(1)
    model = tiny_gpt2()
    reference = copy.deepcopy(model)
    data = blocks(8)
    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(gradient_clipping=0.0))
    options = dict(lr=5e-2, initial_accumulator_value=0.1)
    prepared, _, loader = accelerator.prepare(
        model, torch.optim.Adagrad(model.parameters(), **options), _loader(data)
    )
    ours = [prepared(**batch).loss.item() for batch in loader]
    theirs = _reference_steps(
        reference, torch.optim.Adagrad(reference.parameters(), **options), data
    )
    assert ours == pytest.approx(theirs, abs=1e-5)
    trained = accelerator.unwrap_model(prepared).state_dict()
    for name, tensor in reference.state_dict().items():
        assert torch.allclose(trained[name], tensor, atol=1e-5), name

    stepped_model = tiny_gpt2()
    stepped = torch.optim.Adagrad(stepped_model.parameters(), lr=0.1)
    stepped_model(**default_data_collator(data[:2])).loss.backward()
    stepped.step()
    with pytest.raises(PrepareError, match="already has state"):
        Accelerator().prepare(stepped_model, stepped, _loader(data))


def _decay_at(step, optimizer):
    if step == 1:  # a step decay at an "epoch boundary", written once
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * 0.1
            group["weight_decay"] = 0.5
    if step == 3:
        for group in optimizer.param_groups:
            group["lr"] = 0.0


def _prepare_adamw(model, data):
    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(gradient_clipping=0.0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    return accelerator, *accelerator.prepare(model, optimizer, _loader(data))


def test_learning_rate_written_once_sticks(tmp_path):
    """g["lr"] / g["weight_decay"] written after prepare stay as in PyTorch (and in a saved state)."""
    set_seed(2)
    model = tiny_gpt2()
    reference = copy.deepcopy(model)
    data = blocks(20)
    accelerator, prepared, optimizer, loader = _prepare_adamw(model, data)
    ours, lrs, weights = [], [], []
    for step, batch in enumerate(loader):
        _decay_at(step, optimizer)
        ours.append(prepared(**batch).loss.item())
        lrs.append(optimizer.param_groups[0]["lr"])
        weights.append(accelerator.unwrap_model(prepared).lm_head.weight.clone())
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.0)
    theirs = _reference_steps(reference, ref_opt, data, before_step=_decay_at)
    assert ours == pytest.approx(theirs, abs=1e-5)
    assert lrs == pytest.approx([1e-2, 1e-3, 1e-3, 0.0, 0.0])
    assert torch.equal(weights[2], weights[3]) and torch.equal(weights[3], weights[4])
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.5]
    accelerator.save_state(tmp_path / "state")
    accelerator, _, optimizer, _ = _prepare_adamw(tiny_gpt2(), data)
    accelerator.load_state(tmp_path / "state")
    assert [(g["lr"], g["weight_decay"]) for g in optimizer.param_groups] == [(0.0, 0.5)]


def test_learning_rate_written_under_a_scheduler_lasts_one_step():
    """With a scheduler prepared, a written lr is used by the next step, then the schedule's (PyTorch's order)."""
    set_seed(3)
    model = tiny_gpt2()
    data = blocks(12)
    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(gradient_clipping=0.0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=3, warmup_num_steps=0)
    prepared, optimizer, loader, scheduler = accelerator.prepare(
        model, optimizer, _loader(data), scheduler
    )
    batches = list(loader)
    prepared(**batches[0])
    scheduled = scheduler.get_last_lr()[0]
    optimizer.param_groups[0]["lr"] = 0.0
    before = accelerator.unwrap_model(prepared).lm_head.weight.clone()
    prepared(**batches[1])
    assert torch.equal(accelerator.unwrap_model(prepared).lm_head.weight, before)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 / 3) != scheduled


def _causal(kind):
    if kind == "gpt2":
        return tiny_gpt2(positions=32)
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=101,
        max_position_embeddings=32,
        initializer_range=0.2,  # attention that depends on the positions
    )
    return transformers.LlamaForCausalLM(config)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_position_ids_reach_the_model(kind):
    """The batch's position_ids give transformers' loss and logits, in evaluation and in the train step."""
    set_seed(4)
    model = _causal(kind)
    reference = copy.deepcopy(model).eval()
    data = blocks(4)
    for i, sample in enumerate(data):  # shifted and restarted positions
        positions = torch.arange(16) + 3 * i
        positions[10:] = torch.arange(6)
        sample["position_ids"] = positions
    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(return_logits=True))
    prepared, loader = accelerator.prepare(model, _loader(data, batch_size=2))
    batches = list(loader)
    prepared.eval()
    for batch in batches:
        ours, theirs = prepared(**batch), reference(**batch)
        assert ours.loss.item() == pytest.approx(theirs.loss.item(), abs=1e-5)
        assert torch.allclose(ours.logits, theirs.logits, atol=1e-5)
        default = reference(**{k: v for k, v in batch.items() if k != "position_ids"}).logits
        assert (default - theirs.logits).abs().max() > 1e-3  # the positions matter
    prepared.train()
    assert prepared(**batches[0]).loss.item() == pytest.approx(
        reference(**batches[0]).loss.item(), abs=1e-5
    )


def test_num_items_in_batch_is_transformers_loss():
    """Loss and gradient are the token sum over num_items_in_batch (two micro-batches of ragged rows)."""
    set_seed(5)
    model = tiny_gpt2()
    reference = copy.deepcopy(model)
    data = ragged(8)
    plugin = MegatronLMPlugin(gradient_clipping=0.0, num_micro_batches=2)
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    prepared, _, loader = accelerator.prepare(
        model, torch.optim.SGD(model.parameters(), lr=0.5), _loader(data, batch_size=2)
    )
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    for batch in loader:  # one step: 4 rows in 2 micro-batches of 2
        items = int((batch["labels"][:, 1:] != -100).sum()) + 3  # any count: the divisor
        ours = prepared(**batch, num_items_in_batch=items).loss.item()
        theirs = reference(**batch, num_items_in_batch=items).loss
        theirs.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert ours == pytest.approx(theirs.item(), abs=1e-5)
        mean = reference(**batch).loss.item()
        assert abs(ours - mean) > 1e-3  # not the token mean
    trained = accelerator.unwrap_model(prepared).state_dict()
    for name, tensor in reference.state_dict().items():
        assert torch.allclose(trained[name], tensor, atol=1e-5), name
    prepared.eval()
    with torch.no_grad():
        for batch in loader:
            ours = prepared(**batch, num_items_in_batch=7).loss.item()
            assert ours == pytest.approx(
                reference(**batch, num_items_in_batch=7).loss.item(), abs=1e-5
            )


@pytest.mark.parametrize(
    ("extra", "error", "named"),
    [
        ({"token_type_ids": torch.zeros(4, 16, dtype=torch.long)}, BatchError, "token_type_ids"),
        ({"idx": torch.arange(4)}, BatchError, "idx"),
        ({"output_hidden_states": True}, EngineError, "output_hidden_states"),
        ({"output_attentions": True}, EngineError, "output_attentions"),
        ({"use_cache": True}, EngineError, "use_cache"),
        ({"num_items_in_batch": 0}, EngineError, "num_items_in_batch"),
    ],
)
def test_keys_the_model_cannot_honour_are_refused(extra, error, named):
    """Nothing is dropped: each key or keyword the prepared model cannot honour is refused by name."""
    set_seed(6)
    accelerator = Accelerator()
    prepared, loader = accelerator.prepare(tiny_gpt2(), _loader(blocks(4)))
    batch = next(iter(loader))
    with pytest.raises(error, match=named):
        prepared(**batch, **extra)


def test_harmless_keywords_change_nothing():
    """use_cache=False / output_hidden_states=False are accepted; return_dict=False gives the tuple."""
    set_seed(7)
    model = tiny_gpt2()
    reference = copy.deepcopy(model).eval()
    accelerator = Accelerator()
    prepared, loader = accelerator.prepare(model, _loader(blocks(4)))
    prepared.eval()
    batch = next(iter(loader))
    expected = reference(**batch).loss.item()
    out = prepared(**batch, use_cache=False, output_hidden_states=False, return_dict=False)
    assert isinstance(out, tuple) and out[0].item() == pytest.approx(expected, abs=1e-5)


def test_num_items_in_batch_refused_where_transformers_ignores_it():
    """BertForMaskedLM's transformers loss is the token mean: num_items_in_batch is refused by name."""
    config = transformers.BertConfig(
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
        vocab_size=99,
    )
    data = [
        {"input_ids": r, "labels": r.clone(), "attention_mask": torch.ones(16, dtype=torch.long)}
        for r in torch.randint(5, 99, (4, 16))
    ]
    accelerator = Accelerator()
    prepared, loader = accelerator.prepare(transformers.BertForMaskedLM(config), _loader(data))
    with pytest.raises(EngineError, match="num_items_in_batch: BertForMaskedLM"):
        prepared(**next(iter(loader)), num_items_in_batch=10)
