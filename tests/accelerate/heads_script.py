"""A classification script in the style of Accelerate's ``nlp_example.py``, on tiny models.

``AutoModelForSequenceClassification`` / ``AutoModelForTokenClassification`` (BERT,
GPT-2, Llama, ESM) built from a config, synthetic labelled rows of different
lengths padded on the right, AdamW with ``get_constant_schedule``,
``outputs.loss``, then evaluation with ``outputs.logits.argmax(dim=-1)`` and
``accelerator.gather_for_metrics``. The main process writes a JSON report: the
loss of every step, the evaluation loss (mean over batches), the gathered
predictions and the logits' sum.

``python heads_script.py --plan PLAN.json`` runs several configurations in one
process start (under ``epochal launch``): the plan is a list of ``{"env": {...},
"argv": [...]}``, ``env`` being the ``MEGATRON_LM_*`` variables of that run.
"""

import argparse
import json
import os

import torch
import transformers
from torch.utils.data import DataLoader

VOCAB = 203
PAD = 0
LENGTH = 16


def tiny_classifier(arch: str, family: str, num_labels: int, problem_type: str | None):
    common = dict(num_labels=num_labels, problem_type=problem_type)
    if arch == "bert":
        config = transformers.BertConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            intermediate_size=128,
            vocab_size=VOCAB,
            max_position_embeddings=32,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            pad_token_id=PAD,
            **common,
        )
    elif arch == "gpt2":
        config = transformers.GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=4,
            vocab_size=VOCAB,
            n_positions=32,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            classifier_dropout=0.0,
            pad_token_id=PAD,
            bos_token_id=1,
            eos_token_id=1,
            **common,
        )
    elif arch == "llama":
        config = transformers.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            vocab_size=VOCAB,
            max_position_embeddings=32,
            classifier_dropout=0.0,
            pad_token_id=PAD,
            bos_token_id=1,
            eos_token_id=1,
            **common,
        )
    elif arch in ("qwen2", "qwen3", "mistral"):
        config = transformers.AutoConfig.for_model(
            arch,
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=128,
            vocab_size=VOCAB,
            max_position_embeddings=32,
            classifier_dropout=0.0,
            pad_token_id=PAD,
            bos_token_id=1,
            eos_token_id=1,
            **common,
        )
    else:
        config = transformers.EsmConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            intermediate_size=128,
            vocab_size=33,
            max_position_embeddings=40,
            pad_token_id=1,
            mask_token_id=32,
            position_embedding_type="rotary",
            token_dropout=False,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            **common,
        )
    auto = (
        transformers.AutoModelForSequenceClassification
        if family == "sequence"
        else transformers.AutoModelForTokenClassification
    )
    return auto.from_config(config)


def labelled_rows(
    arch: str, family: str, num_labels: int, problem_type: str, n: int = 12
) -> list[dict]:
    """``n`` rows of different lengths (padded on the right by the collator)."""
    g = torch.Generator().manual_seed(7)
    low, high = (4, 33) if arch == "esm" else (5, VOCAB)
    rows = []
    for i in range(n):
        length = int(torch.randint(6, LENGTH, (1,), generator=g))
        ids = torch.randint(low, high, (length,), generator=g)
        row = {"input_ids": ids}
        if arch == "bert":
            row["token_type_ids"] = (torch.arange(length) > length // 2).long()
        if family == "token":
            labels = torch.randint(0, num_labels, (length,), generator=g)
            labels[0] = -100  # e.g. a special token
            row["labels"] = labels
        elif problem_type == "regression":
            row["labels"] = torch.randn(num_labels, generator=g).squeeze(0)
        elif problem_type == "multi_label_classification":
            row["labels"] = torch.randint(0, 2, (num_labels,), generator=g).float()
        else:
            row["labels"] = torch.tensor(i % num_labels)
        rows.append(row)
    return rows


def collate_rows(pad: int, length: int | None = None):
    """A collator padding on the right to the longest row (or to ``length``)."""

    def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
        width = length or max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        out = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in rows[0]:
            out["token_type_ids"] = torch.zeros_like(ids)
        token_labels = rows[0]["labels"].dim() == 1 and len(rows[0]["labels"]) == len(
            rows[0]["input_ids"]
        )
        if token_labels:
            out["labels"] = torch.full_like(ids, -100)
        for i, r in enumerate(rows):
            n = len(r["input_ids"])
            ids[i, :n] = r["input_ids"]
            mask[i, :n] = 1
            if "token_type_ids" in r:
                out["token_type_ids"][i, :n] = r["token_type_ids"]
            if token_labels:
                out["labels"][i, :n] = r["labels"]
        if not token_labels:
            out["labels"] = torch.stack([r["labels"] for r in rows])
        return out

    return collate


def main(argv=None):
    from epochal.accelerate import Accelerator, set_seed

    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="bert")
    parser.add_argument("--family", default="sequence")
    parser.add_argument("--num_labels", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--report", default=None)
    args = parser.parse_args(argv)
    set_seed(0)
    model = tiny_classifier(args.arch, args.family, args.num_labels, None)
    rows = labelled_rows(args.arch, args.family, args.num_labels, "single_label_classification")
    # one length for every batch: pipeline parallelism fixes it at the first batch's
    collate = collate_rows(1 if args.arch == "esm" else PAD, LENGTH)
    accelerator = Accelerator()
    loader = DataLoader(rows, batch_size=2, collate_fn=collate)
    evaluation = DataLoader(rows[:8], batch_size=2, collate_fn=collate)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # constant: Accelerate steps a prepared scheduler once per data-parallel process, so a
    # decaying schedule would differ between DP2 and one process by design
    schedule = transformers.get_constant_schedule(optimizer)
    prepared = accelerator.prepare(model, optimizer, loader, evaluation, schedule)
    model, optimizer, loader, evaluation, schedule = prepared
    losses = []
    model.train()
    for step, batch in enumerate(loader):
        if step == args.steps:
            break
        outputs = model(**batch)
        losses.append(outputs.loss.item())
        accelerator.backward(outputs.loss)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    model.eval()
    eval_losses, predictions, logit_sum = [], [], 0.0
    for batch in evaluation:
        with torch.no_grad():
            outputs = model(**batch)
        eval_losses.append(outputs.loss.item())
        logit_sum += accelerator.gather_for_metrics(outputs.logits).double().sum().item()
        predictions += accelerator.gather_for_metrics(outputs.logits.argmax(dim=-1)).tolist()
    if args.report and accelerator.is_main_process:
        with open(args.report, "w") as f:
            json.dump(
                {
                    "train_losses": losses,
                    "eval_loss": sum(eval_losses) / len(eval_losses),
                    "predictions": predictions,
                    "logit_sum": logit_sum,
                },
                f,
            )
    accelerator.end_training()


def run_plan(path: str) -> None:
    """Run every configuration of the plan at ``path`` (see the module docstring)."""
    with open(path) as f:
        plan = json.load(f)
    for run in plan:
        for key in [k for k in os.environ if k.startswith("MEGATRON_LM_")]:
            del os.environ[key]
        os.environ.update(run["env"])
        main(run["argv"])


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--plan"]:
        run_plan(sys.argv[2])
    else:
        main()
