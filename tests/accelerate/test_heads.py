"""Sequence and token classification models through ``accelerator.prepare`` (one process).

Each problem type (regression, single- and multi-label) and each architecture (BERT,
GPT-2, Llama, Qwen3, ESM) is trained by some case, Llama's token classifier by the saving
test; Qwen2 and Mistral (converted as Llama) by the weight round trip.

Peer: transformers itself. From a tiny model with random weights (2 layers, hidden
64), the prepared run's first loss is the transformers model's loss on the same
batch; its losses over a few steps are those of plain PyTorch training of the
transformers model with the same AdamW and schedule (no clipping: the script asks
for none and has no Megatron-LM plugin, as under Accelerate); evaluation returns transformers' logits (with and without
labels); ``unwrap_model(model).save_pretrained`` and ``accelerator.save_model``
write folders transformers loads as the same class, with the trained logits.
"""

import copy

import pytest
import torch
import transformers
from torch.utils.data import DataLoader

from epochal.accelerate import Accelerator, set_seed
from epochal.accelerate.batches import BatchError
from epochal.accelerate.prepare_model import ModelPrepareError, convert_hf_model
from tests.accelerate.heads_script import PAD, collate_rows, labelled_rows, tiny_classifier

#: (architecture, family, num_labels, problem_type)
CASES = [
    ("bert", "sequence", 2, "single_label_classification"),
    ("bert", "sequence", 1, "regression"),
    ("gpt2", "sequence", 3, "multi_label_classification"),
    ("llama", "sequence", 3, "single_label_classification"),
    ("qwen3", "sequence", 2, "single_label_classification"),
    ("esm", "sequence", 3, "single_label_classification"),
    ("bert", "token", 3, None),
    ("gpt2", "token", 3, None),
    ("esm", "token", 2, None),
]


def _train(arch, family, num_labels, problem_type, steps=3):
    set_seed(0)
    # transformers decides the problem type from num_labels and the labels' dtype, except
    # a regression of several values (float labels read as multi-label otherwise)
    explicit = problem_type if problem_type == "regression" and num_labels > 1 else None
    model = tiny_classifier(arch, family, num_labels, explicit)
    reference = copy.deepcopy(model)
    rows = labelled_rows(arch, family, num_labels, problem_type or "single_label_classification")
    collate = collate_rows(1 if arch == "esm" else PAD)
    accelerator = Accelerator()
    loader = DataLoader(rows, batch_size=4, collate_fn=collate)
    evaluation = DataLoader(rows[:8], batch_size=4, collate_fn=collate)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, 0, 10)
    prepared = accelerator.prepare(model, optimizer, loader, evaluation, schedule)
    model, optimizer, loader, evaluation, schedule = prepared
    ours = []
    for batch in list(loader)[:steps]:
        loss = model(**batch).loss
        ours.append(loss.item())
        accelerator.backward(loss)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3, weight_decay=0.01)
    ref_schedule = transformers.get_linear_schedule_with_warmup(ref_optimizer, 0, 10)
    theirs = []
    for batch in list(DataLoader(rows, batch_size=4, collate_fn=collate))[:steps]:
        loss = reference(**batch).loss
        theirs.append(loss.item())
        loss.backward()
        ref_optimizer.step()
        ref_schedule.step()
        ref_optimizer.zero_grad()
    return accelerator, model, evaluation, reference, ours, theirs


@pytest.mark.parametrize("arch,family,num_labels,problem_type", CASES)
def test_losses_and_logits_equal_transformers(arch, family, num_labels, problem_type):
    accelerator, model, evaluation, reference, ours, theirs = _train(
        arch, family, num_labels, problem_type
    )
    assert abs(ours[0] - theirs[0]) < 1e-5, (ours, theirs)
    assert ours == pytest.approx(theirs, abs=2e-5), (ours, theirs)
    if family == "sequence":
        assert reference.config.problem_type == problem_type
    model.eval()
    reference.eval()
    # after training, Adam turns float-rounding differences of tiny gradients into
    # differences of its step size (lr 1e-3 here): the logits agree to 1e-4
    for batch in evaluation:
        with torch.no_grad():
            out = model(**batch)
            expected = reference(**batch)
            unlabelled = model(**{k: v for k, v in batch.items() if k != "labels"})
        assert out.logits.shape == expected.logits.shape
        real = batch["attention_mask"].bool()  # a causal model's padding positions differ
        if family == "token":
            assert torch.allclose(out.logits[real], expected.logits[real], atol=1e-4)
        else:
            assert torch.allclose(out.logits, expected.logits, atol=1e-4)
        assert abs(out.loss.item() - expected.loss.item()) < 1e-4
        assert unlabelled.loss is None and torch.equal(unlabelled.logits, out.logits)
        predictions = accelerator.gather_for_metrics(out.logits.argmax(dim=-1))
        assert torch.equal(predictions, out.logits.argmax(dim=-1))


@pytest.mark.parametrize("arch,family", [("bert", "sequence"), ("llama", "token")])
def test_saved_folder_loads_as_the_same_class(tmp_path, arch, family):
    accelerator, model, evaluation, _, _, _ = _train(arch, family, 3, "single_label_classification")
    model.eval()
    batch = next(iter(evaluation))
    with torch.no_grad():
        trained = model(**batch).logits
    unwrapped = accelerator.unwrap_model(model)
    unwrapped.save_pretrained(tmp_path / "pretrained")
    accelerator.save_model(model, tmp_path / "saved")
    for folder in ("pretrained", "saved"):
        loaded = type(unwrapped).from_pretrained(tmp_path / folder).eval()
        assert type(loaded) is type(unwrapped)
        assert loaded.config.problem_type == unwrapped.config.problem_type
        with torch.no_grad():
            logits = loaded(**batch).logits
        if family == "token":  # a causal model's padding positions differ
            real = batch["attention_mask"].bool()
            logits, trained_real = logits[real], trained[real]
        else:
            trained_real = trained
        assert torch.allclose(logits, trained_real, atol=1e-5), (logits - trained_real).abs().max()


@pytest.mark.parametrize("family", ["sequence", "token"])
@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama", "qwen2", "qwen3", "mistral", "esm"])
def test_weights_convert_both_ways(arch, family):
    """Every classifier's weights become epochal's and come back unchanged (the head included)."""
    model = tiny_classifier(arch, family, 3, None)
    source = convert_hf_model(model)
    assert source.config.head == (
        "pooled_classifier" if family == "sequence" else "token_classifier"
    )
    assert any(name.startswith("head.out.") for name in source.state)
    back = source.hf_state(source.state)
    own = model.state_dict()
    assert set(back) == set(own) - source.placeholders - {"esm.rotary_embeddings.inv_freq"}
    for name, tensor in back.items():
        assert torch.equal(tensor, own[name]), name


def test_unsupported_classifier_is_refused_naming_it():
    config = transformers.RobertaConfig(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64
    )
    model = transformers.RobertaForSequenceClassification(config)
    accelerator = Accelerator()
    loader = DataLoader([{"input_ids": torch.ones(4, dtype=torch.long)}] * 4, batch_size=2)
    with pytest.raises(ModelPrepareError, match="RobertaForSequenceClassification.*BERT, GPT-2"):
        accelerator.prepare(model, loader)


def test_last_token_pooling_needs_a_pad_token_id():
    """transformers refuses rows > 1 without ``pad_token_id``; so does the prepared model."""
    set_seed(0)
    model = tiny_classifier("gpt2", "sequence", 2, None)
    model.config.pad_token_id = None
    rows = labelled_rows("gpt2", "sequence", 2, "single_label_classification", n=4)
    loader = DataLoader(rows, batch_size=2, collate_fn=collate_rows(PAD))
    accelerator = Accelerator()
    model, loader = accelerator.prepare(model, loader)
    with pytest.raises(BatchError, match="pad_token_id"):
        model(**next(iter(loader)))
