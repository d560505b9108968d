"""A training script in the style of Accelerate's ``megatron_lm_gpt_pretraining.py``.

It follows the guide's pattern and API calls (``Accelerator``, ``DistributedType``,
``MegatronLMDummyScheduler``, ``accelerator.prepare``, ``model(**batch).loss``,
``accelerator.backward``, the Megatron branches for the scheduler, the global batch
size and the evaluation losses, ``save_state`` / ``load_state``) on tiny
transformers models built from a config, a tokenizer made in memory and
synthetic samples, so it runs offline in seconds:

- ``--task clm``: ``AutoModelForCausalLM`` (GPT-2 or Llama) on blocks of ids (what
  the guide's ``group_texts`` makes), ``default_data_collator``;
- ``--task mlm``: ``AutoModelForMaskedLM`` (BERT) with ``DataCollatorForLanguageModeling``;
- ``--task seq2seq``: ``AutoModelForSeq2SeqLM`` (T5) with ``DataCollatorForSeq2Seq``.

``--backend epochal`` imports ``epochal.accelerate``; ``--backend accelerate``
imports Hugging Face Accelerate itself (the peer: plain PyTorch, one process).
The main process writes a JSON report (``--report``): the loss of every step, the
evaluation loss, the train loader's position, the global batch size.
``--kill_after_save`` ends the process with SIGKILL right after ``save_state``.
"""

import argparse
import importlib
import json
import math
import os
import signal

import torch
import transformers
from torch.utils.data import DataLoader
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    default_data_collator,
)

VOCAB = 203  # odd on purpose: epochal pads it, the loss must not see the padding
SPECIAL = ["<pad>", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "</s>"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("epochal", "accelerate"), default="epochal")
    parser.add_argument("--task", choices=("clm", "mlm", "seq2seq"), default="clm")
    parser.add_argument("--model_type", choices=("gpt2", "llama", "bert", "t5"), default=None)
    parser.add_argument("--per_device_train_batch_size", type=int, default=2)
    parser.add_argument("--per_device_eval_batch_size", type=int, default=2)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--weight_decay", type=float, default=0.1)
    parser.add_argument("--max_train_steps", type=int, default=3)
    parser.add_argument("--num_warmup_steps", type=int, default=0)
    parser.add_argument("--block_size", type=int, default=32)
    parser.add_argument("--train_samples", type=int, default=32)
    parser.add_argument("--eval_samples", type=int, default=8)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output_dir", default=None)
    parser.add_argument("--checkpointing_steps", type=int, default=None)
    parser.add_argument("--resume_from_checkpoint", default=None)
    parser.add_argument("--kill_after_save", action="store_true")
    parser.add_argument("--save_pretrained", default=None)
    parser.add_argument("--report", default=None)
    return parser.parse_args(argv)


def make_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL), VOCAB)})
    core = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        eos_token="</s>",
    )


def tiny_model(args, tokenizer):
    special = dict(pad_token_id=tokenizer.pad_token_id, vocab_size=VOCAB)
    kind = args.model_type or {"clm": "gpt2", "mlm": "bert", "seq2seq": "t5"}[args.task]
    if kind == "gpt2":
        config = transformers.GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=4,
            n_positions=args.block_size,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
            **special,
        )
    elif kind == "llama":
        config = transformers.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            max_position_embeddings=args.block_size,
            bos_token_id=0,
            eos_token_id=0,
            **special,
        )
    elif kind == "bert":
        config = transformers.BertConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=args.block_size,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            **special,
        )
    else:
        config = transformers.T5Config(
            num_layers=2,
            d_model=64,
            num_heads=4,
            d_kv=16,
            d_ff=128,
            dropout_rate=0.0,
            decoder_start_token_id=tokenizer.pad_token_id,
            eos_token_id=5,
            **special,
        )
    auto = {
        "clm": AutoModelForCausalLM,
        "mlm": AutoModelForMaskedLM,
        "seq2seq": AutoModelForSeq2SeqLM,
    }
    return auto[args.task].from_config(config)


def samples(args, n, seed, tokenizer):
    g = torch.Generator().manual_seed(seed)
    first = len(SPECIAL)
    if args.task == "clm":
        ids = torch.randint(first, VOCAB, (n, args.block_size), generator=g)
        return [
            {"input_ids": r, "attention_mask": torch.ones_like(r), "labels": r.clone()} for r in ids
        ]
    out = []
    for _ in range(n):
        length = int(torch.randint(8, args.block_size - 1, (1,), generator=g))
        words = torch.randint(first, VOCAB, (length,), generator=g).tolist()
        if args.task == "mlm":
            out.append({"input_ids": [tokenizer.cls_token_id, *words, tokenizer.sep_token_id]})
        else:
            target = torch.randint(first, VOCAB, (length // 2,), generator=g).tolist()
            out.append(
                {
                    "input_ids": [*words, tokenizer.eos_token_id],
                    "labels": [*target, tokenizer.eos_token_id],
                }
            )
    return out


def main(argv=None):
    args = parse_args(argv)
    root = "epochal.accelerate" if args.backend == "epochal" else "accelerate"
    acc_mod = importlib.import_module(root)
    utils = importlib.import_module(root + ".utils")
    Accelerator, DistributedType = acc_mod.Accelerator, acc_mod.DistributedType
    MegatronLMDummyScheduler, set_seed = utils.MegatronLMDummyScheduler, utils.set_seed
    logger = importlib.import_module(root + ".logging").get_logger(__name__)

    accelerator = Accelerator(gradient_accumulation_steps=1)
    logger.info(accelerator.state, main_process_only=False)
    set_seed(args.seed)

    tokenizer = make_tokenizer()
    model = tiny_model(args, tokenizer)
    with accelerator.main_process_first():
        train_dataset = samples(args, args.train_samples, 1, tokenizer)
        eval_dataset = samples(args, args.eval_samples, 2, tokenizer)

    if args.task == "clm":
        collator = default_data_collator
    elif args.task == "mlm":
        collator = DataCollatorForLanguageModeling(
            tokenizer, mlm_probability=0.15, pad_to_multiple_of=args.block_size
        )
    else:
        collator = DataCollatorForSeq2Seq(tokenizer, model=model, pad_to_multiple_of=16)
    train_dataloader = DataLoader(
        train_dataset,
        shuffle=True,
        collate_fn=collator,
        batch_size=args.per_device_train_batch_size,
    )
    eval_dataloader = DataLoader(
        eval_dataset, collate_fn=collator, batch_size=args.per_device_eval_batch_size
    )

    no_decay = [
        "bias",
        "LayerNorm.weight",
        "layer_norm.weight",
        "ln_1.weight",
        "ln_2.weight",
        "ln_f.weight",
        "norm.weight",
    ]
    optimizer_grouped_parameters = [
        {
            "params": [
                p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)
            ],
            "weight_decay": args.weight_decay,
        },
        {
            "params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
            "weight_decay": 0.0,
        },
    ]
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate)

    if accelerator.distributed_type == DistributedType.MEGATRON_LM:
        lr_scheduler = MegatronLMDummyScheduler(
            optimizer=optimizer,
            total_num_steps=args.max_train_steps,
            warmup_num_steps=args.num_warmup_steps,
        )
    else:
        lr_scheduler = transformers.get_scheduler(
            name="linear",
            optimizer=optimizer,
            num_warmup_steps=args.num_warmup_steps,
            num_training_steps=args.max_train_steps,
        )

    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )

    if accelerator.distributed_type == DistributedType.MEGATRON_LM:
        total_batch_size = accelerator.state.megatron_lm_plugin.global_batch_size
    else:
        total_batch_size = args.per_device_train_batch_size * accelerator.num_processes
    num_update_steps_per_epoch = len(train_dataloader)
    num_train_epochs = math.ceil(args.max_train_steps / num_update_steps_per_epoch)

    completed_steps = 0
    if args.resume_from_checkpoint:
        accelerator.load_state(args.resume_from_checkpoint)
        completed_steps = int(
            os.path.basename(args.resume_from_checkpoint.rstrip("/")).replace("step_", "")
        )

    train_losses = []
    epoch = completed_steps // num_update_steps_per_epoch
    while completed_steps < args.max_train_steps and epoch < num_train_epochs:
        model.train()
        for batch in train_dataloader:  # the prepared loader resumes by itself
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                train_losses.append(loss.item())
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed_steps += 1
            if args.checkpointing_steps and completed_steps % args.checkpointing_steps == 0:
                accelerator.save_state(os.path.join(args.output_dir, f"step_{completed_steps}"))
                if args.kill_after_save:
                    accelerator.wait_for_everyone()
                    os.kill(os.getpid(), signal.SIGKILL)
            if completed_steps >= args.max_train_steps:
                break
        epoch += 1

    model.eval()
    losses = []
    for batch in eval_dataloader:
        with torch.no_grad():
            outputs = model(**batch)
        loss = outputs.loss
        if accelerator.distributed_type == DistributedType.MEGATRON_LM:
            losses.append(loss)
        else:
            losses.append(
                accelerator.gather_for_metrics(loss.repeat(args.per_device_eval_batch_size))
            )
    if accelerator.distributed_type == DistributedType.MEGATRON_LM:
        losses = torch.tensor(losses)
    else:
        losses = torch.cat(losses)
    eval_loss = torch.mean(losses)
    logger.info(f"eval_loss: {eval_loss}")

    if args.save_pretrained:
        accelerator.wait_for_everyone()
        unwrapped_model = accelerator.unwrap_model(model)
        if accelerator.is_main_process:
            unwrapped_model.save_pretrained(args.save_pretrained)
    if args.report and accelerator.is_main_process:
        position = getattr(train_dataloader, "consumed_samples", None)
        with open(args.report, "w") as f:
            json.dump(
                {
                    "train_losses": train_losses,
                    "eval_loss": eval_loss.item(),
                    "consumed_samples": position,
                    "global_batch_size": total_batch_size,
                    "steps": completed_steps,
                },
                f,
            )
    accelerator.end_training()


if __name__ == "__main__":
    main()
