"""Fine-tuning cost: full fine-tuning vs a frozen encoder vs LoRA adapters, on ESM-2 8M's shape.

One ``sequence_classification`` model (6 layers, hidden 320, 20 heads, FFN 1280: ESM-2
8M) per mode, AdamW over the trainable parameters, random batches of ``--batch`` x
``--seq`` tokens with a padding tail. For each mode it reports the trainable
parameters, the bytes of gradients plus AdamW state after a step (measured from the
tensors the optimizer holds), and the median time of a forward + backward + optimizer
step over ``--steps`` steps after ``--warmup``. CPU by default (``--device cuda`` also
reports ``torch.cuda.max_memory_allocated``).

Run::

    python benchmarks/bench_lora.py                 # ~1 minute on a 2-core CPU
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from epochal.model import build_model
from epochal.model.config import ModelConfig
from epochal.train.optim.optimizer import build_adamw

ESM2_8M = dict(
    type="esm",
    vocab_size=33,
    hidden_size=320,
    num_layers=6,
    num_attention_heads=20,
    ffn_hidden_size=1280,
    max_position_embeddings=1026,
    position_embedding_type="rope",
    mask_token_id=32,
    pad_token_id=1,
    head="sequence_classification",
    num_labels=2,
)
MODES = {
    "full fine-tuning": {},
    "frozen encoder": {"freeze_encoder": True},
    "LoRA r=8 (wq,wv)": {"lora_rank": 8, "lora_target_modules": "wq,wv"},
    "LoRA r=8 (all 6)": {"lora_rank": 8, "lora_target_modules": "wq,wk,wv,wo,fc1,fc2"},
}


def run(mode: dict, args: argparse.Namespace) -> dict[str, float]:
    device = torch.device(args.device)
    with torch.device(device):
        model = build_model(ModelConfig(**ESM2_8M, **mode), seed=0)
    opt = build_adamw([model], lr=1e-4, weight_decay=0.01)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 24, (args.batch, args.seq), generator=g).to(device)
    padding = torch.ones_like(tokens)
    padding[:, args.seq * 3 // 4 :] = 0
    residue = padding.clone()
    residue[:, 0] = 0
    labels = torch.randint(0, 2, (args.batch,), generator=g).to(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(tokens, None, padding, residue_mask=residue), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    held = sum(p.grad.nbytes for p in model.parameters() if p.grad is not None)
    held += sum(t.nbytes for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    out = {
        "trainable": trainable,
        "grad+adam MiB": held / 2**20,
        "step ms": 1e3 * statistics.median(times),
    }
    if device.type == "cuda":
        out["peak MiB"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    torch.manual_seed(0)
    print(
        f"ESM-2 8M shape, batch {args.batch} x {args.seq} tokens, {args.device}, torch {torch.__version__}"
    )
    rows = {name: run(mode, args) for name, mode in MODES.items()}
    cols = list(next(iter(rows.values())))
    print(f"| mode | {' | '.join(cols)} |")
    print("|---|" + "---|" * len(cols))
    for name, r in rows.items():
        cells = [f"{r[c]:,}" if c == "trainable" else f"{r[c]:.1f}" for c in cols]
        print(f"| {name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
